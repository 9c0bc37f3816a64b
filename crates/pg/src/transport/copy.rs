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

/// Copies `len` bytes from `src` to `dst`; `stream` selects non-temporal
/// stores where the CPU supports them.
///
/// # Safety
/// `src` and `dst` must be valid for `len` bytes and must not overlap.
pub(crate) unsafe fn copy(src: *const u8, dst: *mut u8, len: usize, stream: bool) {
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

/// SSE2 non-temporal copy (SSE2 is part of the x86_64 baseline).
///
/// # Safety
/// As [`copy`].
#[cfg(target_arch = "x86_64")]
unsafe fn stream_copy_x86(src: *const u8, dst: *mut u8, len: usize) {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_sfence, _mm_stream_si128};
    // SAFETY: every access stays inside [src, src+len) and [dst, dst+len),
    // valid per the caller's contract; stores go to 16-aligned addresses
    // (`d` is aligned by the head copy) as `_mm_stream_si128` requires.
    unsafe {
        // Align the destination to 16 bytes with a plain copy of the head.
        let head = (16 - (dst as usize & 15)) & 15;
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
        _mm_sfence();
        std::ptr::copy_nonoverlapping(s, d, left);
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn stream_copy_matches_memcpy_at_odd_offsets() {
        let src: Vec<u8> = (0..20000u32).map(|i| (i * 7 % 251) as u8).collect();
        for off in [0usize, 1, 7, 15] {
            let mut dst = vec![0u8; 20000 + 16];
            // SAFETY: both ranges lie inside their vectors and do not overlap.
            unsafe {
                super::copy(
                    src.as_ptr().add(off),
                    dst.as_mut_ptr().add(off),
                    19000,
                    true,
                )
            };
            assert_eq!(&dst[off..off + 19000], &src[off..off + 19000]);
        }
    }
}
