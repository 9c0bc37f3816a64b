//! Spreading one batch of copies over threads: large local or same-host
//! transfers are cut into parts of about [`SHARE_PIECE`] bytes
//! ([`share_ops`]) that the calling thread and up to [`copy_threads`] minus one
//! helper threads claim one at a time ([`run_all`]). Shared by the ranged
//! reads (`ranges`) and the located writes (`writes`), which is what tensor
//! IO lowers onto.
//!
//! Claiming parts dynamically matters on a busy machine: with fixed halves,
//! a call waited for its second thread to get a core (several ms with the
//! reference VM's 2 cores loaded), and was slower than one thread; now the
//! calling thread takes whatever the helper has not claimed yet.

use mooncake_transfer::{Op, Rows, Stores};
use parking_lot::{Condvar, Mutex};
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Total bytes of one local or same-host group above which it is split
/// over threads.
pub(crate) const PAR_LOCAL: u64 = 8 << 20;

/// Largest piece one thread copies in one go when a local transfer is split
/// (below the transfer engine's own two-thread split, so threads do not nest).
pub(crate) const LOCAL_PIECE: u64 = 4 << 20;

/// Threads a large local or same-host copy is spread over
/// (`MC_TENSOR_COPY_THREADS`, default the number of cores; 1 to 4).
pub(crate) fn copy_threads() -> usize {
    static N: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *N.get_or_init(|| {
        let cores = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1);
        std::env::var("MC_TENSOR_COPY_THREADS")
            .ok()
            .and_then(|v| v.trim().parse::<usize>().ok())
            .unwrap_or(cores)
            .clamp(1, 4)
    })
}

/// What a batch copies against one segment: contiguous ops (writes) or
/// sets of rows (reads, where a tensor box's rows travel as one item).
pub(crate) trait Piece: Copy {
    /// Bytes copied.
    fn bytes(&self) -> u64;
    /// Cut `items` into `parts` runs of about equal bytes, no piece longer
    /// than `max_piece` bytes.
    fn split(items: &[Self], parts: usize, max_piece: u64) -> Vec<Vec<Self>>;
}

impl Piece for Op {
    fn bytes(&self) -> u64 {
        self.len
    }
    fn split(items: &[Self], parts: usize, max_piece: u64) -> Vec<Vec<Self>> {
        Op::split(items, parts, max_piece)
    }
}

impl Piece for Rows {
    fn bytes(&self) -> u64 {
        Rows::bytes(self).unwrap_or(u64::MAX)
    }
    fn split(items: &[Self], parts: usize, max_piece: u64) -> Vec<Vec<Self>> {
        Rows::split(items, parts, max_piece)
    }
}

/// Cut `ops` (all against one segment) into `parts` runs of about equal
/// bytes, every op cut into pieces of at most [`LOCAL_PIECE`] bytes, so that
/// each part can be copied by its own thread.
pub(crate) fn split_ops<P: Piece>(ops: &[P], parts: usize) -> Vec<Vec<P>> {
    P::split(ops, parts, LOCAL_PIECE)
}

/// One unit of work of a batch: a part of group `group`'s ops, and the
/// stores its copy uses when it goes through memory.
pub(crate) struct Task<P = Op> {
    pub(crate) group: usize,
    pub(crate) ops: Vec<P>,
    pub(crate) stores: Stores,
}

/// The tasks of a batch of per-owner groups of ops (each given with
/// whether its owner is reached locally or on this host): a large local
/// group (at least [`PAR_LOCAL`] bytes) is shared out in parts
/// ([`share_ops`]), any other group (a TCP owner, whose engine splits it
/// over parallel connections, or a small group) is one task. A batch that
/// moves at least [`Stores::STREAM_MIN`] bytes through memory in all does
/// not fit in the cache, so its copies stream; so do the replies of its TCP
/// groups when the whole batch is that large (the kernel's copy into
/// destinations that are not in the cache would read each line before
/// writing it). Also returns the workers for
/// [`run_all`]: every unsplit group in flight at once, plus the copy threads
/// if any group was split.
pub(crate) fn group_tasks<'a, P: Piece + 'a>(
    groups: impl IntoIterator<Item = (&'a [P], bool)>,
) -> (Vec<Task<P>>, usize) {
    let groups: Vec<(&[P], bool, u64)> = groups
        .into_iter()
        .map(|(ops, local)| (ops, local, ops.iter().map(|o| o.bytes()).sum()))
        .collect();
    let local_bytes: u64 = groups.iter().filter(|g| g.1).map(|g| g.2).sum();
    let stores = Stores::for_bytes(local_bytes);
    let tcp_stores = Stores::for_bytes(groups.iter().map(|g| g.2).sum());
    let mut tasks: Vec<Task<P>> = Vec::new();
    let (mut split, mut whole) = (false, 0usize);
    for (group, (ops, local, bytes)) in groups.into_iter().enumerate() {
        if ops.is_empty() {
            continue;
        }
        let stores = if local { stores } else { tcp_stores };
        if local && bytes >= PAR_LOCAL {
            tasks.extend(
                share_ops(ops)
                    .into_iter()
                    .map(|ops| Task { group, ops, stores }),
            );
            split = true;
        } else {
            tasks.push(Task {
                group,
                ops: ops.to_vec(),
                stores,
            });
            whole += 1;
        }
    }
    let workers = if split { whole + copy_threads() } else { whole };
    (tasks, workers)
}

/// Bytes of one part of a split local copy: parts are shared out
/// dynamically, so a worker that starts late (waiting for a core on a busy
/// machine) leaves its share to the others instead of holding up the call.
pub(crate) const SHARE_PIECE: u64 = 2 << 20;

/// Cut one segment's `ops` for [`run_all`]: parts of about
/// [`SHARE_PIECE`] bytes (at least [`copy_threads`] parts).
pub(crate) fn share_ops<P: Piece>(ops: &[P]) -> Vec<Vec<P>> {
    let total: u64 = ops.iter().map(|o| o.bytes()).sum();
    let parts = usize::try_from(total.div_ceil(SHARE_PIECE)).unwrap_or(usize::MAX);
    split_ops(ops, parts.clamp(copy_threads(), 1024))
}

/// What the workers of one [`run_all`] call share.
struct Shared<R> {
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
    panic: Option<Box<dyn std::any::Any + Send>>,
}

// SAFETY: `work` points to a `Sync` closure and is called only while the
// `run_all` call that owns it is waiting (see `drain`); everything else is
// atomics and locked state of `Send` results.
unsafe impl<R: Send> Send for Shared<R> {}
// SAFETY: as for Send.
unsafe impl<R: Send> Sync for Shared<R> {}

/// Claim and run tasks until none is left.
fn drain<R>(s: &Shared<R>) {
    loop {
        let i = s.next.fetch_add(1, Ordering::AcqRel);
        if i >= s.n {
            return;
        }
        let run = AssertUnwindSafe(|| {
            // SAFETY: task `i < n` was claimed by this worker, so the
            // `run_all` call owning `work` is still waiting: it returns only
            // after all `n` tasks have finished, and `i` is not finished yet.
            unsafe { (*s.work)(i) }
        });
        let r = std::panic::catch_unwind(run);
        let mut st = s.state.lock();
        match r {
            Ok(r) => st.results[i] = Some(r),
            Err(p) => {
                st.panic.get_or_insert(p);
            }
        }
        st.finished += 1;
        if st.finished == s.n {
            s.all_done.notify_all();
        }
    }
}

/// Run `f` on every task with up to `workers` workers (the calling thread
/// and `workers - 1` helper threads); results come back in task order.
///
/// Tasks are claimed one at a time, so when a helper thread is slow to
/// start the calling thread runs its tasks instead, and the call waits only
/// for tasks already claimed: never for a thread that has not started.
pub(crate) fn run_all<T: Sync, R: Send + 'static>(
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
    let shared = Arc::new(Shared {
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
    for _ in 0..helpers {
        let s = Arc::clone(&shared);
        let spawned = std::thread::Builder::new()
            .name("mc-copy".into())
            .spawn(move || drain(&s));
        if spawned.is_err() {
            // No thread: the calling thread does that share.
            break;
        }
    }
    drain(&shared);
    let mut st = shared.state.lock();
    while st.finished < n {
        shared.all_done.wait(&mut st);
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

    #[test]
    fn results_keep_task_order_with_any_worker_count() {
        let tasks: Vec<u64> = (0..37).collect();
        for workers in [0, 1, 2, 4, 64] {
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
    }

    fn ops_of(mib: u64, at: u64) -> Vec<Op> {
        (0..mib)
            .map(|i| Op {
                seg_offset: at + (i << 20),
                local_ptr: 0x1000_0000 + (i << 20) as usize,
                len: 1 << 20,
            })
            .collect()
    }

    #[test]
    fn a_batch_too_large_for_the_cache_streams_its_memory_copies() {
        let streams = |tasks: &[Task], group: usize| -> Vec<Stores> {
            tasks
                .iter()
                .filter(|t| t.group == group)
                .map(|t| t.stores)
                .collect()
        };
        // 64 MiB from one local owner: split over threads, every part streams.
        let big = ops_of(64, 0);
        let (tasks, _) = group_tasks([(big.as_slice(), true)]);
        assert!(tasks.len() > 1);
        assert!(streams(&tasks, 0).iter().all(|&s| s == Stores::Streaming));
        let moved: u64 = tasks.iter().flat_map(|t| &t.ops).map(|o| o.len).sum();
        assert_eq!(moved, 64 << 20);
        // 4 MiB stays in the cache: plain stores.
        let small = ops_of(4, 0);
        let (tasks, _) = group_tasks([(small.as_slice(), true)]);
        assert_eq!(streams(&tasks, 0), vec![Stores::Cached]);
        // Two local owners of 5 MiB each: 10 MiB through memory in all, so
        // both stream although neither group is split; a TCP owner's bytes
        // do not count for the memory copies, and its reply streams because
        // the whole batch is large.
        let (a, b, c) = (ops_of(5, 0), ops_of(5, 64 << 20), ops_of(64, 0));
        let (tasks, _) = group_tasks([
            (a.as_slice(), true),
            (b.as_slice(), true),
            (c.as_slice(), false),
        ]);
        assert_eq!(streams(&tasks, 0), vec![Stores::Streaming]);
        assert_eq!(streams(&tasks, 1), vec![Stores::Streaming]);
        assert_eq!(streams(&tasks, 2), vec![Stores::Streaming]);
        let (tasks, _) = group_tasks([(small.as_slice(), true), (c.as_slice(), false)]);
        assert_eq!(streams(&tasks, 0), vec![Stores::Cached]);
        // A small batch from a TCP owner lands straight from the kernel.
        let (tasks, _) = group_tasks([(small.as_slice(), false)]);
        assert_eq!(streams(&tasks, 0), vec![Stores::Cached]);
    }

    #[test]
    fn share_ops_cuts_into_small_balanced_parts() {
        let ops = [Op {
            seg_offset: 100,
            local_ptr: 1 << 30,
            len: 9 << 20,
        }];
        let parts = share_ops(&ops);
        assert!(parts.len() >= 5);
        let mut at = 100;
        for p in &parts {
            for o in p {
                assert_eq!(o.seg_offset, at);
                assert_eq!(o.local_ptr as u64, (1 << 30) + at - 100);
                assert!(o.len <= SHARE_PIECE);
                at += o.len;
            }
        }
        assert_eq!(at, 100 + (9 << 20));
    }

    #[test]
    fn run_all_keeps_task_order_and_runs_each_once() {
        let ran = AtomicUsize::new(0);
        let tasks: Vec<u64> = (0..7).collect();
        let out = run_all(&tasks, tasks.len(), |&t| {
            ran.fetch_add(1, Ordering::Relaxed);
            t * 10
        });
        assert_eq!(out, vec![0, 10, 20, 30, 40, 50, 60]);
        assert_eq!(ran.load(Ordering::Relaxed), 7);
        assert_eq!(run_all(&[3u64], 1, |&t| t + 1), vec![4]);
    }

    #[test]
    fn run_all_runs_tasks_at_once() {
        // Two tasks that each wait for the other to start: they finish only
        // if they run at the same time (the caller and one helper).
        let started = AtomicUsize::new(0);
        let out = run_all(&[0u8, 1u8], 2, |&t| {
            started.fetch_add(1, Ordering::SeqCst);
            while started.load(Ordering::SeqCst) < 2 {
                std::thread::yield_now();
            }
            t
        });
        assert_eq!(out, vec![0, 1]);
    }
}
