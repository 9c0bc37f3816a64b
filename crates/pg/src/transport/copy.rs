//! Bulk copies into and out of the shared-memory rings.
//!
//! Large messages are written with non-temporal (streaming) stores, on both
//! sides of a ring:
//! - into the ring (the producer): the consumer then reads the piece from
//!   memory instead of pulling each line out of the producer core's cache.
//!   A cache-to-cache handoff is fast while the two cores share a
//!   last-level cache, but when the host places them apart (a VM's vCPUs on
//!   two sockets) every line becomes a remote snoop and the handoff drops
//!   about fivefold; the streamed push is fast in both placements
//!   (the PG shared-memory figures in `benchmarks/RESULTS.md`);
//! - out of the ring (the receive buffer): the data is not read again soon,
//!   and skipping the read-for-ownership of every destination line cuts
//!   memory traffic by a third.
//!
//! Small messages keep plain copies: their pieces are read back at once,
//! and a cache handoff is then the faster path.

/// Messages at least this large use streaming stores (ring push and final
/// copy).
pub(crate) const STREAM_MIN_MESSAGE: usize = 8 << 20;

/// The copy kernel (`stream` selects non-temporal stores).
pub(crate) use mooncake_common::memcopy::copy;
