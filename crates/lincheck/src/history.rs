//! The recorded operations.

use serde::{Deserialize, Serialize};

/// The id of a written value (unique over the history).
pub type ValueId = u64;

/// What an operation asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Call {
    /// Write-once: sets an absent key to the value, keeps a present one.
    Put(ValueId),
    /// Sets the key to the value.
    Upsert(ValueId),
    /// Clears the key.
    Remove,
    /// Reads the key.
    Get,
    /// Asks whether the key is present: `Ok(Some(_))` present (whatever
    /// its value), `Ok(None)` absent.
    Exists,
}

/// How an operation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// It took effect. A `get` carries what it read (`None`: not found); a
    /// `remove` carries `Some(_)` when it removed something and `None`
    /// when it answered OBJECT_NOT_FOUND; writes carry `None`.
    Ok(Option<ValueId>),
    /// It did not take effect (a code that says nothing was done).
    Failed,
    /// It may or may not have taken effect (timeout, connection lost).
    Unknown,
    /// Its process was killed before it completed: like `Unknown` (the
    /// request may still take effect after the process is gone), but never
    /// stuck, since nobody was left to see it complete.
    Crashed,
}

/// One recorded operation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Op {
    /// The process that ran it.
    pub client: u32,
    /// The key.
    pub key: String,
    /// What it asked for.
    pub call: Call,
    /// When it was invoked (one clock for the whole history, e.g. ns).
    pub invoke: u64,
    /// When it completed; `None` when it never did.
    pub complete: Option<u64>,
    /// How it ended.
    pub outcome: Outcome,
}

impl Op {
    /// The instant by which it must have taken effect, if it did.
    pub(crate) fn deadline(&self) -> u64 {
        match (self.outcome, self.complete) {
            (Outcome::Unknown | Outcome::Crashed, _) | (_, None) => u64::MAX,
            (_, Some(t)) => t,
        }
    }

    /// Whether it may or may not have taken effect.
    pub(crate) fn indeterminate(&self) -> bool {
        matches!(self.outcome, Outcome::Unknown | Outcome::Crashed)
    }

    /// The value this op writes, if it is a write.
    pub(crate) fn written(&self) -> Option<ValueId> {
        match self.call {
            Call::Put(v) | Call::Upsert(v) => Some(v),
            _ => None,
        }
    }
}
