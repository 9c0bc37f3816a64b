//! Copies the master asks of this segment's owner for copy and move tasks
//! ([`LedgerOp::Fetch`]): read the object from any replica into the space
//! the master allocated on this segment, then report each result with
//! `MasterRequest::Fetched`. They run on a thread of their own, so the
//! ledger stream acknowledges its pushes without waiting for the network;
//! the client gives the thread the function that makes a batch of copies
//! (`Client::fetch_copies`).

use mooncake_common::ledger::LedgerOp;
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::time::Duration;

/// Most copies looked up and read in one batch.
const BATCH: usize = 256;
/// How often an idle thread checks whether its client is gone.
const IDLE_CHECK: Duration = Duration::from_millis(500);

/// One copy to make.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Job {
    pub key: String,
    pub version: u64,
    pub offset: u64,
    pub size: u64,
}

impl Job {
    /// The copy a ledger op asks for, if it is a fetch.
    pub(crate) fn of(op: &LedgerOp) -> Option<Job> {
        match op {
            LedgerOp::Fetch {
                offset,
                version,
                key,
                size,
            } => Some(Job {
                key: key.clone(),
                version: *version,
                offset: *offset,
                size: *size,
            }),
            _ => None,
        }
    }
}

/// The queue of the copying thread.
#[derive(Debug, Clone)]
pub(crate) struct Fetcher {
    tx: Sender<Job>,
}

impl Fetcher {
    /// Start the copying thread: `copy` makes a batch of copies and
    /// answers whether the thread goes on (false once its client is gone
    /// or closed); it is also called with no copies every idle half
    /// second, to ask just that.
    pub(crate) fn start<F>(copy: F) -> std::io::Result<Fetcher>
    where
        F: FnMut(&[Job]) -> bool + Send + 'static,
    {
        let (tx, rx) = channel();
        std::thread::Builder::new()
            .name("mc-fetch".into())
            .spawn(move || run(copy, rx))?;
        Ok(Fetcher { tx })
    }

    /// Queue a copy.
    pub(crate) fn push(&self, job: Job) {
        // The thread is gone only when its client is: nothing to copy for.
        let _ = self.tx.send(job);
    }
}

fn run<F: FnMut(&[Job]) -> bool>(mut copy: F, rx: Receiver<Job>) {
    loop {
        let first = match rx.recv_timeout(IDLE_CHECK) {
            Ok(j) => j,
            Err(RecvTimeoutError::Timeout) => {
                if copy(&[]) {
                    continue;
                }
                return;
            }
            Err(RecvTimeoutError::Disconnected) => return,
        };
        let mut jobs = vec![first];
        while jobs.len() < BATCH {
            match rx.try_recv() {
                Ok(j) => jobs.push(j),
                Err(_) => break,
            }
        }
        if !copy(&jobs) {
            return;
        }
    }
}
