//! Completion state of one submitted op, waited on by `Work.wait()`: done
//! flag, error, the failed-rank set F_i and the
//! source of a receive.

use crate::error::PgError;
use parking_lot::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// Final (or current) state of an op.
#[derive(Clone, Debug, Default)]
pub struct OpState {
    /// The op has finished (successfully or not).
    pub done: bool,
    /// Why it failed, if it did.
    pub error: Option<PgError>,
    /// Bitmap of slots whose contribution could not be obtained (F_i).
    pub failed: u64,
    /// Source slot of a completed receive, or -1.
    pub source: i64,
}

/// Shared completion cell: set once by the engine, read by Python.
#[derive(Default)]
pub struct Completion {
    state: Mutex<OpState>,
    cv: Condvar,
}

impl Completion {
    /// A fresh, pending completion.
    pub fn new() -> Self {
        Completion {
            state: Mutex::new(OpState {
                source: -1,
                ..Default::default()
            }),
            cv: Condvar::new(),
        }
    }

    /// Marks the op finished and wakes waiters.
    pub fn complete(&self, error: Option<PgError>, failed: u64) {
        let mut s = self.state.lock();
        if s.done {
            return;
        }
        s.done = true;
        s.error = error;
        s.failed |= failed;
        self.cv.notify_all();
    }

    /// Records the source slot of a receive.
    pub fn set_source(&self, slot: usize) {
        self.state.lock().source = slot as i64;
    }

    /// Blocks until done or `timeout`; returns whether it is done.
    pub fn wait(&self, timeout: Option<Duration>) -> bool {
        let mut s = self.state.lock();
        let deadline = timeout.map(|t| Instant::now() + t);
        while !s.done {
            match deadline {
                Some(d) => {
                    if self.cv.wait_until(&mut s, d).timed_out() {
                        return s.done;
                    }
                }
                None => self.cv.wait(&mut s),
            }
        }
        true
    }

    /// A copy of the current state.
    pub fn snapshot(&self) -> OpState {
        self.state.lock().clone()
    }

    /// Non-blocking completion check.
    pub fn is_done(&self) -> bool {
        self.state.lock().done
    }
}
