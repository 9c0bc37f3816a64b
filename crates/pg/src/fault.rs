//! Fault-injection hook for tests, built into the transport.
//!
//! Rules come from `MOONCAKE_PG_FAULT="rule;rule"` (read once, when the first
//! group is created) or from [`inject`] at run time. A rule is
//! `action@key=val,…`:
//!
//! | action | keys | effect |
//! |---|---|---|
//! | `exit` | `group`, `seq`, `point=before_send\|mid_send\|after_send`, `code` | `_exit(code)` at that op |
//! | `freeze` | `group`, `seq` | every engine thread of the process stops for good |
//! | `drop_link` | `group`, `slot` | close the link to that slot and refuse it afterwards |
//! | `delay` | `group`, `slot`, `ms` | delay frames sent to that peer |
//! | `fail_connect` | `group`, `slot` | refuse outbound connects to that peer |
//!
//! `group` is the torch group id (`"0"` for the default group); a missing
//! key matches anything. With no rule set every hook is one relaxed atomic
//! load.

use crate::error::PgError;
use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Once;
use std::time::Duration;

/// Where in an op an `exit` rule fires (named after the rule's
/// `point=before_send|mid_send|after_send` values).
#[allow(clippy::enum_variant_names)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Point {
    /// When the op starts executing, before anything is sent.
    BeforeSend,
    /// Right after the first data piece reached the lowest-slot peer.
    MidSend,
    /// After the op's transfers finished, before it completes.
    AfterSend,
}

/// What a rule does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Action {
    /// `_exit(code)` at `point`.
    Exit {
        /// Exit status.
        code: i32,
        /// When in the op.
        point: Point,
    },
    /// Stop every engine thread; the process stays alive.
    Freeze,
    /// Close the link to `slot` and refuse it afterwards.
    DropLink,
    /// Delay frames sent to `slot`.
    Delay {
        /// Delay per frame.
        ms: u64,
    },
    /// Refuse outbound connects to `slot`.
    FailConnect,
}

/// One parsed rule.
#[derive(Debug)]
pub(crate) struct Rule {
    /// The rule as written.
    pub(crate) text: String,
    /// Its action.
    pub(crate) action: Action,
    /// Torch group id it applies to (any if `None`).
    pub(crate) group: Option<String>,
    /// Op sequence number it applies to (any if `None`).
    pub(crate) seq: Option<u64>,
    /// Peer slot it applies to (any if `None`).
    pub(crate) slot: Option<usize>,
    fired: AtomicU64,
}

impl Rule {
    fn matches(&self, group: &str, seq: Option<u64>, slot: Option<usize>) -> bool {
        self.group.as_deref().is_none_or(|g| g == group)
            && (self.seq.is_none() || seq.is_none() || self.seq == seq)
            && (self.slot.is_none() || slot.is_none() || self.slot == slot)
    }

    fn fire(&self) {
        self.fired.fetch_add(1, Ordering::Relaxed);
    }
}

static ACTIVE: AtomicBool = AtomicBool::new(false);
static FROZEN: AtomicBool = AtomicBool::new(false);
static RULES: Mutex<Vec<Rule>> = parking_lot::const_mutex(Vec::new());
static ENV: Once = Once::new();

/// Parses one rule (`action@key=val,…`).
pub(crate) fn parse(text: &str) -> Result<Rule, PgError> {
    let text = text.trim();
    let bad = |reason: String| PgError::FaultRule {
        rule: text.to_string(),
        reason,
    };
    let (name, args) = text.split_once('@').unwrap_or((text, ""));
    let mut group = None;
    let mut seq = None;
    let mut slot = None;
    let mut point = Point::BeforeSend;
    let mut code = 1i32;
    let mut ms = None;
    for kv in args.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (k, v) = kv
            .split_once('=')
            .ok_or_else(|| bad(format!("{kv:?} is not key=value")))?;
        let num = |v: &str| {
            v.trim()
                .parse::<u64>()
                .map_err(|_| bad(format!("{k}={v} is not a number")))
        };
        match k.trim() {
            "group" => group = Some(v.trim().to_string()),
            "seq" => seq = Some(num(v)?),
            "slot" => slot = Some(num(v)? as usize),
            "ms" => ms = Some(num(v)?),
            "code" => {
                code = v
                    .trim()
                    .parse()
                    .map_err(|_| bad(format!("code={v} is not an integer")))?
            }
            "point" => {
                point = match v.trim() {
                    "before_send" => Point::BeforeSend,
                    "mid_send" => Point::MidSend,
                    "after_send" => Point::AfterSend,
                    o => return Err(bad(format!("unknown point {o:?}"))),
                }
            }
            o => return Err(bad(format!("unknown key {o:?}"))),
        }
    }
    let need_slot = |a: Action| {
        if slot.is_none() {
            Err(bad(format!("{name} needs slot=")))
        } else {
            Ok(a)
        }
    };
    let action = match name.trim() {
        "exit" => Action::Exit { code, point },
        "freeze" => Action::Freeze,
        "drop_link" => need_slot(Action::DropLink)?,
        "fail_connect" => need_slot(Action::FailConnect)?,
        "delay" => need_slot(Action::Delay {
            ms: ms.ok_or_else(|| bad("delay needs ms=".into()))?,
        })?,
        o => return Err(bad(format!("unknown action {o:?}"))),
    };
    Ok(Rule {
        text: text.to_string(),
        action,
        group,
        seq,
        slot,
        fired: AtomicU64::new(0),
    })
}

/// Parses `rules` (`rule;rule`) and adds them; nothing is added on error.
pub fn inject(rules: &str) -> Result<(), PgError> {
    let parsed = rules
        .split(';')
        .filter(|r| !r.trim().is_empty())
        .map(parse)
        .collect::<Result<Vec<_>, _>>()?;
    let mut all = RULES.lock();
    all.extend(parsed);
    ACTIVE.store(!all.is_empty(), Ordering::Release);
    Ok(())
}

/// Removes every rule.
pub fn clear() {
    RULES.lock().clear();
    ACTIVE.store(false, Ordering::Release);
}

/// Every rule with the number of times it fired.
pub fn stats() -> Vec<(String, u64)> {
    RULES
        .lock()
        .iter()
        .map(|r| (r.text.clone(), r.fired.load(Ordering::Relaxed)))
        .collect()
}

/// Loads `MOONCAKE_PG_FAULT` once per process.
pub(crate) fn load_env() -> Result<(), PgError> {
    let mut res = Ok(());
    ENV.call_once(|| {
        if let Ok(v) = std::env::var("MOONCAKE_PG_FAULT") {
            res = inject(&v);
        }
    });
    res
}

/// True when at least one rule is set (the only cost of an inert hook).
#[inline]
pub(crate) fn active() -> bool {
    ACTIVE.load(Ordering::Relaxed)
}

/// True once a `freeze` rule fired in this process.
#[inline]
pub(crate) fn frozen() -> bool {
    FROZEN.load(Ordering::Relaxed)
}

/// Parks the calling engine thread for good once the process is frozen.
pub(crate) fn park_if_frozen() {
    while frozen() {
        std::thread::sleep(Duration::from_secs(3600));
    }
}

/// Applies `exit` and `freeze` rules at `point` of op `seq` in `group`.
pub(crate) fn at_op(group: &str, seq: u64, point: Point) {
    if !active() {
        return;
    }
    let mut exit = None;
    let mut freeze = false;
    for r in RULES.lock().iter() {
        if !r.matches(group, Some(seq), None) {
            continue;
        }
        match r.action {
            Action::Exit { code, point: p } if p == point => {
                r.fire();
                exit = Some(code);
            }
            Action::Freeze if point == Point::BeforeSend => {
                r.fire();
                freeze = true;
            }
            _ => {}
        }
    }
    if let Some(code) = exit {
        // SAFETY: `_exit` ends the process at once, like a crash; it has no
        // preconditions.
        unsafe { libc::_exit(code) };
    }
    if freeze {
        FROZEN.store(true, Ordering::Release);
        park_if_frozen();
    }
}

/// True when a rule of kind `pick` matches `group`, op `seq` and peer `slot`
/// (counted as fired).
fn any(group: &str, seq: Option<u64>, slot: usize, pick: impl Fn(Action) -> bool) -> bool {
    if !active() {
        return false;
    }
    let rules = RULES.lock();
    let mut hit = false;
    for r in rules.iter() {
        if pick(r.action) && r.matches(group, seq, Some(slot)) {
            r.fire();
            hit = true;
        }
    }
    hit
}

/// True when the link to `slot` must be dropped at op `seq`.
pub(crate) fn drop_link(group: &str, seq: u64, slot: usize) -> bool {
    any(group, Some(seq), slot, |a| a == Action::DropLink)
}

/// True when outbound connects to `slot` must fail.
pub(crate) fn fail_connect(group: &str, slot: usize) -> bool {
    any(group, None, slot, |a| a == Action::FailConnect)
}

/// Sleeps as long as the `delay` rules for frames to `slot` say.
pub(crate) fn delay(group: &str, slot: usize) {
    if !active() {
        return;
    }
    let ms: u64 = RULES
        .lock()
        .iter()
        .filter(|r| r.matches(group, None, Some(slot)))
        .filter_map(|r| match r.action {
            Action::Delay { ms } => {
                r.fire();
                Some(ms)
            }
            _ => None,
        })
        .sum();
    if ms > 0 {
        std::thread::sleep(Duration::from_millis(ms));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_parse() {
        let r = parse("exit@group=0,seq=3,point=mid_send,code=7").expect("exit");
        assert_eq!(
            r.action,
            Action::Exit {
                code: 7,
                point: Point::MidSend
            }
        );
        assert_eq!((r.group.as_deref(), r.seq), (Some("0"), Some(3)));
        assert_eq!(
            parse("freeze@seq=2").expect("freeze").action,
            Action::Freeze
        );
        assert_eq!(
            parse("delay@slot=1,ms=5").expect("delay").action,
            Action::Delay { ms: 5 }
        );
        assert_eq!(
            parse("drop_link@group=0,slot=1").expect("drop").slot,
            Some(1)
        );
        assert!(parse("fail_connect@slot=2").is_ok());
        for bad in [
            "explode",
            "exit@point=sideways",
            "exit@seq=x",
            "delay@slot=1",
            "drop_link",
            "exit@colour=red",
            "exit@seq",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
        assert!(inject("exit@seq=1;bogus").is_err());
    }

    #[test]
    fn matching_ignores_missing_keys() {
        let r = parse("drop_link@group=1,slot=2").expect("rule");
        assert!(r.matches("1", Some(9), Some(2)));
        assert!(!r.matches("0", Some(9), Some(2)));
        assert!(!r.matches("1", Some(9), Some(3)));
    }
}
