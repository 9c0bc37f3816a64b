//! The per-group liveness watchdog: while
//! anything waits on a peer (a running collective, a posted receive, a
//! send awaiting its acknowledgement, a blocked write), it PINGs that peer every `min(T/4, 100 ms)` and fences it
//! once it has been silent for T (no frame received, no write completed).
//! Live peers answer from their reader threads, so a slow but live peer is
//! never fenced. While nothing waits it sleeps for `min(T/2, 1 s)` (only
//! shutdown wakes it early), so a failure is declared within
//! `T + min(T/2, 1 s) + min(T/4, 100 ms)` < 2·T.

use crate::config;
use crate::fault;
use crate::runtime::shared::Shared;
use crate::transport::wire::KIND_PING;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// What the watchdog does about one peer at one tick.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Nothing waits on the peer.
    Idle,
    /// Watched; nothing to do this tick.
    Quiet,
    /// Watched, and a PING is due.
    Ping,
    /// Silent for `silent_ns`, past its timeout: declare it failed.
    Fence { silent_ns: u64 },
}

/// Per-peer watch state, on explicit times (nanoseconds of the group's
/// clock): when the current wait on a peer began, and when it was last
/// pinged.
#[derive(Default)]
pub(crate) struct Watch {
    since: Vec<Option<u64>>,
    pinged: Vec<u64>,
}

impl Watch {
    fn grow(&mut self, slot: usize) {
        if self.since.len() <= slot {
            self.since.resize(slot + 1, None);
            self.pinged.resize(slot + 1, 0);
        }
    }

    /// One tick for peer `slot` at `now`: `waited` says whether anything
    /// waits on it, `heard` is its latest sign of life, `timeout` the
    /// silence after which it fails. Silence counts from the later of
    /// `heard` and the start of the current wait.
    pub(crate) fn check(
        &mut self,
        slot: usize,
        now: u64,
        waited: bool,
        heard: u64,
        timeout: Duration,
    ) -> Verdict {
        self.grow(slot);
        if !waited {
            self.since[slot] = None;
            return Verdict::Idle;
        }
        let start = *self.since[slot].get_or_insert(now);
        let silent = now.saturating_sub(heard.max(start));
        if silent > timeout.as_nanos() as u64 {
            self.since[slot] = None;
            return Verdict::Fence { silent_ns: silent };
        }
        let every = (timeout / 4).min(Duration::from_millis(100)).as_nanos() as u64;
        if now.saturating_sub(self.pinged[slot]) >= every {
            Verdict::Ping
        } else {
            Verdict::Quiet
        }
    }

    /// A PING went to `slot` at `now`.
    pub(crate) fn pinged(&mut self, slot: usize, now: u64) {
        self.grow(slot);
        self.pinged[slot] = now;
    }

    /// `slot` has no live link: its wait is over.
    pub(crate) fn forget(&mut self, slot: usize) {
        if let Some(s) = self.since.get_mut(slot) {
            *s = None;
        }
    }
}

/// Watchdog thread body.
pub(crate) fn watchdog_loop(shared: Arc<Shared>) {
    let mut watch = Watch::default();
    loop {
        if shared.is_shutdown() {
            return;
        }
        let cap = shared.capacity();
        fault::park_if_frozen();
        let links = shared.links();
        let coll = shared.waiting_coll.load(Ordering::Acquire);
        let waited = coll | shared.p2p.waited_mask(cap);
        let mut watching = false;
        let now = shared.clock.now_ns();
        let (tc, tp) = (shared.cfg.coll_timeout(), shared.cfg.p2p_timeout());
        for (slot, l) in links.iter().enumerate().take(cap) {
            let Some(l) = l.as_ref().filter(|l| !l.is_dead()) else {
                watch.forget(slot);
                continue;
            };
            let busy = waited >> slot & 1 == 1 || l.writing() || l.sends_pending();
            let t = if coll >> slot & 1 == 1 { tc } else { tp };
            match watch.check(slot, now, busy, l.last_heard_ns(), t) {
                Verdict::Idle => {}
                Verdict::Quiet => watching = true,
                Verdict::Ping => {
                    watching = true;
                    if l.try_write_ctrl(KIND_PING, 0) {
                        watch.pinged(slot, now);
                    }
                }
                Verdict::Fence { silent_ns } => {
                    watching = true;
                    if config::log_info() {
                        eprintln!(
                            "mooncake-pg: group {} rank {}: rank {slot} silent for {:.1}s; declared failed",
                            shared.label,
                            shared.rank,
                            silent_ns as f64 / 1e9
                        );
                    }
                    l.fence();
                    shared.bell().ring();
                    shared.notify_ctrl();
                }
            }
        }
        let tick = (tc.min(tp) / 4).clamp(Duration::from_millis(1), Duration::from_millis(100));
        let mut g = shared.watch.lock();
        if shared.is_shutdown() {
            return;
        }
        if watching {
            shared.watch_cv.wait_for(&mut g, tick);
        } else {
            // Ops do not wake us (that would cost each op a thread wakeup);
            // a new wait is noticed within this bound instead.
            let idle = (tc.min(tp) / 2).clamp(Duration::from_millis(1), Duration::from_secs(1));
            shared.watch_cv.wait_for(&mut g, idle);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;
    const T: Duration = Duration::from_secs(1);

    #[test]
    fn silence_counts_from_the_start_of_the_wait_and_ends_in_one_fence() {
        let mut w = Watch::default();
        // Last heard at 0; the wait starts at 10 s: not silent yet.
        let t0 = 10_000 * MS;
        assert_eq!(w.check(2, t0, true, 0, T), Verdict::Ping);
        w.pinged(2, t0);
        assert_eq!(w.check(2, t0 + 1000 * MS, true, 0, T), Verdict::Ping);
        match w.check(2, t0 + 1001 * MS, true, 0, T) {
            Verdict::Fence { silent_ns } => assert_eq!(silent_ns, 1001 * MS),
            v => panic!("not fenced: {v:?}"),
        }
    }

    /// Times from 10 s on (the first PING is due once 100 ms have passed
    /// since time 0).
    const B: u64 = 10_000 * MS;

    #[test]
    fn a_frame_heard_restarts_the_silence() {
        let mut w = Watch::default();
        assert_eq!(w.check(0, B, true, 0, T), Verdict::Ping);
        w.pinged(0, B);
        // Heard at 900 ms into the wait: at 1.5 s it was silent 600 ms only.
        assert_eq!(
            w.check(0, B + 1500 * MS, true, B + 900 * MS, T),
            Verdict::Ping
        );
        assert!(matches!(
            w.check(0, B + 1901 * MS, true, B + 900 * MS, T),
            Verdict::Fence { .. }
        ));
    }

    #[test]
    fn pings_go_every_quarter_timeout_at_most_every_100_ms() {
        let mut w = Watch::default();
        assert_eq!(w.check(1, B, true, B, T), Verdict::Ping);
        w.pinged(1, B);
        assert_eq!(w.check(1, B + 60 * MS, true, B, T), Verdict::Quiet);
        assert_eq!(w.check(1, B + 100 * MS, true, B, T), Verdict::Ping);
        // A short timeout pings every quarter of it.
        let short = Duration::from_millis(40);
        let mut w = Watch::default();
        w.pinged(1, B);
        assert_eq!(w.check(1, B + 9 * MS, true, B, short), Verdict::Quiet);
        assert_eq!(w.check(1, B + 10 * MS, true, B, short), Verdict::Ping);
    }

    #[test]
    fn a_peer_nothing_waits_on_is_idle_and_a_new_wait_starts_afresh() {
        let mut w = Watch::default();
        assert_eq!(w.check(3, B, true, 0, T), Verdict::Ping);
        w.pinged(3, B);
        assert_eq!(w.check(3, B + 800 * MS, false, 0, T), Verdict::Idle);
        // Long after its last frame, a new wait: silence counts from now.
        assert_eq!(w.check(3, B + 5000 * MS, true, 0, T), Verdict::Ping);
        assert_eq!(w.check(3, B + 5900 * MS, true, 0, T), Verdict::Ping);
        w.forget(3);
        assert_eq!(w.check(3, B + 9000 * MS, true, 0, T), Verdict::Ping);
        assert!(matches!(
            w.check(3, B + 10_001 * MS, true, 0, T),
            Verdict::Fence { .. }
        ));
    }
}
