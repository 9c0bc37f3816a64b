//! The per-key search and the whole-history check.

use crate::history::{Call, Op, Outcome, ValueId};
use std::collections::{BTreeMap, HashSet};

/// What the store may do besides the recorded operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Model {
    /// The store may drop a key at any instant (memory eviction).
    pub eviction: bool,
}

/// Something the history shows that the store must never do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Anomaly {
    /// No order of the key's operations explains every result.
    NotLinearizable {
        /// The key.
        key: String,
        /// Its operations that took part (failed ones are left out).
        ops: usize,
        /// The operation the longest explained prefix could not be
        /// extended with: the earliest to complete of those left.
        blocked: Op,
    },
    /// A read returned a value no write of the key made.
    Torn {
        /// The read.
        op: Op,
    },
    /// An operation that did not complete within the bound.
    Stuck {
        /// The operation.
        op: Op,
    },
}

/// The result of [`check`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    /// Operations checked.
    pub ops: usize,
    /// Keys checked.
    pub keys: usize,
    /// What was found (empty: the history is linearizable).
    pub anomalies: Vec<Anomaly>,
}

/// The register of one key.
type State = Option<ValueId>;

/// The puts of one key (by client and invocation) that overlap another
/// write of the key in time.
type Contended = HashSet<(u32, u64)>;

/// The puts of `ops` (one key's, failed ones included) that another put or
/// upsert of the key was in flight with. Such a put may answer success
/// without taking effect: the store reports a key whose write has started
/// as present ("already exists" is success for a put) before that write
/// completes, and that write may still fail.
fn contended(ops: &[&Op]) -> Contended {
    let mut writes: Vec<&Op> = ops
        .iter()
        .copied()
        .filter(|o| o.written().is_some())
        .collect();
    writes.sort_by_key(|o| o.invoke);
    let mut out = Contended::new();
    for (i, a) in writes.iter().enumerate() {
        let end = a.deadline();
        // Writes invoked later than `a` that began before it ended; each
        // overlapping pair is found from its earlier member.
        for b in writes[i + 1..].iter().take_while(|b| b.invoke <= end) {
            for o in [a, b] {
                if matches!(o.call, Call::Put(_)) {
                    out.insert((o.client, o.invoke));
                }
            }
        }
    }
    out
}

/// The registers `op` may leave when it takes effect on `state` (none when
/// its result contradicts `state`); `contended`: see [`contended`].
fn steps(state: State, op: &Op, model: Model, contended: bool) -> Vec<State> {
    let unknown = op.indeterminate();
    let mut out = match (op.call, op.outcome) {
        (Call::Put(v), _) => {
            let mut s = vec![state.or(Some(v))];
            if model.eviction {
                s.push(Some(v));
            }
            if contended {
                s.push(state);
            }
            s
        }
        (Call::Upsert(v), _) => vec![Some(v)],
        (Call::Remove, Outcome::Ok(Some(_))) => match state {
            Some(_) => vec![None],
            None => vec![],
        },
        (Call::Remove, Outcome::Ok(None)) => match state {
            None => vec![None],
            Some(_) if model.eviction => vec![None],
            Some(_) => vec![],
        },
        (Call::Remove, _) => vec![None],
        (Call::Get, Outcome::Ok(read)) => {
            if read == state || (read.is_none() && model.eviction) {
                vec![read]
            } else {
                vec![]
            }
        }
        (Call::Get, _) => vec![state],
        (Call::Exists, Outcome::Ok(present)) => match (present, state) {
            (Some(_), Some(_)) | (None, None) => vec![state],
            (None, Some(_)) if model.eviction => vec![None],
            _ => vec![],
        },
        (Call::Exists, _) => vec![state],
    };
    out.sort_unstable();
    out.dedup();
    if unknown {
        // It may never have taken effect: tried first, because an operation
        // that took no effect fits anywhere (placing it now is as good as
        // placing it later), so a history explained without it is found
        // without trying where each indeterminate operation might have
        // taken effect.
        out.retain(|s| *s != state);
        out.insert(0, state);
    }
    out
}

fn bit(bits: &[u64], i: usize) -> bool {
    bits[i / 64] & (1 << (i % 64)) != 0
}

fn flip(bits: &mut [u64], i: usize) {
    bits[i / 64] ^= 1 << (i % 64);
}

/// The operations that may take effect next: those not yet placed that
/// were invoked before every other unplaced operation had to complete,
/// each with the registers it may leave.
fn candidates(
    ops: &[&Op],
    bits: &[u64],
    state: State,
    model: Model,
    contended: &Contended,
) -> Vec<(usize, State)> {
    let horizon = (0..ops.len())
        .filter(|&i| !bit(bits, i))
        .map(|i| ops[i].deadline())
        .min()
        .unwrap_or(u64::MAX);
    let mut out = Vec::new();
    for (i, op) in ops.iter().enumerate() {
        if bit(bits, i) {
            continue;
        }
        if op.invoke > horizon {
            break;
        }
        let c = contended.contains(&(op.client, op.invoke));
        out.extend(steps(state, op, model, c).into_iter().map(|s| (i, s)));
    }
    out
}

struct Frame {
    cands: Vec<(usize, State)>,
    next: usize,
    /// The operation placed to reach this frame.
    via: Option<usize>,
}

/// Whether one key's operations (all of the same key, failed ones already
/// left out, starting from an absent key) are linearizable; on failure the
/// operation the longest explained prefix could not be extended with.
pub fn check_key(ops: &[&Op], model: Model) -> Result<(), Op> {
    search(ops, model, &contended(ops))
}

/// [`check_key`] with the contended puts given.
fn search(ops: &[&Op], model: Model, contended: &Contended) -> Result<(), Op> {
    let mut ops: Vec<&Op> = ops.to_vec();
    ops.sort_by_key(|o| o.invoke);
    let n = ops.len();
    let mut bits = vec![0u64; n.div_ceil(64).max(1)];
    let mut seen: HashSet<(Vec<u64>, State)> = HashSet::new();
    let mut placed = 0usize;
    let mut best = (0usize, bits.clone());
    seen.insert((bits.clone(), None));
    let mut stack = vec![Frame {
        cands: candidates(&ops, &bits, None, model, contended),
        next: 0,
        via: None,
    }];
    while placed < n {
        let Some(top) = stack.last_mut() else {
            break;
        };
        if let Some(&(i, next)) = top.cands.get(top.next) {
            top.next += 1;
            flip(&mut bits, i);
            if seen.insert((bits.clone(), next)) {
                placed += 1;
                if placed > best.0 {
                    best = (placed, bits.clone());
                }
                stack.push(Frame {
                    cands: candidates(&ops, &bits, next, model, contended),
                    next: 0,
                    via: Some(i),
                });
            } else {
                flip(&mut bits, i);
            }
        } else {
            let done = stack.pop();
            match done.and_then(|f| f.via) {
                Some(i) => {
                    flip(&mut bits, i);
                    placed -= 1;
                }
                None => break,
            }
        }
    }
    if placed == n {
        return Ok(());
    }
    let blocked = (0..n)
        .filter(|&i| !bit(&best.1, i))
        .min_by_key(|&i| ops[i].deadline())
        .map(|i| ops[i].clone());
    Err(blocked.unwrap_or_else(|| ops[0].clone()))
}

/// [`check_key`] in up to three passes, each only if the one before fails:
/// first with every indeterminate operation whose effect no read shows
/// taken as having had none (a write whose value no read returned, any
/// remove); then with the indeterminate removes back in; then with all of
/// them. An indeterminate operation may always have had no effect, so a
/// history explained without some of them is linearizable; and the early
/// passes do not search where each left-out operation might have taken
/// effect, which for a few dozen of them (the timeouts of a fault) is
/// exponential. A remove that took effect without its client learning so
/// shows only as a later read of "not found": the second pass explains it
/// while still leaving out the (many more) unread writes.
fn check_live(live: &[&Op], model: Model, contended: &Contended) -> Result<(), Op> {
    let read: HashSet<ValueId> = live
        .iter()
        .filter_map(|o| match (o.call, o.outcome) {
            (Call::Get, Outcome::Ok(Some(v))) => Some(v),
            _ => None,
        })
        .collect();
    let unread_write =
        |o: &Op| o.indeterminate() && o.written().is_some_and(|v| !read.contains(&v));
    let unknown_remove = |o: &Op| o.indeterminate() && o.call == Call::Remove;
    if !live.iter().any(|o| unread_write(o) || unknown_remove(o)) {
        return search(live, model, contended);
    }
    let without = |drop: &dyn Fn(&Op) -> bool| -> Vec<&Op> {
        live.iter().copied().filter(|o| !drop(o)).collect()
    };
    search(
        &without(&|o| unread_write(o) || unknown_remove(o)),
        model,
        contended,
    )
    .or_else(|_| search(&without(&unread_write), model, contended))
    .or_else(|_| search(live, model, contended))
}

/// Whether `op` takes part in its key's search. A failed operation did
/// nothing. An indeterminate read (`get` or `is_exist` whose answer never
/// came) observed nothing and changes nothing, so it fits anywhere and is
/// left out too: kept, it would be a candidate at every step until placed,
/// and a search that must backtrack would try every subset of such reads
/// placed so far (a fault that times out a few dozen of them made one key's
/// search run for minutes).
fn takes_part(op: &Op) -> bool {
    let unread_read = op.indeterminate() && matches!(op.call, Call::Get | Call::Exists);
    op.outcome != Outcome::Failed && !unread_read
}

/// Checks a whole history: each key for linearizability under `model`,
/// every read for a value some write of its key made, and every operation
/// for a completion within `stuck_after` of its invocation (`end` is when
/// recording stopped).
pub fn check(history: &[Op], model: Model, end: u64, stuck_after: u64) -> Report {
    let mut by_key: BTreeMap<&str, Vec<&Op>> = BTreeMap::new();
    for op in history {
        by_key.entry(op.key.as_str()).or_default().push(op);
    }
    let mut anomalies = Vec::new();
    for op in history.iter().filter(|o| o.outcome != Outcome::Crashed) {
        let waited = op.complete.unwrap_or(end).saturating_sub(op.invoke);
        if waited > stuck_after {
            anomalies.push(Anomaly::Stuck { op: op.clone() });
        }
    }
    for (key, ops) in &by_key {
        let written: HashSet<ValueId> = ops.iter().filter_map(|o| o.written()).collect();
        for op in ops {
            if let (Call::Get, Outcome::Ok(Some(v))) = (op.call, op.outcome) {
                if !written.contains(&v) {
                    anomalies.push(Anomaly::Torn { op: (*op).clone() });
                }
            }
        }
        let live: Vec<&Op> = ops.iter().copied().filter(|o| takes_part(o)).collect();
        // Failed writes count: one in flight makes a concurrent put's
        // success say nothing.
        if let Err(blocked) = check_live(&live, model, &contended(ops)) {
            anomalies.push(Anomaly::NotLinearizable {
                key: (*key).to_string(),
                ops: live.len(),
                blocked,
            });
        }
    }
    Report {
        ops: history.len(),
        keys: by_key.len(),
        anomalies,
    }
}

#[cfg(test)]
mod tests;
