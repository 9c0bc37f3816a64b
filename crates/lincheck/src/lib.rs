//! Checks recorded store histories for linearizability, one key at a time.
//!
//! Each key is a register that may be absent, with upstream's operations:
//! `put` (write-once: it sets an absent key and leaves a present one as it
//! is, succeeding either way; while another write of the key is in flight
//! the store counts the key as present, so a put that overlaps another
//! write may succeed without taking effect), `upsert` (sets), `remove` (clears a present
//! key; on an absent one it fails with OBJECT_NOT_FOUND and changes
//! nothing), `get` (reads) and `exists` (tells present from absent). Every
//! written value is unique, so a value is named by the id of the write that
//! made it.
//!
//! An operation is recorded with the times it was invoked and completed
//! and how it ended: with a result, with a definite failure (it did not
//! take effect: left out), or indeterminately (a timeout or a lost
//! connection: it may have taken effect at any time after its invocation,
//! or never). An operation whose process was killed before it completed
//! is recorded as crashed: indeterminate like a timeout, and never counted
//! as stuck. A history is linearizable when every operation can be given
//! one instant inside its interval such that, in that order, each result is
//! what the register gives.
//!
//! With eviction allowed, the store may drop a key at any instant: a read
//! may then find nothing, but never a value older than the last one
//! written before it, nor one that was never written.
//!
//! The search is the Wing–Gong algorithm with the memo of visited
//! (linearized set, register) pairs that porcupine adds ([`check_key`]).
//! [`check`] also reports reads of values no write of the key made (torn
//! or foreign bytes) and operations that never completed within the bound.

mod history;
mod search;

pub use history::{Call, Op, Outcome, ValueId};
pub use search::{check, check_key, Anomaly, Model, Report};
