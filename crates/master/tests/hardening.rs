//! Hardening regression tests against the real
//! `mooncake_master` binary: a hostile peer on the RPC port must not crash
//! the master or empty the store.

use mooncake_common::framing::{self, client_handshake, Service};
use mooncake_common::ledger::{LedgerAck, LedgerPush};
use mooncake_common::proto::{
    encode_request, MasterRequest, MasterResponse, SegmentDesc, WriteConfig,
};
use mooncake_common::{AuthKey, ErrorCode};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_mooncake_master");

fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

/// A running master; killed when dropped.
struct Master {
    child: Child,
    rpc_port: u16,
    metrics_port: u16,
}

impl Drop for Master {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts a master on two free ports and waits until it listens. A port
/// found free can be taken by another test before the master binds it; the
/// master then exits, and it is started again on other ports.
fn start_master(extra: &[&str]) -> Master {
    for _ in 0..5 {
        let rpc_port = free_port();
        let metrics_port = free_port();
        let child = Command::new(BIN)
            .arg(format!("--rpc_port={rpc_port}"))
            .arg(format!("--metrics_port={metrics_port}"))
            .arg("--rpc_address=127.0.0.1")
            .arg("--metrics_host=127.0.0.1")
            .args(extra)
            .env_remove("MC_LOG_LEVEL")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn mooncake_master");
        let mut m = Master {
            child,
            rpc_port,
            metrics_port,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if matches!(m.child.try_wait(), Ok(Some(_))) {
                break;
            }
            // The metrics listener is bound after the RPC one (the RPC port
            // is not probed: a probe would count against its connection
            // cap, which one of these tests fills).
            if TcpStream::connect(("127.0.0.1", m.metrics_port)).is_ok()
                && m.child.try_wait().ok().flatten().is_none()
            {
                return m;
            }
            assert!(Instant::now() < deadline, "master never came up");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    panic!("master exited at start 5 times (ports taken?)");
}

fn try_connect(port: u16, key: Option<&AuthKey>) -> std::io::Result<TcpStream> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(20)))?;
    client_handshake(&mut s, Service::Master, key)?;
    Ok(s)
}

fn connect(port: u16) -> TcpStream {
    try_connect(port, None).expect("connect and handshake")
}

/// Play the owner of `segment`: keep its ledger stream and acknowledge
/// every push, as a real client does (the master waits for that before it
/// acknowledges a put). Runs until the master closes the stream.
fn serve_ledger(port: u16, client_id: &str, segment: &str) {
    let mut s = connect(port);
    let req = MasterRequest::LedgerStream {
        client_id: client_id.into(),
        segment_name: segment.into(),
    };
    assert_eq!(call(&mut s, &req), MasterResponse::Ok);
    std::thread::spawn(move || loop {
        let Ok(body) = framing::read_frame(&mut s, 1 << 20) else {
            return;
        };
        let Ok(push) = framing::decode::<LedgerPush>(&body) else {
            return;
        };
        let ack = framing::encode_frame(&LedgerAck { seq: push.seq }).expect("encode ack");
        if s.write_all(&ack).is_err() {
            return;
        }
    });
}

fn call(s: &mut TcpStream, req: &MasterRequest) -> MasterResponse {
    s.write_all(&encode_request(req, &[]).expect("encode"))
        .expect("send");
    let body = framing::read_frame(s, 1 << 20).expect("reply");
    framing::decode(&body).expect("decode")
}

fn segment(name: &str, size: u64) -> SegmentDesc {
    SegmentDesc {
        name: name.into(),
        uuid: format!("uuid-{name}"),
        size,
        base_addr: 1 << 40,
        host_id: "h".into(),
        pid: 1,
        endpoint: name.into(),
        socket_name: String::new(),
    }
}

fn metric(port: u16, name: &str) -> Option<u64> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect admin");
    s.set_read_timeout(Some(Duration::from_secs(10))).ok();
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .expect("write");
    let mut text = String::new();
    s.read_to_string(&mut text).expect("read");
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// A request frame nested thousands of levels deep (the
/// old `WithDone` envelope inside itself) overflowed the RPC thread's stack
/// and killed the master. It must be refused while the master keeps serving.
#[test]
fn deeply_nested_request_frame_does_not_kill_the_master() {
    let m = start_master(&[]);
    let mut s = connect(m.rpc_port);
    // bincode of WithDone { done: [], req: WithDone { ... RemoveAll { force: false } } }
    // in protocol 2, 5000 deep.
    let body = mooncake_common::fuzz::nested_request_body(5000);
    let mut frame = (body.len() as u32).to_le_bytes().to_vec();
    frame.extend_from_slice(&body);
    s.write_all(&frame).expect("send nested frame");
    // Whatever the answer (an error or a closed connection), drain it.
    let mut sink = Vec::new();
    let _ = s.read_to_end(&mut sink);
    // The master still serves a fresh connection.
    let mut s2 = connect(m.rpc_port);
    assert_eq!(
        call(
            &mut s2,
            &MasterRequest::Ping {
                client_id: "probe".into()
            }
        ),
        MasterResponse::Pong { need_remount: true }
    );
}

/// A MountSegment whose size makes the capacity sum wrap
/// (or that no client could map) must be refused with INVALID_PARAMS, and
/// the objects already stored must survive.
#[test]
fn segment_size_that_wraps_the_capacity_sum_is_rejected() {
    let m = start_master(&[]);
    let mut s = connect(m.rpc_port);
    let real = 1u64 << 20;
    assert_eq!(
        call(
            &mut s,
            &MasterRequest::MountSegment {
                client_id: "honest".into(),
                segment: segment("127.0.0.1:1", real),
            }
        ),
        MasterResponse::Ok
    );
    serve_ledger(m.rpc_port, "honest", "127.0.0.1:1");
    let keys: Vec<String> = (0..20).map(|i| format!("k{i}")).collect();
    let resp = call(
        &mut s,
        &MasterRequest::PutStart {
            keys: keys.clone(),
            sizes: vec![1000; keys.len()],
            config: WriteConfig::default(),
            upsert: false,
            exclude: Vec::new(),
        },
    );
    assert!(matches!(resp, MasterResponse::PutStart(ref v) if v.len() == keys.len()));
    assert_eq!(
        call(
            &mut s,
            &MasterRequest::PutEnd {
                keys: keys.clone(),
                versions: Vec::new()
            }
        ),
        MasterResponse::Ok
    );
    let wrap = u64::MAX - real + 1 + 128;
    for (i, size) in [wrap, u64::MAX, 1u64 << 62].into_iter().enumerate() {
        let r = call(
            &mut s,
            &MasterRequest::MountSegment {
                client_id: format!("evil{i}"),
                segment: segment(&format!("10.0.0.1:{i}"), size),
            },
        );
        assert_eq!(
            r,
            MasterResponse::Err(ErrorCode::InvalidParams),
            "size {size}"
        );
    }
    // Give the eviction pass (every 10 ms) time to act on a wrong total.
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        metric(m.metrics_port, "master_total_capacity_bytes"),
        Some(real)
    );
    assert_eq!(metric(m.metrics_port, "master_key_count"), Some(20));
    match call(
        &mut s,
        &MasterRequest::GetReplicaList {
            keys: keys.clone(),
            track: false,
        },
    ) {
        MasterResponse::Objects(v) => assert!(v.iter().all(|r| r.is_ok()), "{v:?}"),
        other => panic!("unexpected {other:?}"),
    }
}

/// With `--auth_token_file`, a peer without the token (or with another
/// one) gets no session; one with it does.
#[test]
fn rpc_requires_the_cluster_token_when_configured() {
    let dir = std::env::temp_dir().join(format!("mc-hardening-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("tmp dir");
    let token = dir.join("token");
    std::fs::write(&token, "cluster secret\n").expect("write token");
    let m = start_master(&[&format!("--auth_token_file={}", token.display())]);
    let e = try_connect(m.rpc_port, None).expect_err("no token");
    assert_eq!(e.kind(), std::io::ErrorKind::PermissionDenied, "{e}");
    let wrong = AuthKey::new("wrong").expect("key");
    let e = try_connect(m.rpc_port, Some(&wrong)).expect_err("wrong token");
    assert_eq!(e.kind(), std::io::ErrorKind::PermissionDenied, "{e}");
    let right = AuthKey::new("cluster secret").expect("key");
    let mut s = try_connect(m.rpc_port, Some(&right)).expect("right token");
    assert_eq!(
        call(
            &mut s,
            &MasterRequest::Ping {
                client_id: "c".into()
            }
        ),
        MasterResponse::Pong { need_remount: true }
    );
    // A master without a token is refused by a client that has one.
    let open = start_master(&[]);
    let e = try_connect(open.rpc_port, Some(&right)).expect_err("unauthenticated master");
    assert_eq!(e.kind(), std::io::ErrorKind::PermissionDenied, "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Connections over the per-peer cap are closed at once; the idle timeout
/// closes silent ones.
#[test]
fn rpc_connections_are_capped_and_idle_ones_closed() {
    let m = start_master(&[
        "--max_connections_per_peer=3",
        "--idle_connection_timeout_sec=1",
    ]);
    let held: Vec<TcpStream> = (0..3).map(|_| connect(m.rpc_port)).collect();
    let e = try_connect(m.rpc_port, None).expect_err("over the cap");
    assert!(
        matches!(
            e.kind(),
            std::io::ErrorKind::UnexpectedEof | std::io::ErrorKind::ConnectionReset
        ),
        "{e}"
    );
    // The held ones are closed by the master once idle.
    for mut s in held {
        let mut b = [0u8; 1];
        let n = s.read(&mut b);
        assert!(matches!(n, Ok(0) | Err(_)), "{n:?}");
    }
    // Slots free again: a new connection works.
    let mut s = connect(m.rpc_port);
    assert!(matches!(
        call(
            &mut s,
            &MasterRequest::Ping {
                client_id: "c".into()
            }
        ),
        MasterResponse::Pong { .. }
    ));
}
