//! Same-host shared-memory transport: one POSIX shm segment per (group,
//! rank) holding the rank's doorbell and one single-producer ring per
//! possible sender slot.
//!
//! The receiver owns its segment; senders map it and push pieces into "their"
//! ring, then ring the receiver's doorbell. A consumer that frees a slot rings
//! the producer's doorbell (in the producer's own segment). Nobody spins.
//! (rings per peer pair, unlinked once both
//! sides mapped them; TCP still carries control and liveness.)

use crate::error::PgError;
use crate::transport::copy;
use crate::transport::futex::Doorbell;
use crate::transport::wire::{Hdr, HDR_LEN};
use memmap2::{MmapOptions, MmapRaw};
use nix::fcntl::OFlag;
use nix::sys::mman::{shm_open, shm_unlink};
use nix::sys::stat::Mode;
use std::fs::File;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Payload bytes per ring slot (also the collective piece size on TCP).
pub(crate) const PIECE: usize = 128 * 1024;
/// Slots per ring.
pub(crate) const NSLOTS: u64 = 16;
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
pub(crate) struct Segment {
    map: MmapRaw,
    name: String,
    owner: bool,
    unlinked: AtomicBool,
}

impl Segment {
    /// Creates and maps a new segment with rings for `capacity` senders.
    pub(crate) fn create(name: &str, capacity: usize) -> Result<Self, PgError> {
        let len = SEG_HDR + RING_BYTES * capacity;
        let fd = shm_open(
            name,
            OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_RDWR,
            Mode::S_IRUSR | Mode::S_IWUSR,
        )
        .map_err(|e| PgError::nix(format!("shm_open({name})"), e))?;
        let file = File::from(fd);
        let seg = file
            .set_len(len as u64)
            .map_err(|e| PgError::io("size shm segment", e))
            .and_then(|()| Self::map(&file, len, name, true));
        let seg = match seg {
            Ok(s) => s,
            Err(e) => {
                let _ = shm_unlink(name);
                return Err(e);
            }
        };
        // SAFETY: the header lies within the fresh (zeroed) mapping, which
        // no other process knows about yet; both words are 8-aligned.
        unsafe {
            (seg.base() as *mut u64).write(SEG_MAGIC);
            (seg.base().add(8) as *mut u64).write(capacity as u64);
        }
        Ok(seg)
    }

    /// Maps an existing segment created by a peer.
    pub(crate) fn open(name: &str) -> Result<Self, PgError> {
        let fd = shm_open(name, OFlag::O_RDWR, Mode::empty())
            .map_err(|e| PgError::nix(format!("shm_open({name})"), e))?;
        let file = File::from(fd);
        let len = file
            .metadata()
            .map_err(|e| PgError::io("stat shm segment", e))?
            .len() as usize;
        if len < SEG_HDR {
            return Err(PgError::BadSegment {
                name: name.to_string(),
                reason: "truncated",
            });
        }
        let seg = Self::map(&file, len, name, false)?;
        // SAFETY: within the mapping (len >= SEG_HDR), 8-aligned.
        let magic = unsafe { (seg.base() as *const u64).read_volatile() };
        if magic != SEG_MAGIC {
            return Err(PgError::BadSegment {
                name: name.to_string(),
                reason: "bad magic",
            });
        }
        Ok(seg)
    }

    fn map(file: &File, len: usize, name: &str, owner: bool) -> Result<Self, PgError> {
        let map = MmapOptions::new()
            .len(len)
            .map_raw(file)
            .map_err(|e| PgError::io("mmap shm segment", e))?;
        Ok(Segment {
            map,
            name: name.to_string(),
            owner,
            unlinked: AtomicBool::new(false),
        })
    }

    fn base(&self) -> *mut u8 {
        self.map.as_mut_ptr()
    }

    /// Segment name (for peers to open).
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// Number of sender rings in this segment.
    pub(crate) fn capacity(&self) -> usize {
        (self.map.len() - SEG_HDR) / RING_BYTES
    }

    /// The owner's doorbell.
    pub(crate) fn bell(&self) -> &Doorbell {
        // SAFETY: BELL_OFF is inside the header and 8-aligned; a Doorbell is
        // two atomics, valid for any bit pattern; the mapping outlives `self`.
        unsafe { &*(self.base().add(BELL_OFF) as *const Doorbell) }
    }

    /// The ring into which sender `slot` writes.
    pub(crate) fn ring(&self, slot: usize) -> Option<Ring<'_>> {
        if slot >= self.capacity() {
            return None;
        }
        Some(Ring {
            // SAFETY: `slot < capacity`, so the ring lies inside the mapping.
            base: unsafe { self.base().add(SEG_HDR + slot * RING_BYTES) },
            _seg: std::marker::PhantomData,
        })
    }

    /// Removes the name from the filesystem (mappings stay valid).
    pub(crate) fn unlink(&self) {
        if self.owner && !self.unlinked.swap(true, Ordering::SeqCst) {
            let _ = shm_unlink(self.name.as_str());
        }
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        self.unlink();
    }
}

/// A single-producer single-consumer ring of pieces inside a segment.
#[derive(Clone, Copy)]
pub(crate) struct Ring<'a> {
    base: *mut u8,
    _seg: std::marker::PhantomData<&'a Segment>,
}

/// A piece at the front of a ring.
pub(crate) struct Piece {
    /// Its header.
    pub(crate) hdr: Hdr,
    /// Its payload (valid until popped).
    pub(crate) data: *const u8,
}

impl Ring<'_> {
    fn head(&self) -> &AtomicU64 {
        // SAFETY: the first 8-aligned control word of a ring inside a live
        // mapping (the lifetime ties the ring to its segment); any bit
        // pattern is a valid AtomicU64.
        unsafe { &*(self.base as *const AtomicU64) }
    }
    fn tail(&self) -> &AtomicU64 {
        // SAFETY: as in `head`, on the ring's second cache line.
        unsafe { &*(self.base.add(64) as *const AtomicU64) }
    }
    fn slot(&self, idx: u64) -> *mut u8 {
        // SAFETY: idx % NSLOTS keeps the offset inside the ring.
        unsafe {
            self.base
                .add(RING_CTRL + (idx % NSLOTS) as usize * SLOT_BYTES)
        }
    }

    /// Producer: copies a piece in if there is room. `data.len() <= PIECE`.
    /// Returns `None` when full, else whether the ring was empty before
    /// (only then can the consumer be asleep waiting on this ring).
    ///
    /// `stream` writes the payload with non-temporal stores (see
    /// [`copy::STREAM_MIN_MESSAGE`]): the consumer then reads it from memory
    /// instead of out of this core's cache.
    pub(crate) fn try_push(&self, hdr: &Hdr, data: &[u8], stream: bool) -> Option<bool> {
        let head = self.head().load(Ordering::Relaxed);
        let tail = self.tail().load(Ordering::SeqCst);
        if head - tail >= NSLOTS {
            return None;
        }
        let len = data.len().min(PIECE);
        let slot = self.slot(head);
        let h = hdr.encode();
        // SAFETY: the slot (SLOT_HDR + PIECE bytes) is owned by the producer
        // until head is published; `len <= PIECE`; `h` and `data` are ours
        // and lie outside the ring. A streamed copy ends with a store fence,
        // so the payload is visible before the head store below.
        unsafe {
            std::ptr::copy_nonoverlapping(h.as_ptr(), slot, HDR_LEN);
            copy::copy(data.as_ptr(), slot.add(SLOT_HDR), len, stream);
        }
        self.head().store(head + 1, Ordering::SeqCst);
        // Re-read the tail: if the consumer drained everything meanwhile it
        // may have gone to sleep, so report "was empty" to wake it.
        Some(head == tail || self.tail().load(Ordering::SeqCst) == head)
    }

    /// Consumer: the front piece, if any.
    pub(crate) fn peek(&self) -> Option<Piece> {
        let tail = self.tail().load(Ordering::Relaxed);
        let head = self.head().load(Ordering::SeqCst);
        if tail == head {
            return None;
        }
        let slot = self.slot(tail);
        let mut h = [0u8; HDR_LEN];
        // SAFETY: a published slot of SLOT_HDR + PIECE bytes; the producer
        // does not touch it until it is popped.
        unsafe { std::ptr::copy_nonoverlapping(slot, h.as_mut_ptr(), HDR_LEN) };
        let mut hdr = Hdr::decode(&h);
        hdr.len = hdr.len.min(PIECE as u32);
        Some(Piece {
            hdr,
            // SAFETY: the payload starts inside the same slot.
            data: unsafe { slot.add(SLOT_HDR) },
        })
    }

    /// Consumer: releases the front piece; returns how many stay queued.
    pub(crate) fn pop(&self) -> u64 {
        let tail = self.tail().load(Ordering::Relaxed);
        self.tail().store(tail + 1, Ordering::SeqCst);
        self.head().load(Ordering::SeqCst) - (tail + 1)
    }

    /// Consumer: drops everything queued (left by a producer that failed),
    /// so that a replacement producer starts on an empty ring.
    pub(crate) fn clear(&self) {
        let head = self.head().load(Ordering::SeqCst);
        self.tail().store(head, Ordering::SeqCst);
    }

    /// The producer needs waking once the ring is at most this full.
    pub(crate) const WAKE_AT: u64 = NSLOTS / 2;
}

/// A process-unique segment name.
pub(crate) fn unique_name(tag: u64) -> String {
    format!("/mcpg-{}-{:016x}", std::process::id(), tag)
}

/// Removes segments left by processes that ended without unlinking them.
///
/// A member keeps its segment's name linked for its whole life, so that
/// joining or replacement members can still map it; a process that is
/// killed leaves the name behind. Names carry the creator's pid, so any
/// whose pid no longer exists is stale.
pub(crate) fn sweep_stale() {
    let Ok(dir) = std::fs::read_dir("/dev/shm") else {
        return;
    };
    for entry in dir.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let Some(rest) = name.strip_prefix("mcpg-") else {
            continue;
        };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = shm_unlink(format!("/{name}").as_str());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::wire::KIND_COLL;

    /// A two-slot segment `(created, opened by a peer)`, already unlinked.
    fn pair(tag: u64) -> (Segment, Segment) {
        let name = unique_name(tag);
        let own = Segment::create(&name, 2).expect("create");
        let peer = Segment::open(&name).expect("open");
        own.unlink();
        (own, peer)
    }

    #[test]
    fn ring_push_peek_pop_and_full() {
        let (own, peer) = pair(0xfeed_0001);
        let tx = peer.ring(1).expect("ring");
        let rx = own.ring(1).expect("ring");
        assert!(rx.peek().is_none());
        let hdr = Hdr {
            kind: KIND_COLL,
            len: 3,
            total: 3,
            ..Default::default()
        };
        assert_eq!(tx.try_push(&hdr, b"abc", false), Some(true));
        for _ in 1..NSLOTS {
            assert_eq!(tx.try_push(&hdr, b"abc", false), Some(false));
        }
        assert_eq!(tx.try_push(&hdr, b"abc", false), None);
        let p = rx.peek().expect("piece");
        assert_eq!(p.hdr, hdr);
        // SAFETY: the piece holds 3 payload bytes until popped.
        let got = unsafe { std::slice::from_raw_parts(p.data, 3) };
        assert_eq!(got, b"abc");
        assert_eq!(rx.pop(), NSLOTS - 1);
        assert_eq!(tx.try_push(&hdr, b"abc", false), Some(false));
        assert!(own.ring(2).is_none());
        rx.clear();
        assert!(rx.peek().is_none());
    }

    #[test]
    fn streamed_pushes_deliver_every_byte() {
        let (own, peer) = pair(0xfeed_0003);
        let tx = peer.ring(0).expect("ring");
        let rx = own.ring(0).expect("ring");
        // Every slot first holds other bytes, so a byte the streamed copy
        // skipped would show.
        let junk = vec![0xaau8; PIECE];
        for _ in 0..NSLOTS {
            let hdr = Hdr {
                kind: KIND_COLL,
                len: PIECE as u32,
                ..Default::default()
            };
            assert!(tx.try_push(&hdr, &junk, false).is_some());
            rx.pop();
        }
        // A full piece, a piece whose tail is not a multiple of the 64-byte
        // streamed block, one too short to stream, and one from an odd
        // source address: each must arrive intact.
        let src: Vec<u8> = (0..PIECE + 1).map(|i| (i * 7 + i / 251) as u8).collect();
        let cases: [(usize, usize); 4] = [(0, PIECE), (0, PIECE - 37), (5, 1000), (1, 70_001)];
        for (round, &(at, len)) in cases.iter().enumerate() {
            for stream in [false, true] {
                let data = if stream {
                    &src[at..at + len]
                } else {
                    &src[..len]
                };
                let hdr = Hdr {
                    kind: KIND_COLL,
                    len: len as u32,
                    total: len as u64,
                    offset: round as u64,
                    ..Default::default()
                };
                assert!(tx.try_push(&hdr, data, stream).is_some());
                let p = rx.peek().expect("piece");
                assert_eq!(p.hdr, hdr);
                // SAFETY: the piece holds `len` payload bytes until popped.
                let got = unsafe { std::slice::from_raw_parts(p.data, len) };
                assert!(
                    got == data,
                    "round {round}, stream {stream}: payload differs"
                );
                rx.pop();
            }
        }
    }

    #[test]
    fn bad_segments_are_rejected() {
        assert!(Segment::open("/mcpg-no-such-segment").is_err());
        let name = unique_name(0xfeed_0002);
        let own = Segment::create(&name, 1).expect("create");
        assert!(Segment::create(&name, 1).is_err(), "O_EXCL");
        own.unlink();
        assert!(Segment::open(&name).is_err(), "unlinked");
    }
}
