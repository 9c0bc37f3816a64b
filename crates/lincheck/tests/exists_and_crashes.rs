//! Existence checks and operations of killed processes, through the public
//! `check`.

use mooncake_lincheck::{check, Anomaly, Call, Model, Op, Outcome};

fn op(client: u32, call: Call, span: (u64, Option<u64>), outcome: Outcome) -> Op {
    Op {
        client,
        key: "k".into(),
        call,
        invoke: span.0,
        complete: span.1,
        outcome,
    }
}

const PRESENT: Outcome = Outcome::Ok(Some(1));
const ABSENT: Outcome = Outcome::Ok(None);
const STRICT: Model = Model { eviction: false };
const EVICTION: Model = Model { eviction: true };

fn anomalies(history: &[Op], model: Model) -> Vec<Anomaly> {
    check(history, model, 10_000, 1_000).anomalies
}

#[test]
fn exists_answers_must_follow_the_writes_and_removes() {
    let write = op(0, Call::Upsert(7), (0, Some(5)), Outcome::Ok(None));
    let remove = op(0, Call::Remove, (20, Some(25)), Outcome::Ok(Some(1)));
    // Present after the write, absent after the remove: linearizable.
    let good = [
        write.clone(),
        op(1, Call::Exists, (6, Some(9)), PRESENT),
        remove.clone(),
        op(1, Call::Exists, (30, Some(35)), ABSENT),
    ];
    assert!(anomalies(&good, STRICT).is_empty());
    // Absent before anything was written, present once it was.
    let before = [op(1, Call::Exists, (0, Some(1)), ABSENT), write.clone()];
    assert!(anomalies(&before, STRICT).is_empty());
    // Present before any write began: no order explains it.
    let early = [op(1, Call::Exists, (0, Some(1)), PRESENT), {
        let mut w = write.clone();
        w.invoke = 2;
        w.complete = Some(5);
        w
    }];
    assert!(matches!(
        anomalies(&early, STRICT)[..],
        [Anomaly::NotLinearizable { .. }]
    ));
    // Absent after an acknowledged write: lost, unless eviction is allowed.
    let lost = [write.clone(), op(1, Call::Exists, (6, Some(9)), ABSENT)];
    assert!(matches!(
        anomalies(&lost, STRICT)[..],
        [Anomaly::NotLinearizable { .. }]
    ));
    assert!(anomalies(&lost, EVICTION).is_empty());
    // An evicted key stays gone: present again needs a write.
    let back = [
        write,
        op(1, Call::Exists, (6, Some(9)), ABSENT),
        op(1, Call::Exists, (10, Some(12)), PRESENT),
    ];
    assert!(matches!(
        anomalies(&back, EVICTION)[..],
        [Anomaly::NotLinearizable { .. }]
    ));
    // A present answer names no value: it is never a torn read.
    let after_remove = [remove, op(1, Call::Exists, (30, Some(35)), PRESENT)];
    assert!(matches!(
        anomalies(&after_remove, STRICT)[..],
        [Anomaly::NotLinearizable { .. }]
    ));
}

#[test]
fn a_crashed_write_may_take_effect_late_or_never_and_is_not_stuck() {
    let crashed = op(0, Call::Upsert(7), (0, None), Outcome::Crashed);
    // Seen long after its process died (the request was still on its way).
    let late = [
        crashed.clone(),
        op(1, Call::Get, (500, Some(510)), Outcome::Ok(None)),
        op(1, Call::Get, (600, Some(610)), Outcome::Ok(Some(7))),
    ];
    assert!(anomalies(&late, STRICT).is_empty());
    // Never seen: fine too.
    let never = [
        crashed.clone(),
        op(1, Call::Get, (600, Some(610)), Outcome::Ok(None)),
    ];
    assert!(anomalies(&never, STRICT).is_empty());
    // Once seen it stays, like any write.
    let undone = [
        crashed.clone(),
        op(1, Call::Get, (500, Some(510)), Outcome::Ok(Some(7))),
        op(1, Call::Get, (600, Some(610)), Outcome::Ok(None)),
    ];
    assert!(matches!(
        anomalies(&undone, STRICT)[..],
        [Anomaly::NotLinearizable { .. }]
    ));
    // The same open operation of a live process is stuck.
    let open = op(0, Call::Upsert(7), (0, None), Outcome::Unknown);
    assert!(matches!(
        anomalies(&[open], STRICT)[..],
        [Anomaly::Stuck { .. }]
    ));
}

#[test]
fn the_history_format_names_the_new_kinds() {
    let line =
        r#"{"client":3,"key":"k","call":"exists","invoke":1,"complete":null,"outcome":"crashed"}"#;
    let parsed: Op = serde_json::from_str(line).expect("parse");
    assert_eq!(parsed.call, Call::Exists);
    assert_eq!(parsed.outcome, Outcome::Crashed);
    assert_eq!(parsed.complete, None);
}

#[test]
fn a_put_overlapping_another_write_may_succeed_without_effect() {
    // The pattern a cluster run recorded: put A in flight, put B inside it
    // answers success, a check after B finds the key absent (A has not
    // completed), then A's value is read.
    let a = op(4, Call::Put(40), (100, Some(300)), Outcome::Ok(None));
    let b = op(2, Call::Put(20), (150, Some(170)), Outcome::Ok(None));
    let history = [
        a.clone(),
        b.clone(),
        op(3, Call::Exists, (200, Some(250)), ABSENT),
        op(3, Call::Get, (310, Some(320)), Outcome::Ok(Some(40))),
    ];
    assert!(anomalies(&history, STRICT).is_empty());
    // The same when the write in flight fails: nothing is ever stored.
    let failed = [
        op(4, Call::Upsert(40), (100, Some(300)), Outcome::Failed),
        b.clone(),
        op(3, Call::Get, (310, Some(320)), ABSENT),
    ];
    assert!(anomalies(&failed, STRICT).is_empty());
    // A put that overlapped no other write and answered success must have
    // set the absent key.
    let alone = [b, op(3, Call::Get, (200, Some(210)), ABSENT)];
    assert!(matches!(
        anomalies(&alone, STRICT)[..],
        [Anomaly::NotLinearizable { .. }]
    ));
    // Overlap never lets a read see a value nobody wrote, nor a contended
    // put's value replace a present one.
    let stale = [
        op(1, Call::Upsert(10), (0, Some(10)), Outcome::Ok(None)),
        a,
        op(2, Call::Put(20), (150, Some(170)), Outcome::Ok(None)),
        op(3, Call::Get, (310, Some(320)), Outcome::Ok(Some(20))),
    ];
    assert!(matches!(
        anomalies(&stale, STRICT)[..],
        [Anomaly::NotLinearizable { .. }]
    ));
}
