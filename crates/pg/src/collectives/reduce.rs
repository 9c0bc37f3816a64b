//! Typed reduction kernels.
//!
//! Contributions are always combined in the order given (ascending rank
//! order), so results are deterministic. f16/bf16 accumulate in f32 and round
//! once when stored. Integers wrap; MIN/MAX on floats propagate NaN like
//! `torch.minimum`/`torch.maximum`.

use crate::dtype::{DType, ReduceOp};
use half::{bf16, f16};

/// Elements combined per block when there are more than two sources: a
/// block's running values stay in registers while each source is added.
const LANES: usize = 64;

/// Reduces `srcs` (each `nelem` elements of `dtype`) into `dst`, in order.
/// `avg_div` is the divisor applied for `ReduceOp::Avg`.
///
/// The kernels run in blocks of [`LANES`] elements held in registers, and
/// with AVX2 where the CPU has it (chosen at run time: the wheel targets
/// the x86-64 baseline).
///
/// # Safety
/// Every pointer must be valid for `nelem` elements; `dst` may alias any
/// source (the kernels read an element of every source before writing it).
pub(crate) unsafe fn reduce(
    dtype: DType,
    op: ReduceOp,
    dst: *mut u8,
    srcs: &[*const u8],
    nelem: usize,
    avg_div: usize,
) {
    let r = Reduction {
        dtype,
        op,
        dst,
        srcs,
        nelem,
        avg_div,
    };
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2 (checked above); the rest is the
        // caller's contract, forwarded.
        unsafe { r.run_avx2() };
        return;
    }
    // SAFETY: forwarded from the caller's contract.
    unsafe { r.run() };
}

/// The arguments of one [`reduce`] call.
struct Reduction<'a> {
    dtype: DType,
    op: ReduceOp,
    dst: *mut u8,
    srcs: &'a [*const u8],
    nelem: usize,
    avg_div: usize,
}

impl Reduction<'_> {
    /// [`Reduction::run`] compiled for AVX2.
    ///
    /// # Safety
    /// As [`reduce`], and the CPU must support AVX2.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn run_avx2(&self) {
        // SAFETY: forwarded from the caller's contract.
        unsafe { self.run() };
    }

    /// The body of [`reduce`], inlined into each instruction-set version.
    ///
    /// # Safety
    /// As [`reduce`].
    #[inline(always)]
    unsafe fn run(&self) {
        let (dtype, op, nelem, avg_div) = (self.dtype, self.op, self.nelem, self.avg_div);
        let (dst, srcs) = (self.dst, self.srcs);
        if srcs.is_empty() || nelem == 0 {
            return;
        }
        // SAFETY: every kernel below reads `nelem` elements from each source and
        // writes `nelem` to `dst`, which the caller guarantees are valid.
        unsafe {
            match dtype {
                DType::U8 => int_reduce::<u8>(op, dst, srcs, nelem),
                DType::I8 => int_reduce::<i8>(op, dst, srcs, nelem),
                DType::I16 => int_reduce::<i16>(op, dst, srcs, nelem),
                DType::U16 => int_reduce::<u16>(op, dst, srcs, nelem),
                DType::I32 => int_reduce::<i32>(op, dst, srcs, nelem),
                DType::U32 => int_reduce::<u32>(op, dst, srcs, nelem),
                DType::I64 => int_reduce::<i64>(op, dst, srcs, nelem),
                DType::U64 => int_reduce::<u64>(op, dst, srcs, nelem),
                DType::Bool => {
                    let op = match op {
                        ReduceOp::Sum | ReduceOp::Max | ReduceOp::BOr => ReduceOp::Max,
                        ReduceOp::BXor => ReduceOp::BXor,
                        _ => ReduceOp::Min,
                    };
                    int_reduce::<u8>(op, dst, srcs, nelem)
                }
                DType::F32 => float_reduce::<f32, f32>(op, dst, srcs, nelem, avg_div, |x| x, |x| x),
                DType::F64 => float_reduce::<f64, f64>(op, dst, srcs, nelem, avg_div, |x| x, |x| x),
                DType::F16 => float_reduce::<f16, f32>(
                    op,
                    dst,
                    srcs,
                    nelem,
                    avg_div,
                    |x: f16| x.to_f32(),
                    f16::from_f32,
                ),
                DType::BF16 => float_reduce::<bf16, f32>(
                    op,
                    dst,
                    srcs,
                    nelem,
                    avg_div,
                    bf16_to_f32,
                    f32_to_bf16,
                ),
                DType::Raw => {}
            }
        }
    }
}

/// A bf16 widened to f32 (exact: bf16 is the top half of an f32).
#[inline(always)]
fn bf16_to_f32(x: bf16) -> f32 {
    f32::from_bits(u32::from(x.to_bits()) << 16)
}

/// An f32 rounded to bf16, to nearest with ties to even; a NaN stays a
/// (quiet) NaN. Matches `bf16::from_f32` bit for bit, without branches, so
/// a block of conversions vectorizes.
#[inline(always)]
fn f32_to_bf16(x: f32) -> bf16 {
    let b = x.to_bits();
    let nan = (b & 0x7FFF_FFFF) > 0x7F80_0000;
    let rounded = b.wrapping_add(0x7FFF + ((b >> 16) & 1));
    let quiet = b | 0x0040_0000;
    bf16::from_bits((if nan { quiet } else { rounded } >> 16) as u16)
}

/// Integer element operations.
trait IntElem: Copy + Ord + AvgDiv {
    fn wadd(self, o: Self) -> Self;
    fn wmul(self, o: Self) -> Self;
    fn band(self, o: Self) -> Self;
    fn bor(self, o: Self) -> Self;
    fn bxor(self, o: Self) -> Self;
}

macro_rules! int_elem {
    ($($t:ty),*) => {$(
        impl IntElem for $t {
            #[inline(always)] fn wadd(self, o: Self) -> Self { self.wrapping_add(o) }
            #[inline(always)] fn wmul(self, o: Self) -> Self { self.wrapping_mul(o) }
            #[inline(always)] fn band(self, o: Self) -> Self { self & o }
            #[inline(always)] fn bor(self, o: Self) -> Self { self | o }
            #[inline(always)] fn bxor(self, o: Self) -> Self { self ^ o }
        }
    )*};
}
int_elem!(u8, i8, i16, u16, i32, u32, i64, u64);

/// Integer reduction of `n` elements per source.
///
/// # Safety
/// As [`reduce`], with `T` the element type.
#[inline(always)]
unsafe fn int_reduce<T: IntElem>(op: ReduceOp, dst: *mut u8, srcs: &[*const u8], n: usize) {
    // SAFETY: forwarded from the caller's contract.
    unsafe {
        match op {
            ReduceOp::Sum | ReduceOp::Avg => combine::<T, T>(dst, srcs, n, id, id, T::wadd, None),
            ReduceOp::Product => combine::<T, T>(dst, srcs, n, id, id, T::wmul, None),
            ReduceOp::Min => combine::<T, T>(dst, srcs, n, id, id, std::cmp::min, None),
            ReduceOp::Max => combine::<T, T>(dst, srcs, n, id, id, std::cmp::max, None),
            ReduceOp::BAnd => combine::<T, T>(dst, srcs, n, id, id, T::band, None),
            ReduceOp::BOr => combine::<T, T>(dst, srcs, n, id, id, T::bor, None),
            ReduceOp::BXor => combine::<T, T>(dst, srcs, n, id, id, T::bxor, None),
        }
    }
}

#[inline(always)]
fn id<T>(x: T) -> T {
    x
}

/// Float accumulator operations.
trait FloatAcc:
    Copy + PartialOrd + std::ops::Add<Output = Self> + std::ops::Mul<Output = Self> + AvgDiv
{
    fn nan(self) -> bool;
}

/// [`FloatAcc`] and [`AvgDiv`] (division by the contributor count) for the
/// float accumulator types.
macro_rules! float_acc {
    ($($t:ty),*) => {$(
        impl FloatAcc for $t {
            #[inline(always)] fn nan(self) -> bool { self.is_nan() }
        }
        impl AvgDiv for $t {
            #[inline(always)] fn avg_div(self, n: usize) -> Self { self / n as $t }
        }
    )*};
}
float_acc!(f32, f64);

/// NaN-propagating choice between `a` and `b`: a NaN `b`, else a NaN `a`,
/// else `b` where `take_b(a, b)` holds, else `a`.
#[inline(always)]
fn pick_nan<A: FloatAcc>(a: A, b: A, take_b: impl Fn(A, A) -> bool) -> A {
    if b.nan() || (!a.nan() && take_b(a, b)) {
        b
    } else {
        a
    }
}

/// Floating-point reduction of `n` elements per source, accumulated in `A`.
///
/// # Safety
/// As [`reduce`], with `T` the element type.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn float_reduce<T: Copy, A: FloatAcc>(
    op: ReduceOp,
    dst: *mut u8,
    srcs: &[*const u8],
    n: usize,
    avg_div: usize,
    load: fn(T) -> A,
    store: fn(A) -> T,
) {
    // NaN in either operand propagates (`b`'s first).
    #[inline(always)]
    fn nmin<A: FloatAcc>(a: A, b: A) -> A {
        pick_nan(a, b, |a, b| b < a)
    }
    #[inline(always)]
    fn nmax<A: FloatAcc>(a: A, b: A) -> A {
        pick_nan(a, b, |a, b| b > a)
    }
    #[inline(always)]
    fn add<A: FloatAcc>(a: A, b: A) -> A {
        a + b
    }
    #[inline(always)]
    fn mul<A: FloatAcc>(a: A, b: A) -> A {
        a * b
    }
    let div = avg_div.max(1);
    // SAFETY: forwarded from the caller's contract.
    unsafe {
        match op {
            ReduceOp::Sum => combine::<T, A>(dst, srcs, n, load, store, add, None),
            ReduceOp::Avg => combine::<T, A>(dst, srcs, n, load, store, add, Some(div)),
            ReduceOp::Product => combine::<T, A>(dst, srcs, n, load, store, mul, None),
            ReduceOp::Min => combine::<T, A>(dst, srcs, n, load, store, nmin, None),
            ReduceOp::Max => combine::<T, A>(dst, srcs, n, load, store, nmax, None),
            // Rejected earlier by `check_reduction`.
            ReduceOp::BAnd | ReduceOp::BOr | ReduceOp::BXor => {}
        }
    }
}

/// Shared kernel: `dst = fin(f(...f(f(s0, s1), s2)..., sk))`.
///
/// # Safety
/// Every source must be valid for `n` reads of `T` and `dst` for `n`
/// writes; `dst` may alias a source (each element is read before written).
#[inline(always)]
unsafe fn combine<T: Copy, A: Copy + AvgDiv>(
    dst: *mut u8,
    srcs: &[*const u8],
    n: usize,
    load: impl Fn(T) -> A,
    store: impl Fn(A) -> T,
    f: impl Fn(A, A) -> A,
    avg: Option<usize>,
) {
    let dst = dst as *mut T;
    // SAFETY: all offsets are below `n`, inside the ranges the caller vouches
    // for; a mutable slice over `dst` is made only where no shared slice
    // overlaps it (`dst` is that source itself, or apart from it).
    unsafe {
        if srcs.len() == 1 {
            let a = srcs[0] as *const T;
            for i in 0..n {
                let mut v = load(*a.add(i));
                if let Some(d) = avg {
                    v = v.avg_div(d);
                }
                *dst.add(i) = store(v);
            }
            return;
        }
        if srcs.len() == 2 && avg.is_none() {
            let a = srcs[0] as *const T;
            let b = srcs[1] as *const T;
            // Slices (the destination either is a source or overlaps
            // neither) let the compiler vectorize; a partial overlap keeps
            // the element-by-element loop.
            let bytes = n * std::mem::size_of::<T>();
            let apart = |p: *const T| {
                let (x, y) = (p as usize, dst as usize);
                x + bytes <= y || y + bytes <= x
            };
            if std::ptr::eq(dst, a) && apart(b) {
                let d = std::slice::from_raw_parts_mut(dst, n);
                let b = std::slice::from_raw_parts(b, n);
                for (x, y) in d.iter_mut().zip(b) {
                    *x = store(f(load(*x), load(*y)));
                }
            } else if std::ptr::eq(dst, b) && apart(a) {
                let d = std::slice::from_raw_parts_mut(dst, n);
                let a = std::slice::from_raw_parts(a, n);
                for (y, x) in d.iter_mut().zip(a) {
                    *y = store(f(load(*x), load(*y)));
                }
            } else if apart(a) && apart(b) {
                let d = std::slice::from_raw_parts_mut(dst, n);
                let a = std::slice::from_raw_parts(a, n);
                let b = std::slice::from_raw_parts(b, n);
                for ((z, x), y) in d.iter_mut().zip(a).zip(b) {
                    *z = store(f(load(*x), load(*y)));
                }
            } else {
                for i in 0..n {
                    *dst.add(i) = store(f(load(*a.add(i)), load(*b.add(i))));
                }
            }
            return;
        }
        let fin = |a: A| match avg {
            Some(div) => a.avg_div(div),
            None => a,
        };
        let mut start = 0;
        while start < n {
            let len = LANES.min(n - start);
            if len == LANES {
                // A full block: fixed trip counts, so the compiler keeps
                // `acc` in registers and vectorizes each loop.
                let mut acc: [A; LANES] = std::array::from_fn(|j| {
                    load((srcs[0] as *const T).add(start + j).read_unaligned())
                });
                for s in &srcs[1..] {
                    let p = (*s as *const T).add(start);
                    for (j, a) in acc.iter_mut().enumerate() {
                        *a = f(*a, load(p.add(j).read_unaligned()));
                    }
                }
                // Every source element of this block is read: `dst` may
                // alias them.
                let d = dst.add(start);
                for (j, a) in acc.iter().enumerate() {
                    d.add(j).write_unaligned(store(fin(*a)));
                }
            } else {
                for i in start..n {
                    let mut a = load((srcs[0] as *const T).add(i).read_unaligned());
                    for s in &srcs[1..] {
                        a = f(a, load((*s as *const T).add(i).read_unaligned()));
                    }
                    dst.add(i).write_unaligned(store(fin(a)));
                }
            }
            start += len;
        }
    }
}

/// Division by the contributor count (identity for integers, which reject AVG).
trait AvgDiv: Sized {
    fn avg_div(self, n: usize) -> Self;
}
macro_rules! avg_ident {
    ($($t:ty),*) => {$( impl AvgDiv for $t { #[inline(always)] fn avg_div(self, _n: usize) -> Self { self } } )*};
}
avg_ident!(u8, i8, i16, u16, i32, u32, i64, u64);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_sources_in_place_apart_and_overlapping() {
        // buf holds x = [0..8) at 0..8 and y = [100..108) at 8..16.
        let fresh = || -> Vec<f32> {
            (0..8)
                .map(|i| i as f32)
                .chain((100..108).map(|i| i as f32))
                .collect()
        };
        let want: Vec<f32> = (0..8).map(|i| (i + 100 + i) as f32).collect();
        let sum2 = |dst: *mut f32, a: *const f32, b: *const f32, n: usize| {
            // SAFETY: every caller below passes ranges inside one live buffer.
            unsafe {
                reduce(
                    DType::F32,
                    ReduceOp::Sum,
                    dst as *mut u8,
                    &[a as *const u8, b as *const u8],
                    n,
                    2,
                )
            }
        };
        // dst is the first source.
        let mut v = fresh();
        let p = v.as_mut_ptr();
        // SAFETY: offsets 0 and 8 with 8 elements stay inside the 16.
        sum2(p, p, unsafe { p.add(8) }, 8);
        assert_eq!(&v[..8], &want[..]);
        // dst is the second source.
        let mut v = fresh();
        let p = v.as_mut_ptr();
        // SAFETY: as above.
        sum2(unsafe { p.add(8) }, p, unsafe { p.add(8) }, 8);
        assert_eq!(&v[8..], &want[..]);
        // dst apart from both.
        let v = fresh();
        let mut d = vec![0.0f32; 8];
        // SAFETY: as above; d holds 8 elements.
        sum2(d.as_mut_ptr(), v.as_ptr(), unsafe { v.as_ptr().add(8) }, 8);
        assert_eq!(d, want);
        // dst overlaps a source by part: element by element, each read
        // before it is written (d[i] = v[i+1] + v[i+8]).
        let mut v = fresh();
        let p = v.as_mut_ptr();
        // SAFETY: offsets 0, 1 and 8 with 7 elements stay inside the 16.
        sum2(p, unsafe { p.add(1) }, unsafe { p.add(8) }, 7);
        let expect: Vec<f32> = (0..7).map(|i| (i + 1 + 100 + i) as f32).collect();
        assert_eq!(&v[..7], &expect[..]);
    }

    /// Reduce `srcs` into `dst` (every slice as long as `dst`).
    fn reduce_into<T: Copy>(dtype: DType, op: ReduceOp, dst: &mut [T], srcs: &[&[T]], avg: usize) {
        assert!(srcs.iter().all(|s| s.len() == dst.len()));
        let ptrs: Vec<*const u8> = srcs.iter().map(|s| s.as_ptr() as *const u8).collect();
        // SAFETY: every source holds `dst.len()` elements of `T`, checked above.
        unsafe {
            reduce(
                dtype,
                op,
                dst.as_mut_ptr() as *mut u8,
                &ptrs,
                dst.len(),
                avg,
            )
        }
    }

    #[test]
    fn sum_three_in_order() {
        let a = [1.0f32, 2.0];
        let b = [10.0f32, 20.0];
        let c = [100.0f32, 200.0];
        let mut d = [0.0f32; 2];
        reduce_into(DType::F32, ReduceOp::Sum, &mut d, &[&a, &b, &c], 3);
        assert_eq!(d, [111.0, 222.0]);
    }

    #[test]
    fn avg_bf16_rounds_once() {
        let a = [bf16::from_f32(1.0); 3];
        let b = [bf16::from_f32(2.0); 3];
        let mut d = [bf16::from_f32(0.0); 3];
        reduce_into(DType::BF16, ReduceOp::Avg, &mut d, &[&a, &b], 2);
        assert_eq!(d[0].to_f32(), 1.5);
    }

    #[test]
    fn nan_propagates_in_min_max() {
        let a = [1.0f32, f32::NAN];
        let b = [f32::NAN, 2.0];
        let mut d = [0.0f32; 2];
        reduce_into(DType::F32, ReduceOp::Min, &mut d, &[&a, &b], 2);
        assert!(d[0].is_nan() && d[1].is_nan());
    }

    #[test]
    fn int_wraps_and_bool_is_or() {
        let a = [250u8, 1];
        let b = [10u8, 0];
        let mut d = [0u8; 2];
        reduce_into(DType::U8, ReduceOp::Sum, &mut d, &[&a, &b], 2);
        assert_eq!(d, [4, 1]);
        reduce_into(DType::Bool, ReduceOp::Sum, &mut d, &[&a, &b], 2);
        assert_eq!(d[1], 1);
    }

    /// Reference reduction: element by element, sources in order, through
    /// `half` for the 16-bit floats.
    fn naive_f32(op: ReduceOp, srcs: &[Vec<f32>], avg: usize) -> Vec<f32> {
        (0..srcs[0].len())
            .map(|i| {
                let mut a = srcs[0][i];
                for s in &srcs[1..] {
                    let b = s[i];
                    a = match op {
                        ReduceOp::Sum | ReduceOp::Avg => a + b,
                        ReduceOp::Product => a * b,
                        ReduceOp::Min if b.is_nan() || (!a.is_nan() && b < a) => b,
                        ReduceOp::Max if b.is_nan() || (!a.is_nan() && b > a) => b,
                        _ => a,
                    };
                }
                if op == ReduceOp::Avg {
                    a / avg as f32
                } else {
                    a
                }
            })
            .collect()
    }

    /// Values with NaNs, infinities, signed zeros and ties to round.
    fn values(n: usize, salt: u32) -> Vec<f32> {
        (0..n as u32)
            .map(|i| match (i * 7 + salt) % 23 {
                0 => f32::NAN,
                1 => f32::INFINITY,
                2 => -0.0,
                3 => 1.0 + f32::EPSILON * 128.0,
                k => (k as f32 - 11.5) * 0.37 + i as f32 * 1e-3,
            })
            .collect()
    }

    fn same_bits(a: &[f32], b: &[f32]) -> bool {
        a.iter()
            .zip(b)
            .all(|(x, y)| x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan()))
    }

    #[test]
    fn full_blocks_and_tails_match_the_element_by_element_reference() {
        // Lengths around the block size, 1 to 5 sources, the output apart
        // from the sources or in place over the first or a later one.
        for n in [1, LANES - 1, LANES, LANES + 3, 3 * LANES + 17] {
            for k in 1..=5 {
                let srcs: Vec<Vec<f32>> = (0..k).map(|s| values(n, s as u32 * 5)).collect();
                for op in [
                    ReduceOp::Sum,
                    ReduceOp::Avg,
                    ReduceOp::Product,
                    ReduceOp::Min,
                    ReduceOp::Max,
                ] {
                    let want = naive_f32(op, &srcs, k);
                    for alias in [None, Some(0), Some(k - 1)] {
                        let mut bufs = srcs.clone();
                        let mut apart = vec![0f32; n];
                        let dst = match alias {
                            Some(a) => bufs[a].as_mut_ptr(),
                            None => apart.as_mut_ptr(),
                        };
                        let ptrs: Vec<*const u8> =
                            bufs.iter().map(|b| b.as_ptr() as *const u8).collect();
                        // SAFETY: every buffer holds `n` f32 values; `dst` is
                        // one of them or a separate `n`-value buffer.
                        unsafe { reduce(DType::F32, op, dst as *mut u8, &ptrs, n, k) };
                        let got = match alias {
                            Some(a) => bufs[a].clone(),
                            None => apart,
                        };
                        assert!(same_bits(&got, &want), "n={n} k={k} {op:?} alias={alias:?}");
                    }
                }
            }
        }
    }

    #[test]
    fn sixteen_bit_floats_accumulate_in_f32_and_round_once() {
        let n = 2 * LANES + 9;
        let srcs: Vec<Vec<f32>> = (0..4).map(|s| values(n, s * 3)).collect();
        for op in [ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max] {
            // The reference widens each rounded input, reduces in f32 and
            // rounds the result once.
            let b: Vec<Vec<bf16>> = srcs
                .iter()
                .map(|v| v.iter().map(|&x| bf16::from_f32(x)).collect())
                .collect();
            let h: Vec<Vec<f16>> = srcs
                .iter()
                .map(|v| v.iter().map(|&x| f16::from_f32(x)).collect())
                .collect();
            let bw: Vec<Vec<f32>> = b
                .iter()
                .map(|v| v.iter().map(|x| x.to_f32()).collect())
                .collect();
            let hw: Vec<Vec<f32>> = h
                .iter()
                .map(|v| v.iter().map(|x| x.to_f32()).collect())
                .collect();
            let mut bd = vec![bf16::ZERO; n];
            let mut hd = vec![f16::ZERO; n];
            let br: Vec<&[bf16]> = b.iter().map(|v| &v[..]).collect();
            let hr: Vec<&[f16]> = h.iter().map(|v| &v[..]).collect();
            reduce_into(DType::BF16, op, &mut bd, &br, 4);
            reduce_into(DType::F16, op, &mut hd, &hr, 4);
            let bwant: Vec<f32> = naive_f32(op, &bw, 4)
                .iter()
                .map(|&x| bf16::from_f32(x).to_f32())
                .collect();
            let hwant: Vec<f32> = naive_f32(op, &hw, 4)
                .iter()
                .map(|&x| f16::from_f32(x).to_f32())
                .collect();
            let bgot: Vec<f32> = bd.iter().map(|x| x.to_f32()).collect();
            let hgot: Vec<f32> = hd.iter().map(|x| x.to_f32()).collect();
            assert!(same_bits(&bgot, &bwant), "bf16 {op:?}");
            assert!(same_bits(&hgot, &hwant), "f16 {op:?}");
        }
    }

    #[test]
    fn bf16_conversions_match_the_half_crate_bit_for_bit() {
        // Every non-NaN bf16 widens exactly; a NaN widens to a NaN (`half`
        // also quiets it, which narrowing does here), and either way the
        // round trip gives the same bits.
        for bits in 0..=u16::MAX {
            let x = bf16::from_bits(bits);
            let (ours, theirs) = (bf16_to_f32(x), x.to_f32());
            if x.is_nan() {
                assert!(ours.is_nan());
            } else {
                assert_eq!(ours.to_bits(), theirs.to_bits(), "{bits:#06x}");
            }
            assert_eq!(
                f32_to_bf16(ours).to_bits(),
                bf16::from_f32(theirs).to_bits()
            );
        }
        // Narrowing: the patterns around every rounding boundary (low 17
        // bits near 0x8000 and 0x18000) under a spread of high halves, and
        // NaN and infinity patterns.
        let lows = [
            0u32, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF, 0x1_7FFF, 0x1_8000, 0x1_8001, 0x1_FFFF,
        ];
        for high in (0..=u16::MAX as u32)
            .step_by(7)
            .chain([0x7F7F, 0x7F80, 0x7FC0, 0xFF80, 0xFFFF])
        {
            for &low in &lows {
                let b = ((high << 16) & !0x1_FFFF) | low;
                let x = f32::from_bits(b);
                assert_eq!(
                    f32_to_bf16(x).to_bits(),
                    bf16::from_f32(x).to_bits(),
                    "{b:#010x}"
                );
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_baseline_and_avx2_kernels_agree_byte_for_byte() {
        if !std::arch::is_x86_feature_detected!("avx2") {
            return;
        }
        let n = 5 * LANES + 3;
        let f: Vec<Vec<f32>> = (0..4).map(|s| values(n, s * 11)).collect();
        let cases: Vec<(DType, Vec<Vec<u8>>)> = vec![
            (
                DType::F32,
                f.iter()
                    .map(|v| v.iter().flat_map(|x| x.to_ne_bytes()).collect())
                    .collect(),
            ),
            (
                DType::BF16,
                f.iter()
                    .map(|v| {
                        v.iter()
                            .flat_map(|&x| bf16::from_f32(x).to_ne_bytes())
                            .collect()
                    })
                    .collect(),
            ),
            (
                DType::I32,
                (0..4)
                    .map(|s| {
                        (0..n as i32)
                            .flat_map(|i| (i * 7919 + s * 1_000_003).to_ne_bytes())
                            .collect()
                    })
                    .collect(),
            ),
        ];
        for (dt, srcs) in cases {
            for op in [ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Min] {
                if dt == DType::I32 && op == ReduceOp::Avg {
                    continue;
                }
                let ptrs: Vec<*const u8> = srcs.iter().map(|b| b.as_ptr()).collect();
                let mut a = vec![0u8; srcs[0].len()];
                let mut b = vec![0u8; srcs[0].len()];
                let nel = srcs[0].len() / dt.size();
                // SAFETY: every buffer holds `nel` elements of `dt`; the
                // CPU has AVX2 (checked above).
                unsafe {
                    Reduction {
                        dtype: dt,
                        op,
                        dst: a.as_mut_ptr(),
                        srcs: &ptrs,
                        nelem: nel,
                        avg_div: 4,
                    }
                    .run();
                    Reduction {
                        dtype: dt,
                        op,
                        dst: b.as_mut_ptr(),
                        srcs: &ptrs,
                        nelem: nel,
                        avg_div: 4,
                    }
                    .run_avx2();
                }
                assert_eq!(a, b, "{dt:?} {op:?}");
            }
        }
    }
}
