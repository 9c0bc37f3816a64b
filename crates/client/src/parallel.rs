//! Spreading one batch of copies over threads: large local or same-host
//! transfers are cut into byte-balanced parts (each op into pieces of at
//! most [`LOCAL_PIECE`]) and run on up to [`copy_threads`] threads. Shared by
//! the ranged reads (`ranges`) and the located writes (`writes`), which is
//! what tensor IO lowers onto.

use mooncake_transfer::Op;
use parking_lot::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

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

/// Cut `ops` (all against one segment) into `parts` runs of about equal
/// bytes, every op cut into pieces of at most [`LOCAL_PIECE`] bytes, so that
/// each part can be copied by its own thread.
pub(crate) fn split_ops(ops: &[Op], parts: usize) -> Vec<Vec<Op>> {
    let total: u64 = ops.iter().map(|o| o.len).sum();
    let parts = parts.max(1) as u64;
    let per = total.div_ceil(parts).max(1);
    let mut out: Vec<Vec<Op>> = vec![Vec::new()];
    let mut acc = 0u64;
    for o in ops {
        let mut o = *o;
        while o.len > 0 {
            let take = o.len.min(per - acc).min(LOCAL_PIECE);
            if let Some(last) = out.last_mut() {
                last.push(Op {
                    seg_offset: o.seg_offset,
                    local_ptr: o.local_ptr,
                    len: take,
                });
            }
            acc += take;
            o.seg_offset += take;
            o.local_ptr += take as usize;
            o.len -= take;
            if acc >= per {
                out.push(Vec::new());
                acc = 0;
            }
        }
    }
    out.retain(|p| !p.is_empty());
    out
}

/// Run `f` on every task, as many at once as there are tasks: the calling
/// thread and one helper thread per further task each claim the next task
/// not yet started until none is left. Results are in task order.
///
/// The calling thread works too, and tasks are claimed rather than
/// assigned, so when the machine is busy and a helper is scheduled late the
/// caller runs the tasks that helper would have run instead of waiting for
/// it (the call then waits only for a helper's current task).
pub(crate) fn run_all<T: Sync, R: Send>(tasks: &[T], f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    if tasks.len() <= 1 {
        return tasks.iter().map(&f).collect();
    }
    let next = AtomicUsize::new(0);
    let slots: Vec<Mutex<Option<R>>> = tasks.iter().map(|_| Mutex::new(None)).collect();
    let work = || loop {
        let i = next.fetch_add(1, Ordering::Relaxed);
        let Some(t) = tasks.get(i) else { break };
        let r = f(t);
        *slots[i].lock() = Some(r);
    };
    std::thread::scope(|sc| {
        let hs: Vec<_> = (1..tasks.len()).map(|_| sc.spawn(work)).collect();
        work();
        for h in hs {
            if let Err(panic) = h.join() {
                std::panic::resume_unwind(panic);
            }
        }
    });
    slots
        .into_iter()
        .map(|s| match s.into_inner() {
            Some(r) => r,
            // Every index below tasks.len() is claimed by exactly one worker,
            // which stores its result before claiming again; a worker that
            // panicked was re-raised above.
            None => unreachable!("a claimed task always stores its result"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_all_keeps_task_order_and_runs_each_once() {
        let ran = AtomicUsize::new(0);
        let tasks: Vec<u64> = (0..7).collect();
        let out = run_all(&tasks, |&t| {
            ran.fetch_add(1, Ordering::Relaxed);
            t * 10
        });
        assert_eq!(out, vec![0, 10, 20, 30, 40, 50, 60]);
        assert_eq!(ran.load(Ordering::Relaxed), 7);
        assert_eq!(run_all(&[3u64], |&t| t + 1), vec![4]);
        assert!(run_all(&[] as &[u64], |&t| t).is_empty());
    }

    #[test]
    fn run_all_runs_tasks_at_once() {
        // Two tasks that each wait for the other to start: they finish only
        // if they run at the same time (the caller and one helper).
        let started = AtomicUsize::new(0);
        let out = run_all(&[0u8, 1u8], |&t| {
            started.fetch_add(1, Ordering::SeqCst);
            while started.load(Ordering::SeqCst) < 2 {
                std::thread::yield_now();
            }
            t
        });
        assert_eq!(out, vec![0, 1]);
    }
}
