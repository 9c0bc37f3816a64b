//! Device memory behind one small interface, [`DeviceOps`], and the staging
//! pipeline that moves it through pinned host buffers.
//!
//! The real interface is the CUDA driver (the `cuda` child module, loaded at run
//! time). Everything else here — chunking, the overlap of the device copy
//! of one chunk with the send or receive of the next, ordering, error
//! propagation, the fallback from CUDA IPC to staging — is plain Rust over
//! that interface, so it runs (and is tested) with host memory standing in
//! for device memory ([`HostDevice`], under `cfg(test)` or the
//! `fake-device` feature).
//!
//! Rules:
//! - A device range goes out ([`Device::stage_out`]) or comes in
//!   ([`Device::stage_in`]) in chunks of [`Device::chunk`] bytes through two
//!   pinned buffers: the device copy of chunk k+1 runs while chunk k is sent
//!   (out), or while chunk k+1 is received the copy of chunk k runs (in).
//!   Chunks are handed over in address order.
//! - The first failure (a device copy, a send, a receive) stops the
//!   pipeline; it is returned and no later chunk moves.
//! - Pinned buffers are allocated once and kept in a small pool.

mod cuda;

use crate::engine::error::{EngineError, ErrorKind, Result};
use crate::engine::log::{emit, Level};
use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::sync_channel;
use std::sync::OnceLock;

/// Bytes of a CUDA IPC memory handle.
pub const IPC_HANDLE_LEN: usize = 64;

/// Default staging chunk (`MC_DEVICE_STAGING_CHUNK` overrides it).
pub const DEFAULT_CHUNK: usize = 4 << 20;

/// Pinned buffers the pool keeps for reuse.
const POOL_KEEP: usize = 16;

/// A device allocation exported for another process of this host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpcExport {
    /// The opaque handle (64 bytes for CUDA).
    pub handle: Vec<u8>,
    /// Offset of the exported address from the allocation's base.
    pub offset: u64,
    /// Bytes of the allocation.
    pub size: u64,
}

/// The device operations the engine and the store use.
pub trait DeviceOps: Send + Sync {
    /// The device ordinal when `addr` is device memory; `None` for host
    /// memory (unified memory counts as host memory).
    fn device_of(&self, addr: u64) -> Option<i32>;

    /// Copy `len` bytes from `src` to `dst`, either of which may be device
    /// memory; returns once the bytes have arrived.
    ///
    /// # Safety
    /// `[src, src+len)` must be readable and `[dst, dst+len)` writable
    /// memory (host or device) that nothing else writes meanwhile.
    unsafe fn copy(&self, dst: u64, src: u64, len: usize) -> Result<()>;

    /// `len` bytes of pinned host memory, usable with the device that
    /// `near` belongs to (any device when `near` is host memory).
    fn alloc_pinned(&self, len: usize, near: u64) -> Result<u64>;

    /// Free what [`DeviceOps::alloc_pinned`] returned.
    ///
    /// # Safety
    /// `addr` came from `alloc_pinned`, is freed once and is not used after.
    unsafe fn free_pinned(&self, addr: u64);

    /// Wait for the work queued on CUDA stream `stream` (0: the default
    /// stream) of the context `near` belongs to (any context when `near`
    /// is `None`).
    fn synchronize_stream(&self, stream: u64, near: Option<u64>) -> Result<()>;

    /// Export the allocation holding device address `addr` for another
    /// process of this host.
    fn ipc_export(&self, addr: u64) -> Result<IpcExport>;

    /// Whether an IPC handle can be opened by the process that exported it
    /// (CUDA refuses that: a target in the same process is staged for).
    fn ipc_within_process(&self) -> bool {
        false
    }

    /// Map an allocation another process exported; returns its base here
    /// and its size. `near` is a device address of this process whose
    /// device should map it (or host memory: any device).
    fn ipc_open(&self, handle: &[u8], near: Option<u64>) -> Result<(u64, u64)>;

    /// Unmap what [`DeviceOps::ipc_open`] returned.
    ///
    /// # Safety
    /// `base` came from `ipc_open`, is closed once and is not used after.
    unsafe fn ipc_close(&self, base: u64);
}

/// Device operations plus the staging pool and chunk size.
pub struct Device {
    ops: &'static dyn DeviceOps,
    chunk: usize,
    pool: Mutex<Vec<u64>>,
}

/// A pinned buffer of [`Device::chunk`] bytes, back to the pool on drop.
struct Lease<'a> {
    dev: &'a Device,
    addr: u64,
}

impl Drop for Lease<'_> {
    fn drop(&mut self) {
        let mut p = self.dev.pool.lock();
        if p.len() < POOL_KEEP {
            p.push(self.addr);
        } else {
            drop(p);
            // SAFETY: allocated by this pool's ops and no longer leased.
            unsafe { self.dev.ops.free_pinned(self.addr) };
        }
    }
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device")
            .field("chunk", &self.chunk)
            .finish()
    }
}

fn internal(what: &str) -> EngineError {
    EngineError::new(ErrorKind::Internal, what.to_string())
}

impl Device {
    /// Staging over `ops` in chunks of `chunk` bytes (at least 4 KiB).
    pub fn new(ops: &'static dyn DeviceOps, chunk: usize) -> Device {
        Device {
            ops,
            chunk: chunk.max(4096),
            pool: Mutex::new(Vec::new()),
        }
    }

    /// The operations underneath.
    pub fn ops(&self) -> &'static dyn DeviceOps {
        self.ops
    }

    /// Bytes per staged chunk.
    pub fn chunk(&self) -> usize {
        self.chunk
    }

    fn lease(&self, near: u64) -> Result<Lease<'_>> {
        let cached = self.pool.lock().pop();
        let addr = match cached {
            Some(a) => a,
            None => self.ops.alloc_pinned(self.chunk, near)?,
        };
        Ok(Lease { dev: self, addr })
    }

    /// Copy between any two ranges (host or device).
    ///
    /// # Safety
    /// As [`DeviceOps::copy`].
    pub unsafe fn copy(&self, dst: u64, src: u64, len: u64) -> Result<()> {
        let n = usize::try_from(len).map_err(|_| internal("length too large"))?;
        // SAFETY: the caller's contract.
        unsafe { self.ops.copy(dst, src, n) }
    }

    /// Send `len` bytes of device memory at `src` through pinned chunks:
    /// `sink(offset, bytes)` gets each chunk in order while the next one is
    /// copied out of the device.
    ///
    /// # Safety
    /// `[src, src+len)` must be readable device (or host) memory that
    /// nothing writes meanwhile.
    pub unsafe fn stage_out(
        &self,
        src: u64,
        len: u64,
        sink: &mut dyn FnMut(u64, &[u8]) -> Result<()>,
    ) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        let chunk = self.chunk as u64;
        let n = len.div_ceil(chunk);
        let piece = |k: u64| (k * chunk, chunk.min(len - k * chunk) as usize);
        if n == 1 {
            let b = self.lease(src)?;
            // SAFETY: the lease holds `chunk` >= len bytes; src is the
            // caller's readable range.
            unsafe { self.ops.copy(b.addr, src, len as usize)? };
            // SAFETY: the lease's bytes were just written and stay ours.
            return sink(0, unsafe { pinned(b.addr, len as usize) });
        }
        let leases = [self.lease(src)?, self.lease(src)?];
        let bufs = [leases[0].addr, leases[1].addr];
        std::thread::scope(|s| {
            let (full_tx, full_rx) = sync_channel::<Result<(usize, u64, usize)>>(2);
            let (free_tx, free_rx) = sync_channel::<usize>(2);
            for i in 0..2 {
                let _ = free_tx.send(i);
            }
            let copier = s.spawn(move || {
                for k in 0..n {
                    let Ok(i) = free_rx.recv() else { return };
                    let (off, m) = piece(k);
                    // SAFETY: buffer i is not handed out (it came back through
                    // `free`); the source is the caller's readable range.
                    let r = unsafe { self.ops.copy(bufs[i], src + off, m) };
                    let failed = r.is_err();
                    if full_tx.send(r.map(|()| (i, off, m))).is_err() || failed {
                        return;
                    }
                }
            });
            let mut out = Ok(());
            for _ in 0..n {
                match full_rx.recv() {
                    Ok(Ok((i, off, m))) => {
                        // SAFETY: the copier filled buffer i and hands it
                        // over until it is sent back through `free`.
                        if let Err(e) = sink(off, unsafe { pinned(bufs[i], m) }) {
                            out = Err(e);
                            break;
                        }
                        let _ = free_tx.send(i);
                    }
                    Ok(Err(e)) => {
                        out = Err(e);
                        break;
                    }
                    Err(_) => {
                        out = Err(internal("the staging copier stopped"));
                        break;
                    }
                }
            }
            drop(free_tx);
            drop(full_rx);
            copier
                .join()
                .map_err(|_| internal("the staging copier panicked"))?;
            out
        })
    }

    /// Receive `len` bytes into device memory at `dst` through pinned
    /// chunks: `source(offset, buffer)` fills each chunk in order while the
    /// previous one is copied into the device.
    ///
    /// # Safety
    /// `[dst, dst+len)` must be writable device (or host) memory that
    /// nothing else uses meanwhile.
    pub unsafe fn stage_in(
        &self,
        dst: u64,
        len: u64,
        source: &mut dyn FnMut(u64, &mut [u8]) -> Result<()>,
    ) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        let chunk = self.chunk as u64;
        let n = len.div_ceil(chunk);
        let piece = |k: u64| (k * chunk, chunk.min(len - k * chunk) as usize);
        if n == 1 {
            let b = self.lease(dst)?;
            // SAFETY: the lease holds `chunk` >= len bytes, ours alone.
            source(0, unsafe { pinned_mut(b.addr, len as usize) })?;
            // SAFETY: dst is the caller's writable range; the lease holds
            // the bytes just received.
            return unsafe { self.ops.copy(dst, b.addr, len as usize) };
        }
        let leases = [self.lease(dst)?, self.lease(dst)?];
        let bufs = [leases[0].addr, leases[1].addr];
        std::thread::scope(|s| {
            let (full_tx, full_rx) = sync_channel::<(usize, u64, usize)>(2);
            let (free_tx, free_rx) = sync_channel::<usize>(2);
            for i in 0..2 {
                let _ = free_tx.send(i);
            }
            let copier = s.spawn(move || -> Result<()> {
                while let Ok((i, off, m)) = full_rx.recv() {
                    // SAFETY: buffer i was filled and handed over; dst is the
                    // caller's writable range.
                    unsafe { self.ops.copy(dst + off, bufs[i], m)? };
                    if free_tx.send(i).is_err() {
                        break;
                    }
                }
                Ok(())
            });
            let mut out = Ok(());
            for k in 0..n {
                let Ok(i) = free_rx.recv() else { break };
                let (off, m) = piece(k);
                // SAFETY: buffer i came back through `free`: the copier is
                // done with it.
                if let Err(e) = source(off, unsafe { pinned_mut(bufs[i], m) }) {
                    out = Err(e);
                    break;
                }
                if full_tx.send((i, off, m)).is_err() {
                    break;
                }
            }
            drop(full_tx);
            let copied = copier
                .join()
                .map_err(|_| internal("the staging copier panicked"))?;
            drop(free_rx);
            out.and(copied)
        })
    }
}

/// # Safety
/// `[addr, addr+len)` is a pinned buffer this caller alone reads now.
unsafe fn pinned<'a>(addr: u64, len: usize) -> &'a [u8] {
    // SAFETY: the caller's contract.
    unsafe { std::slice::from_raw_parts(addr as usize as *const u8, len) }
}

/// # Safety
/// `[addr, addr+len)` is a pinned buffer this caller alone uses now.
unsafe fn pinned_mut<'a>(addr: u64, len: usize) -> &'a mut [u8] {
    // SAFETY: the caller's contract.
    unsafe { std::slice::from_raw_parts_mut(addr as usize as *mut u8, len) }
}

fn chunk_from_env() -> usize {
    std::env::var("MC_DEVICE_STAGING_CHUNK")
        .ok()
        .and_then(|v| mooncake_common::size::parse_size(&v))
        .map_or(DEFAULT_CHUNK, |v| v as usize)
}

static INSTALLED: OnceLock<Device> = OnceLock::new();

/// The device of this process: the CUDA driver (loaded on first use), or
/// the error naming why there is none ("no CUDA driver was found").
pub fn current() -> Result<&'static Device> {
    if let Some(d) = INSTALLED.get() {
        return Ok(d);
    }
    static REAL: OnceLock<Device> = OnceLock::new();
    if let Some(d) = REAL.get() {
        return Ok(d);
    }
    let drv = cuda::driver()?;
    Ok(REAL.get_or_init(|| Device::new(drv, chunk_from_env())))
}

/// The device ordinal when `addr` is device memory. Without a driver in
/// the process (none loaded by any library) no device memory can exist,
/// and nothing is loaded to find out.
pub fn classify(addr: u64) -> Option<i32> {
    if let Some(d) = INSTALLED.get() {
        return d.ops.device_of(addr);
    }
    if !cuda::loaded() {
        return None;
    }
    current().ok()?.ops.device_of(addr)
}

/// Whether a device can be used in this process: a CUDA driver library
/// can be loaded (it is not initialized by asking).
pub fn available() -> bool {
    INSTALLED.get().is_some() || cuda::loadable()
}

/// Use `ops` as this process's device instead of the CUDA driver (tests
/// with host memory standing in for device memory). Only the first call
/// takes effect.
#[cfg(any(test, feature = "fake-device"))]
pub fn install(ops: &'static dyn DeviceOps, chunk: usize) -> &'static Device {
    INSTALLED.get_or_init(|| Device::new(ops, chunk))
}

static IPC_DENIED: AtomicBool = AtomicBool::new(false);

/// Whether CUDA IPC between processes of this host was refused once (then
/// device memory is staged through pinned host memory from then on).
pub fn ipc_denied() -> bool {
    IPC_DENIED.load(Ordering::Relaxed)
}

/// Record that the driver refused CUDA IPC; the first time, log why.
pub fn deny_ipc(why: &str) {
    if !IPC_DENIED.swap(true, Ordering::Relaxed) {
        emit(
            Level::Warning,
            &format!(
                "transfer engine: CUDA IPC between processes of this host was refused ({why}); \
                 device memory is staged through pinned host memory from now on"
            ),
        );
    }
}

#[cfg(any(test, feature = "fake-device"))]
pub use fake::HostDevice;

#[cfg(any(test, feature = "fake-device"))]
mod fake {
    //! Host memory standing in for device memory.
    use super::{DeviceOps, IpcExport};
    use crate::engine::error::{EngineError, ErrorKind, Result};
    use parking_lot::{Condvar, Mutex};
    use std::collections::BTreeMap;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

    /// "Device" memory that is host memory marked as device, with fault
    /// injection and a log of the copies.
    #[derive(Default)]
    pub struct HostDevice {
        regions: Mutex<BTreeMap<u64, (u64, i32)>>,
        /// The copies made, `(dst, src, len)`, in order.
        pub copies: Mutex<Vec<(u64, u64, usize)>>,
        copied: Condvar,
        /// Fail the copy with this 1-based number (0: never).
        pub fail_copy: AtomicU64,
        /// Refuse to open IPC handles.
        pub refuse_ipc: AtomicBool,
        /// IPC handles opened.
        pub ipc_opened: AtomicU64,
        /// Pinned buffers allocated.
        pub pinned: AtomicU64,
        /// Stream synchronizations.
        pub synced: AtomicU64,
    }

    impl std::fmt::Debug for HostDevice {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("HostDevice").finish()
        }
    }

    impl HostDevice {
        /// A leaked instance (the interface wants `'static`).
        pub fn leak() -> &'static HostDevice {
            Box::leak(Box::default())
        }

        /// Allocate `len` bytes of "device" memory on device `ordinal`
        /// (zeroed, never freed).
        pub fn alloc(&self, len: usize, ordinal: i32) -> u64 {
            let v = vec![0u8; len].into_boxed_slice();
            let a = Box::leak(v).as_mut_ptr() as u64;
            self.regions.lock().insert(a, (len as u64, ordinal));
            a
        }

        /// Copies made so far.
        pub fn copy_count(&self) -> usize {
            self.copies.lock().len()
        }

        /// Wait (up to 5 s) until `n` copies have started.
        pub fn wait_copies(&self, n: usize) -> bool {
            let mut g = self.copies.lock();
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
            while g.len() < n {
                if self.copied.wait_until(&mut g, deadline).timed_out() {
                    return g.len() >= n;
                }
            }
            true
        }
    }

    impl DeviceOps for HostDevice {
        fn device_of(&self, addr: u64) -> Option<i32> {
            let g = self.regions.lock();
            let (&s, &(l, o)) = g.range(..=addr).next_back()?;
            (addr < s + l).then_some(o)
        }

        unsafe fn copy(&self, dst: u64, src: u64, len: usize) -> Result<()> {
            let nth = {
                let mut g = self.copies.lock();
                g.push((dst, src, len));
                g.len() as u64
            };
            self.copied.notify_all();
            if self.fail_copy.load(Ordering::Relaxed) == nth {
                return Err(EngineError::new(ErrorKind::Cuda, "injected copy failure"));
            }
            // SAFETY: the caller's contract (both ranges valid host memory).
            unsafe { std::ptr::copy(src as usize as *const u8, dst as usize as *mut u8, len) };
            Ok(())
        }

        fn alloc_pinned(&self, len: usize, _near: u64) -> Result<u64> {
            self.pinned.fetch_add(1, Ordering::Relaxed);
            Ok(Box::leak(vec![0u8; len].into_boxed_slice()).as_mut_ptr() as u64)
        }

        unsafe fn free_pinned(&self, _addr: u64) {}

        fn synchronize_stream(&self, _stream: u64, _near: Option<u64>) -> Result<()> {
            self.synced.fetch_add(1, Ordering::Relaxed);
            Ok(())
        }

        fn ipc_within_process(&self) -> bool {
            true
        }

        fn ipc_export(&self, addr: u64) -> Result<IpcExport> {
            let g = self.regions.lock();
            let Some((&s, &(l, _))) = g
                .range(..=addr)
                .next_back()
                .filter(|(&s, &(l, _))| addr < s + l)
            else {
                return Err(EngineError::new(ErrorKind::Cuda, "not device memory"));
            };
            let mut handle = vec![0u8; super::IPC_HANDLE_LEN];
            handle[..8].copy_from_slice(&s.to_le_bytes());
            Ok(IpcExport {
                handle,
                offset: addr - s,
                size: l,
            })
        }

        fn ipc_open(&self, handle: &[u8], _near: Option<u64>) -> Result<(u64, u64)> {
            if self.refuse_ipc.load(Ordering::Relaxed) {
                return Err(EngineError::new(ErrorKind::Cuda, "injected IPC refusal"));
            }
            self.ipc_opened.fetch_add(1, Ordering::Relaxed);
            let mut b = [0u8; 8];
            b.copy_from_slice(&handle[..8]);
            let base = u64::from_le_bytes(b);
            let size = self.regions.lock().get(&base).map_or(0, |r| r.0);
            Ok((base, size))
        }

        unsafe fn ipc_close(&self, _base: u64) {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dev(chunk: usize) -> (&'static HostDevice, Device) {
        let h = HostDevice::leak();
        (h, Device::new(h, chunk))
    }

    fn pattern(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i * 7 + i / 4096) as u8).collect()
    }

    fn fill(h: &HostDevice, bytes: &[u8]) -> u64 {
        let a = h.alloc(bytes.len(), 0);
        // SAFETY: `a` is a fresh allocation of bytes.len() bytes.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), a as *mut u8, bytes.len()) };
        a
    }

    #[test]
    fn stage_out_delivers_every_chunk_in_order() {
        for len in [1usize, 4095, 4096, 4097, 3 * 4096, 10 * 4096 + 17] {
            let (h, d) = dev(4096);
            let src = pattern(len);
            let a = fill(h, &src);
            let mut got = Vec::new();
            let mut offs = Vec::new();
            // SAFETY: `a` holds len readable bytes.
            unsafe {
                d.stage_out(a, len as u64, &mut |off, b| {
                    offs.push(off);
                    got.extend_from_slice(b);
                    Ok(())
                })
            }
            .unwrap();
            assert_eq!(got, src, "len {len}");
            let want: Vec<u64> = (0..len.div_ceil(4096) as u64).map(|k| k * 4096).collect();
            assert_eq!(offs, want);
            assert!(h.pinned.load(Ordering::Relaxed) <= 2);
        }
    }

    #[test]
    fn stage_in_fills_the_device_range_in_order() {
        for len in [1usize, 4096, 4097, 9 * 4096 + 5] {
            let (h, d) = dev(4096);
            let want = pattern(len);
            let a = h.alloc(len, 1);
            // SAFETY: `a` holds len writable bytes.
            unsafe {
                d.stage_in(a, len as u64, &mut |off, b| {
                    b.copy_from_slice(&want[off as usize..off as usize + b.len()]);
                    Ok(())
                })
            }
            .unwrap();
            // SAFETY: `a` holds len readable bytes.
            let got = unsafe { std::slice::from_raw_parts(a as *const u8, len) };
            assert_eq!(got, &want[..]);
            let dsts: Vec<u64> = h.copies.lock().iter().map(|c| c.0).collect();
            let mut sorted = dsts.clone();
            sorted.sort_unstable();
            assert_eq!(dsts, sorted, "device copies run in address order");
        }
    }

    #[test]
    fn stage_out_copies_the_next_chunk_while_one_is_sent() {
        let (h, d) = dev(4096);
        let a = fill(h, &pattern(4 * 4096));
        let mut overlapped = 0;
        // SAFETY: `a` holds 4 chunks.
        unsafe {
            d.stage_out(a, 4 * 4096, &mut |off, _| {
                let k = (off / 4096) as usize;
                // While chunk k is being sent, the copy of chunk k+1 starts.
                if k < 3 && h.wait_copies(k + 2) {
                    overlapped += 1;
                }
                Ok(())
            })
        }
        .unwrap();
        assert_eq!(overlapped, 3);
    }

    #[test]
    fn stage_in_receives_the_next_chunk_while_one_is_copied() {
        let (h, d) = dev(4096);
        let a = h.alloc(4 * 4096, 0);
        let mut overlapped = 0;
        // SAFETY: `a` holds 4 chunks.
        unsafe {
            d.stage_in(a, 4 * 4096, &mut |off, _| {
                let k = (off / 4096) as usize;
                // Receiving chunk k (k >= 2) needs a buffer the copy of
                // chunk k-2 released; meanwhile chunk k-1's copy may run.
                if k >= 1 && h.wait_copies(k) {
                    overlapped += 1;
                }
                Ok(())
            })
        }
        .unwrap();
        assert_eq!(overlapped, 3);
    }

    #[test]
    fn a_failed_device_copy_stops_the_pipeline_and_is_returned() {
        let (h, d) = dev(4096);
        let a = fill(h, &pattern(8 * 4096));
        h.fail_copy.store(3, Ordering::Relaxed);
        let mut sent = Vec::new();
        // SAFETY: `a` holds 8 chunks.
        let r = unsafe {
            d.stage_out(a, 8 * 4096, &mut |off, _| {
                sent.push(off);
                Ok(())
            })
        };
        assert_eq!(r.unwrap_err().kind(), ErrorKind::Cuda);
        assert_eq!(sent, vec![0, 4096], "chunks after the failure are not sent");
        assert!(h.copy_count() <= 4);

        let (h, d) = dev(4096);
        let b = h.alloc(8 * 4096, 0);
        h.fail_copy.store(2, Ordering::Relaxed);
        let mut received = 0;
        // SAFETY: `b` holds 8 chunks.
        let r = unsafe {
            d.stage_in(b, 8 * 4096, &mut |_, _| {
                received += 1;
                Ok(())
            })
        };
        assert_eq!(r.unwrap_err().kind(), ErrorKind::Cuda);
        assert!(received <= 4, "the source stops soon after the failure");
    }

    #[test]
    fn a_failed_send_or_receive_stops_the_pipeline_and_is_returned() {
        let (h, d) = dev(4096);
        let a = fill(h, &pattern(16 * 4096));
        let mut calls = 0;
        // SAFETY: `a` holds 16 chunks.
        let r = unsafe {
            d.stage_out(a, 16 * 4096, &mut |off, _| {
                calls += 1;
                if off == 4096 {
                    return Err(EngineError::new(ErrorKind::Unreachable, "peer gone"));
                }
                Ok(())
            })
        };
        assert_eq!(r.unwrap_err().kind(), ErrorKind::Unreachable);
        assert_eq!(calls, 2);
        assert!(h.copy_count() <= 4, "the copier stops too");

        let (h, d) = dev(4096);
        let b = h.alloc(16 * 4096, 0);
        // SAFETY: `b` holds 16 chunks.
        let r = unsafe {
            d.stage_in(b, 16 * 4096, &mut |off, _| {
                if off == 2 * 4096 {
                    return Err(EngineError::new(ErrorKind::Timeout, "slow peer"));
                }
                Ok(())
            })
        };
        assert_eq!(r.unwrap_err().kind(), ErrorKind::Timeout);
        assert_eq!(
            h.copy_count(),
            2,
            "only the chunks received reach the device"
        );
    }

    #[test]
    fn pinned_buffers_are_reused_across_transfers() {
        let (h, d) = dev(4096);
        let a = fill(h, &pattern(5 * 4096));
        for _ in 0..10 {
            // SAFETY: `a` holds 5 chunks.
            unsafe { d.stage_out(a, 5 * 4096, &mut |_, _| Ok(())) }.unwrap();
        }
        assert_eq!(h.pinned.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn classification_and_ipc_of_the_stand_in() {
        let h = HostDevice::leak();
        let a = h.alloc(8192, 3);
        assert_eq!(h.device_of(a + 100), Some(3));
        assert_eq!(h.device_of(a + 8192), None);
        let x = h.ipc_export(a + 100).unwrap();
        assert_eq!((x.offset, x.size), (100, 8192));
        assert_eq!(h.ipc_open(&x.handle, None).unwrap(), (a, 8192));
        h.refuse_ipc.store(true, Ordering::Relaxed);
        assert!(h.ipc_open(&x.handle, None).is_err());
    }
}
