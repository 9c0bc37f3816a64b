//! Box geometry over C-contiguous tensors: where a shard sits in the global
//! index space, and the contiguous byte runs that copy the overlap of two
//! boxes from one C-ordered buffer to another. Narrowing a tensor along a dim
//! (a write shard) and assembling a target from stored shards (a read) are
//! both expressed as these runs, so the executor gathers and scatters
//! directly between user memory and store objects without a staging copy.

use crate::axis::Parallelism;
use crate::error::{TensorError, TensorResult};

/// A box in a tensor's global index space: `origin[i] .. origin[i] + extent[i]`.
/// The data of a box is stored C-contiguously with shape `extent`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Region {
    /// First index per dim.
    pub origin: Vec<u64>,
    /// Extent per dim (the stored shape).
    pub extent: Vec<u64>,
}

/// One contiguous copy between two buffers, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CopyRun {
    /// Offset in the source buffer.
    pub src: u64,
    /// Offset in the destination buffer.
    pub dst: u64,
    /// Length.
    pub len: u64,
}

/// Number of elements of a shape (`None` on overflow).
pub fn numel(shape: &[u64]) -> Option<u64> {
    shape.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d))
}

fn strides(extent: &[u64]) -> Vec<u64> {
    let mut s = vec![1u64; extent.len()];
    for i in (0..extent.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1].saturating_mul(extent[i + 1]);
    }
    s
}

impl Region {
    /// The whole of a tensor of `shape`.
    pub fn whole(shape: &[u64]) -> Region {
        Region {
            origin: vec![0; shape.len()],
            extent: shape.to_vec(),
        }
    }

    /// Number of elements.
    pub fn volume(&self) -> u64 {
        numel(&self.extent).unwrap_or(u64::MAX)
    }

    /// This box cut to the `rank`-th of `count` uniform pieces along `dim`.
    /// Fails when `dim` is out of range or the extent is not divisible.
    pub fn split(&self, dim: usize, rank: u32, count: u32) -> TensorResult<Region> {
        let Some(&e) = self.extent.get(dim) else {
            return Err(TensorError::invalid(format!(
                "split_dim {dim} is outside the tensor's {} dims",
                self.extent.len()
            )));
        };
        let count = u64::from(count);
        if count == 0 || e % count != 0 {
            return Err(TensorError::invalid(format!(
                "only uniform sharding is supported: dim {dim} of extent {e} does not split into {count} equal parts"
            )));
        }
        let part = e / count;
        let mut r = self.clone();
        r.origin[dim] += part * u64::from(rank);
        r.extent[dim] = part;
        Ok(r)
    }

    /// The overlap of two boxes of the same rank (`None` when disjoint or of
    /// different rank). 0-d boxes overlap in their single element.
    pub fn intersect(&self, other: &Region) -> Option<Region> {
        if self.extent.len() != other.extent.len() {
            return None;
        }
        let mut origin = Vec::with_capacity(self.extent.len());
        let mut extent = Vec::with_capacity(self.extent.len());
        for i in 0..self.extent.len() {
            let lo = self.origin[i].max(other.origin[i]);
            let hi = (self.origin[i] + self.extent[i]).min(other.origin[i] + other.extent[i]);
            if hi <= lo {
                return None;
            }
            origin.push(lo);
            extent.push(hi - lo);
        }
        Some(Region { origin, extent })
    }
}

/// `count` equal copies of `len` bytes, the `i`-th from `src + i * src_stride`
/// to `dst + i * dst_stride`: the rows of one dimension of an overlap, where
/// a row is the part of the overlap that is contiguous in both buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CopyRows {
    /// Offset of the first row in the source buffer.
    pub src: u64,
    /// Offset of the first row in the destination buffer.
    pub dst: u64,
    /// Bytes per row.
    pub len: u64,
    /// Rows (at least 1).
    pub count: u64,
    /// Bytes from one row to the next in the source.
    pub src_stride: u64,
    /// Bytes from one row to the next in the destination.
    pub dst_stride: u64,
}

impl CopyRows {
    /// Bytes copied.
    pub fn bytes(&self) -> u64 {
        self.len * self.count
    }

    /// The rows as contiguous runs.
    pub fn runs(&self) -> impl Iterator<Item = CopyRun> + '_ {
        (0..self.count).map(move |i| CopyRun {
            src: self.src + i * self.src_stride,
            dst: self.dst + i * self.dst_stride,
            len: self.len,
        })
    }
}

/// Append to `out` the row sets copying the overlap of `src` and `dst`
/// (each stored C-contiguously with its own extent, elements of `itemsize`
/// bytes) from the source buffer to the destination buffer: trailing dims
/// covered whole in both boxes merge into one row, the next dim out gives
/// the row count and strides, and every index of the dims outside that is
/// one [`CopyRows`]. Sets come out in increasing destination order. Returns
/// the number of elements covered.
pub fn copy_rows(itemsize: u64, src: &Region, dst: &Region, out: &mut Vec<CopyRows>) -> u64 {
    let Some(inter) = src.intersect(dst) else {
        return 0;
    };
    let nd = inter.extent.len();
    let (ss, ds) = (strides(&src.extent), strides(&dst.extent));
    // Merge trailing dims fully covered in both boxes into one run; the
    // first dim (from the inside) that is not adds its extent and stops it.
    let mut run = 1u64;
    let mut k = nd;
    while k > 0 {
        let j = k - 1;
        run *= inter.extent[j];
        k = j;
        if !(inter.extent[j] == src.extent[j] && inter.extent[j] == dst.extent[j]) {
            break;
        }
    }
    let base = |o: &Region, st: &[u64]| -> u64 {
        (0..nd)
            .map(|i| (inter.origin[i] - o.origin[i]) * st[i])
            .sum()
    };
    let (sb, db) = (base(src, &ss), base(dst, &ds));
    // Dim `k - 1` (if any) is the rows' dim; the dims before it are looped.
    let (count, src_stride, dst_stride, outer_dims) = match k.checked_sub(1) {
        Some(r) => (inter.extent[r], ss[r] * itemsize, ds[r] * itemsize, r),
        None => (1, 0, 0, 0),
    };
    let outer = &inter.extent[..outer_dims];
    let total = numel(outer).unwrap_or(0);
    out.reserve(usize::try_from(total).unwrap_or(0));
    let mut idx = vec![0u64; outer_dims];
    for _ in 0..total {
        let so: u64 = sb + (0..outer_dims).map(|i| idx[i] * ss[i]).sum::<u64>();
        let d_o: u64 = db + (0..outer_dims).map(|i| idx[i] * ds[i]).sum::<u64>();
        out.push(CopyRows {
            src: so * itemsize,
            dst: d_o * itemsize,
            len: run * itemsize,
            count,
            src_stride,
            dst_stride,
        });
        for i in (0..outer_dims).rev() {
            idx[i] += 1;
            if idx[i] < outer[i] {
                break;
            }
            idx[i] = 0;
        }
    }
    total * count * run
}

/// Append to `out` the contiguous runs copying the overlap of `src` and
/// `dst` ([`copy_rows`], one run per row), in increasing destination order.
/// Returns the number of elements covered.
pub fn copy_runs(itemsize: u64, src: &Region, dst: &Region, out: &mut Vec<CopyRun>) -> u64 {
    let mut rows = Vec::new();
    let n = copy_rows(itemsize, src, dst, &mut rows);
    for r in &rows {
        out.extend(r.runs());
    }
    n
}

/// The box of a tensor of `global` shape that the layout axes of `p` select.
pub(crate) fn narrow(global: &[u64], p: &Parallelism) -> TensorResult<Region> {
    let mut b = Region::whole(global);
    for a in p.axes() {
        if let Some(d) = a.split_dim {
            b = b.split(d, a.rank, a.size)?;
        }
    }
    Ok(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(src: u64, dst: u64, len: u64) -> CopyRun {
        CopyRun { src, dst, len }
    }

    /// A 4x6 tensor's whole box and the uniform shard `rank` of `size` along `dim`.
    fn split_4x6(dim: usize, rank: u32, size: u32) -> (Region, Region) {
        let full = Region::whole(&[4, 6]);
        let shard = full.split(dim, rank, size).expect("uniform");
        (full, shard)
    }

    /// Apply runs to byte buffers.
    fn apply(runs: &[CopyRun], src: &[u8], dst: &mut [u8]) {
        for r in runs {
            let (s, d, n) = (r.src as usize, r.dst as usize, r.len as usize);
            dst[d..d + n].copy_from_slice(&src[s..s + n]);
        }
    }

    #[test]
    fn narrow_along_dim0_is_one_run() {
        let (full, shard) = split_4x6(0, 1, 2);
        let mut runs = Vec::new();
        assert_eq!(copy_runs(4, &full, &shard, &mut runs), 12);
        assert_eq!(runs, vec![run(48, 0, 48)]);
    }

    #[test]
    fn narrow_along_dim1_is_strided_rows() {
        let (full, shard) = split_4x6(1, 1, 3);
        let mut runs = Vec::new();
        copy_runs(1, &full, &shard, &mut runs);
        assert_eq!(runs.len(), 4);
        assert_eq!(runs[0], run(2, 0, 2));
        assert_eq!(runs[3], run(20, 6, 2));
        let src: Vec<u8> = (0..24).collect();
        let mut dst = vec![0u8; 8];
        apply(&runs, &src, &mut dst);
        assert_eq!(dst, vec![2, 3, 8, 9, 14, 15, 20, 21]);
    }

    #[test]
    fn non_uniform_split_is_rejected() {
        let e = Region::whole(&[4, 2]).split(1, 1, 3).unwrap_err();
        assert!(e.reason.contains("only uniform sharding is supported"));
        assert!(Region::whole(&[4]).split(1, 0, 2).is_err());
    }

    #[test]
    fn zero_d_and_empty() {
        let mut runs = Vec::new();
        assert_eq!(
            copy_runs(8, &Region::whole(&[]), &Region::whole(&[]), &mut runs),
            1
        );
        assert_eq!(runs, vec![run(0, 0, 8)]);
        runs.clear();
        assert_eq!(
            copy_runs(
                4,
                &Region::whole(&[0, 4]),
                &Region::whole(&[0, 4]),
                &mut runs
            ),
            0
        );
        assert!(runs.is_empty());
    }

    #[test]
    fn rows_of_a_dim1_narrowing_are_one_strided_set() {
        let (full, shard) = split_4x6(1, 1, 3);
        let mut rows = Vec::new();
        assert_eq!(copy_rows(1, &full, &shard, &mut rows), 8);
        assert_eq!(
            rows,
            vec![CopyRows {
                src: 2,
                dst: 0,
                len: 2,
                count: 4,
                src_stride: 6,
                dst_stride: 2
            }]
        );
    }

    #[test]
    fn rows_of_a_3d_overlap_loop_the_outer_dim() {
        // [2, 3, 4] box narrowed on dim 1 to [1..3) and dim 2 to [2..4):
        // per index of dim 0 one set of 2 rows of 2 elements.
        let full = Region::whole(&[2, 3, 4]);
        let part = Region {
            origin: vec![0, 1, 2],
            extent: vec![2, 2, 2],
        };
        let mut rows = Vec::new();
        assert_eq!(copy_rows(4, &full, &part, &mut rows), 8);
        assert_eq!(rows.len(), 2);
        assert_eq!((rows[0].count, rows[0].len), (2, 8));
        assert_eq!((rows[0].src_stride, rows[0].dst_stride), (16, 8));
        assert_eq!((rows[1].src, rows[1].dst), (4 * (12 + 4 + 2), 16));
        // Rows and runs describe the same copies.
        let src: Vec<u8> = (0..96).collect();
        let mut via_runs = vec![0u8; 32];
        let mut runs = Vec::new();
        copy_runs(4, &full, &part, &mut runs);
        apply(&runs, &src, &mut via_runs);
        let flat: Vec<CopyRun> = rows
            .iter()
            .flat_map(|r| r.runs().collect::<Vec<_>>())
            .collect();
        assert_eq!(flat, runs);
        let mut expect = Vec::new();
        for a in 0..2u8 {
            for b in 1..3u8 {
                for c in 2..4u8 {
                    let e = (a * 12 + b * 4 + c) * 4;
                    expect.extend(e..e + 4);
                }
            }
        }
        assert_eq!(via_runs, expect);
    }
}
