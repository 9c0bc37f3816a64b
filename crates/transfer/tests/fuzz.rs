//! Fuzz targets for the transfer crate's decoders of untrusted bytes: the
//! data-request header, whole data-server sessions against a live
//! server, and mapping requests against a live mapping server. The budget
//! per target is `MC_FUZZ_SECS` (see `mooncake_common::fuzz`).

use mooncake_common::framing::{self, Hello, Service};
use mooncake_common::fuzz;
use mooncake_common::{AuthKey, WriteTicket};
use mooncake_transfer::data_path::data_proto::{
    encode_header, RequestHeader, MAX_RANGES, OP_READ, OP_WRITE,
};
use mooncake_transfer::data_path::data_server::DataServer;
use mooncake_transfer::data_path::tcp_pool::TcpPool;
use mooncake_transfer::same_host::mapping::{map_remote, socket_name, MappingServer};
use mooncake_transfer::segment::Segment;
use mooncake_transfer::{Op, Stores};
use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
use proptest::prelude::*;
use std::io::{IoSliceMut, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixStream};
use std::sync::Arc;
use std::time::Duration;

fn header_seeds() -> Vec<Vec<u8>> {
    let key = AuthKey::new("k").expect("key");
    let t = WriteTicket::sign(&key, "seg", 0, 4096, u64::MAX);
    vec![
        encode_header(OP_READ, "seg", None, [(0u64, 10u64), (64, 3)].into_iter()),
        encode_header(OP_WRITE, "seg", None, [(4096u64, 1u64 << 33)].into_iter()),
        encode_header(OP_WRITE, "seg", Some(&t), [(0u64, 100u64)].into_iter()),
    ]
}

#[test]
fn fuzz_data_request_header() {
    fuzz::run("data_header", fuzz::inputs(header_seeds(), 512), |b| {
        if let Ok(h) = RequestHeader::read_from(&mut &b[..]) {
            prop_assert!(h.ranges.len() <= MAX_RANGES);
            prop_assert!(h.uuid.len() <= 255);
            let _ = h.total();
        }
        Ok(())
    });
}

/// A client hello and auth frame (no token), then `rest`.
fn session_seed(rest: &[u8]) -> Vec<u8> {
    let mut b = Vec::new();
    let hello = framing::encode(&Hello::new(Service::Data)).expect("hello");
    for body in [hello, vec![5u8; 32].into_iter().chain([0u8]).collect()] {
        b.extend_from_slice(&(body.len() as u32).to_le_bytes());
        b.extend_from_slice(&body);
    }
    b.extend_from_slice(rest);
    b
}

/// Send `bytes` on a fresh connection, close our side, drain the answer.
fn session(ep: &str, bytes: &[u8]) {
    let Ok(mut s) = TcpStream::connect(ep) else {
        return;
    };
    s.set_read_timeout(Some(Duration::from_secs(20))).ok();
    let _ = s.write_all(bytes);
    let _ = s.shutdown(Shutdown::Write);
    let mut sink = [0u8; 4096];
    while matches!(s.read(&mut sink), Ok(n) if n > 0) {}
}

fn zeroed(seg: &Segment) -> bool {
    // SAFETY: the whole mapping; written only by the data server, which
    // serves no request while the check runs (each session ended).
    unsafe { std::slice::from_raw_parts(seg.base(), seg.size() as usize) }
        .iter()
        .all(|&b| b == 0)
}

#[test]
fn fuzz_data_server_sessions() {
    let key = AuthKey::new("cluster").expect("key");
    let seg = Segment::create(64 << 10).expect("segment");
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let keyed = DataServer::start(l, Some(seg.clone()), Some(key.clone())).expect("server");
    let keyed_ep = keyed.addr().to_string();
    let open_seg = Segment::create(64 << 10).expect("segment");
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let open = DataServer::start(l, Some(open_seg.clone()), None).expect("server");
    let open_ep = open.addr().to_string();
    let mut write = encode_header(OP_WRITE, seg.uuid(), None, [(128u64, 8u64)].into_iter());
    write.extend_from_slice(b"payload!");
    let mut open_write = encode_header(
        OP_WRITE,
        open_seg.uuid(),
        None,
        [(128u64, 8u64)].into_iter(),
    );
    open_write.extend_from_slice(b"payload!");
    let read = encode_header(OP_READ, seg.uuid(), None, [(0u64, 64u64)].into_iter());
    let seeds = vec![
        session_seed(&write),
        session_seed(&open_write),
        session_seed(&read),
        session_seed(&[]),
    ];
    fuzz::run("data_sessions", fuzz::inputs(seeds, 512), |b| {
        session(&keyed_ep, &b);
        session(&open_ep, &b);
        // Without the token nothing lands in the keyed server's segment.
        prop_assert!(zeroed(&seg));
        Ok(())
    });
    // Both servers still serve an honest peer.
    let mut back = vec![1u8; 64];
    let ops = vec![Op {
        seg_offset: 0,
        local_ptr: back.as_mut_ptr() as usize,
        len: 64,
    }];
    // SAFETY: `back` is writable for the call.
    let r =
        unsafe { TcpPool::global().read(&keyed_ep, seg.uuid(), &ops, Some(&key), Stores::Cached) };
    assert!(r.is_ok(), "{r:?}");
    assert_eq!(back, vec![0u8; 64]);
    // SAFETY: as above.
    let r =
        unsafe { TcpPool::global().read(&open_ep, open_seg.uuid(), &ops, None, Stores::Streaming) };
    assert!(r.is_ok(), "{r:?}");
    keyed.stop();
    open.stop();
}

/// Send `bytes` to a mapping socket; the descriptors the owner sent back.
fn mapping_request(name: &str, bytes: &[u8]) -> Vec<OwnedFd> {
    let Ok(addr) = SocketAddr::from_abstract_name(name.as_bytes()) else {
        return Vec::new();
    };
    let Ok(mut c) = UnixStream::connect_addr(&addr) else {
        return Vec::new();
    };
    c.set_read_timeout(Some(Duration::from_secs(20))).ok();
    let _ = c.write_all(bytes);
    let _ = c.shutdown(Shutdown::Write);
    let mut fds = Vec::new();
    loop {
        let mut buf = [0u8; 256];
        let mut cmsg = nix::cmsg_space!([RawFd; 4]);
        let mut iov = [IoSliceMut::new(&mut buf)];
        let Ok(msg) = recvmsg::<()>(
            c.as_raw_fd(),
            &mut iov,
            Some(&mut cmsg),
            MsgFlags::MSG_CMSG_CLOEXEC,
        ) else {
            break;
        };
        if let Ok(cms) = msg.cmsgs() {
            for cm in cms {
                if let ControlMessageOwned::ScmRights(v) = cm {
                    for fd in v {
                        // SAFETY: just received; owned by nobody else.
                        fds.push(unsafe { OwnedFd::from_raw_fd(fd) });
                    }
                }
            }
        }
        if msg.bytes == 0 {
            break;
        }
    }
    fds
}

#[test]
fn fuzz_mapping_requests() {
    let key = AuthKey::new("cluster").expect("key");
    let seg = Segment::create(1 << 16).expect("segment");
    let server = MappingServer::start(Arc::clone(&seg), Some(key.clone())).expect("server");
    let name = socket_name(seg.uuid());
    let u = seg.uuid().as_bytes();
    let mut valid = vec![u.len() as u8];
    valid.extend_from_slice(u);
    valid.push(1);
    valid.extend_from_slice(&[3u8; 32]);
    let mut with_proof = valid.clone();
    with_proof.extend_from_slice(&[4u8; 32]);
    fuzz::run(
        "mapping_requests",
        fuzz::inputs(vec![valid, with_proof], 384),
        |b| {
            // Nobody without the secret gets the segment's descriptor.
            prop_assert!(mapping_request(&name, &b).is_empty());
            Ok(())
        },
    );
    // The owner still serves a reader with the token.
    assert!(map_remote(&name, seg.uuid(), seg.size(), Some(&key)).is_ok());
    server.stop();
}
