//! A flag one thread sleeps on until another sets it or a timeout passes:
//! the heartbeat sleeps on it, and a leader change or a broken ledger stream
//! (see `ledger_stream`) wakes it early. Its own module so both can use it
//! without using each other.

use parking_lot::{Condvar, Mutex};
use std::time::Duration;

/// A flag a thread can sleep on until it is set or a timeout passes.
#[derive(Default)]
pub(crate) struct Wake {
    set: Mutex<bool>,
    cv: Condvar,
}

impl Wake {
    /// Set the flag and wake the sleeper.
    pub(crate) fn notify(&self) {
        *self.set.lock() = true;
        self.cv.notify_all();
    }

    /// Sleep until notified or `timeout`; clears the flag. True if notified.
    pub(crate) fn wait(&self, timeout: Duration) -> bool {
        let mut g = self.set.lock();
        if !*g {
            let _ = self.cv.wait_for(&mut g, timeout);
        }
        std::mem::take(&mut *g)
    }
}
