//! Half-precision conversions over slices, with the `half` crate: float32
//! to float16 or bfloat16 rounds to nearest even (float16 as NumPy's cast;
//! bfloat16 the same way, as `populate` narrows float32 tables), NaN stays
//! NaN; float16/bfloat16 to float32 is exact. On x86-64 with F16C (checked
//! at run time) the float16 conversions use the hardware instructions.
//! These run on the populate and lookup hot paths, so they work on whole
//! slices rather than one value at a time.

use half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};
use half::{bf16, f16};

/// `dst[i]` = the bfloat16 bits of `src[i]` (round to nearest even).
///
/// # Panics
/// If the slices differ in length.
pub fn f32_to_bf16_slice(src: &[f32], dst: &mut [u16]) {
    dst.reinterpret_cast_mut::<bf16>()
        .convert_from_f32_slice(src);
}

/// `dst[i]` = the float16 bits of `src[i]` (round to nearest even).
///
/// # Panics
/// If the slices differ in length.
pub fn f32_to_f16_slice(src: &[f32], dst: &mut [u16]) {
    dst.reinterpret_cast_mut::<f16>()
        .convert_from_f32_slice(src);
}

/// `dst[i]` = the float32 value of the bfloat16 bits `src[i]` (exact).
///
/// # Panics
/// If the slices differ in length.
pub fn bf16_to_f32_slice(src: &[u16], dst: &mut [f32]) {
    src.reinterpret_cast::<bf16>().convert_to_f32_slice(dst);
}

/// `dst[i]` = the float32 value of the float16 bits `src[i]` (exact).
///
/// # Panics
/// If the slices differ in length.
pub fn f16_to_f32_slice(src: &[u16], dst: &mut [f32]) {
    src.reinterpret_cast::<f16>().convert_to_f32_slice(dst);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bf16_of(x: f32) -> u16 {
        let mut o = [0u16];
        f32_to_bf16_slice(&[x], &mut o);
        o[0]
    }

    fn f16_of(x: f32) -> u16 {
        let mut o = [0u16];
        f32_to_f16_slice(&[x], &mut o);
        o[0]
    }

    fn from_bf16(h: u16) -> f32 {
        let mut o = [0f32];
        bf16_to_f32_slice(&[h], &mut o);
        o[0]
    }

    fn from_f16(h: u16) -> f32 {
        let mut o = [0f32];
        f16_to_f32_slice(&[h], &mut o);
        o[0]
    }

    #[test]
    fn bf16_round_trip_and_rne() {
        assert_eq!(from_bf16(bf16_of(1.0)), 1.0);
        // 1 + 2^-8 is exactly halfway between bf16 1.0 and 1+2^-7: ties to even (1.0).
        assert_eq!(from_bf16(bf16_of(1.0 + 1.0 / 256.0)), 1.0);
        assert_eq!(from_bf16(bf16_of(1.0 + 3.0 / 256.0)), 1.0 + 4.0 / 256.0);
        assert!(from_bf16(bf16_of(f32::NAN)).is_nan());
        assert_eq!(bf16_of(-2.0), 0xC000);
    }

    #[test]
    fn f16_encode_rne() {
        assert_eq!(f16_of(1.0), 0x3C00);
        assert_eq!(f16_of(-2.0), 0xC000);
        // 1 + 2^-11 is halfway between 1.0 and 1 + 2^-10: ties to even.
        assert_eq!(f16_of(1.0 + 2f32.powi(-11)), 0x3C00);
        assert_eq!(f16_of(1.0 + 3.0 * 2f32.powi(-11)), 0x3C02);
        assert_eq!(f16_of(65520.0), 0x7C00); // rounds up to infinity
        assert_eq!(f16_of(2f32.powi(-24)), 0x0001);
        for h in [0x0001u16, 0x03FF, 0x3555, 0x7BFF, 0xFBFF] {
            assert_eq!(f16_of(from_f16(h)), h);
        }
    }

    #[test]
    fn f16_decode() {
        assert_eq!(from_f16(0x3C00), 1.0);
        assert_eq!(from_f16(0xC000), -2.0);
        assert_eq!(from_f16(0x0001), 2f32.powi(-24));
        assert_eq!(from_f16(0x7C00), f32::INFINITY);
        assert!(from_f16(0x7E00).is_nan());
    }

    #[test]
    fn slices_of_every_length_match_elementwise() {
        // Lengths around SIMD widths exercise the vector bodies and tails.
        for n in [0usize, 1, 3, 4, 7, 8, 9, 15, 16, 17, 63, 64, 65, 1001] {
            let src: Vec<f32> = (0..n).map(|i| i as f32 * 0.37 - 11.0).collect();
            let mut h = vec![0u16; n];
            let mut b = vec![0u16; n];
            f32_to_f16_slice(&src, &mut h);
            f32_to_bf16_slice(&src, &mut b);
            for i in 0..n {
                assert_eq!(h[i], f16::from_f32(src[i]).to_bits(), "f16 n={n} i={i}");
                assert_eq!(b[i], bf16::from_f32(src[i]).to_bits(), "bf16 n={n} i={i}");
            }
            let mut back = vec![0f32; n];
            f16_to_f32_slice(&h, &mut back);
            for i in 0..n {
                assert_eq!(back[i], f16::from_bits(h[i]).to_f32(), "f16 back n={n}");
            }
            bf16_to_f32_slice(&b, &mut back);
            for i in 0..n {
                assert_eq!(back[i], bf16::from_bits(b[i]).to_f32(), "bf16 back n={n}");
            }
        }
    }
}
