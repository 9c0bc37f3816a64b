//! Fuzz targets for this crate's decoders of untrusted bytes: request and
//! response frames, the frame reader, both sides of the handshake and
//! write tickets (see [`crate::fuzz`] for the time budget).

use crate::auth::{AuthKey, WriteTicket};
use crate::framing::{self, client_handshake, server_handshake, Hello, Service};
use crate::fuzz;
use crate::proto::{
    encode_request, MasterRequest, MasterResponse, ObjectInfo, PutStartItem, ReplicaLoc,
    RequestFrame, SegmentDesc, WriteConfig,
};
use crate::ErrorCode;
use proptest::prelude::*;
use std::io::{self, Read, Write};

fn body_of(frame: Vec<u8>) -> Vec<u8> {
    frame[4..].to_vec()
}

fn request_seeds() -> Vec<Vec<u8>> {
    let reqs = [
        MasterRequest::Ping {
            client_id: "c".into(),
        },
        MasterRequest::MountSegment {
            client_id: "c".into(),
            segment: SegmentDesc {
                name: "h:1".into(),
                uuid: "u".into(),
                size: 1 << 20,
                base_addr: 4096,
                host_id: "x".into(),
                pid: 7,
                endpoint: "h:1".into(),
                socket_name: "s".into(),
            },
        },
        MasterRequest::PutStart {
            keys: vec!["a".into(), "b".into()],
            sizes: vec![1, u64::MAX],
            config: WriteConfig {
                soft_pin_ttl_ms: Some(5),
                preferred_segments: vec!["h:1".into()],
                writer_segment: Some("h:2".into()),
                ..WriteConfig::default()
            },
            upsert: true,
            exclude: vec!["h:3".into()],
        },
        MasterRequest::GetReplicaList {
            keys: vec!["k".into()],
            track: true,
        },
        MasterRequest::RemoveByRegex {
            pattern: "(a|b)*".into(),
            force: false,
        },
        MasterRequest::ReadsDone {
            tickets: vec![1, 2, 3],
        },
    ];
    reqs.iter()
        .map(|r| body_of(encode_request(r, &[9, 10]).expect("encode")))
        .collect()
}

fn response_seeds() -> Vec<Vec<u8>> {
    let loc = ReplicaLoc {
        segment_name: "h:1".into(),
        segment_uuid: "u".into(),
        endpoint: "h:1".into(),
        host_id: "x".into(),
        socket_name: "s".into(),
        segment_size: 1 << 20,
        base_addr: 0,
        offset: 64,
        size: 10,
        ticket: Some(WriteTicket::sign(
            &AuthKey::new("k").expect("key"),
            "u",
            64,
            10,
            1,
        )),
    };
    let resps = [
        MasterResponse::Pong { need_remount: true },
        MasterResponse::PutStart(vec![
            PutStartItem::Write {
                replicas: vec![loc.clone()],
                version: 7,
            },
            PutStartItem::AlreadyExists,
            PutStartItem::Err(ErrorCode::NoAvailableHandle),
        ]),
        MasterResponse::Objects(vec![
            Ok(ObjectInfo {
                size: 10,
                replicas: vec![loc],
                disk: None,
                lease_ttl_ms: 5,
                read_ticket: 3,
            }),
            Err(ErrorCode::ObjectNotFound),
        ]),
        MasterResponse::Codes(vec![0, -704]),
        MasterResponse::Count(-600),
    ];
    resps
        .iter()
        .map(|r| framing::encode(r).expect("encode"))
        .collect()
}

#[test]
fn fuzz_master_request_frames() {
    fuzz::run("master_request", fuzz::inputs(request_seeds(), 512), |b| {
        if let Ok(f) = framing::decode::<RequestFrame>(&b) {
            // Whatever decodes re-encodes to the same bytes.
            let again = body_of(encode_request(&f.req, &f.done).expect("encode"));
            prop_assert_eq!(again, b);
        }
        Ok(())
    });
}

#[test]
fn fuzz_master_response_frames() {
    fuzz::run(
        "master_response",
        fuzz::inputs(response_seeds(), 512),
        |b| {
            if let Ok(r) = framing::decode::<MasterResponse>(&b) {
                prop_assert_eq!(framing::encode(&r).expect("encode"), b);
            }
            Ok(())
        },
    );
}

#[test]
fn fuzz_frame_reader() {
    let seeds = vec![
        vec![3, 0, 0, 0, 1, 2, 3],
        vec![0, 0, 1, 0, 9, 9],
        vec![255, 255, 255, 255],
    ];
    fuzz::run("frame_reader", fuzz::inputs(seeds, 256), |b| {
        for max in [
            0usize,
            16,
            framing::MAX_HANDSHAKE_FRAME,
            framing::MAX_REQUEST_FRAME,
        ] {
            if let Ok(body) = framing::read_frame(&mut &b[..], max) {
                prop_assert!(body.len() <= max && body.len() + 4 <= b.len());
            }
        }
        Ok(())
    });
}

/// A stream that reads scripted bytes and swallows writes.
struct Scripted<'a> {
    input: &'a [u8],
    written: Vec<u8>,
}

impl<'a> Scripted<'a> {
    /// A stream that reads `input` and keeps what is written.
    fn new(input: &'a [u8]) -> Self {
        Scripted {
            input,
            written: Vec::new(),
        }
    }
}

impl Read for Scripted<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.input.read(buf)
    }
}

impl Write for Scripted<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.written.extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

fn handshake_seeds() -> Vec<Vec<u8>> {
    let hello = framing::encode(&Hello::new(Service::Data)).expect("hello");
    let mut frames = Vec::new();
    for body in [hello.clone(), vec![7u8; 33], vec![1u8; 32], vec![1u8; 33]] {
        frames.extend_from_slice(&(body.len() as u32).to_le_bytes());
        frames.extend_from_slice(&body);
    }
    vec![frames, hello]
}

/// One side of the handshake over fuzzed peer bytes: with a secret it
/// never passes, without one it only returns.
fn fuzz_handshake_side(
    name: &str,
    shake: impl Fn(&mut Scripted<'_>, Service, Option<&AuthKey>) -> io::Result<()>,
) {
    let key = AuthKey::new("cluster").expect("key");
    fuzz::run(name, fuzz::inputs(handshake_seeds(), 256), |b| {
        prop_assert!(shake(&mut Scripted::new(&b), Service::Data, Some(&key)).is_err());
        let _ = shake(&mut Scripted::new(&b), Service::Data, None);
        Ok(())
    });
}

#[test]
fn fuzz_handshake_accepting_side() {
    // Nobody without the secret passes: the proof covers our fresh nonce.
    fuzz_handshake_side("server_handshake", |s, svc, key| {
        server_handshake(s, svc, key)
    });
}

#[test]
fn fuzz_handshake_connecting_side() {
    // A peer cannot fake the proof over our fresh nonce.
    fuzz_handshake_side("client_handshake", |s, svc, key| {
        client_handshake(s, svc, key)
    });
}

#[test]
fn fuzz_write_tickets() {
    let key = AuthKey::new("cluster").expect("key");
    let strategy = (
        proptest::array::uniform32(any::<u8>()),
        any::<[u64; 3]>(),
        any::<(u64, u64)>(),
    );
    fuzz::run("write_ticket", strategy, |(mac, [o, l, e], (qo, ql))| {
        let t = WriteTicket {
            offset: o,
            len: l,
            expires_ms: e,
            mac,
        };
        prop_assert!(t.check(&key, "seg", 0).is_err());
        let covered = t.covers(qo, ql);
        if covered {
            prop_assert!(qo >= o && qo.checked_add(ql).is_some());
        }
        prop_assert_eq!(WriteTicket::from_bytes(&t.to_bytes()), t);
        Ok(())
    });
}
