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

impl Op {
    /// Cut `ops` into at most about `parts` groups of equal byte counts, in
    /// order, splitting an op where a group fills up, and no op longer than
    /// `max_piece` bytes: each group can then be moved by its own thread or
    /// stream (the engine's parallel TCP streams, the client's copy threads).
    pub fn split(ops: &[Op], parts: usize, max_piece: u64) -> Vec<Vec<Op>> {
        let total: u64 = ops.iter().map(|o| o.len).sum();
        let parts = parts.max(1) as u64;
        let per = total.div_ceil(parts).max(1);
        let max_piece = max_piece.max(1);
        let mut out: Vec<Vec<Op>> = vec![Vec::new()];
        let mut acc = 0u64;
        for o in ops {
            let mut o = *o;
            while o.len > 0 {
                let take = o.len.min(per - acc).min(max_piece);
                if let Some(last) = out.last_mut() {
                    last.push(Op {
                        seg_offset: o.seg_offset,
                        local_ptr: o.local_ptr,
                        len: take,
                    });
                }
                acc += take;
                o.seg_offset += take;
                o.local_ptr += take as usize;
                o.len -= take;
                if acc >= per {
                    out.push(Vec::new());
                    acc = 0;
                }
            }
        }
        out.retain(|p| !p.is_empty());
        out
    }
}
