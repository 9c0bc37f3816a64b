//! Typed reduction kernels.
//!
//! Contributions are always combined in the order given (ascending rank
//! order), so results are deterministic. f16/bf16 accumulate in f32 and round
//! once when stored. Integers wrap; MIN/MAX on floats propagate NaN like
//! `torch.minimum`/`torch.maximum`.

use crate::dtype::{DType, ReduceOp};
use half::{bf16, f16};

/// Elements processed per block when combining more than two sources.
const BLOCK: usize = 2048;

/// Reduces `srcs` (each `nelem` elements of `dtype`) into `dst`, in order.
/// `avg_div` is the divisor applied for `ReduceOp::Avg`.
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
                |x: bf16| x.to_f32(),
                bf16::from_f32,
            ),
            DType::Raw => {}
        }
    }
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
    fn nmin<A: FloatAcc>(a: A, b: A) -> A {
        pick_nan(a, b, |a, b| b < a)
    }
    fn nmax<A: FloatAcc>(a: A, b: A) -> A {
        pick_nan(a, b, |a, b| b > a)
    }
    fn add<A: FloatAcc>(a: A, b: A) -> A {
        a + b
    }
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
        let mut acc: Vec<A> = Vec::with_capacity(BLOCK.min(n));
        let mut start = 0;
        while start < n {
            let len = BLOCK.min(n - start);
            acc.clear();
            let s0 = std::slice::from_raw_parts((srcs[0] as *const T).add(start), len);
            // One `extend` over a slice (not a `push` per element, which
            // checks the capacity each time and stays scalar).
            acc.extend(s0.iter().map(|x| load(*x)));
            for s in &srcs[1..] {
                let p = std::slice::from_raw_parts((*s as *const T).add(start), len);
                for (a, x) in acc.iter_mut().zip(p) {
                    *a = f(*a, load(*x));
                }
            }
            // Every source slice of this block is gone: `dst` may alias them.
            let d = std::slice::from_raw_parts_mut(dst.add(start), len);
            match avg {
                Some(div) => {
                    for (o, a) in d.iter_mut().zip(&acc) {
                        *o = store(a.avg_div(div));
                    }
                }
                None => {
                    for (o, a) in d.iter_mut().zip(&acc) {
                        *o = store(*a);
                    }
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
}
