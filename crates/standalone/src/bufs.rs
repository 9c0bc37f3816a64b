//! How a dummy names bytes of its shared memory to its daemon: a [`Buf`]
//! (a region, an offset, a length), and the lists of caller buffers of the
//! batch calls ([`Flat`], [`Nested`]), which keep the caller's list lengths
//! so that the daemon's client applies its own rules to them.

use serde::{Deserialize, Serialize};

/// Bytes of a dummy's shared memory: `len` bytes at `offset` of region `region`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Buf {
    /// Region id (the dummy's numbering).
    pub(crate) region: u64,
    /// Offset in the region.
    pub(crate) offset: u64,
    /// Length.
    pub(crate) len: u64,
}

/// A flat list of caller buffers (`ptrs[i]`, `sizes[i]`), with the lengths
/// of both lists as the caller gave them (the daemon's client checks them).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Flat {
    /// One buffer per pair the two lists have in common.
    pub(crate) bufs: Vec<Buf>,
    /// Length of the caller's pointer list.
    pub(crate) ptrs: usize,
    /// Length of the caller's size list.
    pub(crate) sizes: usize,
}

/// Per-key lists of caller buffers, with every list length as given.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Nested {
    /// Per key, one buffer per pair its two lists have in common.
    pub(crate) bufs: Vec<Vec<Buf>>,
    /// Lengths of the caller's per-key pointer lists.
    pub(crate) ptrs: Vec<usize>,
    /// Lengths of the caller's per-key size lists.
    pub(crate) sizes: Vec<usize>,
}
