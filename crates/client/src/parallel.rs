//! Spreading one batch of copies over threads: large local or same-host
//! transfers are cut into parts of about [`SHARE_PIECE`] bytes
//! ([`share_ops`]) that the calling thread and up to [`copy_threads`] minus one
//! of the process's helper threads claim one at a time ([`run_all`]). Shared by the ranged
//! reads (`ranges`) and the located writes (`writes`), which is what tensor
//! IO lowers onto.
//!
//! Claiming parts dynamically matters on a busy machine: with fixed halves,
//! a call waited for its second thread to get a core (several ms with the
//! reference VM's 2 cores loaded), and was slower than one thread; now the
//! calling thread takes whatever the helper has not claimed yet.

pub(crate) use mooncake_transfer::workers::run_all;
use mooncake_transfer::{Op, Rows, Stores};

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

#[cfg(test)]
mod tests {
    use super::*;

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
}
