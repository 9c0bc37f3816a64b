//! Registered memory: the regions of this process that peers may read and
//! write, and that local buffers of transfers must lie in.
//!
//! Regions never overlap (regions that touch are fine). Every transfer pins
//! the regions its ranges lie in for as long as it moves bytes, so a region
//! cannot be unregistered (and then freed) under a transfer: unregistering a
//! pinned region fails with [`ErrorKind::InUse`]. A store and an engine in
//! one process share one registry.

use crate::engine::error::{EngineError, ErrorKind, Result};
use parking_lot::{Condvar, Mutex};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Longest an `unregister` waits for transfers that finished their copy and
/// wait only for their initiator's last message.
pub const SETTLE_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

#[derive(Debug)]
struct Region {
    len: u64,
    /// Registration order (for "the first buffer").
    seq: u64,
    /// Transfers using the region now.
    pins: u64,
    /// Of those, the ones whose copy already finished and that only wait
    /// for their initiator's last word ([`Pin::settle`]).
    settling: u64,
    /// Where the memory lives (`cpu:0`, `cuda:1`, `*`).
    location: String,
    /// Device memory: moved through [`crate::engine::device`], never touched by
    /// host copies.
    device: bool,
}

#[derive(Debug, Default)]
struct Inner {
    regions: BTreeMap<u64, Region>,
    next_seq: u64,
    /// Regions of device memory among them.
    devices: usize,
}

/// The registered regions of one engine (and of a store sharing it).
#[derive(Debug, Default)]
pub struct Registry {
    inner: Mutex<Inner>,
    /// Signalled whenever a pin is released.
    released: Condvar,
}

/// Regions held against unregistration while a transfer uses them;
/// released on drop.
#[derive(Debug)]
pub struct Pin {
    registry: Arc<Registry>,
    starts: Vec<u64>,
    settled: bool,
}

impl Pin {
    /// The transfer's copy into or out of the regions is finished; the pin
    /// only waits for the initiator to say so (its message is already on
    /// the way when its call has returned). An `unregister` meanwhile waits
    /// for the release instead of failing.
    pub fn settle(&mut self) {
        if std::mem::replace(&mut self.settled, true) {
            return;
        }
        let mut g = self.registry.inner.lock();
        for s in &self.starts {
            if let Some(r) = g.regions.get_mut(s) {
                r.settling += 1;
            }
        }
    }
}

impl Drop for Pin {
    fn drop(&mut self) {
        let mut g = self.registry.inner.lock();
        for s in &self.starts {
            if let Some(r) = g.regions.get_mut(s) {
                r.pins = r.pins.saturating_sub(1);
                if self.settled {
                    r.settling = r.settling.saturating_sub(1);
                }
            }
        }
        drop(g);
        self.registry.released.notify_all();
    }
}

impl Inner {
    /// The start of the region holding `[addr, addr+len)`, if one does.
    fn holder(&self, addr: u64, len: u64) -> Option<u64> {
        let end = addr.checked_add(len)?;
        let (&s, r) = self.regions.range(..=addr).next_back()?;
        (end <= s + r.len).then_some(s)
    }
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Arc<Registry> {
        Arc::new(Registry::default())
    }

    /// Register `[addr, addr+len)` at `location`. Zero bytes, a range that
    /// wraps, or one overlapping a registered region is refused.
    pub fn register(&self, addr: u64, len: u64, location: &str) -> Result<()> {
        self.register_memory_of(addr, len, location, false)
    }

    /// [`Registry::register`] of host memory (`device` false) or device
    /// memory (`device` true).
    pub fn register_memory_of(
        &self,
        addr: u64,
        len: u64,
        location: &str,
        device: bool,
    ) -> Result<()> {
        if len == 0 {
            return Err(EngineError::new(
                ErrorKind::ZeroLength,
                format!("cannot register a zero-length region at {addr:#x}"),
            ));
        }
        let Some(end) = addr.checked_add(len) else {
            return Err(EngineError::new(
                ErrorKind::Overflow,
                format!("region at {addr:#x} of {len} bytes runs past the address space"),
            ));
        };
        let mut g = self.inner.lock();
        if let Some((&s, r)) = g.regions.range(..end).next_back() {
            if s + r.len > addr {
                return Err(EngineError::new(
                    ErrorKind::Overlap,
                    format!(
                        "region [{addr:#x}, {end:#x}) overlaps the registered region [{s:#x}, {:#x})",
                        s + r.len
                    ),
                ));
            }
        }
        let seq = g.next_seq;
        g.next_seq += 1;
        g.devices += usize::from(device);
        g.regions.insert(
            addr,
            Region {
                settling: 0,
                len,
                seq,
                pins: 0,
                location: location.to_string(),
                device,
            },
        );
        Ok(())
    }

    /// Unregister the region starting at `addr`; returns its length. A
    /// region that only settling transfers still hold ([`Pin::settle`]) is
    /// waited for, up to [`SETTLE_WAIT`].
    pub fn unregister(&self, addr: u64) -> Result<u64> {
        self.unregister_within(addr, SETTLE_WAIT)
    }

    /// [`Registry::unregister`], waiting at most `wait` for settling
    /// transfers to release the region.
    pub fn unregister_within(&self, addr: u64, wait: std::time::Duration) -> Result<u64> {
        let deadline = std::time::Instant::now() + wait;
        let mut g = self.inner.lock();
        let mut waited_out = false;
        let held = loop {
            let Some(r) = g.regions.get(&addr) else {
                return Err(EngineError::new(
                    ErrorKind::NotRegistered,
                    format!("no registered region starts at {addr:#x}"),
                ));
            };
            let (pins, settling) = (r.pins, r.settling);
            if pins == 0 || pins != settling || waited_out {
                break pins;
            }
            waited_out = self.released.wait_until(&mut g, deadline).timed_out();
        };
        if held > 0 {
            return Err(EngineError::new(
                ErrorKind::InUse,
                format!(
                    "region at {addr:#x} is in use by {held} transfer(s); unregister it after they finish"
                ),
            ));
        }
        let r = g.regions.remove(&addr);
        g.devices -= r.as_ref().map_or(0, |r| usize::from(r.device));
        Ok(r.map_or(0, |r| r.len))
    }

    /// Pin the regions holding every `(addr, len)` range (ranges of zero
    /// bytes are skipped). Fails, pinning nothing, when a range lies
    /// outside every region or runs past the end of the one it starts in;
    /// `what` names the side in the error ("local buffer", "peer range").
    pub fn pin(
        self: &Arc<Self>,
        ranges: impl Iterator<Item = (u64, u64)>,
        kind: ErrorKind,
        what: &str,
    ) -> Result<Pin> {
        let mut g = self.inner.lock();
        let mut starts: Vec<u64> = Vec::new();
        let mut last: Option<(u64, u64)> = None;
        for (i, (addr, len)) in ranges.enumerate() {
            if len == 0 {
                continue;
            }
            // Consecutive ranges mostly lie in one region: check that first.
            if let Some((s, e)) = last {
                if addr >= s && addr.checked_add(len).is_some_and(|end| end <= e) {
                    continue;
                }
            }
            let Some(s) = g.holder(addr, len) else {
                return Err(EngineError::new(
                    kind,
                    format!("{what} {i} [{addr:#x}, +{len}) {}", describe_miss(&g, addr)),
                ));
            };
            let e = s + g.regions.get(&s).map_or(0, |r| r.len);
            last = Some((s, e));
            if starts.last() != Some(&s) {
                starts.push(s);
            }
        }
        starts.sort_unstable();
        starts.dedup();
        for s in &starts {
            if let Some(r) = g.regions.get_mut(s) {
                r.pins += 1;
            }
        }
        drop(g);
        Ok(Pin {
            settled: false,
            registry: Arc::clone(self),
            starts,
        })
    }

    /// Whether `addr` lies in a registered region of device memory.
    pub fn is_device(&self, addr: u64) -> bool {
        let g = self.inner.lock();
        g.regions
            .range(..=addr)
            .next_back()
            .is_some_and(|(&s, r)| r.device && addr < s + r.len)
    }

    /// Whether a registered region of device memory holds any of `ranges`
    /// (none is registered: false at once).
    pub fn any_device(&self, ranges: impl Iterator<Item = (u64, u64)>) -> bool {
        let g = self.inner.lock();
        if g.devices == 0 {
            return false;
        }
        ranges.filter(|r| r.1 > 0).any(|(a, _)| {
            g.regions
                .range(..=a)
                .next_back()
                .is_some_and(|(&s, r)| r.device && a < s + r.len)
        })
    }

    /// Whether `[addr, addr+len)` lies inside one registered region.
    pub fn contains(&self, addr: u64, len: u64) -> bool {
        self.inner.lock().holder(addr, len.max(1)).is_some()
    }

    /// Bytes from `addr` to the end of the region holding it.
    pub fn room_from(&self, addr: u64) -> Option<u64> {
        let g = self.inner.lock();
        let (&s, r) = g.regions.range(..=addr).next_back()?;
        (addr < s + r.len).then(|| s + r.len - addr)
    }

    /// The registered regions `(addr, len, location)`, in registration order.
    pub fn regions(&self) -> Vec<(u64, u64, String)> {
        let g = self.inner.lock();
        let mut v: Vec<(u64, u64, u64, String)> = g
            .regions
            .iter()
            .map(|(&a, r)| (r.seq, a, r.len, r.location.clone()))
            .collect();
        v.sort_unstable_by_key(|r| r.0);
        v.into_iter().map(|(_, a, l, loc)| (a, l, loc)).collect()
    }

    /// The address of the region registered first (among those still
    /// registered).
    pub fn first(&self) -> Option<u64> {
        let g = self.inner.lock();
        g.regions.iter().min_by_key(|(_, r)| r.seq).map(|(&a, _)| a)
    }
}

/// Why a range starting at `addr` is not inside one region.
fn describe_miss(g: &Inner, addr: u64) -> String {
    match g.regions.range(..=addr).next_back() {
        Some((&s, r)) if addr < s + r.len => format!(
            "runs past the end of the registered region [{s:#x}, {:#x})",
            s + r.len
        ),
        _ if g.regions.is_empty() => "lies outside registered memory (none is registered)".into(),
        _ => "lies outside every registered region".into(),
    }
}

/// Whether `[addr, addr+len)` is mapped memory of this process (`mincore`
/// answers `ENOMEM` for any unmapped page in the range). Checked in slices
/// so that a huge region costs a bounded buffer.
pub fn is_mapped(addr: u64, len: u64) -> bool {
    // SAFETY: sysconf has no preconditions.
    let page = match unsafe { libc::sysconf(libc::_SC_PAGESIZE) } {
        p if p > 0 => p as u64,
        _ => 4096,
    };
    let Some(end) = addr.checked_add(len) else {
        return false;
    };
    let mut at = addr & !(page - 1);
    const SLICE_PAGES: u64 = 1 << 16;
    let mut vec = vec![0u8; SLICE_PAGES as usize];
    while at < end {
        let pages = ((end - at).div_ceil(page)).min(SLICE_PAGES);
        // SAFETY: mincore only reads the page tables of the range and
        // writes one byte per page into `vec`, which holds `pages` bytes.
        let r = unsafe {
            libc::mincore(
                at as *mut libc::c_void,
                (pages * page) as usize,
                vec.as_mut_ptr(),
            )
        };
        if r != 0 {
            return false;
        }
        at += pages * page;
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlap_touch_zero_and_unregister() {
        let r = Registry::new();
        r.register(1000, 100, "*").unwrap();
        assert_eq!(
            r.register(1050, 10, "*").unwrap_err().kind(),
            ErrorKind::Overlap
        );
        assert_eq!(
            r.register(950, 51, "*").unwrap_err().kind(),
            ErrorKind::Overlap
        );
        r.register(1100, 10, "*").unwrap();
        r.register(900, 100, "*").unwrap();
        assert_eq!(
            r.register(5, 0, "*").unwrap_err().kind(),
            ErrorKind::ZeroLength
        );
        assert_eq!(
            r.register(u64::MAX, 2, "*").unwrap_err().kind(),
            ErrorKind::Overflow
        );
        assert_eq!(r.first(), Some(1000));
        assert_eq!(r.room_from(1031), Some(69));
        assert_eq!(r.unregister(1000).unwrap(), 100);
        assert_eq!(
            r.unregister(1000).unwrap_err().kind(),
            ErrorKind::NotRegistered
        );
        assert_eq!(r.first(), Some(1100));
        assert_eq!(
            r.regions()
                .iter()
                .map(|(a, l, _)| (*a, *l))
                .collect::<Vec<_>>(),
            vec![(1100, 10), (900, 100)]
        );
    }

    #[test]
    fn unregister_waits_only_for_settled_pins() {
        let r = Registry::new();
        r.register(1000, 100, "*").unwrap();
        let pin = || {
            r.pin(
                vec![(1000, 10)].into_iter(),
                ErrorKind::OutOfBounds,
                "peer range",
            )
            .unwrap()
        };
        // A transfer still copying: refused at once, whatever the wait.
        let busy = pin();
        let t0 = std::time::Instant::now();
        assert_eq!(r.unregister(1000).unwrap_err().kind(), ErrorKind::InUse);
        assert!(t0.elapsed() < SETTLE_WAIT);
        // Settled, with another still copying: still refused.
        let mut done = pin();
        done.settle();
        assert_eq!(r.unregister(1000).unwrap_err().kind(), ErrorKind::InUse);
        drop(busy);
        // Only settled pins: refused without a wait, and waited for with one.
        let e = r
            .unregister_within(1000, std::time::Duration::ZERO)
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InUse);
        std::thread::scope(|sc| {
            let (tx, rx) = std::sync::mpsc::channel::<()>();
            sc.spawn(move || {
                // Released once the unregister below is waiting (or about to).
                rx.recv().unwrap();
                drop(done);
            });
            tx.send(()).unwrap();
            assert_eq!(r.unregister(1000).unwrap(), 100);
        });
    }

    #[test]
    fn pins_bound_ranges_and_block_unregister() {
        let r = Registry::new();
        r.register(1000, 100, "*").unwrap();
        r.register(1100, 100, "*").unwrap();
        let oob = |ranges: Vec<(u64, u64)>| {
            r.pin(ranges.into_iter(), ErrorKind::OutOfBounds, "peer range")
                .unwrap_err()
                .kind()
        };
        // Past the end of a region, even into the next one.
        assert_eq!(oob(vec![(1050, 51)]), ErrorKind::OutOfBounds);
        assert_eq!(oob(vec![(999, 2)]), ErrorKind::OutOfBounds);
        assert_eq!(oob(vec![(u64::MAX, 2)]), ErrorKind::OutOfBounds);
        assert_eq!(oob(vec![(1000, 1), (5000, 1)]), ErrorKind::OutOfBounds);
        let p = r
            .pin(
                vec![(1000, 100), (1100, 1), (1000, 0), (7, 0)].into_iter(),
                ErrorKind::OutOfBounds,
                "peer range",
            )
            .unwrap();
        assert_eq!(r.unregister(1000).unwrap_err().kind(), ErrorKind::InUse);
        assert_eq!(r.unregister(1100).unwrap_err().kind(), ErrorKind::InUse);
        drop(p);
        r.unregister(1000).unwrap();
        r.unregister(1100).unwrap();
    }

    #[test]
    fn mapped_memory_is_recognised() {
        let v = vec![1u8; 3 * 4096];
        assert!(is_mapped(v.as_ptr() as u64, v.len() as u64));
        assert!(!is_mapped(4096, 4096));
        assert!(!is_mapped(u64::MAX - 10, 100));
    }
}
