//! Asynchronous batches: work submitted under a batch id, run by a small
//! pool of worker threads, and collected by polling
//! (`transfer_check_status`) or waiting (`get_batch_transfer_status`).
//! A batch's id is forgotten once its final state has been reported.

use crate::engine::error::{EngineError, ErrorKind, Result};
use parking_lot::{Condvar, Mutex};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Worker threads running asynchronous batches.
const WORKERS: usize = 8;

type Job = Box<dyn FnOnce() + Send>;

/// The state of one batch as `transfer_check_status` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchState {
    /// Still moving bytes.
    Running,
    /// Finished, every entry moved.
    Done,
    /// Finished with a failure.
    Failed,
    /// Running for longer than the transfer timeout.
    TimedOut,
}

struct Slot {
    result: Mutex<Option<Result<()>>>,
    cv: Condvar,
    started: Instant,
}

/// The batches in flight of one engine.
pub(crate) struct Batches {
    next: AtomicU64,
    slots: Mutex<HashMap<u64, Arc<Slot>>>,
    queue: Mutex<Option<mpsc::Sender<Job>>>,
}

impl Default for Batches {
    fn default() -> Self {
        Batches {
            next: AtomicU64::new(1),
            slots: Mutex::new(HashMap::new()),
            queue: Mutex::new(None),
        }
    }
}

fn unknown(id: u64) -> EngineError {
    EngineError::new(
        ErrorKind::UnknownBatch,
        format!("batch id {id} names no batch in flight (unknown, or already collected)"),
    )
}

impl Batches {
    fn sender(&self) -> Result<mpsc::Sender<Job>> {
        let mut g = self.queue.lock();
        if let Some(s) = g.as_ref() {
            return Ok(s.clone());
        }
        let (tx, rx) = mpsc::channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        for i in 0..WORKERS {
            let rx = Arc::clone(&rx);
            std::thread::Builder::new()
                .name(format!("mc-engine-async-{i}"))
                .spawn(move || loop {
                    let job = rx.lock().recv();
                    match job {
                        Ok(j) => j(),
                        Err(_) => return,
                    }
                })
                .map_err(|e| {
                    EngineError::new(ErrorKind::Internal, "cannot start a worker thread")
                        .with_source(e)
                })?;
        }
        *g = Some(tx.clone());
        Ok(tx)
    }

    /// Run `work` in the background; returns its batch id (never 0).
    pub(crate) fn submit(&self, work: impl FnOnce() -> Result<()> + Send + 'static) -> Result<u64> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let slot = Arc::new(Slot {
            result: Mutex::new(None),
            cv: Condvar::new(),
            started: Instant::now(),
        });
        self.slots.lock().insert(id, Arc::clone(&slot));
        let job: Job = Box::new(move || {
            let r = work();
            *slot.result.lock() = Some(r);
            slot.cv.notify_all();
        });
        let sent = self.sender().and_then(|tx| {
            tx.send(job)
                .map_err(|_| EngineError::new(ErrorKind::Internal, "the worker pool stopped"))
        });
        if let Err(e) = sent {
            self.slots.lock().remove(&id);
            return Err(e);
        }
        Ok(id)
    }

    /// The state of batch `id`, without waiting; a final state forgets the
    /// batch (its error, if any, comes with it).
    pub(crate) fn check(
        &self,
        id: u64,
        timeout: Duration,
    ) -> Result<(BatchState, Option<EngineError>)> {
        let slot = self
            .slots
            .lock()
            .get(&id)
            .cloned()
            .ok_or_else(|| unknown(id))?;
        let done = slot.result.lock().take();
        match done {
            None if slot.started.elapsed() > timeout => Ok((BatchState::TimedOut, None)),
            None => Ok((BatchState::Running, None)),
            Some(r) => {
                self.slots.lock().remove(&id);
                match r {
                    Ok(()) => Ok((BatchState::Done, None)),
                    Err(e) => Ok((BatchState::Failed, Some(e))),
                }
            }
        }
    }

    /// Wait for every batch of `ids` and forget them; the first failure.
    pub(crate) fn wait(&self, ids: &[u64]) -> Result<()> {
        let slots: Vec<(u64, Option<Arc<Slot>>)> = {
            let g = self.slots.lock();
            ids.iter().map(|id| (*id, g.get(id).cloned())).collect()
        };
        let mut first: Option<EngineError> = None;
        for (id, slot) in slots {
            let Some(slot) = slot else {
                first.get_or_insert_with(|| unknown(id));
                continue;
            };
            let mut g = slot.result.lock();
            while g.is_none() {
                slot.cv.wait(&mut g);
            }
            let r = g.take();
            drop(g);
            self.slots.lock().remove(&id);
            if let Some(Err(e)) = r {
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), Err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_collected_once() {
        let b = Batches::default();
        let ok = b.submit(|| Ok(())).unwrap();
        let bad = b
            .submit(|| Err(EngineError::new(ErrorKind::Unreachable, "x")))
            .unwrap();
        assert!(ok != 0 && bad != ok);
        b.wait(&[ok]).unwrap();
        assert_eq!(
            b.check(ok, Duration::from_secs(1)).unwrap_err().kind(),
            ErrorKind::UnknownBatch
        );
        assert_eq!(b.wait(&[bad]).unwrap_err().kind(), ErrorKind::Unreachable);
        let id = b.submit(|| Ok(())).unwrap();
        loop {
            match b.check(id, Duration::from_secs(60)).unwrap() {
                (BatchState::Running, _) => std::thread::yield_now(),
                (s, e) => {
                    assert_eq!(s, BatchState::Done);
                    assert!(e.is_none());
                    break;
                }
            }
        }
        assert!(b.check(id, Duration::from_secs(1)).is_err());
        assert_eq!(
            b.wait(&[12345]).unwrap_err().kind(),
            ErrorKind::UnknownBatch
        );
    }
}
