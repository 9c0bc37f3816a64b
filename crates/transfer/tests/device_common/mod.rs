//! Helpers of the device transfer tests: host memory standing in for
//! device memory ([`HostDevice`]).

#![allow(dead_code, missing_docs, unreachable_pub)]

use mooncake_transfer::engine::device::{self, HostDevice};
use mooncake_transfer::engine::{Opcode, TransferEngine, P2PHANDSHAKE};

pub const CHUNK: usize = 64 << 10;

pub fn fake() -> &'static HostDevice {
    static F: std::sync::OnceLock<&'static HostDevice> = std::sync::OnceLock::new();
    F.get_or_init(|| {
        let h = HostDevice::leak();
        device::install(h, CHUNK);
        h
    })
}

pub fn engine() -> TransferEngine {
    let e = TransferEngine::new();
    e.initialize("127.0.0.1", P2PHANDSHAKE, "tcp", "").unwrap();
    e
}

pub fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 12) as u8)
        .collect()
}

/// A "device" buffer on `ordinal` holding `bytes`.
pub fn device_buf(bytes: &[u8], ordinal: i32) -> u64 {
    let a = fake().alloc(bytes.len(), ordinal);
    // SAFETY: `a` is a fresh allocation of bytes.len() bytes.
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), a as *mut u8, bytes.len()) };
    a
}

/// A host buffer (leaked) holding `bytes`.
pub fn host_buf(bytes: &[u8]) -> u64 {
    Box::leak(bytes.to_vec().into_boxed_slice()).as_mut_ptr() as u64
}

pub fn read(addr: u64, n: usize) -> Vec<u8> {
    // SAFETY: the tests' buffers are leaked, valid for the process.
    unsafe { std::slice::from_raw_parts(addr as *const u8, n) }.to_vec()
}

pub fn register(e: &TransferEngine, addr: u64, n: usize) {
    // SAFETY: every test buffer is leaked: valid for the process.
    unsafe { e.register_memory(addr, n as u64, "*") }.unwrap();
}

/// Zeroed buffers of `n` bytes, each registered at its engine: device
/// memory (ordinal 0 at `a`, `b_ordinal` at `b`) and host memory at both;
/// `(ad, bd, ah, bh)`.
pub fn buffers(
    a: &TransferEngine,
    b: &TransferEngine,
    n: usize,
    b_ordinal: i32,
) -> (u64, u64, u64, u64) {
    let (ad, bd) = (
        device_buf(&vec![0; n], 0),
        device_buf(&vec![0; n], b_ordinal),
    );
    let (ah, bh) = (host_buf(&vec![0; n]), host_buf(&vec![0; n]));
    for (e, x) in [(a, ad), (a, ah), (b, bd), (b, bh)] {
        register(e, x, n);
    }
    (ad, bd, ah, bh)
}

/// Copy `bytes` to `addr` (device or host memory) through the device.
fn put(addr: u64, bytes: &[u8]) {
    // SAFETY: `addr` is one of the tests' leaked buffers, holding the
    // `bytes.len()` bytes that `round_trip` moves.
    unsafe {
        device::current()
            .unwrap()
            .copy(addr, bytes.as_ptr() as u64, bytes.len() as u64)
    }
    .unwrap();
}

/// Move `n` bytes between `local` of `a` and `remote` of `b` both ways and
/// check the bytes each time.
pub fn round_trip(a: &TransferEngine, b: &TransferEngine, local: u64, remote: u64, n: usize) {
    let name = b.name().unwrap();
    let range = [(local, remote, n as u64)];
    let want = pattern(n, 7);
    put(local, &want);
    a.transfer(&name, Opcode::Write, &range, None).unwrap();
    assert_eq!(read(remote, n), want, "write of {n} bytes");
    let back = pattern(n, 99);
    put(remote, &back);
    a.transfer(&name, Opcode::Read, &range, None).unwrap();
    assert_eq!(read(local, n), back, "read of {n} bytes");
}
