//! Regression tests of issue 10 items 4 and 5: the same-host mapping
//! server answers every connection (concurrently) and keeps no descriptor
//! per answered request.

use mooncake_transfer::same_host::{map_remote, socket_name, MappingServer};
use mooncake_transfer::segment::Segment;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixStream};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The tests count this process's descriptors: run them one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count())
}

/// Issue 10 item 4: 300 answered mapping requests used to leave 300
/// descriptors open in the owner.
#[test]
fn answered_mapping_connections_are_closed() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let seg = Segment::create(1 << 20).expect("segment");
    let server = MappingServer::start(seg.clone()).expect("mapping server");
    let name = socket_name(seg.uuid());
    // One mapping first, so lazily created process state is not counted.
    drop(map_remote(&name, seg.uuid(), seg.size()).expect("map"));
    let before = open_fds();
    for _ in 0..300 {
        let m = map_remote(&name, seg.uuid(), seg.size()).expect("map");
        drop(m);
    }
    // The owner closes its end after answering; allow it a moment to do so.
    let deadline = Instant::now() + Duration::from_secs(10);
    while open_fds() > before + 8 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let after = open_fds();
    assert!(
        after <= before + 8,
        "descriptors grew from {before} to {after} over 300 mapping requests"
    );
    server.stop();
}

/// Issue 10 item 5: three idle local connections stalled a reader for 2 s
/// each (one connection served at a time), so its own 2 s wait ran out.
#[test]
fn idle_connections_do_not_stall_a_mapping_reader() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let seg = Segment::create(1 << 20).expect("segment");
    let server = MappingServer::start(seg.clone()).expect("mapping server");
    let name = socket_name(seg.uuid());
    let addr = SocketAddr::from_abstract_name(name.as_bytes()).expect("addr");
    let idle: Vec<UnixStream> = (0..3)
        .map(|_| UnixStream::connect_addr(&addr).expect("idle connect"))
        .collect();
    let m = map_remote(&name, seg.uuid(), seg.size());
    assert!(m.is_ok(), "reader failed behind idle connections: {:?}", m.err());
    drop(idle);
    server.stop();
}
