//! Bulk memory copies that can bypass the cache.
//!
//! A copy of many megabytes does not fit in the cache, and its destination
//! is not read again soon. Plain stores then read every destination line
//! from memory before overwriting it (read-for-ownership), so the copy moves
//! three bytes over the memory bus for each byte copied. Non-temporal
//! (streaming) stores write whole lines without reading them: on the
//! reference VM one thread copies 64 MiB at 18 GB/s that way against
//! 9.5-10 GB/s with `memcpy`, whose own switch to streaming stores sits
//! above 240 MiB there.
//!
//! A small copy, or one whose destination is read right after, keeps plain
//! stores: it stays in the cache, where plain copies are several times
//! faster than memory.

/// Copies `len` bytes from `src` to `dst`; `stream` selects non-temporal
/// stores where the CPU supports them (x86_64; elsewhere a plain copy).
///
/// # Safety
/// `src` must be valid for reads and `dst` for writes of `len` bytes, and
/// the two ranges must not overlap.
pub unsafe fn copy(src: *const u8, dst: *mut u8, len: usize, stream: bool) {
    #[cfg(target_arch = "x86_64")]
    if stream && len >= 4096 {
        // SAFETY: forwarded from the caller's contract.
        unsafe { stream_copy_x86(src, dst, len) };
        return;
    }
    let _ = stream;
    // SAFETY: forwarded from the caller's contract.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, len) };
}

/// Copies `count` rows of `len` bytes, row `i` from `src + i * src_stride`
/// to `dst + i * dst_stride` (the rows of one dimension of a tensor box).
/// With `stream`, rows of at least 64 bytes use non-temporal stores (on
/// x86_64): a many-row copy of short rows into fresh memory then writes its
/// destination lines without first reading them, as [`copy`] does for one
/// long range.
///
/// # Safety
/// Every row's source must be valid for reads and its destination for
/// writes of `len` bytes, and no destination row may overlap a source row
/// or another destination row.
pub unsafe fn copy_rows(
    src: *const u8,
    dst: *mut u8,
    len: usize,
    count: usize,
    src_stride: usize,
    dst_stride: usize,
    stream: bool,
) {
    #[cfg(target_arch = "x86_64")]
    if stream && len >= 64 {
        for i in 0..count {
            // SAFETY: row `i` of the caller's valid, disjoint rows.
            unsafe {
                stream_run_x86(
                    src.wrapping_add(i * src_stride),
                    dst.wrapping_add(i * dst_stride),
                    len,
                )
            };
        }
        // SAFETY: a store fence has no memory-safety requirement.
        unsafe { std::arch::x86_64::_mm_sfence() };
        return;
    }
    let _ = stream;
    for i in 0..count {
        // SAFETY: row `i` of the caller's valid, disjoint rows.
        unsafe {
            std::ptr::copy_nonoverlapping(
                src.wrapping_add(i * src_stride),
                dst.wrapping_add(i * dst_stride),
                len,
            )
        };
    }
}

/// SSE2 non-temporal copy (SSE2 is part of the x86_64 baseline).
///
/// # Safety
/// As [`copy`].
#[cfg(target_arch = "x86_64")]
unsafe fn stream_copy_x86(src: *const u8, dst: *mut u8, len: usize) {
    // SAFETY: forwarded from the caller's contract.
    unsafe { stream_run_x86(src, dst, len) };
    // Streaming stores are weakly ordered: fence them before whatever
    // publishes the copy (a status, a flag, a lock release).
    // SAFETY: a store fence has no memory-safety requirement.
    unsafe { std::arch::x86_64::_mm_sfence() };
}

/// The body of a non-temporal copy, without the closing fence (the caller
/// fences once after its last run).
///
/// # Safety
/// As [`copy`].
#[cfg(target_arch = "x86_64")]
unsafe fn stream_run_x86(src: *const u8, dst: *mut u8, len: usize) {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_stream_si128};
    // SAFETY: every access stays inside [src, src+len) and [dst, dst+len),
    // valid per the caller's contract; stores go to 16-aligned addresses
    // (`d` is aligned by the head copy) as `_mm_stream_si128` requires.
    unsafe {
        // Align the destination to 16 bytes with a plain copy of the head.
        let head = ((16 - (dst as usize & 15)) & 15).min(len);
        std::ptr::copy_nonoverlapping(src, dst, head);
        let mut s = src.add(head);
        let mut d = dst.add(head);
        let mut left = len - head;
        while left >= 64 {
            let a = _mm_loadu_si128(s as *const __m128i);
            let b = _mm_loadu_si128(s.add(16) as *const __m128i);
            let c = _mm_loadu_si128(s.add(32) as *const __m128i);
            let e = _mm_loadu_si128(s.add(48) as *const __m128i);
            _mm_stream_si128(d as *mut __m128i, a);
            _mm_stream_si128(d.add(16) as *mut __m128i, b);
            _mm_stream_si128(d.add(32) as *mut __m128i, c);
            _mm_stream_si128(d.add(48) as *mut __m128i, e);
            s = s.add(64);
            d = d.add(64);
            left -= 64;
        }
        while left >= 16 {
            _mm_stream_si128(d as *mut __m128i, _mm_loadu_si128(s as *const __m128i));
            s = s.add(16);
            d = d.add(16);
            left -= 16;
        }
        std::ptr::copy_nonoverlapping(s, d, left);
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn stream_copy_matches_memcpy_at_odd_offsets() {
        let src: Vec<u8> = (0..20000u32).map(|i| (i * 7 % 251) as u8).collect();
        for stream in [false, true] {
            for off in [0usize, 1, 7, 15] {
                for len in [0usize, 63, 4096, 19000] {
                    let mut dst = vec![0xEEu8; 20000 + 16];
                    // SAFETY: both ranges lie inside their vectors and do
                    // not overlap.
                    unsafe {
                        super::copy(
                            src.as_ptr().add(off),
                            dst.as_mut_ptr().add(off),
                            len,
                            stream,
                        )
                    };
                    assert_eq!(&dst[off..off + len], &src[off..off + len]);
                    // Nothing around the range is touched.
                    assert!(dst[..off].iter().all(|&b| b == 0xEE));
                    assert!(dst[off + len..].iter().all(|&b| b == 0xEE));
                }
            }
        }
    }

    #[test]
    fn row_copy_matches_per_row_memcpy() {
        let src: Vec<u8> = (0..40000u32).map(|i| (i * 13 % 251) as u8).collect();
        for stream in [false, true] {
            for (len, count, ss, ds, off) in [
                (256usize, 20usize, 512usize, 256usize, 0usize),
                (100, 30, 300, 112, 3),
                (64, 7, 64, 80, 9),
                (8, 50, 24, 8, 1),
            ] {
                let size = ds * (count - 1) + len + off + 16;
                let mut dst = vec![0xEEu8; size];
                // SAFETY: every row lies inside its vector (sizes above) and
                // destination rows are disjoint (ds >= len).
                unsafe {
                    super::copy_rows(
                        src.as_ptr().add(off),
                        dst.as_mut_ptr().add(off),
                        len,
                        count,
                        ss,
                        ds,
                        stream,
                    )
                };
                let mut want = vec![0xEEu8; size];
                for i in 0..count {
                    let (a, b) = (off + i * ss, off + i * ds);
                    want[b..b + len].copy_from_slice(&src[a..a + len]);
                }
                assert_eq!(dst, want, "len {len} count {count} stream {stream}");
            }
        }
    }
}
