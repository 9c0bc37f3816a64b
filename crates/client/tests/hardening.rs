//! Hardening against broken or hostile peers, with a real master and real
//! clients: a segment whose owner does not serve (a fake mount, or an owner
//! that stopped heartbeating) must not make honest puts fail.

use mooncake_client::{Client, ClientConfig, ReplicateConfig};
use mooncake_common::framing::{self, client_handshake, Service};
use mooncake_common::proto::{encode_request, MasterRequest, MasterResponse, SegmentDesc};
use mooncake_master::config::MasterConfig;
use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

fn client(master: &str, seg: u64) -> Arc<Client> {
    Client::setup(ClientConfig::loopback(master, seg)).expect("client setup")
}

fn rpc(master: &str, req: &MasterRequest) -> MasterResponse {
    let mut s = TcpStream::connect(master).expect("connect master");
    s.set_read_timeout(Some(Duration::from_secs(10))).ok();
    client_handshake(&mut s, Service::Master, None).expect("handshake");
    s.write_all(&encode_request(req, &[]).expect("encode"))
        .expect("send");
    let body = framing::read_frame(&mut s, 1 << 20).expect("reply");
    framing::decode(&body).expect("decode")
}

/// A port that accepts and immediately closes every connection, counting them.
fn counting_port() -> (String, Arc<AtomicUsize>) {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().expect("addr").to_string();
    let n = Arc::new(AtomicUsize::new(0));
    let c = Arc::clone(&n);
    std::thread::spawn(move || {
        for s in l.incoming() {
            c.fetch_add(1, Ordering::SeqCst);
            drop(s);
        }
    });
    (addr, n)
}

#[test]
fn puts_avoid_a_segment_whose_owner_does_not_serve() {
    let m = mooncake_master::embedded::spawn_loopback(MasterConfig {
        client_ttl_sec: 60,
        ..MasterConfig::default()
    })
    .expect("master");
    let a = client(&m, 64 << 20);
    let (fake_ep, hits) = counting_port();
    // A 1 TiB segment mounted by a "client" that never pings or serves.
    let r = rpc(
        &m,
        &MasterRequest::MountSegment {
            client_id: "fake".into(),
            segment: SegmentDesc {
                name: fake_ep.clone(),
                uuid: "fake-uuid".into(),
                size: 1 << 40,
                base_addr: 1 << 40,
                host_id: "another-host".into(),
                pid: 1,
                endpoint: fake_ep.clone(),
                socket_name: String::new(),
            },
        },
    );
    assert_eq!(r, MasterResponse::Ok);
    let data = vec![7u8; 4096];
    for replicas in [1u64, 2] {
        let cfg = ReplicateConfig {
            replica_num: replicas,
            ..ReplicateConfig::default()
        };
        for i in 0..30 {
            let key = format!("r{replicas}-{i}");
            assert_eq!(a.put(&key, &data, &cfg, false), Ok(()), "{key}");
            assert_eq!(a.get(&key).expect("get").data, data, "{key}");
        }
    }
    // Once its owner has missed a heartbeat the segment is suspect: puts
    // are no longer even tried there.
    std::thread::sleep(Duration::from_secs(3));
    let before = hits.load(Ordering::SeqCst);
    let cfg = ReplicateConfig::default();
    for i in 0..30 {
        let key = format!("late-{i}");
        assert_eq!(a.put(&key, &data, &cfg, false), Ok(()), "{key}");
    }
    assert_eq!(
        hits.load(Ordering::SeqCst),
        before,
        "puts still tried the suspect segment"
    );
    a.close();
}
