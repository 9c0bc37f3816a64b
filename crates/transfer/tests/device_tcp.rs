//! Device memory between engines over TCP (as between hosts): staged
//! through pinned host memory at both ends.

mod device_common;
use device_common::*;
use mooncake_transfer::engine::Opcode;
use std::sync::atomic::Ordering;

#[test]
fn device_memory_moves_over_tcp_through_pinned_staging() {
    // Set before any engine starts (this test binary is its own process).
    std::env::set_var("MC_FORCE_TCP", "1");
    let f = fake();
    let (a, b) = (engine(), engine());
    let n = 5 * CHUNK + 123;
    let (ad, bd, ah, bh) = buffers(&a, &b, n, 0);
    round_trip(&a, &b, ad, bd, n);
    round_trip(&a, &b, ad, bh, n);
    round_trip(&a, &b, ah, bd, n);
    round_trip(&a, &b, ad, bd, 1);
    assert_eq!(
        f.ipc_opened.load(Ordering::Relaxed),
        0,
        "no IPC between hosts"
    );
    // Several device items in one batch keep their order and offsets.
    let name = b.name().unwrap();
    let items: Vec<_> = (0..4u64)
        .map(|k| (ad + k * 70_000, bd + (3 - k) * 70_000, 70_000))
        .collect();
    a.transfer(&name, Opcode::Write, &items, None).unwrap();
    for k in 0..4u64 {
        assert_eq!(
            read(bd + (3 - k) * 70_000, 70_000),
            read(ad + k * 70_000, 70_000)
        );
    }
    // A device copy failing at the target breaks that transfer only.
    f.fail_copy
        .store(f.copy_count() as u64 + 2, Ordering::Relaxed);
    assert!(a
        .transfer(&name, Opcode::Write, &[(ah, bd, n as u64)], None)
        .is_err());
    round_trip(&a, &b, ad, bd, n);
}
