//! Delivery of ledger ops (see `mooncake_common::ledger`) from the master to
//! segment owners, one ordered queue per mounted segment.
//!
//! Mutations enqueue ops while they hold the state lock and get a sequence
//! number; they then wait (without the lock) until the owner acknowledged
//! that number, so a write or removal is acknowledged to the caller only once
//! the segment owners know about it. The owner's *ledger stream* connection
//! is served by [`OwnerQueue::serve`]: it sends the unacknowledged ops in
//! batches and reads the acks. Space freed by a forget goes back to the
//! allocator only after the forget is acknowledged (the caller's `release`
//! callback), so no ledger entry can describe bytes someone else rewrites.
//!
//! A queue whose owner has no stream (it never connected, or not for a
//! while) does not make writers wait: their commits are counted as
//! unconfirmed instead (the owner is unreachable from the master, and will be
//! expired by the client TTL if it stays so).

use mooncake_common::framing;
use mooncake_common::ledger::{LedgerAck, LedgerOp, LedgerPush};
use parking_lot::{Condvar, Mutex};
use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::time::{Duration, Instant};

/// How long a mutation waits for an owner's ack before it proceeds unconfirmed.
pub(crate) const ACK_TIMEOUT: Duration = Duration::from_secs(2);
/// A queue whose stream dropped less than this long ago still makes writers
/// wait (the owner is probably reconnecting).
const RECONNECT_GRACE: Duration = Duration::from_secs(2);
/// Idle streams get an empty push this often (detects dead connections).
const KEEPALIVE: Duration = Duration::from_millis(1000);
/// Largest batch of ops in one push.
const MAX_BATCH: usize = 4096;
/// A push carries offloads (copies to disk the owner makes before it
/// acknowledges) of at most about this many bytes: the first offload
/// always goes, and the batch ends after the one that reaches it. Their
/// space returns on the ack, so a put waiting for room waits for about
/// one such copy, not for a whole eviction pass.
const OFFLOAD_BATCH_BYTES: u64 = 1 << 20;
/// Capacity (in ops) above which an emptied queue gives its memory back.
const SHRINK_ABOVE: usize = 1 << 16;
/// Largest ack frame accepted (an ack is a sequence number).
const MAX_ACK_FRAME: usize = 64;

/// Hands the `(offset, size)` ranges whose forgets were acknowledged back
/// to the allocator. Until then their bytes count as on their way back
/// ([`OwnerQueue::releasing_bytes`]); the second argument, `settle`, stops
/// counting them. A release calls it under the lock that makes the freed
/// space visible to puts waiting for room, before it wakes them: a put
/// that looks at the room under that lock then sees either the bytes
/// still on their way (and is woken when they arrive) or the space free,
/// never the space free and the bytes still counted as on their way (it
/// would wait for a wake-up that already happened). A release that does
/// not call it has it called once it returns.
pub(crate) type Release<'a> = dyn Fn(Vec<(u64, u64)>, &dyn Fn()) + 'a;

/// Outcome of waiting for an ack.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AckWait {
    /// The owner applied the op.
    Acked,
    /// The owner did not answer in time, or has no stream: the op stays
    /// queued and is delivered when it reconnects.
    Unconfirmed,
    /// The segment is gone (unmounted or expired).
    Gone,
}

#[derive(Debug)]
struct QState {
    /// Last sequence number assigned (the first op gets 1).
    last_seq: u64,
    /// Highest sequence number the owner acknowledged.
    acked: u64,
    /// Unacknowledged ops, oldest first.
    pending: VecDeque<(u64, LedgerOp)>,
    /// Space to release when the op with that sequence number is acked:
    /// `(seq, offset, size)`.
    frees: VecDeque<(u64, u64, u64)>,
    /// Bytes taken out of `frees` by an ack and not yet handed back to
    /// the allocator (still on their way back).
    releasing: u64,
    /// Generation of the current stream (0: none ever).
    stream_gen: u64,
    /// A stream is being served now.
    connected: bool,
    /// When the last stream ended.
    disconnected_at: Option<Instant>,
    /// The segment was unmounted: everything is void.
    closed: bool,
    /// Copies to disk (offloads and write-throughs) queued and not yet
    /// acknowledged.
    disk_writes: u64,
}

impl Default for QState {
    fn default() -> Self {
        QState {
            last_seq: 0,
            acked: 0,
            pending: VecDeque::new(),
            frees: VecDeque::new(),
            releasing: 0,
            stream_gen: 0,
            connected: false,
            // A new queue's owner is about to connect its stream (it does so
            // right after mounting): writers wait for it like for a reconnect.
            disconnected_at: Some(Instant::now()),
            closed: false,
            disk_writes: 0,
        }
    }
}

/// The ordered ledger queue of one segment.
#[derive(Debug, Default)]
pub(crate) struct OwnerQueue {
    st: Mutex<QState>,
    cv: Condvar,
}

impl OwnerQueue {
    /// Queue `op`; returns its sequence number.
    /// The ops not yet acknowledged, oldest first.
    #[cfg(test)]
    pub(crate) fn pending_ops(&self) -> Vec<LedgerOp> {
        self.st
            .lock()
            .pending
            .iter()
            .map(|(_, op)| op.clone())
            .collect()
    }

    pub(crate) fn push(&self, op: LedgerOp) -> u64 {
        let mut g = self.st.lock();
        g.last_seq += 1;
        let seq = g.last_seq;
        g.disk_writes += u64::from(writes_to_disk(&op));
        g.pending.push_back((seq, op));
        drop(g);
        self.cv.notify_all();
        seq
    }

    /// Queue a forget whose space (`offset`, `size`) is released once acked.
    pub(crate) fn push_forget_then_free(&self, op: LedgerOp, offset: u64, size: u64) -> u64 {
        let mut g = self.st.lock();
        g.last_seq += 1;
        let seq = g.last_seq;
        g.disk_writes += u64::from(writes_to_disk(&op));
        g.pending.push_back((seq, op));
        g.frees.push_back((seq, offset, size));
        drop(g);
        self.cv.notify_all();
        seq
    }

    /// Release `(offset, size)` once the op `seq` (queued earlier) is
    /// acknowledged. Returns false when it already is (or the queue is
    /// closed): the caller releases the space itself.
    pub(crate) fn free_after(&self, seq: u64, offset: u64, size: u64) -> bool {
        let mut g = self.st.lock();
        if g.closed || g.acked >= seq {
            return false;
        }
        // Keep `frees` ordered by sequence number: acks drain it from the front.
        let at = g.frees.partition_point(|(s, _, _)| *s <= seq);
        g.frees.insert(at, (seq, offset, size));
        true
    }

    /// Bytes queued for release that a connected owner is about to
    /// acknowledge (0 while no stream is served: those may wait long).
    pub(crate) fn releasing_bytes(&self) -> u64 {
        let g = self.st.lock();
        if !g.connected {
            return g.releasing;
        }
        g.frees
            .iter()
            .map(|&(_, _, s)| s)
            .sum::<u64>()
            .saturating_add(g.releasing)
    }

    /// Bytes queued for release once their forgets are acknowledged.
    #[cfg(test)]
    pub(crate) fn pending_free_bytes(&self) -> u64 {
        self.st.lock().frees.iter().map(|&(_, _, s)| s).sum()
    }

    /// Make the owner look long gone (tests).
    #[cfg(test)]
    pub(crate) fn mark_unreachable(&self) {
        self.st.lock().disconnected_at = Some(Instant::now() - RECONNECT_GRACE);
    }

    /// Copies to disk queued for the owner and not yet acknowledged.
    pub(crate) fn disk_writes(&self) -> u64 {
        self.st.lock().disk_writes
    }

    /// Highest acknowledged sequence number.
    pub(crate) fn acked(&self) -> u64 {
        self.st.lock().acked
    }

    /// Wait until `seq` is acknowledged, at most until `deadline`.
    pub(crate) fn wait(&self, seq: u64, deadline: Instant) -> AckWait {
        let mut g = self.st.lock();
        loop {
            if g.closed {
                return AckWait::Gone;
            }
            if g.acked >= seq {
                return AckWait::Acked;
            }
            let reachable = g.connected
                || g.disconnected_at
                    .is_some_and(|t| t.elapsed() < RECONNECT_GRACE);
            if !reachable || self.cv.wait_until(&mut g, deadline).timed_out() {
                return if g.closed {
                    AckWait::Gone
                } else if g.acked >= seq {
                    AckWait::Acked
                } else {
                    AckWait::Unconfirmed
                };
            }
        }
    }

    /// The segment is gone: wake every waiter, drop what is queued.
    pub(crate) fn close(&self) {
        let mut g = self.st.lock();
        g.closed = true;
        g.pending.clear();
        g.frees.clear();
        g.disk_writes = 0;
        drop(g);
        self.cv.notify_all();
    }

    /// Serve one ledger stream of this segment's owner until it breaks, the
    /// segment is closed, or a newer stream replaces it; a push carries at
    /// most `max_promotes` promotions (each a disk read the owner makes
    /// before it acknowledges). `release` gets the `(offset, size)` ranges
    /// whose forgets were just acknowledged.
    pub(crate) fn serve<S: Read + Write>(
        &self,
        sock: &mut S,
        max_promotes: usize,
        release: &Release<'_>,
    ) -> io::Result<()> {
        let gen = {
            let mut g = self.st.lock();
            g.stream_gen += 1;
            g.connected = true;
            g.stream_gen
        };
        self.cv.notify_all();
        let r = self.serve_inner(sock, gen, max_promotes, release);
        let mut g = self.st.lock();
        if g.stream_gen == gen {
            g.connected = false;
            g.disconnected_at = Some(Instant::now());
        }
        drop(g);
        self.cv.notify_all();
        r
    }

    fn serve_inner<S: Read + Write>(
        &self,
        sock: &mut S,
        gen: u64,
        max_promotes: usize,
        release: &Release<'_>,
    ) -> io::Result<()> {
        loop {
            let push = {
                let mut g = self.st.lock();
                let idle_until = Instant::now() + KEEPALIVE;
                while g.pending.is_empty() && !g.closed && g.stream_gen == gen {
                    if self.cv.wait_until(&mut g, idle_until).timed_out() {
                        break;
                    }
                }
                if g.closed || g.stream_gen != gen {
                    return Ok(());
                }
                let n = batch_len(g.pending.iter().map(|(_, op)| op), max_promotes);
                let ops: Vec<LedgerOp> =
                    g.pending.iter().take(n).map(|(_, op)| op.clone()).collect();
                let seq = match n {
                    0 => g.acked,
                    n => g.pending.get(n - 1).map(|(s, _)| *s).unwrap_or(g.acked),
                };
                LedgerPush { seq, ops }
            };
            sock.write_all(&framing::encode_frame(&push)?)?;
            let ack: LedgerAck = framing::decode(&framing::read_frame(sock, MAX_ACK_FRAME)?)?;
            self.on_ack(ack.seq, release);
        }
    }

    /// The owner acknowledged every op up to `seq`: release the space of
    /// the acknowledged forgets first, then publish the ack, so a caller
    /// woken by it finds the space free already.
    fn on_ack(&self, seq: u64, release: &Release<'_>) {
        let (freed, acked, bytes) = {
            let mut g = self.st.lock();
            let acked = if seq > g.acked && seq <= g.last_seq {
                seq
            } else {
                g.acked
            };
            let mut freed = Vec::new();
            let mut bytes = 0u64;
            while g.frees.front().is_some_and(|(s, _, _)| *s <= acked) {
                if let Some((_, off, size)) = g.frees.pop_front() {
                    freed.push((off, size));
                    bytes = bytes.saturating_add(size);
                }
            }
            // Still on its way back until `release` returns.
            g.releasing = g.releasing.saturating_add(bytes);
            (freed, acked, bytes)
        };
        if !freed.is_empty() {
            let settled = std::cell::Cell::new(false);
            let settle = || {
                if !settled.replace(true) {
                    let mut g = self.st.lock();
                    g.releasing = g.releasing.saturating_sub(bytes);
                }
            };
            release(freed, &settle);
            settle();
        }
        let shrunk = {
            let mut g = self.st.lock();
            g.acked = g.acked.max(acked);
            while g.pending.front().is_some_and(|(s, _)| *s <= acked) {
                if let Some((_, op)) = g.pending.pop_front() {
                    g.disk_writes = g.disk_writes.saturating_sub(u64::from(writes_to_disk(&op)));
                }
            }
            // A burst of ops (a large removal) left big empty queues.
            let big = g.pending.capacity() > SHRINK_ABOVE || g.frees.capacity() > SHRINK_ABOVE;
            if big && g.pending.is_empty() && g.frees.is_empty() {
                g.pending.shrink_to_fit();
                g.frees.shrink_to_fit();
                true
            } else {
                false
            }
        };
        self.cv.notify_all();
        if shrunk {
            crate::memory::return_free_memory();
        }
    }

    /// Act as a connected owner that applied every op queued so far and
    /// acknowledged them (tests without sockets); returns the ops.
    #[cfg(test)]
    pub(crate) fn ack_all(&self, release: &Release<'_>) -> Vec<LedgerOp> {
        let (ops, seq) = {
            let mut g = self.st.lock();
            g.connected = true;
            let ops = g.pending.iter().map(|(_, op)| op.clone()).collect();
            (ops, g.last_seq)
        };
        self.on_ack(seq, release);
        ops
    }

    /// Make the owner look connected (tests without sockets).
    #[cfg(test)]
    pub(crate) fn mark_connected(&self) {
        self.st.lock().connected = true;
    }
}

/// Whether the owner copies bytes to its disk tier for `op`.
fn writes_to_disk(op: &LedgerOp) -> bool {
    matches!(op, LedgerOp::Offload { .. } | LedgerOp::Persist { .. })
}

/// How many of the queued `ops` (oldest first) one push carries: at most
/// [`MAX_BATCH`], ending after the offload that brings the offloaded bytes
/// to [`OFFLOAD_BATCH_BYTES`] or after the `max_promotes`-th promotion (at
/// least one always goes).
fn batch_len<'a>(ops: impl Iterator<Item = &'a LedgerOp>, max_promotes: usize) -> usize {
    let mut n = 0;
    let mut offloaded = 0u64;
    let mut promotes = 0usize;
    for op in ops.take(MAX_BATCH) {
        n += 1;
        if matches!(op, LedgerOp::Promote { .. }) {
            promotes += 1;
            if promotes >= max_promotes.max(1) {
                break;
            }
        }
        if let LedgerOp::Offload { size, .. } | LedgerOp::Persist { size, .. } = op {
            offloaded = offloaded.saturating_add(*size);
            if offloaded >= OFFLOAD_BATCH_BYTES {
                break;
            }
        }
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;
    use mooncake_common::ledger::LedgerEntry;
    use std::net::{TcpListener, TcpStream};
    use std::sync::Arc;

    fn commit(key: &str, offset: u64) -> LedgerOp {
        LedgerOp::Commit(LedgerEntry::unpinned(key, 1, offset, 10))
    }

    /// A forget of version 1 at offset `i`.
    fn forget(i: u64) -> LedgerOp {
        LedgerOp::Forget {
            offset: i,
            version: 1,
        }
    }

    /// An owner that applies pushes into a Vec and acks them.
    fn owner(mut s: TcpStream, seen: Arc<Mutex<Vec<LedgerOp>>>, stop_after: usize) {
        let mut n = 0;
        while let Ok(body) = framing::read_frame(&mut s, framing::MAX_CONTROL_FRAME) {
            let push: LedgerPush = framing::decode(&body).unwrap();
            seen.lock().extend(push.ops);
            n += 1;
            if n > stop_after {
                return; // drop the connection without acking
            }
            let ack = framing::encode_frame(&LedgerAck { seq: push.seq }).unwrap();
            if s.write_all(&ack).is_err() {
                return;
            }
        }
    }

    type Seen = Arc<Mutex<Vec<LedgerOp>>>;

    /// An [`owner`] connected to `l` on its own thread: the master's side
    /// of its stream, what it applied, and its thread.
    fn connect_owner(
        l: &TcpListener,
        stop_after: usize,
    ) -> (TcpStream, Seen, std::thread::JoinHandle<()>) {
        let addr = l.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s = Arc::clone(&seen);
        let t = std::thread::spawn(move || owner(TcpStream::connect(addr).unwrap(), s, stop_after));
        let (sock, _) = l.accept().unwrap();
        (sock, seen, t)
    }

    #[test]
    fn ops_are_delivered_in_order_and_frees_released_on_ack() {
        let q = Arc::new(OwnerQueue::default());
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let (mut sock, seen, t) = connect_owner(&l, 1000);
        let released = Arc::new(Mutex::new(Vec::new()));
        let (q2, r2) = (Arc::clone(&q), Arc::clone(&released));
        let server = std::thread::spawn(move || {
            let _ = q2.serve(&mut sock, 1, &|f, _| r2.lock().extend(f));
        });
        let s1 = q.push(commit("a", 0));
        let s2 = q.push_forget_then_free(forget(0), 0, 64);
        assert_eq!((s1, s2), (1, 2));
        assert_eq!(
            q.wait(s2, Instant::now() + Duration::from_secs(5)),
            AckWait::Acked
        );
        assert_eq!(q.acked(), 2);
        // Release happens right after the ack is processed.
        let deadline = Instant::now() + Duration::from_secs(5);
        while released.lock().is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(*released.lock(), vec![(0, 64)]);
        assert_eq!(q.pending_free_bytes(), 0);
        assert_eq!(*seen.lock(), vec![commit("a", 0), forget(0)]);
        q.close();
        assert_eq!(
            q.wait(99, Instant::now() + Duration::from_secs(5)),
            AckWait::Gone
        );
        server.join().unwrap();
        drop(t);
    }

    #[test]
    fn unacked_ops_are_resent_on_a_new_stream() {
        let q = Arc::new(OwnerQueue::default());
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        // First owner connection reads one push and hangs up without acking.
        let (mut sock, _seen1, t1) = connect_owner(&l, 0);
        q.push(commit("a", 0));
        let q1 = Arc::clone(&q);
        assert!(q1.serve(&mut sock, 1, &|_, _| {}).is_err());
        t1.join().unwrap();
        assert_eq!(q.acked(), 0);
        // Not connected, but within the reconnect grace: a waiter waits.
        let q2 = Arc::clone(&q);
        let waiter =
            std::thread::spawn(move || q2.wait(1, Instant::now() + Duration::from_secs(10)));
        let (mut sock, seen2, t2) = connect_owner(&l, 1000);
        let q3 = Arc::clone(&q);
        let server = std::thread::spawn(move || {
            let _ = q3.serve(&mut sock, 1, &|_, _| {});
        });
        assert_eq!(waiter.join().unwrap(), AckWait::Acked);
        assert_eq!(*seen2.lock(), vec![commit("a", 0)]);
        q.close();
        server.join().unwrap();
        drop(t2);
    }

    #[test]
    fn a_push_carries_offloads_of_about_one_mib_and_forgets_without_limit() {
        let offload = |i: u64| LedgerOp::Offload {
            offset: i << 18,
            version: 1,
            key: format!("k{i}"),
            size: 1 << 18,
        };
        let ops: Vec<LedgerOp> = (0..10).map(offload).collect();
        assert_eq!(batch_len(ops.iter(), 1), 4);
        let big = [LedgerOp::Offload {
            offset: 0,
            version: 1,
            key: "big".into(),
            size: 64 << 20,
        }];
        assert_eq!(batch_len(big.iter(), 1), 1, "one offload always goes");
        let forgets: Vec<LedgerOp> = (0..5000).map(forget).collect();
        assert_eq!(batch_len(forgets.iter(), 1), MAX_BATCH);
        let mixed: Vec<LedgerOp> = (0..3).map(forget).chain((0..6).map(offload)).collect();
        assert_eq!(batch_len(mixed.iter(), 1), 7);
    }

    #[test]
    fn a_push_carries_at_most_the_allowed_promotions() {
        let promote = |i: u64| LedgerOp::Promote {
            offset: i << 10,
            version: 1,
            key: format!("p{i}"),
            size: 1 << 10,
        };
        let ops: Vec<LedgerOp> = (0..2)
            .map(forget)
            .chain((0..5).map(promote))
            .chain((2..4).map(forget))
            .collect();
        assert_eq!(batch_len(ops.iter(), 1), 3, "forgets, then one promotion");
        assert_eq!(batch_len(ops.iter(), 3), 5);
        assert_eq!(batch_len(ops.iter(), 0), 3, "at least one goes");
        assert_eq!(batch_len(ops.iter(), 100), ops.len());
    }

    #[test]
    fn no_stream_means_no_wait() {
        let q = OwnerQueue::default();
        q.st.lock().disconnected_at = Some(Instant::now() - RECONNECT_GRACE);
        let seq = q.push(commit("a", 0));
        let t0 = Instant::now();
        assert_eq!(
            q.wait(seq, Instant::now() + Duration::from_secs(5)),
            AckWait::Unconfirmed
        );
        assert!(t0.elapsed() < Duration::from_secs(1));
    }
}
