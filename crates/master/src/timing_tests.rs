//! Time-driven rules of the master state, tested on a [`ManualClock`]:
//! leases, client TTLs, discarded and released writes, soft pins, suspect
//! owners, retired versions and stale upserts. Time moves only when a test
//! advances it; the periodic passes are called directly.

use crate::clock::ManualClock;
use crate::config::MasterConfig;
use crate::state::MasterState;
use mooncake_common::proto::{PutStartItem, SegmentDesc, SoftPin, WriteConfig};
use mooncake_common::ErrorCode;
use std::sync::Arc;
use std::time::Duration;

fn desc(name: &str, uuid: &str, size: u64) -> SegmentDesc {
    SegmentDesc {
        name: name.into(),
        uuid: uuid.into(),
        size,
        base_addr: 0,
        host_id: "host".into(),
        pid: 1,
        endpoint: name.into(),
        socket_name: String::new(),
    }
}

fn state(cfg: MasterConfig) -> (Arc<MasterState>, Arc<ManualClock>) {
    let (st, clock) = MasterState::on_manual_clock(cfg);
    st.mount_segment("c1", desc("h:1", "u1", 1 << 20)).unwrap();
    (st, clock)
}

/// A state whose read leases last `ms`.
fn state_with_lease(ms: u64) -> (Arc<MasterState>, Arc<ManualClock>) {
    state(MasterConfig {
        default_kv_lease_ttl_ms: ms,
        ..MasterConfig::default()
    })
}

/// A state whose clients expire after `sec` without a ping.
fn state_with_client_ttl(sec: i64) -> (Arc<MasterState>, Arc<ManualClock>) {
    state(MasterConfig {
        client_ttl_sec: sec,
        ..MasterConfig::default()
    })
}

/// A state that discards a write left in flight after `discard_sec` and
/// releases its space after `release_sec`.
fn state_with_put_timeouts(
    discard_sec: u64,
    release_sec: u64,
) -> (Arc<MasterState>, Arc<ManualClock>) {
    state(MasterConfig {
        put_start_discard_timeout_sec: discard_sec,
        put_start_release_timeout_sec: release_sec,
        ..MasterConfig::default()
    })
}

fn keys(k: &str) -> Vec<String> {
    vec![k.to_string()]
}

/// Start and commit a write of `key` as the owner of "h:1".
fn put(st: &MasterState, key: &str, size: u64, cfg: &WriteConfig, upsert: bool) -> PutStartItem {
    let mut items = st.put_start(&keys(key), &[size], cfg, upsert);
    if let PutStartItem::Write { version, .. } = items[0] {
        st.commit_end(&keys(key), &[version], &["h:1".to_string()])
            .unwrap();
    }
    items.remove(0)
}

/// [`put`], which must be granted a write.
fn put_ok(st: &MasterState, key: &str, size: u64, cfg: &WriteConfig, upsert: bool) {
    let item = put(st, key, size, cfg, upsert);
    assert!(
        matches!(item, PutStartItem::Write { .. }),
        "{key}: {item:?}"
    );
}

/// Write `key` (64 bytes, default config) and check it was stored.
fn stored(st: &MasterState, key: &str) {
    put_ok(st, key, 64, &WriteConfig::default(), false);
}

/// A removal of `key` is refused: a lease holds it.
fn assert_leased(st: &MasterState, key: &str) {
    assert_eq!(
        st.remove(&keys(key), false),
        vec![ErrorCode::ObjectHasLease.code()],
        "{key}"
    );
}

/// The segment the first replica of a granted write was placed on.
fn placed_on(item: &PutStartItem) -> &str {
    match item {
        PutStartItem::Write { replicas, .. } => &replicas[0].segment_name,
        other => panic!("{other:?}"),
    }
}

fn used(st: &MasterState) -> u64 {
    st.inner.lock().segments["h:1"].alloc.used()
}

#[test]
fn a_lease_blocks_removal_until_it_runs_out() {
    let (st, clock) = state_with_lease(5000);
    stored(&st, "k");
    assert!(st.get_replica_list(&keys("k"), false)[0].is_ok());
    assert_leased(&st, "k");
    clock.advance(Duration::from_millis(4999));
    assert_leased(&st, "k");
    // is_exist renews the lease like a read.
    assert_eq!(st.exist(&keys("k")), vec![1]);
    clock.advance(Duration::from_millis(4999));
    assert_leased(&st, "k");
    clock.advance(Duration::from_millis(2));
    assert_eq!(st.remove(&keys("k"), false), vec![0]);
}

#[test]
fn a_silent_client_expires_after_its_ttl_and_takes_its_objects() {
    let (st, clock) = state_with_client_ttl(10);
    stored(&st, "k");
    clock.advance(Duration::from_secs(9));
    assert!(!st.ping("c1"), "a known client needs no remount");
    clock.advance(Duration::from_secs(10));
    st.expire_clients();
    assert_eq!(st.inner.lock().segments.len(), 1, "it pinged 10 s ago");
    clock.advance(Duration::from_millis(1));
    st.expire_clients();
    let g = st.inner.lock();
    assert!(g.segments.is_empty());
    assert!(g.objects.is_empty());
    assert!(g.segments.is_expired("u1"));
    drop(g);
    assert!(st.ping("c1"), "an expired client must remount");
}

#[test]
fn a_master_that_did_not_run_gives_its_clients_a_full_ttl_after_it_resumes() {
    let (st, clock) = state_with_client_ttl(2);
    stored(&st, "k");
    let tick = Duration::from_millis(200);
    st.expire_clients();
    // The master is stopped for 3 s: longer than the TTL, no check runs.
    clock.advance(Duration::from_secs(3));
    st.expire_clients();
    assert_eq!(
        st.inner.lock().segments.len(),
        1,
        "the client was silent only while the master did not run"
    );
    // Checks every 200 ms again: a client that stays silent for its TTL
    // after the master resumed is expired then, not before.
    for _ in 0..10 {
        clock.advance(tick);
        st.expire_clients();
    }
    assert_eq!(st.inner.lock().segments.len(), 1, "2 s after the resume");
    clock.advance(tick);
    st.expire_clients();
    let g = st.inner.lock();
    assert!(
        g.segments.is_empty(),
        "silent past its TTL after the resume"
    );
    assert!(g.objects.is_empty());
}

#[test]
fn a_client_that_pings_through_a_master_stall_is_kept() {
    let (st, clock) = state_with_client_ttl(2);
    stored(&st, "k");
    st.expire_clients();
    clock.advance(Duration::from_secs(5));
    // Its heartbeat is served first on resume, before the next check.
    assert!(!st.ping("c1"));
    st.expire_clients();
    for _ in 0..5 {
        clock.advance(Duration::from_millis(200));
        assert!(!st.ping("c1"));
        st.expire_clients();
    }
    assert_eq!(st.inner.lock().segments.len(), 1);
}

#[test]
fn a_write_left_in_flight_is_discarded_then_its_space_released() {
    let (st, clock) = state_with_put_timeouts(30, 600);
    let items = st.put_start(&keys("stuck"), &[1000], &WriteConfig::default(), false);
    assert!(matches!(items[0], PutStartItem::Write { .. }));
    // Young: a second write of the key waits for it (write-once).
    clock.advance(Duration::from_secs(30));
    st.sweep_discarded();
    assert!(st.inner.lock().objects.contains_key("stuck"));
    clock.advance(Duration::from_secs(1));
    st.sweep_discarded();
    assert!(!st.inner.lock().objects.contains_key("stuck"));
    // The writer may still be copying: the space stays taken until release.
    assert_eq!(used(&st), 1024);
    clock.advance(Duration::from_secs(600 - 31 - 1));
    st.sweep_discarded();
    assert_eq!(used(&st), 1024);
    clock.advance(Duration::from_secs(1));
    st.sweep_discarded();
    assert_eq!(used(&st), 0);
}

#[test]
fn a_stale_upsert_is_dropped_and_the_committed_version_stays() {
    let (st, clock) = state_with_put_timeouts(30, 60);
    stored(&st, "k");
    let v = match st.put_start(&keys("k"), &[64], &WriteConfig::default(), true)[0] {
        PutStartItem::Write { version, .. } => version,
        ref other => panic!("{other:?}"),
    };
    clock.advance(Duration::from_secs(31));
    st.sweep_discarded();
    assert!(st.inner.lock().objects["k"].upserts().is_empty());
    // The writer may still be copying: its space stays.
    assert_eq!(used(&st), 128);
    // Its commit comes too late: the committed version is unchanged.
    let before = st.get_replica_list(&keys("k"), false)[0].clone().unwrap();
    st.commit_end(&keys("k"), &[v], &["h:1".to_string()])
        .unwrap();
    assert_eq!(st.get_replica_list(&keys("k"), false)[0], Ok(before));
    // The writer is done: the owner forgets the version, and the space
    // returns on that ack, well before the release delay.
    let q = st.ledger_queue("c1", "h:1").expect("queue").0;
    q.ack_all(&|r, settle| st.release_forgotten("h:1", "u1", r, settle));
    assert_eq!(used(&st), 64);
    clock.advance(Duration::from_secs(30));
    st.sweep_discarded();
    assert_eq!(used(&st), 64);
}

#[test]
fn a_soft_pin_protects_from_eviction_only_while_it_lasts() {
    let cfg = MasterConfig {
        default_kv_lease_ttl_ms: 100,
        allow_evict_soft_pinned_objects: false,
        ..MasterConfig::default()
    };
    let (st, clock) = state(cfg);
    let pinned = WriteConfig {
        soft_pin: SoftPin::Enable,
        soft_pin_ttl_ms: Some(60_000),
        ..WriteConfig::default()
    };
    put_ok(&st, "pinned", 1 << 19, &pinned, false);
    put_ok(&st, "plain", 1 << 18, &WriteConfig::default(), false);
    // Full past the watermark; leases long over.
    put_ok(
        &st,
        "fill",
        (1 << 18) - 1024,
        &WriteConfig::default(),
        false,
    );
    clock.advance(Duration::from_secs(1));
    for _ in 0..4 {
        st.eviction_pass();
    }
    assert!(st.inner.lock().objects.contains_key("pinned"));
    clock.advance(Duration::from_secs(60));
    for _ in 0..4 {
        st.eviction_pass();
    }
    let g = st.inner.lock();
    assert!(!g.objects.contains_key("pinned"), "the pin ran out");
}

#[test]
fn a_read_holds_a_replaced_version_until_its_lease_runs_out() {
    let (st, clock) = state_with_lease(2000);
    let w = WriteConfig::default();
    put_ok(&st, "k", 64, &w, false);
    // A read whose done report never comes.
    assert!(st.get_replica_list(&keys("k"), true)[0].is_ok());
    put_ok(&st, "k", 64, &w, true);
    assert_eq!(used(&st), 128);
    clock.advance(Duration::from_millis(1999));
    st.sweep_discarded();
    assert_eq!(used(&st), 128);
    clock.advance(Duration::from_millis(2));
    st.sweep_discarded();
    assert_eq!(used(&st), 64);
    assert!(st.inner.lock().retired.is_empty());
}

#[test]
fn a_suspect_owner_gets_new_replicas_only_when_nothing_else_fits() {
    let (st, clock) = state(MasterConfig::default());
    st.mount_segment("c2", desc("h:2", "u2", 1 << 20)).unwrap();
    // c1 goes silent past one and a half heartbeats; c2 keeps pinging.
    clock.advance(Duration::from_millis(1600));
    assert!(!st.ping("c2"));
    for i in 0..8 {
        let items = st.put_start(
            &keys(&format!("k{i}")),
            &[64],
            &WriteConfig::default(),
            false,
        );
        assert_eq!(placed_on(&items[0]), "h:2");
    }
    // With h:2 full, the suspect h:1 is still used rather than failing.
    let items = st.put_start(&keys("big"), &[1 << 20], &WriteConfig::default(), false);
    assert_eq!(placed_on(&items[0]), "h:1");
}

#[test]
fn stale_writes_among_many_objects_are_found_a_chunk_at_a_time() {
    use crate::state::SWEEP_CHUNK;
    let (st, clock) = state_with_put_timeouts(30, 600);
    st.mount_segment("c1", desc("h:2", "u2", 64 << 20)).unwrap();
    // More writes left in flight than one sweep looks at.
    let n = SWEEP_CHUNK + SWEEP_CHUNK / 2;
    let names: Vec<String> = (0..n).map(|i| format!("k{i}")).collect();
    let items = st.put_start(&names, &vec![1; n], &WriteConfig::default(), false);
    assert!(items
        .iter()
        .all(|i| matches!(i, PutStartItem::Write { .. })));
    clock.advance(Duration::from_secs(31));
    // One sweep discards one chunk; the next picks up where it stopped.
    st.sweep_discarded();
    assert_eq!(st.inner.lock().objects.len(), n - SWEEP_CHUNK);
    st.sweep_discarded();
    assert!(st.inner.lock().objects.is_empty());
}

#[test]
fn a_stale_rewrite_in_place_is_discarded_and_no_longer_holds_lookups() {
    let (st, clock) = state_with_put_timeouts(30, 600);
    st.inner.lock().segments["h:1"].ledger.mark_unreachable();
    let same_host = WriteConfig {
        writer_host_id: "host".into(),
        writer_maps_host: true,
        ..WriteConfig::default()
    };
    put(&st, "k", 100, &same_host, false);
    let items = st.put_start(&keys("k"), &[100], &same_host, true);
    assert!(matches!(items[0], PutStartItem::Write { .. }));
    assert_eq!(st.metrics.upsert_in_place.get(), 1);
    // The writer went silent: past the discard delay a lookup is not held.
    clock.advance(Duration::from_secs(31));
    assert_eq!(
        st.get_replica_list(&keys("k"), false)
            .remove(0)
            .unwrap_err(),
        ErrorCode::ReplicaIsNotReady
    );
    // The sweep drops the half-written object: the key is gone, never torn.
    st.sweep_discarded();
    assert_eq!(
        st.get_replica_list(&keys("k"), false)
            .remove(0)
            .unwrap_err(),
        ErrorCode::ObjectNotFound
    );
    assert_eq!(st.exist(&keys("k")), vec![0]);
}

/// Start and commit a write of `key` in group `group`.
fn put_in_group(st: &MasterState, key: &str, size: u64, group: &str) -> PutStartItem {
    let cfg = WriteConfig {
        groups: vec![(key.to_string(), group.to_string())],
        ..WriteConfig::default()
    };
    put(st, key, size, &cfg, false)
}

#[test]
fn reading_one_member_of_a_group_leases_every_member() {
    let (st, clock) = state_with_lease(5000);
    for k in ["a1", "a2"] {
        assert!(matches!(
            put_in_group(&st, k, 64, "g"),
            PutStartItem::Write { .. }
        ));
    }
    stored(&st, "b");
    assert!(st.get_replica_list(&keys("a1"), false)[0].is_ok());
    assert_leased(&st, "a2");
    assert_eq!(st.remove(&keys("b"), false), vec![0], "not in the group");
    clock.advance(Duration::from_millis(5001));
    // is_exist leases the group too.
    assert_eq!(st.exist(&keys("a2")), vec![1]);
    assert_leased(&st, "a1");
    clock.advance(Duration::from_millis(5001));
    assert_eq!(st.remove(&keys("a1"), false), vec![0]);
    assert_eq!(st.remove(&keys("a2"), false), vec![0]);
}

#[test]
fn a_key_cannot_change_group_while_it_exists() {
    let (st, _) = state(MasterConfig::default());
    assert!(matches!(
        put_in_group(&st, "k", 64, "g"),
        PutStartItem::Write { .. }
    ));
    let other = WriteConfig {
        groups: vec![("k".to_string(), "h".to_string())],
        ..WriteConfig::default()
    };
    let items = st.put_start(&keys("k"), &[64], &other, true);
    assert_eq!(items[0], PutStartItem::Err(ErrorCode::InvalidParams));
    // The same group, or none, may upsert it.
    assert!(matches!(
        put_in_group(&st, "k", 64, "g"),
        PutStartItem::AlreadyExists
    ));
    let items = st.put_start(&keys("k"), &[64], &WriteConfig::default(), true);
    assert!(matches!(items[0], PutStartItem::Write { .. }), "{items:?}");
    // A plain key cannot join a group while it exists.
    stored(&st, "plain");
    let join = WriteConfig {
        groups: vec![("plain".to_string(), "g".to_string())],
        ..WriteConfig::default()
    };
    let items = st.put_start(&keys("plain"), &[64], &join, true);
    assert_eq!(items[0], PutStartItem::Err(ErrorCode::InvalidParams));
}

#[test]
fn eviction_takes_a_group_whole_and_never_while_a_member_is_leased() {
    let cfg = MasterConfig {
        default_kv_lease_ttl_ms: 5000,
        eviction_high_watermark_ratio: 0.5,
        eviction_ratio: 0.05,
        ..MasterConfig::default()
    };
    let (st, clock) = state(cfg);
    let kib = 1024;
    for k in ["a1", "a2", "a3"] {
        assert!(matches!(
            put_in_group(&st, k, 150 * kib, "g"),
            PutStartItem::Write { .. }
        ));
    }
    put_ok(&st, "b", 150 * kib, &WriteConfig::default(), false);
    // 600 KiB of 1 MiB used: above the watermark. a1 is leased, so the
    // group stays; only b can go.
    assert!(st.get_replica_list(&keys("a1"), false)[0].is_ok());
    clock.advance(Duration::from_millis(1));
    st.eviction_pass();
    let live = |k: &str| st.exist(&keys(k))[0];
    assert_eq!(live("b"), 0, "the ungrouped object is evicted");
    clock.advance(Duration::from_millis(10_000));
    // Leases over: the next pass that picks any member takes all three.
    put_ok(&st, "c", 150 * kib, &WriteConfig::default(), false);
    st.eviction_pass();
    let members: Vec<i32> = ["a1", "a2", "a3"].iter().map(|k| live(k)).collect();
    assert!(
        members == vec![0, 0, 0] || members == vec![1, 1, 1],
        "{members:?}"
    );
    assert_eq!(members, vec![0, 0, 0], "the oldest leases are the group's");
}
