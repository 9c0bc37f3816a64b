//! The data server under a cluster token and under connection limits:
//! peers must prove the token, writes need the master's ticket
//! for exactly the range they touch, and connections are capped and closed
//! when idle.

use mooncake_common::auth::unix_ms;
use mooncake_common::framing::{client_handshake, Service};
use mooncake_common::limits::ConnLimits;
use mooncake_common::{AuthKey, ErrorCode, WriteTicket};
use mooncake_transfer::data_path::data_server::DataServer;
use mooncake_transfer::data_path::tcp_pool::TcpPool;
use mooncake_transfer::segment::Segment;
use mooncake_transfer::{Op, Stores};
use std::io::Read;
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::time::Duration;

fn server(key: Option<AuthKey>, limits: ConnLimits) -> (Arc<Segment>, DataServer, String) {
    let seg = Segment::create(1 << 20).expect("segment");
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let ds = DataServer::start_with(l, Some(seg.clone()), key, limits).expect("start");
    let ep = ds.addr().to_string();
    (seg, ds, ep)
}

fn roomy() -> ConnLimits {
    ConnLimits {
        max_total: 64,
        max_per_peer: 64,
        idle_timeout: Some(Duration::from_secs(60)),
    }
}

fn op(buf: &[u8], seg_offset: u64) -> Vec<Op> {
    vec![Op {
        seg_offset,
        local_ptr: buf.as_ptr() as usize,
        len: buf.len() as u64,
    }]
}

fn seg_bytes(seg: &Segment, at: usize, n: usize) -> Vec<u8> {
    // SAFETY: test ranges lie inside the 1 MiB segment.
    unsafe { std::slice::from_raw_parts(seg.base().add(at), n).to_vec() }
}

#[test]
fn writes_need_a_ticket_for_their_range() {
    let key = AuthKey::new("cluster").expect("key");
    let (seg, ds, ep) = server(Some(key.clone()), roomy());
    let pool = TcpPool::global();
    let data = vec![0xabu8; 4096];
    let later = unix_ms() + 60_000;
    let good = WriteTicket::sign(&key, seg.uuid(), 8192, 4096, later);
    // SAFETY: `data` is readable for the call.
    let w = |at: u64, t: Option<&WriteTicket>, k: Option<&AuthKey>| unsafe {
        pool.write(&ep, seg.uuid(), &op(&data, at), k, t)
            .map_err(|e| e.code())
    };
    assert_eq!(w(8192, Some(&good), Some(&key)), Ok(()));
    assert_eq!(seg_bytes(&seg, 8192, 4096), data);
    // Without a ticket, outside it, forged, expired, for another segment.
    let forged = WriteTicket {
        mac: [0u8; 32],
        ..good
    };
    let expired = WriteTicket::sign(&key, seg.uuid(), 0, 4096, unix_ms().saturating_sub(1000));
    let elsewhere = WriteTicket::sign(&key, "another-segment", 0, 4096, later);
    for (at, t) in [
        (0, None),
        (8192 + 64, Some(&good)),
        (0, Some(&forged)),
        (0, Some(&expired)),
        (0, Some(&elsewhere)),
    ] {
        assert!(w(at, t, Some(&key)).is_err(), "write at {at} with {t:?}");
    }
    assert_eq!(seg_bytes(&seg, 0, 4096), vec![0u8; 4096]);
    assert_eq!(seg_bytes(&seg, 8192 + 4096, 64), vec![0u8; 64]);
    // No token, or the wrong one: no session at all, for writes or reads.
    let other = AuthKey::new("other").expect("key");
    assert_eq!(w(8192, Some(&good), None), Err(ErrorCode::TransferFail));
    assert_eq!(
        w(8192, Some(&good), Some(&other)),
        Err(ErrorCode::TransferFail)
    );
    let mut back = vec![0u8; 4096];
    let rd = |k: Option<&AuthKey>, back: &mut Vec<u8>| {
        let ops = vec![Op {
            seg_offset: 8192,
            local_ptr: back.as_mut_ptr() as usize,
            len: 4096,
        }];
        // SAFETY: `back` is writable for the call.
        unsafe { pool.read(&ep, seg.uuid(), &ops, k, Stores::Cached) }.map_err(|e| e.code())
    };
    assert_eq!(rd(None, &mut back), Err(ErrorCode::TransferFail));
    assert_eq!(rd(Some(&key), &mut back), Ok(()));
    assert_eq!(back, data);
    ds.stop();
}

#[test]
fn without_a_token_writes_need_no_ticket() {
    let (seg, ds, ep) = server(None, roomy());
    let data = vec![7u8; 100];
    // SAFETY: `data` is readable for the call.
    let r = unsafe { TcpPool::global().write(&ep, seg.uuid(), &op(&data, 64), None, None) };
    assert!(r.is_ok(), "{r:?}");
    assert_eq!(seg_bytes(&seg, 64, 100), data);
    ds.stop();
}

fn closed_within(s: &mut TcpStream, secs: u64) -> bool {
    s.set_read_timeout(Some(Duration::from_secs(secs))).ok();
    let mut b = [0u8; 64];
    loop {
        match s.read(&mut b) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) => {
                return !matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                )
            }
        }
    }
}

#[test]
fn connections_are_capped_per_peer_and_closed_when_idle() {
    let limits = ConnLimits {
        max_total: 16,
        max_per_peer: 2,
        idle_timeout: Some(Duration::from_secs(1)),
    };
    let (_seg, ds, ep) = server(None, limits);
    let mut a = TcpStream::connect(&ep).expect("a");
    client_handshake(&mut a, Service::Data, None).expect("handshake a");
    let mut b = TcpStream::connect(&ep).expect("b");
    let mut c = TcpStream::connect(&ep).expect("c");
    // The third is refused: closed without a handshake.
    assert!(closed_within(&mut c, 20), "connection over the cap kept");
    // The idle ones (one after the handshake, one silent) are closed.
    assert!(closed_within(&mut a, 20), "idle session kept");
    assert!(closed_within(&mut b, 20), "silent connection kept");
    // Slots are free again.
    let mut d = TcpStream::connect(&ep).expect("d");
    client_handshake(&mut d, Service::Data, None).expect("handshake d");
    ds.stop();
}

/// A raw data connection: handshake done, ready for requests.
fn raw_conn(ep: &str) -> TcpStream {
    let mut s = TcpStream::connect(ep).expect("connect");
    client_handshake(&mut s, Service::Data, None).expect("handshake");
    s
}

#[test]
fn a_write_fence_refuses_what_connections_from_before_it_still_carry() {
    use mooncake_transfer::data_path::data_proto::{encode_header, OP_WRITE};
    use std::io::Write;
    let (seg, ds, ep) = server(None, roomy());
    // A write whose header and first half arrived before the fence (its
    // second half is still on the network, as across a partition).
    let mut stale = raw_conn(&ep);
    let mut queued = raw_conn(&ep);
    let n = 8192usize;
    let hdr = encode_header(OP_WRITE, seg.uuid(), None, [(0u64, n as u64)].into_iter());
    stale.write_all(&hdr).expect("header");
    stale.write_all(&vec![0x11u8; n / 2]).expect("first half");
    // Let the server take the first half in.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while seg_bytes(&seg, 0, n / 2) != vec![0x11u8; n / 2] {
        assert!(
            std::time::Instant::now() < deadline,
            "first half never landed"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    // The fence shuts the connection down at once (the write would
    // otherwise hold it until the idle timeout, a minute here).
    let ds = Arc::new(ds);
    let fencer = std::thread::spawn({
        let ds = Arc::clone(&ds);
        move || ds.fence_writes()
    });
    assert!(
        closed_within(&mut stale, 10),
        "the fence left the connection open"
    );
    fencer.join().expect("fence");
    // The rest arrives after the fence: it must not land.
    let _ = stale.write_all(&vec![0x11u8; n / 2]);
    // A whole request on another connection from before the fence: refused.
    let hdr2 = encode_header(OP_WRITE, seg.uuid(), None, [(n as u64, 64u64)].into_iter());
    let _ = queued.write_all(&hdr2);
    let _ = queued.write_all(&[0x22u8; 64]);
    assert!(
        closed_within(&mut queued, 10),
        "a connection from before the fence wrote"
    );
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(
        seg_bytes(&seg, n / 2, n / 2),
        vec![0u8; n / 2],
        "bytes after the fence landed"
    );
    assert_eq!(seg_bytes(&seg, n, 64), vec![0u8; 64]);
    // Writes on connections made after the fence go through.
    let data = vec![0x33u8; 256];
    // SAFETY: `data` is readable for the call.
    let r = unsafe { TcpPool::global().write(&ep, seg.uuid(), &op(&data, 1 << 16), None, None) };
    assert!(r.is_ok(), "{r:?}");
    assert_eq!(seg_bytes(&seg, 1 << 16, 256), data);
    ds.stop();
}
