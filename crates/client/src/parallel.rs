//! Spreading one batch of copies over threads: large local or same-host
//! transfers are cut into byte-balanced parts (each op into pieces of at
//! most [`LOCAL_PIECE`]) and run on up to [`copy_threads`] threads. Shared by
//! the ranged reads (`ranges`) and the located writes (`writes`), which is
//! what tensor IO lowers onto.

use mooncake_transfer::Op;

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

/// Run `f` on every task, on one thread per task when there are several.
pub(crate) fn run_all<T: Sync, R: Send>(tasks: &[T], f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    if tasks.len() <= 1 {
        return tasks.iter().map(&f).collect();
    }
    std::thread::scope(|sc| {
        let f = &f;
        let hs: Vec<_> = tasks.iter().map(|t| sc.spawn(move || f(t))).collect();
        hs.into_iter()
            .map(|h| match h.join() {
                Ok(r) => r,
                Err(panic) => std::panic::resume_unwind(panic),
            })
            .collect()
    })
}
