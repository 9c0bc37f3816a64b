//! The unit every data path moves: one contiguous copy between a range of
//! a segment and memory of this process. It sits below the engine and the
//! TCP pool, which both take slices of it.

/// One contiguous copy between a segment range and local memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Op {
    /// Offset inside the segment.
    pub seg_offset: u64,
    /// Address in this process.
    pub local_ptr: usize,
    /// Bytes to copy.
    pub len: u64,
}
