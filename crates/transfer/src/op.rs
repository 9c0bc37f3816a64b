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
        let sets: Vec<Rows> = ops.iter().map(|&o| Rows::single(o)).collect();
        Rows::split(&sets, parts, max_piece)
            .into_iter()
            .map(|part| part.into_iter().map(|r| r.first()).collect())
            .collect()
    }
}

/// `count` copies of `len` bytes between a segment and local memory, the
/// `i`-th between `seg_offset + i * seg_stride` and
/// `local_ptr + i * local_stride`: the rows of one dimension of a tensor box
/// in one item, where one [`Op`] per row would cost more to plan and to
/// dispatch than the copy of a short row itself. A single range is a set
/// of one row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rows {
    /// Offset of the first row inside the segment.
    pub seg_offset: u64,
    /// Address of the first row in this process.
    pub local_ptr: usize,
    /// Bytes per row.
    pub len: u64,
    /// Rows.
    pub count: u64,
    /// Bytes from one row to the next in the segment.
    pub seg_stride: u64,
    /// Bytes from one row to the next in local memory.
    pub local_stride: u64,
}

impl Rows {
    /// One contiguous range as a set of one row.
    pub fn single(op: Op) -> Rows {
        Rows {
            seg_offset: op.seg_offset,
            local_ptr: op.local_ptr,
            len: op.len,
            count: 1,
            seg_stride: 0,
            local_stride: 0,
        }
    }

    /// The first row.
    pub fn first(&self) -> Op {
        Op {
            seg_offset: self.seg_offset,
            local_ptr: self.local_ptr,
            len: self.len,
        }
    }

    /// Bytes copied (`None` on overflow).
    pub fn bytes(&self) -> Option<u64> {
        self.len.checked_mul(self.count)
    }

    /// Bytes of the segment from the first row's start to the last row's
    /// end (`None` on overflow; 0 for no rows).
    pub fn seg_span(&self) -> Option<u64> {
        match self.count.checked_sub(1) {
            None => Some(0),
            Some(n) => n.checked_mul(self.seg_stride)?.checked_add(self.len),
        }
    }

    /// The rows as contiguous ops.
    pub fn ops(&self) -> impl Iterator<Item = Op> + '_ {
        (0..self.count).map(move |i| Op {
            seg_offset: self.seg_offset + i * self.seg_stride,
            local_ptr: self.local_ptr + (i * self.local_stride) as usize,
            len: self.len,
        })
    }

    /// Cut `sets` into at most about `parts` groups of equal byte counts, in
    /// order, and no piece longer than `max_piece` bytes: a set of one row
    /// is cut anywhere, a set of several rows between rows (a row longer
    /// than `max_piece` becomes its own sets of one row first).
    pub fn split(sets: &[Rows], parts: usize, max_piece: u64) -> Vec<Vec<Rows>> {
        let total: u64 = sets.iter().map(|r| r.bytes().unwrap_or(0)).sum();
        let parts = parts.max(1) as u64;
        let per = total.div_ceil(parts).max(1);
        let max_piece = max_piece.max(1);
        let mut out: Vec<Vec<Rows>> = vec![Vec::new()];
        let mut acc = 0u64;
        let cut = |r: Rows, out: &mut Vec<Vec<Rows>>, acc: &mut u64| {
            let mut r = r;
            while r.count > 0 && r.len > 0 {
                let room = (per - *acc).min(max_piece);
                let piece = if r.count == 1 {
                    let take = r.len.min(room);
                    let p = Rows { len: take, ..r };
                    r.seg_offset += take;
                    r.local_ptr += take as usize;
                    r.len -= take;
                    if r.len == 0 {
                        r.count = 0;
                    }
                    p
                } else if room < r.len && *acc > 0 {
                    // Not even one row fits what is left of this group.
                    out.push(Vec::new());
                    *acc = 0;
                    continue;
                } else {
                    let n = (room / r.len).clamp(1, r.count);
                    let p = Rows { count: n, ..r };
                    r.seg_offset += n * r.seg_stride;
                    r.local_ptr += (n * r.local_stride) as usize;
                    r.count -= n;
                    p
                };
                *acc += piece.len * piece.count;
                if let Some(last) = out.last_mut() {
                    last.push(piece);
                }
                if *acc >= per {
                    out.push(Vec::new());
                    *acc = 0;
                }
            }
        };
        for r in sets {
            if r.count > 1 && r.len > max_piece {
                for op in r.ops() {
                    cut(Rows::single(op), &mut out, &mut acc);
                }
            } else {
                cut(*r, &mut out, &mut acc);
            }
        }
        out.retain(|p| !p.is_empty());
        out
    }
}

/// How a copy stores into its destination: a local copy's own stores, and
/// for a TCP read, whether the reply lands through a cache-sized buffer
/// copied on with streaming stores (`sockio::recv_streamed`) or straight
/// from the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stores {
    /// Plain stores: the destination stays in the cache, where the next
    /// reader finds it (the fastest copy while both ends fit in it).
    Cached,
    /// Non-temporal stores: for a transfer too large for the cache, whose
    /// plain stores would first read every destination line from memory
    /// (`mooncake_common::memcopy`).
    Streaming,
}

impl Stores {
    /// Transfers of at least this many bytes in one call stream.
    pub const STREAM_MIN: u64 = 8 << 20;

    /// The stores for one call that moves `total` bytes locally.
    pub fn for_bytes(total: u64) -> Stores {
        if total >= Self::STREAM_MIN {
            Stores::Streaming
        } else {
            Stores::Cached
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes_of(parts: &[Vec<Rows>]) -> Vec<u64> {
        parts
            .iter()
            .map(|p| p.iter().map(|r| r.len * r.count).sum())
            .collect()
    }

    #[test]
    fn ops_split_into_equal_parts_and_capped_pieces() {
        let ops = [
            Op {
                seg_offset: 0,
                local_ptr: 1000,
                len: 300,
            },
            Op {
                seg_offset: 500,
                local_ptr: 5000,
                len: 100,
            },
        ];
        let parts = Op::split(&ops, 2, 150);
        let lens: Vec<Vec<u64>> = parts
            .iter()
            .map(|p| p.iter().map(|o| o.len).collect())
            .collect();
        assert_eq!(lens, vec![vec![150, 50], vec![100, 100]]);
        assert_eq!(parts[0][1].seg_offset, 150);
        assert_eq!(parts[0][1].local_ptr, 1150);
        assert_eq!(parts[1][1].seg_offset, 500);
    }

    #[test]
    fn row_sets_split_between_rows_and_cover_every_row_once() {
        let set = Rows {
            seg_offset: 64,
            local_ptr: 4096,
            len: 256,
            count: 10,
            seg_stride: 512,
            local_stride: 256,
        };
        let parts = Rows::split(&[set], 3, u64::MAX);
        // Whole rows while several are left; the last row is a single
        // range, cut anywhere.
        assert_eq!(bytes_of(&parts), vec![768, 768, 854, 170]);
        // Byte by byte, the parts copy what the set copies, in order.
        let bytes = |ops: Vec<Op>| -> Vec<(u64, usize)> {
            ops.iter()
                .flat_map(|o| (0..o.len).map(move |b| (o.seg_offset + b, o.local_ptr + b as usize)))
                .collect()
        };
        let got = bytes(parts.iter().flatten().flat_map(|r| r.ops()).collect());
        assert_eq!(got, bytes(set.ops().collect()));
        // A row longer than the piece cap is cut like a single range.
        let long = Rows {
            len: 1000,
            count: 2,
            ..set
        };
        let parts = Rows::split(&[long], 1, 600);
        assert_eq!(bytes_of(&parts), vec![2000]);
        let lens: Vec<u64> = parts[0].iter().map(|r| r.len).collect();
        assert_eq!(lens, vec![600, 400, 600, 400]);
        assert_eq!(parts[0][2].seg_offset, 64 + 512);
    }

    #[test]
    fn spans_and_overflow() {
        let r = Rows {
            seg_offset: 0,
            local_ptr: 0,
            len: 10,
            count: 3,
            seg_stride: 100,
            local_stride: 10,
        };
        assert_eq!(r.seg_span(), Some(210));
        assert_eq!(r.bytes(), Some(30));
        assert_eq!(Rows { count: 0, ..r }.seg_span(), Some(0));
        let huge = Rows {
            count: u64::MAX,
            ..r
        };
        assert_eq!(huge.seg_span(), None);
        assert_eq!(huge.bytes(), None);
    }
}
