//! Executes one collective: takes its snapshot of the active set, plans it
//! (`plan`), pushes pieces, matches incoming pieces by `(seq, tag)`, reduces
//! in rank order straight out of the channel, and sleeps on the group
//! doorbell when nothing can move. Peers found dead during the op become
//! its failed set F_i.
//!
//! Inclusion is all-or-nothing per rank (same contract): a reduction whose
//! algorithm can lose a rank's data partway (`plan::redo`) retains a copy
//! of its input, made piece by piece as the op first reads or overwrites
//! each part (all of it before a phase that may write over the input some
//! other way, and before the op completes); when the op ends with some part of the output
//! including a failed rank and another part not, this rank pulls the
//! survivors' retained inputs and recomputes the op over exactly
//! C_i = itself plus the ranks whose whole input it obtained.

use crate::collectives::plan::{self, Phase, Redo, Reduce, Source, Xfer};
use crate::collectives::reduce;
use crate::config;
use crate::error::PgError;
use crate::fault::{self, Point};
use crate::runtime::reader::answer_pulls;
use crate::runtime::shared::{Links, Op, Shared};
use crate::transport::copy;
use crate::transport::link::{Front, Landing, PeerLink};
use crate::transport::shm::PIECE;
use crate::transport::wire::{Hdr, FLAG_TAINT, KIND_ABORT, KIND_COLL, KIND_PULL_REQ};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

struct Ctx<'a> {
    shared: &'a Shared,
    links: &'a Links,
    seq: u64,
    sig: u32,
    active: &'a [usize],
    failed: u64,
    /// Lowest active peer, while a `mid_send` fault check is still due.
    mid_send: Option<usize>,
    /// This rank's reduction lost a contribution: its forwarded reduced
    /// pieces are flagged [`FLAG_TAINT`].
    lost: bool,
    /// The op's input is retained (`plan::redo`): its pieces are copied
    /// as they are first read or overwritten.
    retained: bool,
    /// Part of the output may include a failed rank's data and part not.
    partial: bool,
    /// Peers a piece of this op came from (they completed every earlier
    /// op: a completed-seq watermark carried by the pieces themselves).
    heard: u64,
}

enum Cls {
    /// Nothing queued.
    Empty,
    /// Left over from an earlier (aborted) op: drop it.
    Stale,
    /// The peer is already in a later op: it never sent what we expect.
    Ahead,
    /// Same op, another message (consumed by another descriptor first).
    Other,
    /// The piece this descriptor expects.
    Cur(Front),
}

fn classify(link: &PeerLink, seq: u64, tag: u32) -> Cls {
    match link.peek() {
        None => Cls::Empty,
        Some(f) => match f.hdr.seq.cmp(&seq) {
            std::cmp::Ordering::Less => Cls::Stale,
            std::cmp::Ordering::Greater => Cls::Ahead,
            std::cmp::Ordering::Equal if f.hdr.phase == tag => Cls::Cur(f),
            std::cmp::Ordering::Equal => Cls::Other,
        },
    }
}

fn mismatch(peer: usize) -> PgError {
    PgError::Mismatch { peer }
}

/// Runs one collective to completion and reports it.
pub(crate) fn run_op(shared: &Shared, links: &Links, op: Op) {
    let mask = shared.view_mask(op.seq);
    let committed = shared.mask();
    let me = shared.rank;
    // Snapshot S: the op's view, minus peers already known dead. Those are
    // flagged in the op's failed set (so survivors agree on C when the
    // failure predates the op) unless a committed view already removed them.
    let mut known_dead = if shared.fenced.load(Ordering::Acquire) {
        shared
            .fenced_before
            .lock()
            .as_ref()
            .map_or(0, |f| f.lost_peers(op.seq, me))
    } else {
        0
    };
    let mut active: Vec<usize> = Vec::with_capacity(mask.count_ones() as usize + 1);
    for i in (0..64).filter(|i| mask >> i & 1 == 1) {
        // A peer that said BYE (orderly destroy) stays in S: what it sent
        // before leaving is still queued and is consumed normally.
        let dead = i != me
            && links
                .get(i)
                .is_none_or(|l| l.as_ref().is_none_or(|l| l.is_dead() && !l.said_bye()));
        if dead {
            if committed >> i & 1 == 1 {
                known_dead |= 1u64 << i;
            }
        } else {
            active.push(i);
        }
    }
    if !active.contains(&me) {
        active.push(me);
        active.sort_unstable();
    }
    // The op's members as every member computes them: its view, whoever
    // each member found dead at the start.
    let view: Vec<usize> = (0..64).filter(|&i| mask >> i & 1 == 1 || i == me).collect();
    let absent = view.iter().fold(0u64, |m, &q| m | 1u64 << q)
        & !active.iter().fold(0u64, |m, &q| m | 1u64 << q);
    let peers = active.iter().fold(0u64, |m, &q| m | 1u64 << q) & !(1u64 << me);
    shared.waiting_coll.store(peers, Ordering::Release);
    let mid_send = if fault::active() {
        fault::at_op(&shared.label, op.seq, Point::BeforeSend);
        for &q in active.iter().filter(|&&q| q != me) {
            if fault::drop_link(&shared.label, op.seq, q) {
                if let Some(l) = links.get(q).and_then(|l| l.as_ref()) {
                    l.fence();
                }
            }
        }
        active.iter().copied().find(|&q| q != me)
    } else {
        None
    };
    // Retain the input before the first send (every member of S may pull
    // it until it acknowledged the op or failed; we keep it for ourselves
    // until the op completes), then answer the pulls that waited for it.
    // The copy is made as the op goes (see `Retention::hold`).
    let redo = plan::redo(&op.kind, me, &view, &active, shared.cfg.small_bytes);
    if let Some(r) = &redo {
        // SAFETY: the ranges are the op's inputs, valid for reads until it
        // completes (`Group::submit`), which is after `fill_all` below; the
        // op writes nothing before a fill covering it: its reductions and
        // receives (here and in the reader's landings) fill each piece
        // before writing it, and a phase whose start writes over them, or
        // any phase after the first, is preceded by `fill_all`.
        let due = unsafe { shared.retain.hold(op.seq, &r.ranges, peers | 1u64 << me) };
        answer_pulls(&shared.retain, links, due, true);
    }
    let refused = shared.retain.begin(op.seq);
    answer_pulls(&shared.retain, links, refused, false);
    let mut ctx = Ctx {
        shared,
        links,
        seq: op.seq,
        sig: op.sig,
        active: &active,
        failed: known_dead,
        mid_send,
        lost: false,
        retained: redo.is_some(),
        partial: false,
        heard: 0,
    };
    let result =
        plan::plan(&op.kind, me, &view, &active, shared.cfg.small_bytes).and_then(|mut p| {
            for (i, ph) in p.phases.iter_mut().enumerate() {
                if let Some(r) = &redo {
                    if i > 0 || writes_over(ph, &r.ranges) {
                        shared.retain.fill_all(op.seq);
                    }
                }
                run_phase(&mut ctx, ph)?;
            }
            // Slots are needed for the ranks still active at the op's end.
            p.unslotted.check(ctx.failed)
        });
    if redo.is_some() {
        // However the phases ended: the inputs are the caller's again once
        // the op completes.
        shared.retain.fill_all(op.seq);
    }
    if let (Ok(()), Some(r)) = (&result, &redo) {
        // A two-phase op splits its chunks over the view: a member that
        // failed during the op, or was absent from its start, left chunks
        // that no one reduced or that disagree on inclusion.
        let newly = ctx.failed & !known_dead;
        if ctx.partial || (r.two_phase && (newly | absent) != 0) {
            if let Some(dst) = r.dst {
                recompute(&mut ctx, r, dst, known_dead);
            }
        }
    }
    // Acknowledgements: we are done with our own copy, and a peer that
    // sent us a piece of this op completed every earlier one.
    shared.retain.ack(me, op.seq + 1);
    for q in (0..64).filter(|q| ctx.heard >> q & 1 == 1) {
        shared.retain.ack(q, op.seq);
    }
    shared.retain.complete(op.seq);
    if fault::active() {
        fault::at_op(&shared.label, op.seq, Point::AfterSend);
    }
    shared.waiting_coll.store(0, Ordering::Release);
    let failed = ctx.failed;
    if let Err(ref e) = result {
        let hdr = Hdr {
            kind: KIND_ABORT,
            seq: op.seq,
            ..Default::default()
        };
        for &q in &active {
            if let Some(l) = links.get(q).and_then(|l| l.as_ref()) {
                if !l.is_dead() {
                    let _ = l.write_frame(&hdr, &[]);
                }
            }
        }
        let _ = e;
    }
    shared.finish(&op.done, result.err(), failed);
}

/// Whether `ph` writes over any of `ranges` when it starts (its local
/// copies and zero fills; its reduction and receives fill each piece of
/// the retained copy before they write it).
fn writes_over(ph: &Phase, ranges: &[(usize, usize)]) -> bool {
    let hits = |d: usize, l: usize| ranges.iter().any(|&(p, n)| d < p + n && p < d + l);
    ph.copies.iter().any(|&(_, d, l)| hits(d, l)) || ph.zeros.iter().any(|&(d, l)| hits(d, l))
}

fn run_phase(ctx: &mut Ctx<'_>, ph: &mut Phase) -> Result<(), PgError> {
    for &(s, d, l) in &ph.copies {
        // SAFETY: the addresses come from the op, whose submitter guarantees
        // (`Group::submit`) they stay valid until it completes;
        // `ptr::copy` tolerates overlap.
        unsafe { std::ptr::copy(s as *const u8, d as *mut u8, l) };
    }
    for &(d, l) in &ph.zeros {
        // SAFETY: as above: an output range of the op.
        unsafe { std::ptr::write_bytes(d as *mut u8, 0, l) };
    }
    // Each receive over TCP lends its output to the link's reader, so its
    // pieces land in place instead of being copied out of a pooled buffer.
    let mut lent = Lent(Vec::new());
    for x in ph.recvs.iter().filter(|x| x.len > 0) {
        if let Some(l) = link(ctx, x.peer) {
            let taken = lent.0.iter().any(|&o| std::ptr::eq(o, l));
            if !taken && !l.uses_shm() && !l.is_dead() {
                let to = Landing {
                    seq: ctx.seq,
                    tag: x.tag,
                    sig: ctx.sig,
                    ptr: x.ptr,
                    len: x.len,
                };
                // SAFETY: `x` is an output range of the op (valid for
                // writes until it completes, `Group::submit`) that only this
                // receive writes; `lent` withdraws it before the phase ends,
                // and `fail_recv` before it zero-fills it.
                unsafe { l.lend_landing(to) };
                lent.0.push(l);
            }
        }
    }
    let spin = ctx.shared.spin();
    loop {
        let seen = ctx.shared.bell().observe();
        let mut progressed = false;
        let mut pending = false;
        for x in ph.sends.iter_mut().filter(|x| !x.done && !x.gated) {
            progressed |= step_send(ctx, x, x.len);
            pending |= !x.done;
        }
        for x in ph.recvs.iter_mut().filter(|x| !x.done) {
            progressed |= step_recv(ctx, x)?;
            pending |= !x.done;
        }
        let mut produced = usize::MAX;
        if let Some(r) = ph.reduce.as_mut() {
            if !r.done {
                progressed |= step_reduce(ctx, r)?;
                pending |= !r.done;
            }
            produced = if r.done { usize::MAX } else { r.pos };
        }
        for i in 0..ph.sends.len() {
            let (x, peer) = (&ph.sends[i], ph.sends[i].peer);
            if x.done || !x.gated {
                continue;
            }
            let first_done = ph.sends.iter().all(|y| y.gated || y.peer != peer || y.done);
            if first_done {
                let x = &mut ph.sends[i];
                progressed |= step_send(ctx, x, produced.min(x.len));
            }
            pending |= !ph.sends[i].done;
        }
        if !pending {
            return Ok(());
        }
        if !progressed {
            if ctx.shared.is_shutdown() {
                return Err(PgError::Shutdown);
            }
            for &q in ctx.active {
                if let Some(l) = ctx.links.get(q).and_then(|l| l.as_ref()) {
                    if l.aborted(ctx.seq) {
                        return Err(PgError::AbortedByPeer { peer: q });
                    }
                }
            }
            ctx.shared
                .bell()
                .wait(seen, Duration::from_millis(100), spin);
        }
    }
}

/// How long the end of a phase waits for a reader still writing a piece
/// into a lent output before it fences that peer (which stalled partway
/// through a piece of a message the op no longer waits for).
const LANDING_PATIENCE: Duration = Duration::from_secs(2);

/// The links holding a lent output of the running phase; dropping it
/// withdraws them, however the phase ends.
struct Lent<'a>(Vec<&'a PeerLink>);

impl Drop for Lent<'_> {
    fn drop(&mut self) {
        for l in &self.0 {
            l.withdraw_landing(LANDING_PATIENCE);
        }
    }
}

fn link<'a>(ctx: &Ctx<'a>, slot: usize) -> Option<&'a PeerLink> {
    ctx.links.get(slot).and_then(|l| l.as_deref())
}

/// Pushes pieces of `x` up to byte `limit` (whole pieces, or the tail).
fn step_send(ctx: &mut Ctx<'_>, x: &mut Xfer, limit: usize) -> bool {
    let Some(l) = link(ctx, x.peer) else {
        x.done = true;
        return true;
    };
    let mut progressed = false;
    loop {
        if l.is_dead() {
            x.done = true;
            return true;
        }
        let plen = PIECE.min(x.len - x.pos);
        if x.pos + plen > limit && !(x.len == 0 && limit == 0) {
            return progressed;
        }
        let hdr = Hdr {
            kind: KIND_COLL,
            flags: if x.gated && ctx.lost { FLAG_TAINT } else { 0 },
            phase: x.tag,
            seq: ctx.seq,
            total: x.len as u64,
            offset: x.pos as u64,
            len: plen as u32,
            aux: ctx.sig,
        };
        if ctx.retained {
            // Copied while it is read: the send then finds it in cache.
            ctx.shared.retain.fill(ctx.seq, x.ptr + x.pos, plen);
        }
        let data: &[u8] = if plen == 0 {
            &[]
        } else {
            // SAFETY: `pos + plen <= len` bytes of the op's source range,
            // valid until the op completes (`Group::submit`).
            unsafe { std::slice::from_raw_parts((x.ptr + x.pos) as *const u8, plen) }
        };
        match l.send_piece(&hdr, data, x.len >= copy::STREAM_MIN_MESSAGE) {
            Ok(true) => {
                if ctx.mid_send == Some(x.peer) {
                    ctx.mid_send = None;
                    fault::at_op(&ctx.shared.label, ctx.seq, Point::MidSend);
                }
                x.pos += plen;
                progressed = true;
                if x.pos >= x.len {
                    x.done = true;
                    return true;
                }
            }
            Ok(false) => return progressed,
            Err(_) => {
                l.mark_dead();
                x.done = true;
                return true;
            }
        }
    }
}

fn step_recv(ctx: &mut Ctx<'_>, x: &mut Xfer) -> Result<bool, PgError> {
    let Some(l) = link(ctx, x.peer) else {
        fail_recv(ctx, x);
        return Ok(true);
    };
    let mut progressed = false;
    loop {
        match classify(l, ctx.seq, x.tag) {
            Cls::Empty => {
                if l.is_dead() && l.peek().is_none() {
                    fail_recv(ctx, x);
                    return Ok(true);
                }
                return Ok(progressed);
            }
            Cls::Other => return Ok(progressed),
            Cls::Stale => {
                l.pop();
                progressed = true;
            }
            Cls::Ahead => return Err(mismatch(x.peer)),
            Cls::Cur(f) => {
                let h = f.hdr;
                let end = h.offset as usize + h.len as usize;
                if h.aux != ctx.sig || h.total != x.len as u64 || end > x.len {
                    l.pop();
                    return Err(mismatch(x.peer));
                }
                if h.flags & FLAG_TAINT != 0 {
                    // The sender's reduced chunk lost a contribution.
                    ctx.partial = true;
                }
                ctx.heard |= 1u64 << x.peer;
                if ctx.retained && h.len > 0 && !f.data.is_null() {
                    // An in-place output: the retained input is copied first.
                    ctx.shared
                        .retain
                        .fill(ctx.seq, x.ptr + h.offset as usize, h.len as usize);
                }
                if h.len > 0 && !f.data.is_null() {
                    // SAFETY: `offset + len <= x.len` was checked above, so the
                    // write stays inside the op's output range (valid until
                    // completion, `Group::submit`); the piece holds `len`
                    // payload bytes until popped; ring and socket buffers
                    // never overlap user tensors.
                    unsafe {
                        copy::copy(
                            f.data,
                            (x.ptr + h.offset as usize) as *mut u8,
                            h.len as usize,
                            x.len >= copy::STREAM_MIN_MESSAGE,
                        )
                    };
                }
                l.pop();
                progressed = true;
                x.pos += h.len as usize;
                if end >= x.len {
                    x.done = true;
                    return Ok(true);
                }
            }
        }
    }
}

fn fail_recv(ctx: &mut Ctx<'_>, x: &mut Xfer) {
    ctx.failed |= 1u64 << x.peer;
    if let Some(l) = link(ctx, x.peer) {
        // The reader may still be landing a piece in the range.
        l.withdraw_landing(LANDING_PATIENCE);
    }
    if x.len > 0 {
        if ctx.retained {
            ctx.shared.retain.fill(ctx.seq, x.ptr, x.len);
        }
        // SAFETY: the op's output range of `x.len` bytes (`Group::submit`).
        unsafe { std::ptr::write_bytes(x.ptr as *mut u8, 0, x.len) };
    }
    x.done = true;
}

fn step_reduce(ctx: &mut Ctx<'_>, r: &mut Reduce) -> Result<bool, PgError> {
    let mut progressed = false;
    let mut fronts: Vec<Option<Front>> = Vec::with_capacity(r.sources.len());
    loop {
        let plen = PIECE.min(r.len - r.pos);
        fronts.clear();
        let mut ready = true;
        for s in r.sources.iter_mut() {
            let Source::Peer(q) = *s else {
                fronts.push(None);
                continue;
            };
            let Some(l) = link(ctx, q) else {
                *s = Source::Gone;
                ctx.failed |= 1u64 << q;
                ctx.lost = true;
                ctx.partial |= r.pos > 0;
                fronts.push(None);
                continue;
            };
            let mut front = None;
            loop {
                match classify(l, ctx.seq, 0) {
                    Cls::Empty => {
                        if l.is_dead() && l.peek().is_none() {
                            *s = Source::Gone;
                            ctx.failed |= 1u64 << q;
                            // Earlier pieces of the output included it.
                            ctx.lost = true;
                            ctx.partial |= r.pos > 0;
                        } else {
                            ready = false;
                        }
                        break;
                    }
                    Cls::Stale => {
                        l.pop();
                        progressed = true;
                    }
                    Cls::Other => {
                        ready = false;
                        break;
                    }
                    Cls::Ahead => return Err(mismatch(q)),
                    Cls::Cur(f) => {
                        let h = f.hdr;
                        // A landed piece belongs to a receive, never to a
                        // reduction.
                        if h.aux != ctx.sig
                            || f.data.is_null()
                            || h.total != r.len as u64
                            || h.offset as usize != r.pos
                            || h.len as usize != plen
                        {
                            l.pop();
                            return Err(mismatch(q));
                        }
                        front = Some(f);
                        ctx.heard |= 1u64 << q;
                        break;
                    }
                }
            }
            fronts.push(front);
        }
        if !ready {
            return Ok(progressed);
        }
        let mut srcs: Vec<*const u8> = Vec::with_capacity(r.sources.len());
        for (s, f) in r.sources.iter().zip(fronts.iter()) {
            match (s, f) {
                (Source::Own(p), _) => srcs.push((p + r.pos) as *const u8),
                (Source::Peer(_), Some(f)) => srcs.push(f.data),
                _ => {}
            }
        }
        if ctx.retained {
            // The retained input is copied before the output overwrites it
            // (in place), and our own input as it is read.
            ctx.shared.retain.fill(ctx.seq, r.dst + r.pos, plen);
            for s in &r.sources {
                if let Source::Own(p) = *s {
                    ctx.shared.retain.fill(ctx.seq, p + r.pos, plen);
                }
            }
        }
        let esize = r.dtype.size();
        // SAFETY: sources are piece payloads (checked to hold `plen` bytes,
        // alive until popped below) or the op's own input at `pos`; `dst` is
        // the op's output range, valid until completion (`Group::submit`).
        unsafe {
            reduce::reduce(
                r.dtype,
                r.op,
                (r.dst + r.pos) as *mut u8,
                &srcs,
                plen / esize,
                srcs.len(),
            )
        };
        for (s, f) in r.sources.iter().zip(fronts.iter()) {
            if let (Source::Peer(q), Some(_)) = (s, f) {
                if let Some(l) = link(ctx, *q) {
                    l.pop();
                }
            }
        }
        progressed = true;
        r.pos += plen;
        if r.pos >= r.len {
            r.done = true;
            return Ok(true);
        }
    }
}

/// Recomputes a reduction over whole inputs (inclusion is all-or-nothing
/// per rank): pulls every other member's
/// retained input range for this op, then reduces, in rank order, our own
/// retained copy and every input that arrived whole into `dst`. The op's
/// failed set becomes the members whose input could not be obtained (dead,
/// refused, or silent past the collective timeout), plus the ranks already
/// known dead when the op started; AVG divides by the contributors.
fn recompute(ctx: &mut Ctx<'_>, r: &Redo, dst: usize, known_dead: u64) {
    let sh = ctx.shared;
    let me = sh.rank;
    let mut pulls: Vec<(usize, Option<u32>, Vec<u8>)> = Vec::new();
    for &q in ctx.active.iter().filter(|&&q| q != me) {
        let mut buf = sh.retain.pull_buffer(r.len);
        let id = match link(ctx, q) {
            Some(l) if !l.is_dead() => {
                // SAFETY: `buf` holds at least `r.len` bytes and is neither
                // moved nor dropped before `finish_pull` below.
                let id = unsafe { sh.retain.start_pull(q, buf.as_mut_ptr() as usize, r.len) };
                let req = Hdr {
                    kind: KIND_PULL_REQ,
                    phase: id,
                    seq: ctx.seq,
                    offset: r.offset as u64,
                    total: r.len as u64,
                    ..Default::default()
                };
                if l.write_frame(&req, &[]).is_err() {
                    sh.retain.fail_pulls(q, Some(id));
                }
                Some(id)
            }
            _ => None,
        };
        pulls.push((q, id, buf));
    }
    let deadline = Instant::now() + config::collective_timeout();
    loop {
        let seen = sh.bell().observe();
        let pending = pulls
            .iter()
            .any(|(_, id, _)| id.is_some_and(|id| sh.retain.pull_state(id).is_none()));
        if !pending || Instant::now() >= deadline || sh.is_shutdown() {
            break;
        }
        sh.bell().wait(seen, Duration::from_millis(100), sh.spin());
    }
    let mut got = 0u64;
    for (q, id, _) in &pulls {
        if let Some(id) = *id {
            if sh.retain.pull_state(id) == Some(true) {
                got |= 1u64 << q;
            }
            sh.retain.finish_pull(id);
        }
    }
    let esize = r.dtype.size();
    let done = sh
        .retain
        .with_range(ctx.seq, r.offset as u64, r.len as u64, |own| {
            let mut srcs: Vec<*const u8> = Vec::with_capacity(ctx.active.len());
            for &q in ctx.active {
                if q == me {
                    srcs.push(own.as_ptr());
                } else if got >> q & 1 == 1 {
                    if let Some((_, _, b)) = pulls.iter().find(|p| p.0 == q) {
                        srcs.push(b.as_ptr());
                    }
                }
            }
            // SAFETY: every source holds `r.len` bytes (our retained range,
            // borrowed for this call, or a pull buffer of at least `r.len`
            // bytes that received all of them); `dst` is the op's output range
            // of `r.len` bytes, valid until completion (`Group::submit`), and
            // aliases none of them.
            unsafe {
                reduce::reduce(
                    r.dtype,
                    r.op,
                    dst as *mut u8,
                    &srcs,
                    r.len / esize,
                    srcs.len(),
                )
            };
        });
    if done.is_some() {
        let peers = ctx.active.iter().fold(0u64, |m, &q| m | 1u64 << q) & !(1u64 << me);
        ctx.failed = known_dead | (peers & !got);
    } else if config::log_info() {
        eprintln!(
            "mooncake-pg: group {} rank {me}: op {} lost its retained input; result not recomputed",
            sh.label, ctx.seq
        );
    }
    for (_, _, b) in pulls {
        sh.retain.recycle(b);
    }
}
