//! Hardening regression tests of the same-host mapping server: it answers
//! every connection (concurrently) and keeps no descriptor
//! per answered request; with a cluster token only readers that prove it
//! get the segment; readers see the owner go.

use mooncake_common::AuthKey;
use mooncake_transfer::same_host::mapping::{map_remote, socket_name, MappingServer};
use mooncake_transfer::segment::Segment;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixStream};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The tests count this process's descriptors: run them one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

/// Hold for the whole test (see [`SERIAL`]).
fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// A new 1 MiB segment and a mapping server for it (with the cluster
/// token `key`).
fn served(key: Option<AuthKey>) -> (Arc<Segment>, MappingServer) {
    let seg = Segment::create(1 << 20).expect("segment");
    let server = MappingServer::start(seg.clone(), key).expect("mapping server");
    (seg, server)
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count())
}

/// 300 answered mapping requests used to leave 300
/// descriptors open in the owner.
#[test]
fn answered_mapping_connections_are_closed() {
    let _g = serial();
    let (seg, server) = served(None);
    let name = socket_name(seg.uuid());
    // One mapping first, so lazily created process state is not counted.
    drop(map_remote(&name, seg.uuid(), seg.size(), None).expect("map"));
    let before = open_fds();
    for _ in 0..300 {
        let m = map_remote(&name, seg.uuid(), seg.size(), None).expect("map");
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

/// Three idle local connections stalled a reader for 2 s
/// each (one connection served at a time), so its own 2 s wait ran out.
#[test]
fn idle_connections_do_not_stall_a_mapping_reader() {
    let _g = serial();
    let (seg, server) = served(None);
    let name = socket_name(seg.uuid());
    let addr = SocketAddr::from_abstract_name(name.as_bytes()).expect("addr");
    let idle: Vec<UnixStream> = (0..3)
        .map(|_| UnixStream::connect_addr(&addr).expect("idle connect"))
        .collect();
    let m = map_remote(&name, seg.uuid(), seg.size(), None);
    assert!(
        m.is_ok(),
        "reader failed behind idle connections: {:?}",
        m.err()
    );
    drop(idle);
    server.stop();
}

#[test]
fn mapping_needs_the_token_when_the_owner_has_one() {
    let _g = serial();
    let key = AuthKey::new("cluster").expect("key");
    let (seg, server) = served(Some(key.clone()));
    // SAFETY: a fresh 1 MiB mapping; one byte written at its start.
    unsafe { *seg.base() = 42 };
    let name = socket_name(seg.uuid());
    let m = map_remote(&name, seg.uuid(), seg.size(), Some(&key)).expect("with the token");
    // SAFETY: the mapping is 1 MiB long.
    assert_eq!(unsafe { *m.segment().base() }, 42);
    let e = map_remote(&name, seg.uuid(), seg.size(), None)
        .err()
        .expect("no token");
    assert_eq!(e.kind(), std::io::ErrorKind::PermissionDenied, "{e}");
    let wrong = AuthKey::new("wrong").expect("key");
    assert!(map_remote(&name, seg.uuid(), seg.size(), Some(&wrong)).is_err());
    // The wrong uuid is refused too.
    assert!(map_remote(&name, "not-the-uuid", seg.size(), Some(&key)).is_err());
    server.stop();
    // An owner without a token is refused by a reader that has one.
    let (open_seg, open) = served(None);
    let e = map_remote(
        &socket_name(open_seg.uuid()),
        open_seg.uuid(),
        open_seg.size(),
        Some(&key),
    )
    .err()
    .expect("unauthenticated owner");
    assert_eq!(e.kind(), std::io::ErrorKind::PermissionDenied, "{e}");
    open.stop();
}

#[test]
fn readers_see_the_owner_stop() {
    let _g = serial();
    let (seg, server) = served(None);
    let m = map_remote(&socket_name(seg.uuid()), seg.uuid(), seg.size(), None).expect("map");
    assert!(m.owner_alive());
    server.stop();
    assert!(!m.owner_alive());
    // A size that disagrees with the master's is refused.
    let (seg, server) = served(None);
    assert!(map_remote(&socket_name(seg.uuid()), seg.uuid(), 4096, None).is_err());
    server.stop();
}

/// A reader's cache drops the mapping of a segment whose owner stopped
/// serving it (a closed store) once it maps another one: a long-lived
/// reader used to keep every dead segment mapped, so the owner's memory
/// could never be freed.
#[test]
fn dead_segments_are_unmapped_when_a_new_one_is_mapped() {
    use mooncake_transfer::same_host::mapping::{MapLookup, MappingCache};
    let _g = serial();
    let cache = MappingCache::default();
    let mut servers = Vec::new();
    let mut segs = Vec::new();
    for _ in 0..3 {
        let (seg, server) = served(None);
        servers.push(server);
        let name = socket_name(seg.uuid());
        let got = cache.get(seg.uuid(), &name, seg.size(), None, || {});
        assert!(matches!(got, MapLookup::Mapped(_)));
        segs.push(seg);
    }
    assert_eq!(cache.len(), 3);
    // The first two stores close; nothing looks them up again.
    servers[0].stop();
    servers[1].stop();
    assert_eq!(cache.len(), 3, "nothing is dropped before the next mapping");
    // A live one stays cached (a hit is not a new mapping).
    let again = cache.get(
        segs[2].uuid(),
        &socket_name(segs[2].uuid()),
        1 << 20,
        None,
        || panic!("a cached live mapping was mapped again"),
    );
    assert!(matches!(again, MapLookup::Mapped(_)));
    let (seg, server) = served(None);
    let got = cache.get(
        seg.uuid(),
        &socket_name(seg.uuid()),
        seg.size(),
        None,
        || {},
    );
    assert!(matches!(got, MapLookup::Mapped(_)));
    assert_eq!(
        cache.len(),
        2,
        "the two dead mappings are gone, the live ones stay"
    );
    server.stop();
    servers[2].stop();
}
