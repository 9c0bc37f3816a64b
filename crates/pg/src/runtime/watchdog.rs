//! The per-group liveness watchdog: while
//! anything waits on a peer (a running collective, a posted receive, a
//! send awaiting its acknowledgement, a blocked write), it PINGs that peer every `min(T/4, 100 ms)` and fences it
//! once it has been silent for T (no frame received, no write completed).
//! Live peers answer from their reader threads, so a slow but live peer is
//! never fenced. While nothing waits it sleeps for `min(T/2, 1 s)` (only
//! shutdown wakes it early), so a failure is declared within
//! `T + min(T/2, 1 s) + min(T/4, 100 ms)` < 2·T.

use crate::clock::now_ns;
use crate::config;
use crate::fault;
use crate::runtime::shared::Shared;
use crate::transport::wire::KIND_PING;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// Watchdog thread body.
pub(crate) fn watchdog_loop(shared: Arc<Shared>) {
    let mut since: Vec<Option<u64>> = Vec::new();
    let mut pinged: Vec<u64> = Vec::new();
    loop {
        if shared.is_shutdown() {
            return;
        }
        let cap = shared.capacity();
        since.resize(cap, None);
        pinged.resize(cap, 0);
        fault::park_if_frozen();
        let links = shared.links();
        let coll = shared.waiting_coll.load(Ordering::Acquire);
        let waited = coll | shared.p2p.waited_mask(cap);
        let mut watching = false;
        let now = now_ns();
        let (tc, tp) = (shared.cfg.coll_timeout(), shared.cfg.p2p_timeout());
        for (slot, l) in links.iter().enumerate().take(cap) {
            let Some(l) = l.as_ref().filter(|l| !l.is_dead()) else {
                since[slot] = None;
                continue;
            };
            if waited >> slot & 1 == 0 && !l.writing() && !l.sends_pending() {
                since[slot] = None;
                continue;
            }
            watching = true;
            let t = if coll >> slot & 1 == 1 { tc } else { tp };
            let start = *since[slot].get_or_insert(now);
            let heard = l.last_heard_ns().max(start);
            let silent = now.saturating_sub(heard);
            if silent > t.as_nanos() as u64 {
                if config::log_info() {
                    eprintln!(
                        "mooncake-pg: group {} rank {}: rank {slot} silent for {:.1}s; declared failed",
                        shared.label,
                        shared.rank,
                        silent as f64 / 1e9
                    );
                }
                l.fence();
                shared.bell().ring();
                shared.notify_ctrl();
                since[slot] = None;
                continue;
            }
            let every = (t / 4).min(Duration::from_millis(100)).as_nanos() as u64;
            if now.saturating_sub(pinged[slot]) >= every && l.try_write_ctrl(KIND_PING, 0) {
                pinged[slot] = now;
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
