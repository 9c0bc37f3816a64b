//! The offload state machine: write-through, moves on eviction, and puts
//! waiting for the room those free.

use super::Offload;
use crate::config::MasterConfig;
use crate::metrics::MasterMetrics;
use crate::state::MasterState;
use mooncake_common::ledger::LedgerOp;
use mooncake_common::proto::{DiskObject, PutStartItem, SegmentDesc, WriteConfig};
use mooncake_common::ErrorCode;
use std::sync::Arc;

fn desc(name: &str, size: u64) -> SegmentDesc {
    SegmentDesc {
        name: name.into(),
        uuid: format!("u-{name}"),
        size,
        base_addr: 0,
        host_id: "h".into(),
        pid: 1,
        endpoint: format!("{name}-data"),
        socket_name: String::new(),
    }
}

fn state(offload: bool, cap: u64) -> Arc<MasterState> {
    state_waiting(offload, cap, 5000)
}

/// [`state`] whose puts wait up to `wait_ms` for room (objects move to
/// disk when eviction selects them: `--offload_on_evict`).
fn state_waiting(offload: bool, cap: u64, wait_ms: u64) -> Arc<MasterState> {
    let cfg = MasterConfig {
        enable_offload: offload,
        offload_on_evict: true,
        global_file_segment_size: cap,
        default_kv_lease_ttl_ms: 0,
        put_space_wait_ms: wait_ms,
        ..MasterConfig::default()
    };
    let st = MasterState::new(cfg, Arc::new(MasterMetrics::default()), None);
    st.mount_segment("c1", desc("a:1", 1 << 20)).expect("mount");
    st
}

const QUARTER: u64 = 1 << 18;

/// An offloading master whose segment (1 MiB, its owner connected with
/// a disk tier) is filled by four committed objects `f0`..`f3`.
fn full_with_tier(cap: u64, wait_ms: u64) -> Arc<MasterState> {
    let st = state_waiting(true, cap, wait_ms);
    st.disk_tier("c1", "a:1", Vec::new(), true).expect("tier");
    connect_and_fill(&st);
    st
}

/// The owner of "a:1" connects its ledger stream; four committed objects
/// `f0`..`f3` then fill the segment.
fn connect_and_fill(st: &MasterState) {
    st.ledger_queue("c1", "a:1")
        .expect("queue")
        .0
        .mark_connected();
    for i in 0..4 {
        put(st, &format!("f{i}"), QUARTER);
    }
}

/// The owner of "a:1" applies and acknowledges what is queued: the ops it
/// got.
fn owner_ack_ops(st: &Arc<MasterState>) -> Vec<LedgerOp> {
    let q = st.ledger_queue("c1", "a:1").expect("queue").0;
    q.ack_all(&|r, settle| st.release_forgotten("a:1", "u-a:1", r, settle))
}

/// [`owner_ack_ops`]: the offloads among them.
fn owner_acks(st: &Arc<MasterState>) -> usize {
    owner_ack_ops(st)
        .iter()
        .filter(|op| matches!(op, LedgerOp::Offload { .. }))
        .count()
}

/// The one item `put_start` answers for a write of `key` (a quarter of the
/// segment, default config).
fn put_quarter(st: &MasterState, key: &str) -> PutStartItem {
    let items = st.put_start(
        &[key.to_string()],
        &[QUARTER],
        &WriteConfig::default(),
        false,
    );
    let [item]: [PutStartItem; 1] = items.try_into().expect("one item");
    item
}

fn start_put(st: &Arc<MasterState>, key: &str) -> std::thread::JoinHandle<PutStartItem> {
    let (st, key) = (Arc::clone(st), key.to_string());
    std::thread::spawn(move || put_quarter(&st, &key))
}

/// Until `n` puts have started waiting for room.
fn until_waiting(st: &MasterState, n: u64) {
    for _ in 0..100_000 {
        if st.metrics.put_space_waits.get() >= n {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    panic!("no put waited for room");
}

#[test]
fn a_put_into_full_memory_waits_for_the_move_to_disk_and_then_gets_its_room() {
    let st = full_with_tier(u64::MAX, 600_000);
    let writer = start_put(&st, "new");
    until_waiting(&st, 1);
    // The waiting put evicted for itself: the oldest object is being
    // copied to disk, and its space comes back on the owner's ack.
    assert!(owner_acks(&st) >= 1);
    let item = writer.join().expect("writer");
    let PutStartItem::Write { version, .. } = item else {
        panic!("the put did not get its room: {item:?}");
    };
    st.commit_end(&["new".to_string()], &[version], &["a:1".to_string()])
        .expect("end");
    let keys: Vec<String> = ["f0", "f1", "f2", "f3", "new"]
        .iter()
        .map(|k| k.to_string())
        .collect();
    assert_eq!(st.exist(&keys), vec![1; 5]);
    let f0 = st
        .get_replica_list(&keys[..1], false)
        .remove(0)
        .expect("f0");
    assert!(
        f0.replicas.is_empty() && f0.disk.is_some(),
        "f0 moved to disk"
    );
}

#[test]
fn two_puts_of_one_key_waiting_for_room_write_it_once() {
    let st = full_with_tier(u64::MAX, 600_000);
    let a = start_put(&st, "same");
    let b = start_put(&st, "same");
    until_waiting(&st, 2);
    assert!(owner_acks(&st) >= 1);
    let got = [a.join().expect("a"), b.join().expect("b")];
    let writes = got
        .iter()
        .filter(|i| matches!(i, PutStartItem::Write { .. }))
        .count();
    let existing = got
        .iter()
        .filter(|i| matches!(i, PutStartItem::AlreadyExists))
        .count();
    assert_eq!((writes, existing), (1, 1), "{got:?}");
}

#[test]
fn room_freed_while_puts_wait_goes_to_them_in_arrival_order() {
    let st = full_with_tier(u64::MAX, 600_000);
    let a = start_put(&st, "a");
    until_waiting(&st, 1);
    let b = start_put(&st, "b");
    until_waiting(&st, 2);
    // Room for one: the first to wait gets it, the other waits on.
    assert!(owner_acks(&st) >= 1);
    let PutStartItem::Write { version: va, .. } = a.join().expect("a") else {
        panic!("the first waiting put did not get the room");
    };
    // The second evicts again for itself once it is first in line.
    until_waiting(&st, 3);
    assert!(owner_acks(&st) >= 1);
    let PutStartItem::Write { version: vb, .. } = b.join().expect("b") else {
        panic!("the second waiting put did not get the next room");
    };
    assert!(va < vb, "placed out of order: {va} >= {vb}");
}

#[test]
fn a_put_that_waited_behind_another_looks_at_the_room_once_it_is_first() {
    let st = state_waiting(false, u64::MAX, 600_000);
    let q = st.ledger_queue("c1", "a:1").expect("queue").0;
    q.mark_connected();
    // Three objects eviction may not take, and one it may.
    let pinned = WriteConfig {
        hard_pin: true,
        ..WriteConfig::default()
    };
    for i in 0..3 {
        put_with(&st, &format!("p{i}"), QUARTER, &pinned, false);
    }
    put(&st, "f", QUARTER);
    // Another put waits for room first; then room is freed.
    let front = st.queue_for_space();
    assert_eq!(st.remove(&["f".to_string()], false), vec![0]);
    owner_ack_ops(&st);
    // This put finds the room kept for the first one and waits behind it;
    // nothing is on its way back (the rest is pinned).
    let writer = start_put(&st, "new");
    until_waiting(&st, 1);
    // The first put leaves without taking the room: the second gets it.
    st.leave_space_queue(front);
    assert!(matches!(
        writer.join().expect("writer"),
        PutStartItem::Write { .. }
    ));
}

#[test]
fn a_put_waiting_for_room_from_an_owner_that_goes_away_fails_at_once() {
    let st = full_with_tier(u64::MAX, 600_000);
    let writer = start_put(&st, "new");
    until_waiting(&st, 1);
    // The room it waits for was to come back on this owner's ack.
    st.unmount_segment("c1", "a:1").expect("unmount");
    assert!(matches!(
        writer.join().expect("writer"),
        PutStartItem::Err(ErrorCode::NoAvailableHandle)
    ));
}

#[test]
fn with_the_disk_full_too_a_put_fails_at_once_and_nothing_is_dropped() {
    // Room on disk for nothing: eviction keeps every object in memory.
    let st = full_with_tier(0, 600_000);
    assert!(matches!(
        put_quarter(&st, "new"),
        PutStartItem::Err(ErrorCode::NoAvailableHandle)
    ));
    assert_eq!(owner_acks(&st), 0, "nothing was moved");
    let keys: Vec<String> = (0..4).map(|i| format!("f{i}")).collect();
    assert_eq!(st.exist(&keys), vec![1; 4]);
    for info in st.get_replica_list(&keys, false) {
        assert_eq!(info.expect("found").replicas.len(), 1);
    }
    assert_eq!(st.inner.lock().objects.disk().bytes(), 0);
    // A periodic pass keeps them too.
    st.eviction_pass();
    assert_eq!(st.exist(&keys), vec![1; 4]);
}

#[test]
fn a_put_whose_room_does_not_come_back_in_time_fails_and_the_room_comes_later() {
    let st = full_with_tier(u64::MAX, 20);
    // The owner never acknowledges within the wait.
    assert!(matches!(
        put_quarter(&st, "late"),
        PutStartItem::Err(ErrorCode::NoAvailableHandle)
    ));
    assert!(owner_acks(&st) >= 1);
    put(&st, "late", QUARTER);
    assert_eq!(st.exist(&["late".to_string()]), vec![1]);
}

#[test]
fn without_offload_a_put_waits_for_evicted_objects_to_be_forgotten() {
    let st = state_waiting(false, u64::MAX, 600_000);
    connect_and_fill(&st);
    let writer = start_put(&st, "new");
    until_waiting(&st, 1);
    let ops = owner_ack_ops(&st);
    assert!(ops.iter().any(|op| matches!(op, LedgerOp::Forget { .. })));
    assert!(matches!(
        writer.join().expect("writer"),
        PutStartItem::Write { .. }
    ));
    assert_eq!(st.exist(&["f0".to_string()]), vec![0], "f0 was evicted");
}

fn put(st: &MasterState, key: &str, size: u64) {
    put_with(st, key, size, &WriteConfig::default(), false);
}

/// Start and end a write of `key` under `cfg`: its version.
fn put_with(st: &MasterState, key: &str, size: u64, cfg: &WriteConfig, upsert: bool) -> u64 {
    let items = st.put_start(&[key.to_string()], &[size], cfg, upsert);
    let Some(PutStartItem::Write { version, .. }) = items.into_iter().next() else {
        panic!("no write of {key}");
    };
    // Ended as the owner of "a:1" (its ledger ops come back here).
    st.commit_end(&[key.to_string()], &[version], &["a:1".to_string()])
        .expect("end");
    version
}

#[test]
fn an_evicted_object_becomes_a_disk_copy_read_from_its_owner() {
    let st = state(true, u64::MAX);
    st.disk_tier("c1", "a:1", Vec::new(), true).expect("tier");
    put(&st, "k", 1000);
    let moved = st.inner.lock().offload_object("k", u64::MAX, u64::MAX);
    assert_eq!(moved, Offload::Moved);
    let info = st
        .get_replica_list(&["k".to_string()], false)
        .remove(0)
        .expect("found");
    assert!(info.replicas.is_empty());
    let disk = info.disk.expect("disk copy");
    assert_eq!(
        (disk.key.as_str(), disk.segment_name.as_str()),
        ("k", "a:1")
    );
    assert_eq!(st.exist(&["k".to_string()]), vec![1]);
    // The owner was told to copy it to disk.
    let q = st.ledger_queue("c1", "a:1").expect("queue").0;
    assert!(q
        .pending_ops()
        .iter()
        .any(|op| matches!(op, LedgerOp::Offload { key, size: 1000, .. } if key == "k")));
    // Removing it tells the owner to delete the copy.
    assert_eq!(st.remove(&["k".to_string()], true), vec![0]);
    assert!(q
        .pending_ops()
        .iter()
        .any(|op| matches!(op, LedgerOp::DiskForget { key, .. } if key == "k")));
    assert_eq!(st.inner.lock().objects.disk().bytes(), 0);
}

#[test]
fn no_disk_tier_or_a_full_file_segment_moves_nothing() {
    let st = state(true, 1500);
    put(&st, "k", 1000);
    let no_tier = st.inner.lock().offload_object("k", 1500, u64::MAX);
    assert_eq!(no_tier, Offload::NoTier);
    st.disk_tier("c1", "a:1", Vec::new(), true).expect("tier");
    let moved = st.inner.lock().offload_object("k", 1500, u64::MAX);
    assert_eq!(moved, Offload::Moved);
    put(&st, "k2", 1000);
    let full = st.inner.lock().offload_object("k2", 1500, u64::MAX);
    assert_eq!(full, Offload::Full, "over the file segment");
}

#[test]
fn a_reported_tier_is_adopted_and_a_dropped_copy_is_forgotten() {
    let st = state(true, u64::MAX);
    put(&st, "known", 10);
    let objs = vec![
        DiskObject {
            key: "old".into(),
            version: 42,
            size: 5,
        },
        DiskObject {
            key: "known".into(),
            version: 1,
            size: 10,
        },
    ];
    assert_eq!(
        st.disk_tier("c1", "a:1", objs, true).expect("tier"),
        vec![1, 0]
    );
    let info = st
        .get_replica_list(&["old".to_string()], false)
        .remove(0)
        .expect("found");
    assert_eq!(info.disk.expect("disk").version, 42);
    assert_eq!(
        st.disk_tier("c2", "a:1", Vec::new(), true),
        Err(ErrorCode::IllegalClient)
    );
    // A report of another version changes nothing.
    st.disk_dropped("c1", "a:1", &[("old".to_string(), 41)])
        .expect("drop");
    assert_eq!(st.exist(&["old".to_string()]), vec![1]);
    st.disk_dropped("c1", "a:1", &[("old".to_string(), 42)])
        .expect("drop");
    assert_eq!(st.exist(&["old".to_string()]), vec![0]);
}

#[test]
fn a_gone_segment_takes_its_disk_copies_with_it() {
    let st = state(true, u64::MAX);
    let objs = vec![DiskObject {
        key: "d".into(),
        version: 3,
        size: 5,
    }];
    st.disk_tier("c1", "a:1", objs, true).expect("tier");
    st.unmount_segment("c1", "a:1").expect("unmount");
    assert_eq!(st.exist(&["d".to_string()]), vec![0]);
    assert_eq!(st.inner.lock().objects.disk().bytes(), 0);
}

/// An offloading master configured by `cfg`, its segment "a:1" (1 MiB)
/// mounted by an owner with a disk tier.
fn offloading(cfg: MasterConfig) -> Arc<MasterState> {
    let cfg = MasterConfig {
        enable_offload: true,
        default_kv_lease_ttl_ms: 0,
        ..cfg
    };
    let st = MasterState::new(cfg, Arc::new(MasterMetrics::default()), None);
    st.mount_segment("c1", desc("a:1", 1 << 20)).expect("mount");
    st.disk_tier("c1", "a:1", Vec::new(), true).expect("tier");
    st
}

/// The ops queued for the owner of "a:1" and not yet acknowledged.
fn queued(st: &MasterState) -> Vec<LedgerOp> {
    st.ledger_queue("c1", "a:1").expect("queue").0.pending_ops()
}

fn persists(ops: &[LedgerOp]) -> Vec<String> {
    ops.iter()
        .filter_map(|op| match op {
            LedgerOp::Persist { key, .. } => Some(key.clone()),
            _ => None,
        })
        .collect()
}

fn offloads(ops: &[LedgerOp]) -> Vec<String> {
    ops.iter()
        .filter_map(|op| match op {
            LedgerOp::Offload { key, .. } => Some(key.clone()),
            _ => None,
        })
        .collect()
}

fn memory_replicas(st: &MasterState, key: &str) -> usize {
    st.inner
        .lock()
        .objects
        .get(key)
        .map_or(0, |o| o.replicas.len())
}

fn has_disk_copy(st: &MasterState, key: &str) -> bool {
    st.inner
        .lock()
        .objects
        .get(key)
        .is_some_and(|o| o.disk().is_some())
}

fn fill4(st: &MasterState) -> Vec<String> {
    let keys: Vec<String> = (0..4).map(|i| format!("f{i}")).collect();
    for k in &keys {
        put(st, k, QUARTER);
    }
    keys
}

#[test]
fn by_default_a_committed_object_is_queued_for_disk_and_stays_in_memory() {
    let st = offloading(MasterConfig::default());
    put(&st, "k", 1000);
    assert_eq!(persists(&queued(&st)), vec!["k".to_string()]);
    assert!(offloads(&queued(&st)).is_empty());
    assert_eq!(memory_replicas(&st, "k"), 1);
    assert!(has_disk_copy(&st, "k"));
    assert_eq!(st.inner.lock().objects.disk().bytes(), 1000);
    // Reads go to memory while it holds a replica.
    let info = st
        .get_replica_list(&["k".to_string()], false)
        .remove(0)
        .expect("found");
    assert_eq!((info.replicas.len(), info.disk.is_none()), (1, true));
    // Removing it deletes the disk copy too.
    assert_eq!(st.remove(&["k".to_string()], true), vec![0]);
    assert!(queued(&st)
        .iter()
        .any(|op| matches!(op, LedgerOp::DiskForget { key, .. } if key == "k")));
    assert_eq!(st.inner.lock().objects.disk().bytes(), 0);
}

#[test]
fn by_default_eviction_drops_only_memory_replicas_after_the_copy_to_disk() {
    let st = offloading(MasterConfig::default());
    let keys = fill4(&st);
    assert_eq!(persists(&queued(&st)).len(), 4);
    st.eviction_pass();
    let evicted: Vec<&String> = keys
        .iter()
        .filter(|k| memory_replicas(&st, k) == 0)
        .collect();
    assert!(!evicted.is_empty(), "nothing was evicted");
    let ops = queued(&st);
    assert!(offloads(&ops).is_empty(), "no second copy to disk: {ops:?}");
    for k in &evicted {
        assert!(has_disk_copy(&st, k), "{k} kept on disk");
        // The owner copies the bytes before it forgets the replica, whose
        // space returns only on that forget's ack.
        let persist = ops
            .iter()
            .position(|op| matches!(op, LedgerOp::Persist { key, .. } if key == *k));
        let forget = ops
            .iter()
            .rposition(|op| matches!(op, LedgerOp::Forget { .. }));
        assert!(persist < forget, "{ops:?}");
        let info = st
            .get_replica_list(&[k.to_string()], false)
            .remove(0)
            .expect("found");
        assert!(info.replicas.is_empty() && info.disk.is_some());
    }
    assert_eq!(st.exist(&keys), vec![1; 4]);
}

#[test]
fn a_written_through_copy_the_owner_loses_leaves_the_memory_replica() {
    let st = offloading(MasterConfig::default());
    put(&st, "k", 1000);
    let version = st.inner.lock().objects.get("k").map(|o| o.version);
    st.disk_dropped("c1", "a:1", &[("k".to_string(), version.unwrap_or(0))])
        .expect("drop");
    assert_eq!(st.exist(&["k".to_string()]), vec![1]);
    assert!(!has_disk_copy(&st, "k"));
    assert_eq!(memory_replicas(&st, "k"), 1);
    assert_eq!(st.inner.lock().objects.disk().bytes(), 0);
}

#[test]
fn an_upsert_queues_its_new_version_and_forgets_the_old_copy() {
    let st = offloading(MasterConfig::default());
    put(&st, "k", 1000);
    let version = put_with(&st, "k", 2000, &WriteConfig::default(), true);
    let ops = queued(&st);
    assert_eq!(persists(&ops), vec!["k".to_string(), "k".to_string()]);
    assert!(ops.iter().any(
        |op| matches!(op, LedgerOp::DiskForget { key, version: v } if key == "k" && *v < version)
    ));
    assert_eq!(st.inner.lock().objects.disk().bytes(), 2000);
}

#[test]
fn with_offload_on_evict_nothing_is_queued_for_disk_until_eviction() {
    let st = offloading(MasterConfig {
        offload_on_evict: true,
        ..MasterConfig::default()
    });
    let keys = fill4(&st);
    assert!(persists(&queued(&st)).is_empty());
    assert!(keys.iter().all(|k| !has_disk_copy(&st, k)));
    assert_eq!(st.inner.lock().objects.disk().bytes(), 0);
    st.eviction_pass();
    let moved = offloads(&queued(&st));
    assert!(!moved.is_empty(), "eviction moved nothing");
    for k in &moved {
        assert!(has_disk_copy(&st, k) && memory_replicas(&st, k) == 0);
    }
    assert_eq!(st.exist(&keys), vec![1; 4]);
}

/// Offload on evict (force-evicting with `force`) with `eviction_ratio` 1
/// (every object is a victim), the rest of `cfg` as given.
fn evicting_all(force: bool, cfg: MasterConfig) -> Arc<MasterState> {
    offloading(MasterConfig {
        offload_on_evict: true,
        offload_force_evict: force,
        eviction_ratio: 1.0,
        ..cfg
    })
}

/// [`evicting_all`] with a pass cap of one object (a queue limit of 2 at
/// ratio 0.5).
fn capped(force: bool) -> Arc<MasterState> {
    evicting_all(
        force,
        MasterConfig {
            offloading_queue_limit: 2,
            offload_cap_ratio: 0.5,
            ..MasterConfig::default()
        },
    )
}

#[test]
fn past_the_pass_cap_objects_stay_in_memory() {
    let st = capped(false);
    let keys = fill4(&st);
    st.eviction_pass();
    assert_eq!(offloads(&queued(&st)).len(), 1);
    assert_eq!(st.exist(&keys), vec![1; 4], "nothing dropped");
    let in_memory = keys.iter().filter(|k| memory_replicas(&st, k) == 1).count();
    assert_eq!(in_memory, 3);
}

#[test]
fn with_force_evict_objects_past_the_pass_cap_are_dropped() {
    let st = capped(true);
    let keys = fill4(&st);
    st.eviction_pass();
    let moved = offloads(&queued(&st));
    assert_eq!(moved.len(), 1);
    let exist = st.exist(&keys);
    assert_eq!(exist.iter().filter(|&&e| e == 1).count(), 1, "{exist:?}");
    assert_eq!(st.exist(&moved), vec![1]);
}

#[test]
fn a_cap_ratio_of_zero_with_force_evict_drops_without_copying() {
    let st = evicting_all(
        true,
        MasterConfig {
            offload_cap_ratio: 0.0,
            ..MasterConfig::default()
        },
    );
    let keys = fill4(&st);
    st.eviction_pass();
    assert!(offloads(&queued(&st)).is_empty());
    assert_eq!(st.exist(&keys), vec![0; 4]);
}

#[test]
fn force_evict_drops_what_the_file_segment_cannot_take() {
    for force in [false, true] {
        let st = evicting_all(
            force,
            MasterConfig {
                global_file_segment_size: 0,
                ..MasterConfig::default()
            },
        );
        let keys = fill4(&st);
        st.eviction_pass();
        let want = if force { 0 } else { 1 };
        assert_eq!(st.exist(&keys), vec![want; 4], "force {force}");
    }
}

#[test]
fn an_owner_with_its_queue_full_gets_no_more_copies_until_it_acks() {
    let st = offloading(MasterConfig {
        offloading_queue_limit: 2,
        ..MasterConfig::default()
    });
    for k in ["a", "b", "c"] {
        put(&st, k, 1000);
    }
    assert_eq!(
        persists(&queued(&st)),
        vec!["a".to_string(), "b".to_string()]
    );
    assert!(!has_disk_copy(&st, "c"));
    // The owner wrote them: the queue has room again.
    owner_acks(&st);
    put(&st, "d", 1000);
    assert_eq!(persists(&queued(&st)), vec!["d".to_string()]);
    // Eviction moves "c", which has no copy yet.
    let moved = st.inner.lock().offload_object("c", u64::MAX, 2);
    assert_eq!(moved, Offload::Moved);
    // Now two copies are queued again: the limit holds for moves too.
    put(&st, "e", 1000);
    assert!(!has_disk_copy(&st, "e"));
    assert_eq!(
        st.inner.lock().offload_object("e", u64::MAX, 2),
        Offload::Full
    );
}

#[test]
fn without_offload_nothing_is_queued_for_disk() {
    let st = state(false, u64::MAX);
    st.disk_tier("c1", "a:1", Vec::new(), true).expect("tier");
    put(&st, "k", 1000);
    assert!(persists(&queued(&st)).is_empty());
    assert!(!has_disk_copy(&st, "k"));
}

fn promotes(ops: &[LedgerOp]) -> Vec<(String, u64)> {
    ops.iter()
        .filter_map(|op| match op {
            LedgerOp::Promote { key, offset, .. } => Some((key.clone(), *offset)),
            _ => None,
        })
        .collect()
}

/// `k` (1000 bytes) committed and then moved to disk, its owner done with
/// the move; reads of it now go to the disk copy.
fn on_disk_only(cfg: MasterConfig) -> Arc<MasterState> {
    let st = offloading(MasterConfig {
        offload_on_evict: true,
        ..cfg
    });
    put(&st, "k", 1000);
    assert_eq!(
        st.inner.lock().offload_object("k", u64::MAX, u64::MAX),
        Offload::Moved
    );
    owner_acks(&st);
    st
}

fn lookup(st: &MasterState) -> mooncake_common::proto::ObjectInfo {
    st.get_replica_list(&["k".to_string()], false)
        .remove(0)
        .expect("found")
}

fn version_of(st: &MasterState, key: &str) -> u64 {
    st.inner.lock().objects.get(key).map_or(0, |o| o.version)
}

#[test]
fn by_default_reads_of_a_disk_copy_promote_nothing() {
    let st = on_disk_only(MasterConfig::default());
    for _ in 0..5 {
        assert!(lookup(&st).disk.is_some());
    }
    assert!(promotes(&queued(&st)).is_empty());
}

#[test]
fn with_promotion_on_hit_the_second_read_brings_the_object_back_to_memory() {
    let st = on_disk_only(MasterConfig {
        promotion_on_hit: true,
        ..MasterConfig::default()
    });
    let used = st.inner.lock().usage().0;
    assert!(lookup(&st).disk.is_some());
    assert!(promotes(&queued(&st)).is_empty(), "one read is not enough");
    assert!(lookup(&st).disk.is_some(), "this read still goes to disk");
    let queued_now = promotes(&queued(&st));
    assert_eq!(queued_now.len(), 1);
    let (key, offset) = queued_now[0].clone();
    assert_eq!(key, "k");
    assert!(st.inner.lock().usage().0 > used, "the space is taken");
    // Another read while it is in flight starts no second one.
    lookup(&st);
    assert_eq!(promotes(&queued(&st)).len(), 1);
    let v = version_of(&st, "k");
    st.promoted("c1", "a:1", &[("k".to_string(), v, offset, true)])
        .expect("promoted");
    let info = lookup(&st);
    assert_eq!(info.replicas.len(), 1);
    assert!(info.disk.is_none(), "read from memory now");
    assert!(has_disk_copy(&st, "k"), "the disk copy stays");
    assert_eq!(st.metrics.promoted_objects.get(), 1);
    // Evicting it again only drops the memory replica.
    assert_eq!(st.inner.lock().evict_to_disk_copy("k"), Offload::Moved);
    assert!(lookup(&st).disk.is_some());
}

#[test]
fn a_failed_or_stale_promotion_gives_its_space_back() {
    let st = on_disk_only(MasterConfig {
        promotion_on_hit: true,
        promotion_admission_threshold: 1,
        ..MasterConfig::default()
    });
    let used = st.inner.lock().usage().0;
    lookup(&st);
    let (_, offset) = promotes(&queued(&st))[0].clone();
    let v = version_of(&st, "k");
    // Another client cannot report it.
    assert_eq!(
        st.promoted("c2", "a:1", &[("k".to_string(), v, offset, true)]),
        Err(ErrorCode::IllegalClient)
    );
    st.promoted("c1", "a:1", &[("k".to_string(), v, offset, false)])
        .expect("report");
    assert_eq!(st.inner.lock().usage().0, used);
    owner_acks(&st);
    // Still on disk only; this read starts another promotion.
    assert!(lookup(&st).disk.is_some());
    let (_, offset) = promotes(&queued(&st))[0].clone();
    // Removed while in flight: the space comes back on the report.
    assert_eq!(st.remove(&["k".to_string()], true), vec![0]);
    st.promoted("c1", "a:1", &[("k".to_string(), v, offset, true)])
        .expect("report");
    assert_eq!(st.exist(&["k".to_string()]), vec![0]);
    assert_eq!(st.inner.lock().usage().0, used);
    assert!(st.inner.lock().promotions.is_empty());
}

#[test]
fn no_promotion_past_the_queue_limit_or_the_high_watermark() {
    let st = on_disk_only(MasterConfig {
        promotion_on_hit: true,
        promotion_admission_threshold: 1,
        promotion_queue_limit: 0,
        ..MasterConfig::default()
    });
    lookup(&st);
    assert!(promotes(&queued(&st)).is_empty(), "queue limit 0");
    let st = on_disk_only(MasterConfig {
        promotion_on_hit: true,
        promotion_admission_threshold: 1,
        eviction_high_watermark_ratio: 0.0001,
        ..MasterConfig::default()
    });
    lookup(&st);
    assert!(promotes(&queued(&st)).is_empty(), "memory at its watermark");
}

#[test]
fn a_reported_copy_of_the_version_in_memory_becomes_its_disk_copy() {
    let st = state(true, u64::MAX);
    put(&st, "k", 10);
    put(&st, "other", 10);
    let v = version_of(&st, "k");
    let objs = vec![
        DiskObject {
            key: "k".into(),
            version: v,
            size: 10,
        },
        DiskObject {
            key: "other".into(),
            version: v.saturating_sub(1),
            size: 10,
        },
    ];
    assert_eq!(
        st.disk_tier("c1", "a:1", objs, true).expect("tier"),
        vec![1, 0]
    );
    assert!(has_disk_copy(&st, "k") && memory_replicas(&st, "k") == 1);
    assert!(!has_disk_copy(&st, "other"));
    assert_eq!(st.inner.lock().objects.disk().bytes(), 10);
}

#[test]
fn a_drained_disk_tier_loses_its_copies_and_gets_no_more() {
    let st = offloading(MasterConfig::default());
    put(&st, "a", 1000);
    put(&st, "b", 1000);
    assert_eq!(
        persists(&queued(&st)),
        vec!["a".to_string(), "b".to_string()]
    );
    owner_acks(&st);
    // "a" lives on disk only, "b" in memory and on disk.
    assert_eq!(st.inner.lock().evict_to_disk_copy("a"), Offload::Moved);
    owner_acks(&st);
    assert_eq!(memory_replicas(&st, "a"), 0);
    // Only the owner may drain its tier.
    assert_eq!(
        st.drain_disk_tier("c2", "a:1"),
        Err(ErrorCode::IllegalClient)
    );
    assert_eq!(
        st.drain_disk_tier("c1", "nope"),
        Err(ErrorCode::SegmentNotFound)
    );
    assert!(has_disk_copy(&st, "a") && has_disk_copy(&st, "b"));
    st.drain_disk_tier("c1", "a:1").expect("drain");
    let keys = ["a".to_string(), "b".to_string()];
    assert_eq!(st.exist(&keys), vec![0, 1], "a had no other copy");
    assert!(!has_disk_copy(&st, "b"));
    assert_eq!(memory_replicas(&st, "b"), 1);
    assert_eq!(st.inner.lock().objects.disk().bytes(), 0);
    // Nothing is written through to the drained tier, and eviction
    // drops instead of moving.
    put(&st, "c", 1000);
    assert!(persists(&queued(&st)).is_empty());
    assert_eq!(
        st.inner.lock().offload_object("c", u64::MAX, u64::MAX),
        Offload::NoTier
    );
}

#[test]
fn an_upsert_in_flight_when_the_disk_copy_it_replaces_is_lost_gets_its_space_back() {
    let st = offloading(MasterConfig::default());
    let k = ["k".to_string()];
    let v1 = put_with(&st, "k", 1000, &WriteConfig::default(), false);
    // Eviction leaves it on disk only (its memory replica forgotten after
    // the copy).
    assert_eq!(st.inner.lock().evict_to_disk_copy("k"), Offload::Moved);
    owner_acks(&st);
    let used = || st.inner.lock().usage().0;
    assert_eq!(used(), 0);
    // An upsert of it is being written...
    let items = st.put_start(&k, &[1000], &WriteConfig::default(), true);
    let Some(PutStartItem::Write { version: v2, .. }) = items.into_iter().next() else {
        panic!("no write of the upsert");
    };
    assert_eq!(used(), 1024);
    // ...when the owner reports the old version's disk copy lost (its
    // write failed on a full disk): the object is gone, as if evicted.
    st.disk_dropped("c1", "a:1", &[("k".to_string(), v1)])
        .expect("drop");
    assert_eq!(st.exist(&k), vec![0]);
    // The writer may still be copying: the upsert's space stays until it
    // ends the write, and then returns on the owner's ack.
    assert_eq!(used(), 1024);
    st.commit_end(&k, &[v2], &["a:1".to_string()]).expect("end");
    owner_acks(&st);
    assert_eq!(used(), 0);
    assert_eq!(st.exist(&k), vec![0]);
}

#[test]
fn a_disk_copy_of_a_removed_object_announced_afterwards_is_not_adopted() {
    // A new leader knows "k" from its owner's ledger only (memory replica,
    // no disk copy yet) and removes it before the owner lists its tier.
    let st = state(true, u64::MAX);
    let v = put_with(&st, "k", 1000, &WriteConfig::default(), false);
    assert_eq!(st.remove(&["k".to_string()], true), vec![0]);
    let copy = DiskObject {
        key: "k".into(),
        version: v,
        size: 1000,
    };
    let other = DiskObject {
        key: "never-known".into(),
        version: 3,
        size: 10,
    };
    // The leftover copy is refused (the owner deletes it); a copy of a key
    // this master never knew is adopted.
    assert_eq!(
        st.disk_tier("c1", "a:1", vec![copy, other], true),
        Ok(vec![0, 1])
    );
    assert_eq!(st.exist(&["k".to_string()]), vec![0]);
    assert_eq!(st.exist(&["never-known".to_string()]), vec![1]);
}

#[test]
fn the_disk_copies_of_objects_gone_with_their_owner_come_back_with_it() {
    // An owner restarted on its old directory: what went with its segment
    // (not removed by anyone) is adopted again.
    let st = state(true, u64::MAX);
    st.disk_tier("c1", "a:1", Vec::new(), true).expect("tier");
    let v = put_with(&st, "k", 1000, &WriteConfig::default(), false);
    st.unmount_segment("c1", "a:1").expect("unmount");
    assert_eq!(st.exist(&["k".to_string()]), vec![0]);
    st.mount_segment("c2", desc("a:1", 1 << 20)).expect("mount");
    let copy = DiskObject {
        key: "k".into(),
        version: v,
        size: 1000,
    };
    assert_eq!(st.disk_tier("c2", "a:1", vec![copy], true), Ok(vec![1]));
    assert_eq!(st.exist(&["k".to_string()]), vec![1]);
}
