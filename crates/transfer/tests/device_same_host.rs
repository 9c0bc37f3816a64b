//! Device memory between two engines of one host (Unix socket route):
//! CUDA IPC where the target can map the handle, else staging (the
//! fallback logged once); host memory at one end and device memory at the
//! other take the socket path, where the target stages its device side.

mod device_common;
use device_common::*;
use mooncake_transfer::engine::device;
use mooncake_transfer::engine::{ErrorKind, Opcode};
use std::sync::atomic::Ordering;

#[test]
fn device_memory_moves_between_engines_of_one_host() {
    let f = fake();
    let (a, b) = (engine(), engine());
    let n = 3 * CHUNK + 4097;
    let (ad, bd, ah, bh) = buffers(&a, &b, n, 1);
    // Device memory is registered at its device.
    let locs: Vec<String> = b.registry().regions().into_iter().map(|r| r.2).collect();
    assert_eq!(locs, vec!["cuda:1".to_string(), "*".to_string()]);

    // Device to device, and device to host: the target maps the IPC handle.
    round_trip(&a, &b, ad, bd, n);
    round_trip(&a, &b, ad, bh, n);
    let opened = f.ipc_opened.load(Ordering::Relaxed);
    assert_eq!(opened, 4);
    // Host to device: the socket path, staged by the target.
    round_trip(&a, &b, ah, bd, n);
    // A batch mixing host and device buffers.
    let name = b.name().unwrap();
    let items = [
        (ah, bd, 1000),
        (ad + 1000, bh + 1000, 70_000),
        (ah + 80_000, bh + 80_000, 10),
    ];
    a.transfer(&name, Opcode::Write, &items, None).unwrap();
    assert_eq!(read(bd, 1000), read(ah, 1000));
    assert_eq!(read(bh + 1000, 70_000), read(ad + 1000, 70_000));
    assert_eq!(read(bh + 80_000, 10), read(ah + 80_000, 10));

    // A target range past the end of its device region: refused.
    let e = a
        .transfer(&name, Opcode::Write, &[(ad, bd + n as u64 - 5, 10)], None)
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::OutOfBounds);
    let e = a
        .transfer(&name, Opcode::Write, &[(ah, bd + n as u64 - 5, 10)], None)
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::OutOfBounds);

    // write_bytes / read_bytes of device memory.
    b.write_bytes(bd + 5, b"device").unwrap();
    assert_eq!(b.read_bytes(bd + 5, 6).unwrap(), b"device");

    // A stream-ordered transfer waits for the stream, then moves.
    let synced = f.synced.load(Ordering::Relaxed);
    a.transfer_on_cuda(&name, Opcode::Write, &[(ad, bd, 4096)], 0)
        .unwrap();
    assert_eq!(f.synced.load(Ordering::Relaxed), synced + 1);

    // The driver refuses IPC: staged from now on, the fallback logged once.
    assert!(!device::ipc_denied());
    let opened = f.ipc_opened.load(Ordering::Relaxed);
    f.refuse_ipc.store(true, Ordering::Relaxed);
    round_trip(&a, &b, ad, bd, n);
    assert!(device::ipc_denied());
    f.refuse_ipc.store(false, Ordering::Relaxed);
    round_trip(&a, &b, ad, bh, n);
    assert_eq!(
        f.ipc_opened.load(Ordering::Relaxed),
        opened,
        "no IPC attempt after the refusal"
    );

    // A failing device copy fails the transfer; the engines stay usable.
    f.fail_copy
        .store(f.copy_count() as u64 + 2, Ordering::Relaxed);
    let e = a.transfer(&name, Opcode::Write, &[(ad, bh, n as u64)], None);
    assert!(e.is_err());
    round_trip(&a, &b, ad, bd, n);
    round_trip(&a, &b, ah, bd, 10);
}
