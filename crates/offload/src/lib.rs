//! The store's disk tier: objects that memory eviction would drop are
//! persisted by the process that owns the segment ("the owner") in bucket
//! files under one directory, and read back from there.
//!
//! # On-disk layout
//!
//! One directory per owner holds:
//!
//! - `.lock`: held with `flock(LOCK_EX)` while an owner uses the directory;
//!   a second owner pointed at the same directory is refused.
//! - `<id>.bucket`: data, a sequence of records, each
//!
//!   ```text
//!   offset  0  magic      4 bytes "MCO1"
//!           4  key_len    u32 LE
//!           8  value_len  u64 LE
//!          16  version    u64 LE (the master's version of the object)
//!          24  value_crc  u32 LE, CRC-32C of the value
//!          28  head_crc   u32 LE, CRC-32C of bytes 0..28 followed by the key
//!          32  key        key_len bytes (UTF-8)
//!              value      value_len bytes
//!   ```
//!
//! - `<id>.meta`: written only once the bucket's data is on disk
//!   (`fdatasync`), through a temporary file and `rename`: three lines,
//!   `MCOFFLOAD-META 1`, a JSON object
//!   `{"bucket":id,"entries":[{"key","version","offset","value_len","value_crc"}]}`
//!   listing the bucket's live records, and the CRC-32C of that JSON line
//!   as 8 hex digits. A removal rewrites the meta file without the removed
//!   record; a bucket with no live record left is deleted.
//!
//! `<id>` is a 20-digit, zero-padded, increasing number (so the oldest
//! bucket sorts first). A bucket without a valid meta file (an owner killed
//! while writing it), a record whose header checksum fails, or a meta file
//! naming bytes beyond its bucket's end is dropped when the directory is
//! opened; a value whose checksum fails when read is an error, never bytes.
//!
//! # Bounds
//!
//! Usage is measured on disk (the allocated blocks of the directory's
//! files, as `du` counts them). A write that would exceed the cap first
//! evicts whole buckets, oldest first; with watermark eviction on, crossing
//! the high watermark evicts down to the low one. Evicted keys are handed
//! to the eviction handler (the owner tells the master) before the files
//! are deleted. A full disk (`ENOSPC`) fails the write, which the caller
//! treats like a memory-only eviction.

mod config;
mod error;
mod layout;
mod tier;
mod usage;

pub use config::{TierConfig, DEFAULT_STORAGE_PATH};
pub use error::{OffloadError, Result};
pub use layout::{RECORD_HEADER, RECORD_MAGIC};
pub use tier::{DiskEntry, DiskTier, EvictHandler, TierStats};
pub use usage::disk_usage;
