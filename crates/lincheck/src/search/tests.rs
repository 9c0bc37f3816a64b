//! Known linearizable and non-linearizable histories.

use super::*;

fn op(client: u32, call: Call, invoke: u64, complete: u64, outcome: Outcome) -> Op {
    Op {
        client,
        key: "k".into(),
        call,
        invoke,
        complete: Some(complete),
        outcome,
    }
}

/// An indeterminate op still pending when the history ends.
fn pending(client: u32, call: Call, invoke: u64) -> Op {
    Op {
        complete: None,
        ..op(client, call, invoke, 0, Outcome::Unknown)
    }
}

fn ok() -> Outcome {
    Outcome::Ok(None)
}

fn read(v: Option<ValueId>) -> Outcome {
    Outcome::Ok(v)
}

fn verdict(h: &[Op], model: Model) -> Vec<Anomaly> {
    check(h, model, 1_000, 1_000).anomalies
}

const STRICT: Model = Model { eviction: false };
const EVICTING: Model = Model { eviction: true };

#[test]
fn sequential_history_is_linearizable() {
    let h = [
        op(0, Call::Get, 0, 1, read(None)),
        op(0, Call::Put(1), 2, 3, ok()),
        op(1, Call::Get, 4, 5, read(Some(1))),
        op(1, Call::Put(2), 6, 7, ok()),
        op(0, Call::Get, 8, 9, read(Some(1))),
        op(0, Call::Upsert(3), 10, 11, ok()),
        op(1, Call::Remove, 12, 13, read(Some(3))),
        op(1, Call::Remove, 14, 15, read(None)),
        op(0, Call::Get, 16, 17, read(None)),
    ];
    assert_eq!(verdict(&h, STRICT), vec![]);
}

#[test]
fn concurrent_reads_may_see_either_side_of_a_write() {
    let h = [
        op(0, Call::Upsert(1), 0, 1, ok()),
        op(1, Call::Upsert(2), 2, 10, ok()),
        op(2, Call::Get, 3, 4, read(Some(2))),
        op(3, Call::Get, 3, 4, read(Some(2))),
        op(4, Call::Get, 5, 6, read(Some(2))),
    ];
    assert_eq!(verdict(&h, STRICT), vec![]);
    // But once one read saw the new value, a later read cannot see the old one.
    let h2 = [
        op(0, Call::Upsert(1), 0, 1, ok()),
        op(1, Call::Upsert(2), 2, 10, ok()),
        op(2, Call::Get, 3, 4, read(Some(2))),
        op(3, Call::Get, 5, 6, read(Some(1))),
    ];
    assert!(matches!(
        verdict(&h2, STRICT).as_slice(),
        [Anomaly::NotLinearizable { .. }]
    ));
}

#[test]
fn a_planted_stale_read_is_caught() {
    let h = [
        op(0, Call::Upsert(1), 0, 1, ok()),
        op(0, Call::Upsert(2), 2, 3, ok()),
        op(1, Call::Get, 4, 5, read(Some(1))),
    ];
    let found = verdict(&h, STRICT);
    let [Anomaly::NotLinearizable { key, blocked, .. }] = found.as_slice() else {
        panic!("{found:?}");
    };
    assert_eq!(key, "k");
    assert_eq!(blocked.call, Call::Get);
    // Eviction never explains an old value.
    assert!(!verdict(&h, EVICTING).is_empty());
}

#[test]
fn a_planted_lost_write_is_caught() {
    // An acknowledged upsert, then quiescent reads that miss it.
    let h = [
        op(0, Call::Put(1), 0, 1, ok()),
        op(0, Call::Upsert(2), 2, 3, ok()),
        op(1, Call::Get, 10, 11, read(Some(1))),
        op(2, Call::Get, 12, 13, read(Some(1))),
    ];
    assert!(matches!(
        verdict(&h, STRICT).as_slice(),
        [Anomaly::NotLinearizable { .. }]
    ));
    // A lost key (read finds nothing) is a loss without eviction, fine with it.
    let gone = [
        op(0, Call::Upsert(1), 0, 1, ok()),
        op(1, Call::Get, 2, 3, read(None)),
    ];
    assert!(!verdict(&gone, STRICT).is_empty());
    assert_eq!(verdict(&gone, EVICTING), vec![]);
}

#[test]
fn a_planted_torn_value_is_caught() {
    let h = [
        op(0, Call::Upsert(1), 0, 1, ok()),
        op(1, Call::Get, 2, 3, read(Some(99))),
    ];
    let found = verdict(&h, EVICTING);
    assert!(found
        .iter()
        .any(|a| matches!(a, Anomaly::Torn { op } if op.client == 1)));
}

#[test]
fn put_is_write_once() {
    let h = [
        op(0, Call::Put(1), 0, 1, ok()),
        op(1, Call::Put(2), 2, 3, ok()),
        op(2, Call::Get, 4, 5, read(Some(1))),
    ];
    assert_eq!(verdict(&h, STRICT), vec![]);
    let wrong = [
        op(0, Call::Put(1), 0, 1, ok()),
        op(1, Call::Put(2), 2, 3, ok()),
        op(2, Call::Get, 4, 5, read(Some(2))),
    ];
    assert!(!verdict(&wrong, STRICT).is_empty());
    // With eviction the first value may have gone before the second put.
    assert_eq!(verdict(&wrong, EVICTING), vec![]);
}

#[test]
fn indeterminate_and_failed_operations() {
    // A timed-out upsert may have happened late...
    let late = [
        op(0, Call::Upsert(1), 0, 1, ok()),
        op(1, Call::Upsert(2), 2, 3, Outcome::Unknown),
        op(2, Call::Get, 10, 11, read(Some(1))),
        op(2, Call::Get, 12, 13, read(Some(2))),
    ];
    assert_eq!(verdict(&late, STRICT), vec![]);
    // ...or never.
    let never = [
        op(0, Call::Upsert(1), 0, 1, ok()),
        op(1, Call::Upsert(2), 2, 3, Outcome::Unknown),
        op(2, Call::Get, 10, 11, read(Some(1))),
    ];
    assert_eq!(verdict(&never, STRICT), vec![]);
    // A definitely failed write must never be seen.
    let failed = [
        op(0, Call::Upsert(1), 0, 1, ok()),
        op(1, Call::Upsert(2), 2, 3, Outcome::Failed),
        op(2, Call::Get, 10, 11, read(Some(2))),
    ];
    assert!(!verdict(&failed, STRICT).is_empty());
}

#[test]
fn removes_report_what_they_found() {
    let h = [
        op(0, Call::Put(1), 0, 1, ok()),
        op(1, Call::Remove, 2, 3, read(Some(1))),
        op(2, Call::Remove, 2, 3, read(None)),
        op(0, Call::Get, 4, 5, read(None)),
    ];
    assert_eq!(verdict(&h, STRICT), vec![]);
    let double = [
        op(0, Call::Put(1), 0, 1, ok()),
        op(1, Call::Remove, 2, 3, read(Some(1))),
        op(2, Call::Remove, 4, 5, read(Some(1))),
    ];
    assert!(!verdict(&double, STRICT).is_empty());
}

#[test]
fn stuck_operations_are_reported() {
    let mut h = vec![op(0, Call::Get, 0, 1, read(None))];
    h.push(pending(1, Call::Upsert(1), 5));
    let r = check(&h, STRICT, 2_000, 1_000);
    assert!(matches!(r.anomalies.as_slice(), [Anomaly::Stuck { op }] if op.client == 1));
    assert_eq!(check(&h, STRICT, 900, 1_000).anomalies, vec![]);
}

#[test]
fn keys_are_independent_and_large_concurrent_histories_finish() {
    // 8 clients x 60 overlapping upserts and reads on one key, each read
    // returning the value of the write it overlaps or the last one before.
    let mut h = Vec::new();
    let mut t = 0;
    let mut last = None;
    for round in 0..60u64 {
        let v = round + 1;
        h.push(op(0, Call::Upsert(v), t, t + 5, ok()));
        for c in 1..8u32 {
            let seen = if c % 2 == 0 { Some(v) } else { last };
            h.push(op(c, Call::Get, t + 1, t + 4, read(seen)));
        }
        last = Some(v);
        t += 6;
    }
    let r = check(&h, STRICT, t, 1_000);
    assert_eq!(r.anomalies, vec![]);
    assert_eq!((r.ops, r.keys), (h.len(), 1));
}

#[test]
fn many_unread_indeterminate_writes_check_quickly_and_stay_optional() {
    // 40 writes time out during a fault and none is ever read, among
    // sequential traffic that is linearizable only if none took effect
    // after the last upsert (the reads keep seeing value 1).
    let mut h = vec![op(0, Call::Upsert(1), 0, 1, ok())];
    for i in 0..40u64 {
        h.push(pending(1, Call::Upsert(1_000 + i), 2 + i));
    }
    for i in 0..4_000u64 {
        h.push(op(2, Call::Get, 100 + 2 * i, 101 + 2 * i, read(Some(1))));
    }
    assert_eq!(check(&h, EVICTING, 10_000, 100_000).anomalies, vec![]);
    assert_eq!(check(&h, STRICT, 10_000, 100_000).anomalies, vec![]);
}

#[test]
fn an_indeterminate_write_that_was_read_still_explains_the_read() {
    let h = [
        op(0, Call::Upsert(1), 0, 1, ok()),
        pending(1, Call::Upsert(2), 2),
        op(2, Call::Get, 10, 11, read(Some(2))),
        op(2, Call::Get, 12, 13, read(Some(2))),
    ];
    assert_eq!(check(&h, STRICT, 100, 1_000).anomalies, vec![]);
}

#[test]
fn unread_indeterminate_writes_do_not_hide_a_stale_read() {
    // A stale read after a completed newer write is an anomaly whatever
    // the indeterminate writes did.
    let mut h = vec![
        op(0, Call::Upsert(1), 0, 1, ok()),
        op(0, Call::Upsert(2), 2, 3, ok()),
        op(1, Call::Get, 10, 11, read(Some(1))),
    ];
    for i in 0..3u64 {
        h.push(pending(2, Call::Upsert(100 + i), 4 + i));
    }
    let found = check(&h, STRICT, 100, 1_000).anomalies;
    assert!(
        matches!(found.as_slice(), [Anomaly::NotLinearizable { .. }]),
        "{found:?}"
    );
}

#[test]
fn an_indeterminate_remove_that_took_effect_explains_a_miss_among_many_unread_writes() {
    // A remove times out but took effect (later reads miss the key), among
    // 40 indeterminate writes nobody read: the check puts the remove back
    // without searching where each of the 40 writes might have landed.
    let mut h = vec![
        op(0, Call::Upsert(1), 0, 1, ok()),
        pending(1, Call::Remove, 2),
    ];
    for i in 0..40u64 {
        h.push(pending(3, Call::Upsert(1_000 + i), 3 + i));
    }
    for i in 0..2_000u64 {
        h.push(op(2, Call::Get, 100 + 2 * i, 101 + 2 * i, read(None)));
    }
    assert_eq!(check(&h, STRICT, 10_000, 100_000).anomalies, vec![]);
    // Without the remove (and with only three unread writes, since a
    // history that is not linearizable is searched in full), the misses
    // after an acknowledged write are an anomaly: a lost write.
    h.remove(1);
    h.truncate(4);
    h.push(op(2, Call::Get, 100, 101, read(None)));
    let found = check(&h, STRICT, 10_000, 100_000).anomalies;
    assert!(
        matches!(found.as_slice(), [Anomaly::NotLinearizable { .. }]),
        "{found:?}"
    );
}

#[test]
fn indeterminate_reads_take_no_part_in_the_search() {
    // A stale read after a completed newer write, while 40 reads and
    // existence checks time out across the whole history: reported at
    // once. Kept in the search, each timed-out read could be placed at
    // every step, and proving that no order explains the stale read would
    // try every subset of them (2^40).
    let mut h = vec![
        op(0, Call::Upsert(1), 0, 1, ok()),
        op(0, Call::Upsert(2), 2, 3, ok()),
        op(1, Call::Get, 10, 11, read(Some(1))),
    ];
    for i in 0..40u64 {
        let call = if i % 2 == 0 { Call::Get } else { Call::Exists };
        h.push(pending(2 + (i % 3) as u32, call, i));
    }
    let found = check(&h, STRICT, 100, 1_000).anomalies;
    assert!(
        matches!(found.as_slice(), [Anomaly::NotLinearizable { ops: 3, .. }]),
        "{found:?}"
    );
    // And they explain nothing: an existence check that never answered
    // does not stand in for the write a read needs.
    let h = [
        pending(1, Call::Exists, 0),
        op(2, Call::Get, 5, 6, read(Some(9))),
    ];
    let found = check(&h, STRICT, 100, 1_000).anomalies;
    assert!(
        matches!(
            found.as_slice(),
            [Anomaly::Torn { .. }, Anomaly::NotLinearizable { .. }]
        ),
        "{found:?}"
    );
}
