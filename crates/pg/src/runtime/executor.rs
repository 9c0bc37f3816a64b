//! The per-group executor thread: runs queued collectives in sequence order
//! (a per-group executor runs ops in issue order;
//! async ops may pipeline but never reorder). A thread blocked in `wait()`
//! may run ops inline instead (see `Group::wait`); `exec_lock` makes the two
//! mutually exclusive.

use crate::error::PgError;
use crate::runtime::progress::run_op;
use crate::runtime::shared::Shared;
use std::sync::Arc;
use std::time::Duration;

/// Executor thread body.
pub(crate) fn executor_loop(shared: Arc<Shared>) {
    loop {
        let seen = shared.submit_bell.observe();
        if shared.is_shutdown() {
            let _guard = shared.exec_lock.lock();
            for op in shared.queue.lock().drain(..) {
                op.done.complete(Some(PgError::Shutdown), 0);
            }
            return;
        }
        if let Some(_guard) = shared.exec_lock.try_lock() {
            if let Some(op) = shared.pop_runnable() {
                let links = shared.links();
                run_op(&shared, &links, op);
                continue;
            }
        }
        shared
            .submit_bell
            .wait(seen, Duration::from_millis(500), Duration::ZERO);
    }
}
