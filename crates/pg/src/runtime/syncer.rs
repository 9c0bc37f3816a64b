//! The per-group sync thread of `auto_sync_on_failure` (upstream's
//! PG-managed synchronized mode): completions of failed ops wait here while
//! the coordinator reconciles the failure; they are released once this
//! member applied the resulting view (the view's commit arrives on the same
//! session before the answer). Without a coordinator they complete after
//! local failure handling.

use crate::membership::control::{SyncStatus, ToAgent};
use crate::runtime::shared::Shared;
use std::sync::Arc;
use std::time::Duration;

/// Sync thread body.
pub(crate) fn sync_loop(sh: Arc<Shared>) {
    loop {
        let batch = {
            let mut d = sh.deferred.lock();
            while d.is_empty() && !sh.is_shutdown() {
                sh.deferred_cv.wait_for(&mut d, Duration::from_millis(500));
            }
            std::mem::take(&mut *d)
        };
        if batch.is_empty() {
            return;
        }
        let dead = batch.iter().fold(0u64, |m, d| m | d.failed) & !(1u64 << sh.rank);
        let reconciled = match sh.agent() {
            Some(agent) if !sh.is_shutdown() => matches!(
                sh.request_sync(&agent, dead),
                Ok(ToAgent::Synced {
                    status: SyncStatus::Reconciled | SyncStatus::NoPending,
                    ..
                })
            ),
            _ => false,
        };
        if !reconciled {
            sh.after_op(dead);
        }
        for d in batch {
            d.done.complete(d.error, d.failed);
        }
    }
}
