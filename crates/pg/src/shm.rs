//! Same-host shared-memory transport: one segment per (group, rank) holding
//! the rank's doorbell and one single-producer ring per possible sender slot.
//!
//! The receiver owns its segment; senders map it and push pieces into "their"
//! ring, then ring the receiver's doorbell. A consumer that frees a slot rings
//! the producer's doorbell (in the producer's own segment). Nobody spins.

use crate::error::PgError;
use crate::futex::Doorbell;
use crate::wire::{Hdr, HDR_LEN};
use std::ffi::CString;
use std::sync::atomic::{AtomicU64, Ordering};

/// Payload bytes per ring slot (also the collective piece size on TCP).
pub const PIECE: usize = 128 * 1024;
/// Slots per ring.
pub const NSLOTS: u64 = 16;
/// Bytes reserved for a slot header.
const SLOT_HDR: usize = 64;
const SLOT_BYTES: usize = SLOT_HDR + PIECE;
/// Ring control block: head and tail on separate cache lines.
const RING_CTRL: usize = 128;
const RING_BYTES: usize = RING_CTRL + SLOT_BYTES * NSLOTS as usize;
/// Segment header: magic, capacity, doorbell.
const SEG_HDR: usize = 4096;
const SEG_MAGIC: u64 = 0x4d43_5047_5348_4d31; // "MCPGSHM1"
const BELL_OFF: usize = 64;

/// A mapped shared-memory segment.
pub struct Segment {
    ptr: *mut u8,
    len: usize,
    name: String,
    owner: bool,
    unlinked: std::sync::atomic::AtomicBool,
}

// SAFETY: the mapping is plain shared memory; all concurrent access goes
// through atomics (ring indices, doorbell) or is handed over by them.
unsafe impl Send for Segment {}
unsafe impl Sync for Segment {}

impl Segment {
    /// Creates and maps a new segment with rings for `capacity` senders.
    pub fn create(name: &str, capacity: usize) -> Result<Self, PgError> {
        let len = SEG_HDR + RING_BYTES * capacity;
        let cname = CString::new(name)
            .map_err(|_| PgError::InvalidArgument("shm name contains NUL".into()))?;
        // SAFETY: plain libc calls with a valid C string; results checked.
        let fd = unsafe {
            libc::shm_open(
                cname.as_ptr(),
                libc::O_CREAT | libc::O_EXCL | libc::O_RDWR,
                0o600,
            )
        };
        if fd < 0 {
            return Err(PgError::io(
                format!("shm_open({name})"),
                std::io::Error::last_os_error(),
            ));
        }
        // SAFETY: fd is valid.
        let rc = unsafe { libc::ftruncate(fd, len as libc::off_t) };
        if rc != 0 {
            let e = std::io::Error::last_os_error();
            // SAFETY: cleanup of what we created.
            unsafe {
                libc::close(fd);
                libc::shm_unlink(cname.as_ptr());
            }
            return Err(PgError::io("ftruncate shm", e));
        }
        let seg = Self::map_fd(fd, len, name, true);
        // SAFETY: fd no longer needed after mmap.
        unsafe { libc::close(fd) };
        let seg = seg?;
        // SAFETY: header lies within the mapping; fresh segment is zeroed.
        unsafe {
            (seg.ptr as *mut u64).write(SEG_MAGIC);
            (seg.ptr.add(8) as *mut u64).write(capacity as u64);
        }
        Ok(seg)
    }

    /// Maps an existing segment created by a peer.
    pub fn open(name: &str) -> Result<Self, PgError> {
        let cname = CString::new(name)
            .map_err(|_| PgError::InvalidArgument("shm name contains NUL".into()))?;
        // SAFETY: valid C string; result checked.
        let fd = unsafe { libc::shm_open(cname.as_ptr(), libc::O_RDWR, 0) };
        if fd < 0 {
            return Err(PgError::io(
                format!("shm_open({name})"),
                std::io::Error::last_os_error(),
            ));
        }
        // SAFETY: fstat into a zeroed struct.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        let rc = unsafe { libc::fstat(fd, &mut st) };
        if rc != 0 {
            let e = std::io::Error::last_os_error();
            unsafe { libc::close(fd) };
            return Err(PgError::io("fstat shm", e));
        }
        let len = st.st_size as usize;
        let seg = Self::map_fd(fd, len, name, false);
        unsafe { libc::close(fd) };
        let seg = seg?;
        if len < SEG_HDR {
            return Err(PgError::Comm(format!("shm segment {name} is truncated")));
        }
        // SAFETY: within the mapping.
        let magic = unsafe { (seg.ptr as *const u64).read() };
        if magic != SEG_MAGIC {
            return Err(PgError::Comm(format!("shm segment {name} has a bad magic")));
        }
        Ok(seg)
    }

    fn map_fd(fd: i32, len: usize, name: &str, owner: bool) -> Result<Self, PgError> {
        // SAFETY: mapping a shm fd of at least `len` bytes.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(PgError::io("mmap shm", std::io::Error::last_os_error()));
        }
        Ok(Segment {
            ptr: ptr as *mut u8,
            len,
            name: name.to_string(),
            owner,
            unlinked: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Segment name (for peers to open).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Number of sender rings in this segment.
    pub fn capacity(&self) -> usize {
        (self.len - SEG_HDR) / RING_BYTES
    }

    /// The owner's doorbell.
    pub fn bell(&self) -> &Doorbell {
        // SAFETY: BELL_OFF is within the header and suitably aligned.
        unsafe { &*(self.ptr.add(BELL_OFF) as *const Doorbell) }
    }

    /// The ring into which sender `slot` writes.
    pub fn ring(&self, slot: usize) -> Option<Ring<'_>> {
        if slot >= self.capacity() {
            return None;
        }
        // SAFETY: in bounds by the check above.
        Some(Ring {
            base: unsafe { self.ptr.add(SEG_HDR + slot * RING_BYTES) },
            _seg: std::marker::PhantomData,
        })
    }

    /// Removes the name from the filesystem (mappings stay valid).
    pub fn unlink(&self) {
        if self.owner && !self.unlinked.swap(true, Ordering::SeqCst) {
            if let Ok(c) = CString::new(self.name.as_str()) {
                // SAFETY: valid C string.
                unsafe { libc::shm_unlink(c.as_ptr()) };
            }
        }
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        self.unlink();
        // SAFETY: unmapping our own mapping once.
        unsafe { libc::munmap(self.ptr as *mut libc::c_void, self.len) };
    }
}

/// A single-producer single-consumer ring of pieces inside a segment.
#[derive(Clone, Copy)]
pub struct Ring<'a> {
    base: *mut u8,
    _seg: std::marker::PhantomData<&'a Segment>,
}

/// A piece at the front of a ring.
pub struct Piece {
    /// Its header.
    pub hdr: Hdr,
    /// Its payload (valid until popped).
    pub data: *const u8,
}

impl Ring<'_> {
    fn head(&self) -> &AtomicU64 {
        // SAFETY: aligned control word inside the ring.
        unsafe { &*(self.base as *const AtomicU64) }
    }
    fn tail(&self) -> &AtomicU64 {
        // SAFETY: aligned control word inside the ring.
        unsafe { &*(self.base.add(64) as *const AtomicU64) }
    }
    fn slot(&self, idx: u64) -> *mut u8 {
        // SAFETY: idx % NSLOTS keeps us in bounds.
        unsafe {
            self.base
                .add(RING_CTRL + (idx % NSLOTS) as usize * SLOT_BYTES)
        }
    }

    /// Producer: copies a piece in if there is room. `data.len() <= PIECE`.
    /// Returns `None` when full, else whether the ring was empty before
    /// (only then can the consumer be asleep waiting on this ring).
    pub fn try_push(&self, hdr: &Hdr, data: &[u8]) -> Option<bool> {
        let head = self.head().load(Ordering::Relaxed);
        let tail = self.tail().load(Ordering::SeqCst);
        if head - tail >= NSLOTS {
            return None;
        }
        let len = data.len().min(PIECE);
        let slot = self.slot(head);
        let h = hdr.encode();
        // SAFETY: the slot is owned by the producer until head is published.
        unsafe {
            std::ptr::copy_nonoverlapping(h.as_ptr(), slot, HDR_LEN);
            std::ptr::copy_nonoverlapping(data.as_ptr(), slot.add(SLOT_HDR), len);
        }
        self.head().store(head + 1, Ordering::SeqCst);
        // Re-read the tail: if the consumer drained everything meanwhile it
        // may have gone to sleep, so report "was empty" to wake it.
        Some(head == tail || self.tail().load(Ordering::SeqCst) == head)
    }

    /// Consumer: the front piece, if any.
    pub fn peek(&self) -> Option<Piece> {
        let tail = self.tail().load(Ordering::Relaxed);
        let head = self.head().load(Ordering::SeqCst);
        if tail == head {
            return None;
        }
        let slot = self.slot(tail);
        let mut h = [0u8; HDR_LEN];
        // SAFETY: published slot; producer does not touch it until popped.
        unsafe { std::ptr::copy_nonoverlapping(slot, h.as_mut_ptr(), HDR_LEN) };
        let mut hdr = Hdr::decode(&h);
        hdr.len = hdr.len.min(PIECE as u32);
        Some(Piece {
            hdr,
            // SAFETY: in bounds.
            data: unsafe { slot.add(SLOT_HDR) },
        })
    }

    /// Consumer: releases the front piece; returns how many stay queued.
    pub fn pop(&self) -> u64 {
        let tail = self.tail().load(Ordering::Relaxed);
        self.tail().store(tail + 1, Ordering::SeqCst);
        self.head().load(Ordering::SeqCst) - (tail + 1)
    }

    /// The producer needs waking once the ring is at most this full.
    pub const WAKE_AT: u64 = NSLOTS / 2;
}

/// A process-unique segment name.
pub fn unique_name(tag: u64) -> String {
    format!("/mcpg-{}-{:016x}", std::process::id(), tag)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::KIND_COLL;

    #[test]
    fn ring_push_peek_pop_and_full() {
        let name = unique_name(0xfeed_0001);
        let own = Segment::create(&name, 2).expect("create");
        let peer = Segment::open(&name).expect("open");
        own.unlink();
        let tx = peer.ring(1).expect("ring");
        let rx = own.ring(1).expect("ring");
        assert!(rx.peek().is_none());
        let hdr = Hdr {
            kind: KIND_COLL,
            len: 3,
            total: 3,
            ..Default::default()
        };
        assert_eq!(tx.try_push(&hdr, b"abc"), Some(true));
        for _ in 1..NSLOTS {
            assert_eq!(tx.try_push(&hdr, b"abc"), Some(false));
        }
        assert_eq!(tx.try_push(&hdr, b"abc"), None);
        let p = rx.peek().expect("piece");
        assert_eq!(p.hdr, hdr);
        let got = unsafe { std::slice::from_raw_parts(p.data, 3) };
        assert_eq!(got, b"abc");
        assert_eq!(rx.pop(), NSLOTS - 1);
        assert_eq!(tx.try_push(&hdr, b"abc"), Some(false));
        assert!(own.ring(2).is_none());
    }
}
