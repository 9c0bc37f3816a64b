//! The per-group executor thread: runs queued collectives in sequence order
//! (pg spec, group model: a per-group executor runs ops in issue order;
//! async ops may pipeline but never reorder). A thread blocked in `wait()`
//! may run ops inline instead (see `Group::wait`); `exec_lock` makes the two
//! mutually exclusive.

use crate::error::PgError;
use crate::progress::run_op;
use crate::shared::Shared;
use std::sync::Arc;
use std::time::Duration;

/// Executor thread body.
pub(crate) fn executor_loop(shared: Arc<Shared>) {
    loop {
        let seen = shared.submit_bell.observe();
        if let Some(_guard) = shared.exec_lock.try_lock() {
            let op = shared.queue.lock().pop_front();
            if let Some(op) = op {
                if shared.is_shutdown() {
                    op.done.complete(Some(PgError::Shutdown), 0);
                } else {
                    let links = shared.links();
                    run_op(&shared, &links, op);
                }
                continue;
            }
        }
        if shared.is_shutdown() && shared.queue.lock().is_empty() {
            return;
        }
        shared
            .submit_bell
            .wait(seen, Duration::from_millis(500), Duration::ZERO);
    }
}
