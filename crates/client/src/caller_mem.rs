//! Caller memory as the store's memory-moving calls take it: where the
//! bytes are (an address and a length, or lists of them, exactly as the
//! caller gave them) and which way they move. `WRITES = false` is memory the
//! call reads (a put's source), `true` memory it writes (a get's
//! destination).
//!
//! The types carry no rule: the call that takes them checks them (null
//! pointers, lists of different lengths). They exist so that a call's
//! signature says which of its arguments are caller memory and which way
//! each moves: a standalone daemon serves a dummy client's memory-moving
//! calls from that alone (`store_moves!`).

/// `len` bytes at the caller's address `ptr`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mem<const WRITES: bool> {
    /// The caller's address.
    pub ptr: usize,
    /// Bytes.
    pub len: usize,
}

impl<const WRITES: bool> Mem<WRITES> {
    /// `len` bytes at `ptr`.
    pub const fn new(ptr: usize, len: usize) -> Self {
        Mem { ptr, len }
    }
}

/// Memory a call reads.
pub type Src = Mem<false>;
/// Memory a call writes.
pub type Dst = Mem<true>;

/// One buffer per item: `ptrs[i]` with `sizes[i]` bytes. The lists are the
/// caller's, so their lengths may differ; the call decides what that means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemList<'a, const WRITES: bool> {
    /// Addresses.
    pub ptrs: &'a [usize],
    /// Sizes.
    pub sizes: &'a [usize],
}

/// One buffer per item, read by the call.
pub type Srcs<'a> = MemList<'a, false>;
/// One buffer per item, written by the call.
pub type Dsts<'a> = MemList<'a, true>;

/// Several buffers per item: item `i`'s buffer `j` is `ptrs[i][j]` with
/// `sizes[i][j]` bytes (the caller's lists, as for [`MemList`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemLists<'a, const WRITES: bool> {
    /// Per item, addresses.
    pub ptrs: &'a [Vec<usize>],
    /// Per item, sizes.
    pub sizes: &'a [Vec<usize>],
}

/// Several buffers per item, read by the call.
pub type SrcLists<'a> = MemLists<'a, false>;
/// Several buffers per item, written by the call.
pub type DstLists<'a> = MemLists<'a, true>;
