//! Little-endian field access at fixed offsets, shared by the header and
//! manifest codecs. Reads past the end of the slice yield 0 (callers check
//! lengths first; this keeps arbitrary input from ever panicking).

fn array<const N: usize>(b: &[u8], off: usize) -> [u8; N] {
    let mut out = [0u8; N];
    if let Some(s) = off.checked_add(N).and_then(|end| b.get(off..end)) {
        out.copy_from_slice(s);
    }
    out
}

fn put<const N: usize>(b: &mut [u8], off: usize, v: [u8; N]) {
    if let Some(s) = off.checked_add(N).and_then(|end| b.get_mut(off..end)) {
        s.copy_from_slice(&v);
    }
}

pub(crate) fn u16_at(b: &[u8], off: usize) -> u16 {
    u16::from_le_bytes(array(b, off))
}
pub(crate) fn u32_at(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes(array(b, off))
}
pub(crate) fn i32_at(b: &[u8], off: usize) -> i32 {
    i32::from_le_bytes(array(b, off))
}
pub(crate) fn u64_at(b: &[u8], off: usize) -> u64 {
    u64::from_le_bytes(array(b, off))
}
pub(crate) fn i64_at(b: &[u8], off: usize) -> i64 {
    i64::from_le_bytes(array(b, off))
}
pub(crate) fn put_u16(b: &mut [u8], off: usize, v: u16) {
    put(b, off, v.to_le_bytes());
}
pub(crate) fn put_u32(b: &mut [u8], off: usize, v: u32) {
    put(b, off, v.to_le_bytes());
}
pub(crate) fn put_i32(b: &mut [u8], off: usize, v: i32) {
    put(b, off, v.to_le_bytes());
}
pub(crate) fn put_u64(b: &mut [u8], off: usize, v: u64) {
    put(b, off, v.to_le_bytes());
}
pub(crate) fn put_i64(b: &mut [u8], off: usize, v: i64) {
    put(b, off, v.to_le_bytes());
}
