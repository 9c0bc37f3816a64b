//! Read-ticket completion reports: how the master learns that a read ended.
//!
//! Every read lookup gets a ticket from the master, which counts the found
//! objects as being read until the ticket is reported done (or its lease
//! runs out): a version an upsert or removal replaced stays allocated while
//! reads of it are in flight, and an upsert may rewrite a value in place
//! only while none is. Finished tickets queue here and reach the master in
//! two ways:
//!
//! * piggybacked on this client's next master RPC (`WithDone`), so a later
//!   upsert from the same client never sees its own finished reads as
//!   still in flight;
//! * by a background flusher a couple of milliseconds later when no RPC
//!   carried them, so other clients' upserts and the release of replaced
//!   versions see the read end promptly.
//!
//! A lost report (crash, network) only delays the end until the lease
//! expiry; a read that finishes after its lease is discarded by the reader
//! (LEASE_EXPIRED), so the expiry never un-protects a copy that is used.

use crate::master::master_conn::MasterConn;
use mooncake_common::proto::MasterRequest;
use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::thread::Thread;
use std::time::Duration;

/// How long a finished ticket may wait for a piggyback before the flusher sends it.
const FLUSH_DELAY: Duration = Duration::from_millis(2);
/// Flusher ticks without work before it parks until woken.
const IDLE_TICKS: u32 = 50;

/// Finished read tickets not yet reported to the master.
#[derive(Default)]
pub(crate) struct DoneQueue {
    pending: Mutex<Vec<u64>>,
    /// Held by the flusher from taking a batch until the master answered
    /// its report: an RPC that piggybacks tickets waits for it, so the
    /// master has seen every read this client finished before that RPC.
    sending: Mutex<()>,
    /// The flusher is parked and must be woken by the next push.
    parked: AtomicBool,
    flusher: Mutex<Option<Thread>>,
    closed: AtomicBool,
}

impl DoneQueue {
    /// Queue a finished ticket (0 = no ticket).
    pub(crate) fn push(&self, ticket: u64) {
        if ticket == 0 {
            return;
        }
        self.pending.lock().push(ticket);
        if self.parked.swap(false, Ordering::AcqRel) {
            if let Some(t) = self.flusher.lock().as_ref() {
                t.unpark();
            }
        }
    }

    /// Take everything queued (to piggyback on an RPC). With
    /// `after_report`, first wait until a report the flusher has in flight
    /// was answered: a request that changes metadata must reach the master
    /// after every read this client finished (a lookup need not wait).
    pub(crate) fn take(&self, after_report: bool) -> Vec<u64> {
        let _reported = after_report.then(|| self.sending.lock());
        self.take_pending()
    }

    fn take_pending(&self) -> Vec<u64> {
        let mut g = self.pending.lock();
        if g.is_empty() {
            Vec::new()
        } else {
            std::mem::take(&mut *g)
        }
    }

    /// Put tickets back after a failed send.
    fn restore(&self, mut t: Vec<u64>) {
        self.pending.lock().append(&mut t);
    }

    /// Start the background flusher (holds only weak references).
    pub(crate) fn start(self: &Arc<Self>, master: &Arc<MasterConn>) {
        let q: Weak<DoneQueue> = Arc::downgrade(self);
        let m: Weak<MasterConn> = Arc::downgrade(master);
        let h = std::thread::Builder::new()
            .name("mc-read-done".into())
            .spawn(move || flusher(q, m));
        if let Ok(h) = h {
            *self.flusher.lock() = Some(h.thread().clone());
        }
    }

    /// Stop the flusher (it exits at its next wake-up).
    pub(crate) fn stop(&self) {
        self.closed.store(true, Ordering::Release);
        if let Some(t) = self.flusher.lock().take() {
            t.unpark();
        }
    }
}

fn flusher(q: Weak<DoneQueue>, m: Weak<MasterConn>) {
    let mut idle = 0u32;
    loop {
        std::thread::park_timeout(FLUSH_DELAY);
        let (Some(queue), Some(master)) = (q.upgrade(), m.upgrade()) else {
            return;
        };
        if queue.closed.load(Ordering::Acquire) {
            return;
        }
        let sending = queue.sending.lock();
        let batch = queue.take_pending();
        if batch.is_empty() {
            drop(sending);
            idle += 1;
            if idle >= IDLE_TICKS {
                queue.parked.store(true, Ordering::Release);
                // A push between the take and the flag would be missed: re-check.
                if queue.pending.lock().is_empty() {
                    drop(queue);
                    drop(master);
                    std::thread::park();
                } else {
                    queue.parked.store(false, Ordering::Release);
                }
                idle = 0;
            }
            continue;
        }
        idle = 0;
        if master
            .call(&MasterRequest::ReadsDone {
                tickets: batch.clone(),
            })
            .is_err()
        {
            // Master unreachable: keep them for the next RPC; they expire anyway.
            if batch.len() < 4096 {
                queue.restore(batch);
            }
        }
        drop(sending);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_change_waits_for_the_report_in_flight_and_a_lookup_does_not() {
        let q = Arc::new(DoneQueue::default());
        q.push(7);
        // The flusher took the batch and is reporting it.
        let reporting = q.sending.lock();
        assert_eq!(q.take_pending(), vec![7]);
        q.push(8);
        let q2 = Arc::clone(&q);
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(q2.take(true));
        });
        // A lookup does not wait for it.
        assert_eq!(q.take(false), vec![8]);
        q.push(9);
        // A change waits until the master answered the report.
        assert!(rx.recv_timeout(Duration::from_millis(100)).is_err());
        drop(reporting);
        assert_eq!(rx.recv_timeout(Duration::from_secs(5)), Ok(vec![9]));
    }
}
