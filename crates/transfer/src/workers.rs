//! One process-wide set of helper threads for the work one call spreads
//! over several threads (the parts of a large copy, the parallel streams of
//! one TCP transfer, the per-owner groups of a batch).
//!
//! [`run_all`] runs a call's tasks on the calling thread and on up to
//! `workers - 1` helpers. Helpers are kept parked between calls instead of
//! being started and ended per call: starting a thread maps and touches
//! its stack, and ending one hands the stack's pages back, for which the
//! kernel interrupts the other cores running the process to flush their
//! address translations; a call in a serving loop paid for both every time.
//!
//! Tasks are claimed one at a time, so when a helper is slow to get a core
//! (a busy machine) the calling thread runs its tasks instead, and the call
//! waits only for tasks already claimed, never for a helper that has not
//! started. That also makes nested calls safe: a helper that runs a task
//! which itself calls [`run_all`] drains its own call the same way.

use std::any::Any;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

/// Most helper threads the process keeps; a call that finds them all busy
/// runs the tasks it could not hand out itself.
pub const MAX_HELPERS: usize = 64;

/// A parked helper that gets no work for this long ends.
pub const IDLE_EXIT: Duration = Duration::from_secs(30);

/// What the tasks of one [`run_all`] call share.
struct Call<R> {
    /// Next unclaimed task.
    next: AtomicUsize,
    /// Number of tasks.
    n: usize,
    /// Tasks finished, their results, and the first panic.
    state: Mutex<Done<R>>,
    /// Signalled when the last task finishes.
    all_done: Condvar,
    /// The work of task `i`; lives on the stack of the `run_all` call, which
    /// returns only once every claimed task has finished.
    work: *const (dyn Fn(usize) -> R + Sync),
}

struct Done<R> {
    finished: usize,
    results: Vec<Option<R>>,
    panic: Option<Box<dyn Any + Send>>,
}

// SAFETY: `work` points to a `Sync` closure and is called only while the
// `run_all` call that owns it is waiting (see `Call::drain`); everything
// else is atomics and locked state of `Send` results.
unsafe impl<R: Send> Send for Call<R> {}
// SAFETY: as for Send.
unsafe impl<R: Send> Sync for Call<R> {}

/// A call's share of work as the helpers see it, whatever its result type.
trait Drain: Send + Sync {
    /// Claim and run tasks until none is left.
    fn drain(&self);
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic inside a task is caught before any lock is taken, so a
    // poisoned lock still holds consistent state.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl<R: Send> Drain for Call<R> {
    fn drain(&self) {
        loop {
            let i = self.next.fetch_add(1, Ordering::AcqRel);
            if i >= self.n {
                return;
            }
            let run = AssertUnwindSafe(|| {
                // SAFETY: task `i < n` was claimed here, so the `run_all`
                // call owning `work` is still waiting: it returns only after
                // all `n` tasks have finished, and `i` has not.
                unsafe { (*self.work)(i) }
            });
            let r = std::panic::catch_unwind(run);
            let mut st = lock(&self.state);
            match r {
                Ok(r) => st.results[i] = Some(r),
                Err(p) => {
                    st.panic.get_or_insert(p);
                }
            }
            st.finished += 1;
            if st.finished == self.n {
                self.all_done.notify_all();
            }
        }
    }
}

/// A parked helper: the call it is handed next.
struct Slot {
    call: Mutex<Option<Arc<dyn Drain>>>,
    ready: Condvar,
}

/// The helpers: the parked ones (the most recently parked last, so the
/// helper with the warmest cache is handed work first) and how many live.
struct Pool {
    state: Mutex<PoolState>,
}

#[derive(Default)]
struct PoolState {
    idle: Vec<Arc<Slot>>,
    threads: usize,
}

fn pool() -> &'static Pool {
    static POOL: OnceLock<Pool> = OnceLock::new();
    POOL.get_or_init(|| Pool {
        state: Mutex::new(PoolState::default()),
    })
}

impl Pool {
    /// Hand `call` to up to `helpers` helper threads: parked ones first,
    /// then new ones (up to [`MAX_HELPERS`] in all).
    fn offer(&'static self, call: &Arc<dyn Drain>, helpers: usize) {
        let start = {
            let mut st = lock(&self.state);
            let mut handed = 0;
            while handed < helpers {
                let Some(slot) = st.idle.pop() else { break };
                *lock(&slot.call) = Some(Arc::clone(call));
                slot.ready.notify_one();
                handed += 1;
            }
            let start = (helpers - handed).min(MAX_HELPERS.saturating_sub(st.threads));
            st.threads += start;
            start
        };
        for _ in 0..start {
            let first = Arc::clone(call);
            let spawned = std::thread::Builder::new()
                .name("mc-worker".into())
                .spawn(move || self.serve(first));
            if spawned.is_err() {
                // No thread: the calling thread does that share.
                lock(&self.state).threads -= 1;
            }
        }
    }

    /// A helper's life: run the call it was handed, park until it is handed
    /// another, end after [`IDLE_EXIT`] parked.
    fn serve(&self, first: Arc<dyn Drain>) {
        let slot = Arc::new(Slot {
            call: Mutex::new(None),
            ready: Condvar::new(),
        });
        let mut next = Some(first);
        loop {
            if let Some(call) = next.take() {
                call.drain();
            }
            lock(&self.state).idle.push(Arc::clone(&slot));
            let mut handed = lock(&slot.call);
            loop {
                if let Some(call) = handed.take() {
                    next = Some(call);
                    break;
                }
                let (g, wait) = slot
                    .ready
                    .wait_timeout(handed, IDLE_EXIT)
                    .unwrap_or_else(|p| p.into_inner());
                handed = g;
                if wait.timed_out() && handed.is_none() {
                    drop(handed);
                    let mut st = lock(&self.state);
                    if let Some(at) = st.idle.iter().position(|s| Arc::ptr_eq(s, &slot)) {
                        st.idle.remove(at);
                        st.threads -= 1;
                        return;
                    }
                    // Taken off the parked list just now: a call is being
                    // handed over.
                    drop(st);
                    handed = lock(&slot.call);
                }
            }
        }
    }
}

/// Helper threads alive and parked (for tests and diagnostics).
pub fn helpers() -> (usize, usize) {
    let st = lock(&pool().state);
    (st.threads, st.idle.len())
}

/// Run `f` on every task with up to `workers` workers (the calling thread
/// and `workers - 1` helpers of the process's pool); results come back in
/// task order. A panicking task panics the call once every claimed task
/// has finished.
pub fn run_all<T: Sync, R: Send + 'static>(
    tasks: &[T],
    workers: usize,
    f: impl Fn(&T) -> R + Sync,
) -> Vec<R> {
    let n = tasks.len();
    let helpers = workers.min(n).saturating_sub(1);
    if helpers == 0 {
        return tasks.iter().map(f).collect();
    }
    let work = |i: usize| f(&tasks[i]);
    let work: &(dyn Fn(usize) -> R + Sync + '_) = &work;
    // SAFETY: only the lifetime is erased. Workers call `work` only for a
    // task they claimed, and this function returns (ending the borrow) only
    // after every task has finished; a helper that starts later claims
    // nothing and never calls it.
    let work: *const (dyn Fn(usize) -> R + Sync + 'static) = unsafe {
        std::mem::transmute::<
            *const (dyn Fn(usize) -> R + Sync + '_),
            *const (dyn Fn(usize) -> R + Sync + 'static),
        >(work)
    };
    let call = Arc::new(Call {
        next: AtomicUsize::new(0),
        n,
        state: Mutex::new(Done {
            finished: 0,
            results: (0..n).map(|_| None).collect(),
            panic: None,
        }),
        all_done: Condvar::new(),
        work,
    });
    let erased: Arc<dyn Drain> = call.clone();
    pool().offer(&erased, helpers);
    drop(erased);
    call.drain();
    let mut st = lock(&call.state);
    while st.finished < n {
        st = call.all_done.wait(st).unwrap_or_else(|p| p.into_inner());
    }
    if let Some(p) = st.panic.take() {
        drop(st);
        std::panic::resume_unwind(p);
    }
    std::mem::take(&mut st.results)
        .into_iter()
        .map(|r| r.unwrap_or_else(|| unreachable!("every task finished without a panic")))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    #[test]
    fn results_keep_task_order_with_any_worker_count() {
        let tasks: Vec<u64> = (0..37).collect();
        for workers in [0, 1, 2, 4, 64, 1000] {
            let out = run_all(&tasks, workers, |&t| t * 3);
            assert_eq!(out, tasks.iter().map(|t| t * 3).collect::<Vec<_>>());
        }
        assert!(run_all(&[] as &[u64], 4, |&t| t).is_empty());
    }

    #[test]
    fn borrowed_state_is_used_only_during_the_call() {
        let data: Vec<u64> = (0..1000).collect();
        let sums = run_all(&[0usize, 250, 500, 750], 4, |&at| {
            data[at..at + 250].iter().sum::<u64>()
        });
        assert_eq!(sums.iter().sum::<u64>(), data.iter().sum::<u64>());
    }

    #[test]
    fn tasks_run_at_once_on_kept_helpers() {
        // Two tasks that each wait for the other to start finish only if a
        // helper runs one while the caller runs the other; repeated calls
        // reuse parked helpers instead of starting one per call (a thread's
        // id is never reused, and the pool keeps at most MAX_HELPERS).
        let rounds = 4 * MAX_HELPERS;
        let mut ran_on = std::collections::HashSet::new();
        let me = std::thread::current().id();
        for _ in 0..rounds {
            let started = AtomicUsize::new(0);
            let out = run_all(&[0u8, 1u8], 2, |&t| {
                started.fetch_add(1, Ordering::SeqCst);
                let t0 = std::time::Instant::now();
                while started.load(Ordering::SeqCst) < 2 {
                    assert!(t0.elapsed() < Duration::from_secs(20), "no second worker");
                    std::thread::yield_now();
                }
                (t, std::thread::current().id())
            });
            assert_eq!(out.iter().map(|o| o.0).collect::<Vec<_>>(), vec![0, 1]);
            let helper: Vec<_> = out.iter().map(|o| o.1).filter(|&id| id != me).collect();
            assert_eq!(helper.len(), 1, "one task ran on a helper");
            ran_on.insert(helper[0]);
        }
        assert!(
            ran_on.len() <= MAX_HELPERS,
            "{} helpers for {rounds} calls",
            ran_on.len()
        );
        let (threads, idle) = helpers();
        assert!(idle <= threads && threads <= MAX_HELPERS);
    }

    #[test]
    fn nested_calls_finish() {
        // Every task of the outer call makes a call of its own: the helpers
        // that run them drain their inner calls themselves.
        let sum = AtomicU64::new(0);
        let outer: Vec<u64> = (0..8).collect();
        let out = run_all(&outer, 8, |&o| {
            let inner: Vec<u64> = (0..8).map(|i| o * 8 + i).collect();
            let r = run_all(&inner, 4, |&x| x);
            sum.fetch_add(r.iter().sum::<u64>(), Ordering::Relaxed);
            r.len()
        });
        assert_eq!(out, vec![8; 8]);
        assert_eq!(sum.load(Ordering::Relaxed), (0..64).sum::<u64>());
    }

    #[test]
    fn a_panicking_task_panics_the_call_after_the_others_finish() {
        let done = AtomicUsize::new(0);
        let tasks: Vec<usize> = (0..8).collect();
        let r = std::panic::catch_unwind(AssertUnwindSafe(|| {
            run_all(&tasks, 3, |&t| {
                if t == 5 {
                    panic!("task 5");
                }
                done.fetch_add(1, Ordering::SeqCst);
            })
        }));
        assert!(r.is_err());
        assert_eq!(done.load(Ordering::SeqCst), 7);
        // The pool still serves calls after a panic.
        assert_eq!(run_all(&[1u8, 2, 3], 3, |&t| t), vec![1, 2, 3]);
    }
}
