//! Collective algorithms, expressed as a list of phases over the active
//! snapshot. A phase is a set of concurrent sends, receives and at most one
//! in-order reduction; each phase carries at most one message per direction
//! per peer, so pieces are matched by `(seq, phase)` alone.

use crate::dtype::{DType, ReduceOp};
use crate::error::PgError;
use crate::transport::shm::PIECE;

/// One submitted collective, with raw buffer addresses (kept alive by the
/// Python `Work`).
#[derive(Clone, Debug)]
pub enum OpKind {
    /// `dst = reduce(src over active ranks)`.
    AllReduce {
        /// Input address.
        src: usize,
        /// Output address (may equal `src`).
        dst: usize,
        /// Bytes per rank.
        nbytes: usize,
        /// Element type.
        dtype: DType,
        /// Operator.
        op: ReduceOp,
    },
    /// Root's buffer to everyone.
    Broadcast {
        /// Buffer address.
        buf: usize,
        /// Bytes.
        nbytes: usize,
        /// Root slot.
        root: usize,
    },
    /// Everyone's `src` into `dsts[slot]`.
    AllGather {
        /// Input address.
        src: usize,
        /// Bytes per rank.
        nbytes: usize,
        /// Output address per slot (K entries).
        dsts: Vec<usize>,
    },
    /// Slot j receives the reduction of every rank's `srcs[j]`.
    ReduceScatter {
        /// Input address per slot (K entries).
        srcs: Vec<usize>,
        /// Output address.
        dst: usize,
        /// Bytes per slot.
        nbytes: usize,
        /// Element type.
        dtype: DType,
        /// Operator.
        op: ReduceOp,
    },
    /// `srcs[j]` goes to slot j, which stores it at `dsts[me]`.
    AllToAll {
        /// (address, bytes) to send per slot.
        srcs: Vec<(usize, usize)>,
        /// (address, bytes) to receive per slot.
        dsts: Vec<(usize, usize)>,
    },
    /// Zero-byte exchange with every active peer.
    Barrier,
    /// Reduction delivered to `root` only.
    Reduce {
        /// Input address.
        src: usize,
        /// Output address (root only).
        dst: usize,
        /// Bytes.
        nbytes: usize,
        /// Element type.
        dtype: DType,
        /// Operator.
        op: ReduceOp,
        /// Root slot.
        root: usize,
    },
    /// Everyone's `src` into the root's `dsts[slot]`.
    Gather {
        /// Input address.
        src: usize,
        /// Bytes per rank.
        nbytes: usize,
        /// Output per slot (root only; empty elsewhere).
        dsts: Vec<usize>,
        /// Root slot.
        root: usize,
    },
    /// Root's `srcs[slot]` to each slot's `dst`.
    Scatter {
        /// Input per slot (root only; empty elsewhere).
        srcs: Vec<usize>,
        /// Output address.
        dst: usize,
        /// Bytes per rank.
        nbytes: usize,
        /// Root slot.
        root: usize,
    },
}

/// A message to or from one peer.
#[derive(Debug)]
pub(crate) struct Xfer {
    /// Peer slot.
    pub(crate) peer: usize,
    /// Buffer address.
    pub(crate) ptr: usize,
    /// Message length.
    pub(crate) len: usize,
    /// Bytes done so far.
    pub(crate) pos: usize,
    /// Finished (or abandoned because the peer failed).
    pub(crate) done: bool,
    /// Message tag within the op (pieces carry it in the `phase` field).
    pub(crate) tag: u32,
    /// Send only what the phase's reduction has produced, and only after
    /// every ungated send to the same peer finished (fused all-reduce).
    pub(crate) gated: bool,
}

impl Xfer {
    fn new(peer: usize, ptr: usize, len: usize) -> Self {
        Xfer {
            peer,
            ptr,
            len,
            pos: 0,
            done: false,
            tag: 0,
            gated: false,
        }
    }

    fn tagged(mut self, tag: u32, gated: bool) -> Self {
        self.tag = tag;
        self.gated = gated;
        self
    }
}

/// One contribution to an in-order reduction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Source {
    /// Local data at this address.
    Own(usize),
    /// Pieces arriving from this peer slot.
    Peer(usize),
    /// A peer that failed before contributing.
    Gone,
}

/// In-order reduction of several contributions into `dst`.
#[derive(Debug)]
pub(crate) struct Reduce {
    /// Contributions in ascending slot order.
    pub(crate) sources: Vec<Source>,
    /// Output address.
    pub(crate) dst: usize,
    /// Bytes.
    pub(crate) len: usize,
    /// Bytes reduced so far (always a multiple of the piece size until done).
    pub(crate) pos: usize,
    /// Element type.
    pub(crate) dtype: DType,
    /// Operator.
    pub(crate) op: ReduceOp,
    /// Finished.
    pub(crate) done: bool,
}

/// One step of an algorithm.
#[derive(Debug, Default)]
pub(crate) struct Phase {
    /// Local copies `(src, dst, len)` done when the phase starts.
    pub(crate) copies: Vec<(usize, usize, usize)>,
    /// Zero fills `(dst, len)` done when the phase starts.
    pub(crate) zeros: Vec<(usize, usize)>,
    /// Outgoing messages.
    pub(crate) sends: Vec<Xfer>,
    /// Incoming messages copied to buffers.
    pub(crate) recvs: Vec<Xfer>,
    /// Incoming messages reduced into a buffer.
    pub(crate) reduce: Option<Reduce>,
    /// Buffers that receive messages from peers without a slot in the op's
    /// output list (see [`Unslotted`]); receives point into them, so they
    /// live as long as the phase.
    pub(crate) scratch: Vec<Vec<u8>>,
}

/// Active peers without a slot in the op's per-slot list.
///
/// A per-slot list only needs slots for the ranks active when the op
/// completes: a peer the op finds dead leaves the active set before then,
/// so a list sized for the survivors is valid even while the op's snapshot
/// still holds the peer. The op therefore still exchanges with such a peer
/// (its message lands in scratch, and nothing is sent to it for a slot the
/// list lacks), and fails only if the peer completes the op alive.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Unslotted {
    /// Bitmap of the peers.
    pub(crate) ranks: u64,
    /// Which argument lacks their slots.
    what: &'static str,
    /// Slots the list has.
    slots: usize,
}

impl Unslotted {
    /// The op's verdict once it ended with the failed set `failed`: an
    /// error naming the lowest peer without a slot that did not fail.
    pub(crate) fn check(&self, failed: u64) -> Result<(), PgError> {
        let alive = self.ranks & !failed;
        if alive == 0 {
            return Ok(());
        }
        Err(PgError::TooFewSlots {
            what: self.what,
            rank: alive.trailing_zeros() as usize,
            slots: self.slots,
        })
    }
}

/// The phases of one op for one rank, and the peers its per-slot list has
/// no slot for.
#[derive(Debug)]
pub(crate) struct Plan {
    /// Steps, run in order.
    pub(crate) phases: Vec<Phase>,
    /// Peers without a slot, to be judged when the op ends.
    pub(crate) unslotted: Unslotted,
}

/// Op kind codes (the bindings' `kind` argument and part of the piece
/// signature), in [`OpKind`] declaration order.
pub const KINDS: [&str; 9] = [
    "all_reduce",
    "broadcast",
    "all_gather",
    "reduce_scatter",
    "all_to_all",
    "barrier",
    "reduce",
    "gather",
    "scatter",
];

/// Wire code of the op kind (1-based index into [`KINDS`]).
pub(crate) fn kind_code(k: &OpKind) -> u32 {
    match k {
        OpKind::AllReduce { .. } => 1,
        OpKind::Broadcast { .. } => 2,
        OpKind::AllGather { .. } => 3,
        OpKind::ReduceScatter { .. } => 4,
        OpKind::AllToAll { .. } => 5,
        OpKind::Barrier => 6,
        OpKind::Reduce { .. } => 7,
        OpKind::Gather { .. } => 8,
        OpKind::Scatter { .. } => 9,
    }
}

/// Uniform description of a collective, as the bindings receive it.
#[derive(Clone, Debug, Default)]
pub struct OpArgs {
    /// Input addresses (one, or one per slot).
    pub srcs: Vec<usize>,
    /// Output addresses (one, or one per slot).
    pub dsts: Vec<usize>,
    /// Bytes per rank or per slot.
    pub nbytes: usize,
    /// Per-slot input sizes (all_to_all only).
    pub src_lens: Vec<usize>,
    /// Per-slot output sizes (all_to_all only).
    pub dst_lens: Vec<usize>,
    /// Root slot (rooted ops).
    pub root: usize,
}

/// Whether the op named `name` reduces: only then do its element type and
/// operator matter; every other op moves raw bytes.
pub fn reduces(name: &str) -> bool {
    matches!(name, "all_reduce" | "reduce_scatter" | "reduce")
}

impl OpKind {
    /// [`OpKind::from_args`] from wire codes: the element type `dt` and the
    /// operator `op` are decoded (and must be known) for an op that
    /// [`reduces`], and ignored otherwise. Also returns the operator code
    /// the op carries (0 for an op that does not reduce).
    pub fn from_codes(name: &str, a: OpArgs, dt: u32, op: u32) -> Result<(OpKind, u32), PgError> {
        if reduces(name) {
            let k = Self::from_args(name, a, DType::from_code(dt)?, ReduceOp::from_code(op)?)?;
            Ok((k, op))
        } else {
            Ok((Self::from_args(name, a, DType::U8, ReduceOp::Sum)?, 0))
        }
    }

    /// Builds the op named `name` (one of [`KINDS`]) from uniform arguments.
    /// Single-buffer ops take `srcs[0]` / `dsts[0]` (0 when absent).
    pub fn from_args(name: &str, a: OpArgs, dtype: DType, op: ReduceOp) -> Result<OpKind, PgError> {
        let src = a.srcs.first().copied().unwrap_or(0);
        let dst = a.dsts.first().copied().unwrap_or(0);
        let (nbytes, root) = (a.nbytes, a.root);
        Ok(match name {
            "all_reduce" => OpKind::AllReduce {
                src,
                dst,
                nbytes,
                dtype,
                op,
            },
            "broadcast" => OpKind::Broadcast {
                buf: src,
                nbytes,
                root,
            },
            "all_gather" => OpKind::AllGather {
                src,
                nbytes,
                dsts: a.dsts,
            },
            "reduce_scatter" => OpKind::ReduceScatter {
                srcs: a.srcs,
                dst,
                nbytes,
                dtype,
                op,
            },
            "all_to_all" => {
                if a.src_lens.len() != a.srcs.len() {
                    return Err(PgError::SplitCount {
                        addrs: a.srcs.len(),
                        sizes: a.src_lens.len(),
                    });
                }
                if a.dst_lens.len() != a.dsts.len() {
                    return Err(PgError::SplitCount {
                        addrs: a.dsts.len(),
                        sizes: a.dst_lens.len(),
                    });
                }
                OpKind::AllToAll {
                    srcs: a.srcs.into_iter().zip(a.src_lens).collect(),
                    dsts: a.dsts.into_iter().zip(a.dst_lens).collect(),
                }
            }
            "barrier" => OpKind::Barrier,
            "reduce" => OpKind::Reduce {
                src,
                dst,
                nbytes,
                dtype,
                op,
                root,
            },
            "gather" => OpKind::Gather {
                src,
                nbytes,
                dsts: a.dsts,
                root,
            },
            "scatter" => OpKind::Scatter {
                srcs: a.srcs,
                dst,
                nbytes,
                root,
            },
            other => return Err(PgError::UnknownCollective(other.to_string())),
        })
    }

    /// Root slot of a rooted op.
    fn root(&self) -> Option<usize> {
        match self {
            OpKind::Broadcast { root, .. }
            | OpKind::Reduce { root, .. }
            | OpKind::Gather { root, .. }
            | OpKind::Scatter { root, .. } => Some(*root),
            _ => None,
        }
    }

    /// Element type and operator of a reduction, `None` for data movement.
    pub fn reduction(&self) -> Option<(DType, ReduceOp)> {
        match self {
            OpKind::AllReduce { dtype, op, .. }
            | OpKind::ReduceScatter { dtype, op, .. }
            | OpKind::Reduce { dtype, op, .. } => Some((*dtype, *op)),
            _ => None,
        }
    }
}

fn ordered_sources(active: &[usize], me: usize, own: usize) -> Vec<Source> {
    active
        .iter()
        .map(|&q| {
            if q == me {
                Source::Own(own)
            } else {
                Source::Peer(q)
            }
        })
        .collect()
}

fn check_slots(active: &[usize], k: usize, what: &'static str) -> Result<(), PgError> {
    match active.iter().find(|&&q| q >= k) {
        Some(&rank) => Err(PgError::TooFewSlots {
            what,
            rank,
            slots: k,
        }),
        None => Ok(()),
    }
}

/// For a list of `k` slots that the op may judge at its end: this rank's
/// own slot must exist (it never fails), while peers without one are
/// returned (see [`Unslotted`]).
fn defer_slots(
    active: &[usize],
    me: usize,
    k: usize,
    what: &'static str,
) -> Result<Unslotted, PgError> {
    if me >= k {
        return Err(PgError::TooFewSlots {
            what,
            rank: me,
            slots: k,
        });
    }
    let ranks = active
        .iter()
        .filter(|&&q| q >= k)
        .fold(0u64, |m, &q| m | 1u64 << q);
    Ok(Unslotted {
        ranks,
        what,
        slots: k,
    })
}

fn check_root(active: &[usize], root: usize) -> Result<(), PgError> {
    if active.contains(&root) {
        Ok(())
    } else {
        Err(PgError::RootInactive { root })
    }
}

/// An in-order reduction of every active rank's contribution into `dst`.
fn reduction(
    active: &[usize],
    me: usize,
    own: usize,
    dst: usize,
    len: usize,
    dtype: DType,
    op: ReduceOp,
) -> Option<Reduce> {
    Some(Reduce {
        sources: ordered_sources(active, me, own),
        dst,
        len,
        pos: 0,
        dtype,
        op,
        done: false,
    })
}

/// One message of `len` bytes at `ptr` to every peer.
fn to_all(peers: &[usize], ptr: usize, len: usize) -> Vec<Xfer> {
    peers.iter().map(|&q| Xfer::new(q, ptr, len)).collect()
}

/// Slot q's own buffer `ptrs[q]` of `len` bytes to every peer q.
fn to_each(peers: &[usize], ptrs: &[usize], len: usize) -> Vec<Xfer> {
    peers.iter().map(|&q| Xfer::new(q, ptrs[q], len)).collect()
}

/// Byte range of element chunk `c` when `nelem` elements are split `n` ways.
fn chunk(nelem: usize, n: usize, c: usize, esize: usize) -> (usize, usize) {
    let base = nelem / n;
    let rem = nelem % n;
    let start = c * base + c.min(rem);
    let len = base + usize::from(c < rem);
    (start * esize, len * esize)
}

/// True when an all_reduce of `nbytes` over `n` ranks runs as two phases
/// (reduce-scatter of element chunks, then the fused all-gather of the
/// reduced chunks) rather than as one direct exchange of whole inputs.
pub(crate) fn two_phase(nbytes: usize, esize: usize, n: usize, small: usize) -> bool {
    n > 1 && nbytes > small && nbytes / esize.max(1) >= n
}

/// How a reduction is recomputed over whole inputs after a failure left
/// it with a rank's data included in part of the output only (inclusion
/// is all-or-nothing per rank).
#[derive(Debug)]
pub(crate) struct Redo {
    /// This rank's input ranges `(address, bytes)` to retain, concatenated
    /// in this order (every rank retains the same layout).
    pub(crate) ranges: Vec<(usize, usize)>,
    /// Offset, within every rank's retained input, of what this rank
    /// reduces.
    pub(crate) offset: usize,
    /// Bytes this rank reduces.
    pub(crate) len: usize,
    /// Where the result goes (`None` on a non-root rank of `reduce`, which
    /// only retains its input for the root).
    pub(crate) dst: Option<usize>,
    /// Element type.
    pub(crate) dtype: DType,
    /// Operator.
    pub(crate) op: ReduceOp,
    /// Two-phase all_reduce: any failure during the op may leave chunks
    /// that disagree on inclusion.
    pub(crate) two_phase: bool,
}

/// The recovery description of `kind` for slot `me`, or `None` when its
/// algorithm cannot include part of a rank's data: data movement, a single
/// rank, or one-piece messages that arrive whole or not at all. `view` and
/// `active` are as for [`plan`].
pub(crate) fn redo(
    kind: &OpKind,
    me: usize,
    view: &[usize],
    active: &[usize],
    small: usize,
) -> Option<Redo> {
    let (dtype, op) = kind.reduction()?;
    // The inputs this rank retains, in this order, each `nbytes` long.
    let (srcs, offset, nbytes, dst, two) = match kind {
        OpKind::AllReduce {
            src, dst, nbytes, ..
        } => {
            let two = two_phase(*nbytes, dtype.size(), view.len(), small);
            (std::slice::from_ref(src), 0, *nbytes, Some(*dst), two)
        }
        OpKind::ReduceScatter {
            srcs, dst, nbytes, ..
        } if me < srcs.len() => (&srcs[..], me * nbytes, *nbytes, Some(*dst), false),
        OpKind::Reduce {
            src,
            dst,
            nbytes,
            root,
            ..
        } => {
            let dst = (*root == me).then_some(*dst);
            (std::slice::from_ref(src), 0, *nbytes, dst, false)
        }
        _ => return None,
    };
    // Alone, only a two-phase all_reduce with a member of its view absent
    // has anything to recompute (over this rank's own input).
    let alone = active.len() < 2;
    (two || (!alone && nbytes > PIECE)).then(|| Redo {
        ranges: srcs.iter().map(|&p| (p, nbytes)).collect(),
        offset,
        len: nbytes,
        dst,
        dtype,
        op,
        two_phase: two,
    })
}

/// Builds the phases of `kind` for slot `me` over the sorted `active` set.
///
/// `view` is the op's member set (sorted, `active` plus the members found
/// dead when the op started), which every member computes alike; `active`
/// may differ between members that saw a death at different times. Where
/// the algorithm splits the work between members (the chunks of a
/// two-phase all_reduce) the split follows `view`, so every member plans
/// the same messages; a dead member's chunk is left for the recomputation.
pub(crate) fn plan(
    kind: &OpKind,
    me: usize,
    view: &[usize],
    active: &[usize],
    small: usize,
) -> Result<Plan, PgError> {
    if let Some(root) = kind.root() {
        check_root(active, root)?;
    }
    let peers: Vec<usize> = active.iter().copied().filter(|&q| q != me).collect();
    let mut ph = Phase::default();
    let mut unslotted = Unslotted::default();
    match kind {
        OpKind::AllReduce {
            src,
            dst,
            nbytes,
            dtype,
            op,
        } => {
            let esize = dtype.size();
            let nelem = nbytes / esize;
            let split = view.len();
            if !two_phase(*nbytes, esize, split, small) {
                ph.sends = to_all(&peers, *src, *nbytes);
                ph.reduce = reduction(active, me, *src, *dst, *nbytes, *dtype, *op);
                return Ok(Plan {
                    phases: vec![ph],
                    unslotted,
                });
            }
            let live = |q: usize| q != me && active.contains(&q);
            let mine = view.iter().position(|&q| q == me).unwrap_or(0);
            let (moff, mlen) = chunk(nelem, split, mine, esize);
            for (c, &q) in view.iter().enumerate() {
                if live(q) {
                    let (off, len) = chunk(nelem, split, c, esize);
                    ph.sends.push(Xfer::new(q, src + off, len));
                }
            }
            ph.reduce = reduction(active, me, src + moff, dst + moff, mlen, *dtype, *op);
            // Fused all-gather: each reduced piece is forwarded while hot.
            for (c, &q) in view.iter().enumerate() {
                if live(q) {
                    let (off, len) = chunk(nelem, split, c, esize);
                    ph.sends
                        .push(Xfer::new(q, dst + moff, mlen).tagged(1, true));
                    ph.recvs.push(Xfer::new(q, dst + off, len).tagged(1, false));
                }
            }
        }
        OpKind::Broadcast { buf, nbytes, root } => {
            if *root == me {
                ph.sends = to_all(&peers, *buf, *nbytes);
            } else {
                ph.recvs.push(Xfer::new(*root, *buf, *nbytes));
            }
        }
        OpKind::AllGather { src, nbytes, dsts } => {
            unslotted = defer_slots(active, me, dsts.len(), "output")?;
            gather_into(&mut ph, me, active, *src, *nbytes, dsts);
            ph.sends = to_all(&peers, *src, *nbytes);
        }
        OpKind::ReduceScatter {
            srcs,
            dst,
            nbytes,
            dtype,
            op,
        } => {
            unslotted = defer_slots(active, me, srcs.len(), "input list")?;
            // A peer without a slot is sent nothing: its own contribution
            // (or its death) still reaches this rank's reduction.
            let slotted: Vec<usize> = peers.iter().copied().filter(|&q| q < srcs.len()).collect();
            ph.sends = to_each(&slotted, srcs, *nbytes);
            ph.reduce = reduction(active, me, srcs[me], *dst, *nbytes, *dtype, *op);
        }
        OpKind::AllToAll { srcs, dsts } => {
            check_slots(active, srcs.len().min(dsts.len()), "split list")?;
            for (j, &(p, l)) in dsts.iter().enumerate() {
                if !active.contains(&j) {
                    ph.zeros.push((p, l));
                }
            }
            let (sp, sl) = srcs[me];
            let (dp, dl) = dsts[me];
            if sl != dl {
                return Err(PgError::SelfSizeMismatch {
                    rank: me,
                    sent: sl,
                    expected: dl,
                });
            }
            if sp != dp {
                ph.copies.push((sp, dp, sl));
            }
            for &q in &peers {
                ph.sends.push(Xfer::new(q, srcs[q].0, srcs[q].1));
                ph.recvs.push(Xfer::new(q, dsts[q].0, dsts[q].1));
            }
        }
        OpKind::Barrier => {
            for &q in &peers {
                ph.sends.push(Xfer::new(q, 0, 0));
                ph.recvs.push(Xfer::new(q, 0, 0));
            }
        }
        // Away from the root, reduce and gather only send the input there.
        OpKind::Reduce {
            src, nbytes, root, ..
        }
        | OpKind::Gather {
            src, nbytes, root, ..
        } if *root != me => {
            ph.sends.push(Xfer::new(*root, *src, *nbytes));
        }
        OpKind::Reduce {
            src,
            dst,
            nbytes,
            dtype,
            op,
            ..
        } => {
            ph.reduce = reduction(active, me, *src, *dst, *nbytes, *dtype, *op);
        }
        OpKind::Gather {
            src, nbytes, dsts, ..
        } => {
            unslotted = defer_slots(active, me, dsts.len(), "gather list")?;
            gather_into(&mut ph, me, active, *src, *nbytes, dsts);
        }
        OpKind::Scatter {
            srcs,
            dst,
            nbytes,
            root,
        } => {
            if *root == me {
                check_slots(active, srcs.len(), "scatter list")?;
                if srcs[me] != *dst {
                    ph.copies.push((srcs[me], *dst, *nbytes));
                }
                ph.sends = to_each(&peers, srcs, *nbytes);
            } else {
                ph.recvs.push(Xfer::new(*root, *dst, *nbytes));
            }
        }
    }
    Ok(Plan {
        phases: vec![ph],
        unslotted,
    })
}

/// Receive side of all_gather/gather: own copy, peer receives, zero fill;
/// an active peer without a slot is received into scratch.
fn gather_into(
    ph: &mut Phase,
    me: usize,
    active: &[usize],
    src: usize,
    nbytes: usize,
    dsts: &[usize],
) {
    for (j, &d) in dsts.iter().enumerate() {
        if j == me {
            if d != src {
                ph.copies.push((src, d, nbytes));
            }
        } else if active.contains(&j) {
            ph.recvs.push(Xfer::new(j, d, nbytes));
        } else {
            ph.zeros.push((d, nbytes));
        }
    }
    for &q in active.iter().filter(|&&q| q >= dsts.len()) {
        let mut buf = vec![0u8; nbytes];
        ph.recvs
            .push(Xfer::new(q, buf.as_mut_ptr() as usize, nbytes));
        ph.scratch.push(buf);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args() -> OpArgs {
        OpArgs {
            srcs: vec![0x1000],
            dsts: vec![0x2000],
            nbytes: 64,
            src_lens: Vec::new(),
            dst_lens: Vec::new(),
            root: 0,
        }
    }

    #[test]
    fn only_reductions_decode_their_dtype_and_operator() {
        let f32 = DType::F32.code();
        let max = ReduceOp::Max.code();
        let (k, op) = OpKind::from_codes("all_reduce", args(), f32, max).expect("all_reduce");
        assert_eq!(op, max);
        assert!(matches!(
            k,
            OpKind::AllReduce {
                dtype: DType::F32,
                op: ReduceOp::Max,
                ..
            }
        ));
        // An unknown operator fails a reduction ...
        assert!(matches!(
            OpKind::from_codes("reduce", args(), f32, 999),
            Err(PgError::UnknownOp(999))
        ));
        assert!(matches!(
            OpKind::from_codes("reduce_scatter", args(), 999, max),
            Err(PgError::UnknownDtype(999))
        ));
        // ... and is ignored by an op that moves bytes.
        let (_, op) = OpKind::from_codes("broadcast", args(), 999, 999).expect("broadcast");
        assert_eq!(op, 0);
        assert!(reduces("all_reduce") && !reduces("all_gather") && !reduces("barrier"));
    }

    #[test]
    fn chunks_cover_everything() {
        let mut total = 0;
        let mut next = 0;
        for c in 0..3 {
            let (off, len) = chunk(10, 3, c, 4);
            assert_eq!(off, next);
            next += len;
            total += len;
        }
        assert_eq!(total, 40);
    }

    #[test]
    fn large_all_reduce_fuses_gather() {
        let k = OpKind::AllReduce {
            src: 0,
            dst: 0,
            nbytes: 1 << 20,
            dtype: DType::F32,
            op: ReduceOp::Sum,
        };
        let p = plan(&k, 1, &[0, 1, 2], &[0, 1, 2], 1024)
            .expect("plan")
            .phases;
        assert_eq!(p.len(), 1);
        assert_eq!(p[0].sends.len(), 4);
        assert_eq!(p[0].sends.iter().filter(|x| x.gated).count(), 2);
        assert_eq!(p[0].recvs.len(), 2);
    }

    #[test]
    fn two_phase_chunks_follow_the_view_whoever_was_seen_dead() {
        let k = OpKind::AllReduce {
            src: 0,
            dst: 0,
            nbytes: 4096,
            dtype: DType::F32,
            op: ReduceOp::Sum,
        };
        let view = [0, 1, 2, 3];
        // Rank 2 saw rank 3 dead at the start, rank 0 did not: both split
        // the input four ways, so what one sends the other expects.
        let saw = plan(&k, 2, &view, &[0, 1, 2], 1024).expect("plan").phases;
        let full = plan(&k, 0, &view, &view, 1024).expect("plan").phases;
        let with = |xs: &[Xfer], peer: usize| -> Vec<(usize, usize)> {
            xs.iter()
                .filter(|x| x.peer == peer)
                .map(|x| (x.ptr, x.len))
                .collect()
        };
        assert_eq!(with(&saw[0].sends, 0), vec![(0, 1024), (2048, 1024)]);
        assert_eq!(with(&full[0].recvs, 2), vec![(2048, 1024)]);
        assert!(saw[0].sends.iter().all(|x| x.peer != 3));
        assert!(saw[0].recvs.iter().all(|x| x.peer != 3));
        // Alone with a dead member left in the view: still retained and
        // recomputed over this rank's input.
        let r = redo(&k, 0, &[0, 1], &[0], 1024).expect("alone in a split op");
        assert!(r.two_phase);
    }

    #[test]
    fn only_multi_piece_reductions_retain_their_input() {
        let ar = |nbytes| OpKind::AllReduce {
            src: 0x1000,
            dst: 0x1000,
            nbytes,
            dtype: DType::F32,
            op: ReduceOp::Sum,
        };
        assert!(
            redo(&ar(4096), 0, &[0, 1, 2], &[0, 1, 2], 1 << 16).is_none(),
            "one piece"
        );
        assert!(
            redo(&ar(1 << 20), 0, &[0], &[0], 1 << 16).is_none(),
            "alone"
        );
        let r = redo(&ar(1 << 20), 1, &[0, 1, 2], &[0, 1, 2], 1 << 16).expect("two-phase");
        assert!(r.two_phase);
        assert_eq!(
            (r.ranges, r.offset, r.len),
            (vec![(0x1000, 1 << 20)], 0, 1 << 20)
        );
        let r = redo(&ar(1 << 20), 1, &[0, 1, 2], &[0, 1, 2], usize::MAX).expect("multi-piece");
        assert!(!r.two_phase);
        let rs = OpKind::ReduceScatter {
            srcs: vec![0x1000, 0x9000, 0x20000],
            dst: 0x40000,
            nbytes: PIECE + 8,
            dtype: DType::I64,
            op: ReduceOp::Sum,
        };
        let r = redo(&rs, 2, &[0, 1, 2], &[0, 1, 2], 0).expect("reduce_scatter");
        assert_eq!(r.ranges.len(), 3);
        assert_eq!((r.offset, r.dst), (2 * (PIECE + 8), Some(0x40000)));
        let b = OpKind::Broadcast {
            buf: 0,
            nbytes: 1 << 24,
            root: 0,
        };
        assert!(redo(&b, 0, &[0, 1], &[0, 1], 0).is_none(), "data movement");
    }

    #[test]
    fn inactive_root_is_an_error() {
        let k = OpKind::Broadcast {
            buf: 0,
            nbytes: 4,
            root: 3,
        };
        assert!(matches!(
            plan(&k, 0, &[0, 1], &[0, 1], 1024),
            Err(PgError::RootInactive { root: 3 })
        ));
    }

    #[test]
    fn a_list_short_of_a_peer_is_judged_when_the_op_ends() {
        // Three slots while the snapshot still holds rank 3: rank 3's
        // message lands in scratch, and the list is valid if rank 3 failed.
        let k = OpKind::AllGather {
            src: 0x100,
            nbytes: 4,
            dsts: vec![0x1000, 0x2000, 0x3000],
        };
        let p = plan(&k, 0, &[0, 1, 2, 3], &[0, 1, 2, 3], 1024).expect("plan");
        let ph = &p.phases[0];
        assert_eq!(p.unslotted.ranks, 1 << 3);
        assert_eq!(ph.recvs.len(), 3);
        let scratch = ph
            .recvs
            .iter()
            .find(|x| x.peer == 3)
            .expect("rank 3's receive");
        assert_eq!(scratch.ptr, ph.scratch[0].as_ptr() as usize);
        assert_eq!(ph.scratch[0].len(), 4);
        assert_eq!(ph.sends.len(), 3, "rank 3 still gets this rank's input");
        assert!(p.unslotted.check(1 << 3).is_ok());
        let e = p.unslotted.check(0).expect_err("rank 3 completed alive");
        assert_eq!(
            e.to_string(),
            "output too small for active rank 3 (3 slots)"
        );
        // The error names the lowest peer without a slot that is alive.
        let two = OpKind::AllGather {
            src: 0,
            nbytes: 4,
            dsts: vec![0, 0],
        };
        let p = plan(&two, 0, &[0, 1, 2, 3], &[0, 1, 2, 3], 1024).expect("plan");
        let e = p.unslotted.check(1 << 2).expect_err("rank 3 alive");
        assert_eq!(
            e.to_string(),
            "output too small for active rank 3 (2 slots)"
        );
        // This rank's own slot must exist: it never fails.
        let e = plan(&two, 2, &[0, 1, 2], &[0, 1, 2], 1024).expect_err("own slot");
        assert_eq!(
            e.to_string(),
            "output too small for active rank 2 (2 slots)"
        );
        // reduce_scatter sends nothing to a peer without a slot and still
        // reduces what that peer sends.
        let rs = OpKind::ReduceScatter {
            srcs: vec![0x1000, 0x2000, 0x3000],
            dst: 0x4000,
            nbytes: 8,
            dtype: DType::I64,
            op: ReduceOp::Sum,
        };
        let p = plan(&rs, 1, &[0, 1, 2, 3], &[0, 1, 2, 3], 1024).expect("plan");
        let ph = &p.phases[0];
        assert_eq!(p.unslotted.ranks, 1 << 3);
        let to: Vec<usize> = ph.sends.iter().map(|x| x.peer).collect();
        assert_eq!(to, vec![0, 2]);
        let r = ph.reduce.as_ref().expect("reduction");
        assert_eq!(r.sources[3], Source::Peer(3));
        // Lists that cover every active rank leave nothing to judge.
        let p = plan(&rs, 1, &[0, 1, 2], &[0, 1, 2], 1024).expect("plan");
        assert_eq!(p.unslotted.ranks, 0);
        assert!(p.unslotted.check(0).is_ok());
        // A gather's root judges its list the same way; scatter's root and
        // all_to_all, which cannot observe a peer they only send to or
        // whose message size they do not know, fail at once.
        let g = OpKind::Gather {
            src: 0,
            nbytes: 4,
            dsts: vec![0x10, 0x20],
            root: 0,
        };
        assert_eq!(
            plan(&g, 0, &[0, 1, 2], &[0, 1, 2], 1024)
                .expect("gather")
                .unslotted
                .ranks,
            1 << 2
        );
        let sc = OpKind::Scatter {
            srcs: vec![0x10, 0x20],
            dst: 0x30,
            nbytes: 4,
            root: 0,
        };
        let e = plan(&sc, 0, &[0, 1, 2], &[0, 1, 2], 1024).expect_err("scatter");
        assert_eq!(
            e.to_string(),
            "scatter list too small for active rank 2 (2 slots)"
        );
    }

    #[test]
    fn malformed_lists_and_unknown_names_are_errors() {
        let bad = OpArgs {
            srcs: vec![1, 2],
            src_lens: vec![4],
            ..Default::default()
        };
        let e = OpKind::from_args("all_to_all", bad, DType::U8, ReduceOp::Sum);
        assert!(matches!(e, Err(PgError::SplitCount { addrs: 2, sizes: 1 })));
        let e = OpKind::from_args("bogus", OpArgs::default(), DType::U8, ReduceOp::Sum);
        assert!(matches!(e, Err(PgError::UnknownCollective(_))));
    }
}
