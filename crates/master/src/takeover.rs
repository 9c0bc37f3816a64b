//! The hold of a master that took over leadership. A new HA leader starts
//! with empty metadata and learns every object from its owners' remounts
//! (see `recovery`). Until they arrived, "no such key" is not an answer it
//! can give: a read would say not found and a later read the old value, a
//! remove would miss the object, a put would create a second one. So a
//! request that names a key the master does not know waits while the hold
//! lasts; a request whose keys are all known is served at once.
//!
//! The leader publishes the names of its mounted segments in etcd (see
//! `ha`), so the next leader knows whose remounts to wait for: its hold
//! lasts until every one of them has remounted (and at least the
//! publication margin, for a segment mounted just before the old leader
//! died), then while any remount is still in progress. When that list could
//! not be read it lasts a quiet window instead (one second by default: live
//! owners ping every 200 ms while the master is away and remount within a
//! few hundred milliseconds). The hold never lasts past the client TTL: an
//! owner silent that long would be expired by any master.

use std::time::{Duration, Instant};

/// Environment variable overriding the quiet window in milliseconds
/// (default [`DEFAULT_QUIET`]; 0 turns the hold off).
pub(crate) const QUIET_ENV: &str = "MC_HA_TAKEOVER_HOLD_MS";

/// Default quiet window after a term starts.
pub(crate) const DEFAULT_QUIET: Duration = Duration::from_millis(1000);

/// The quiet window from [`QUIET_ENV`], else the default.
pub(crate) fn quiet_from_env() -> Duration {
    std::env::var(QUIET_ENV)
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(Duration::from_millis)
        .unwrap_or(DEFAULT_QUIET)
}

/// Granularity of a held request's re-check when no remount wakes it.
pub(crate) const RECHECK: Duration = Duration::from_millis(20);

/// The least a hold with a known owner list lasts: the leader publishes
/// its segment list every [`PUBLISH_EVERY`], so a segment mounted within
/// that long before it died may be missing from the list.
pub(crate) const PUBLISH_MARGIN: Duration = Duration::from_millis(300);

/// How often a leader publishes its segment list when it changed.
pub(crate) const PUBLISH_EVERY: Duration = Duration::from_millis(100);

/// When a taken-over term may answer for keys it does not know.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Hold {
    start: Instant,
    quiet: Duration,
    cap: Duration,
    /// The segments the previous leader had mounted (None: unknown).
    owners: Option<Vec<String>>,
}

impl Hold {
    /// A hold for a term that started at `start` and waits for `owners`'
    /// remounts (or, not knowing them, for `quiet`); at most `cap` (the
    /// client TTL).
    pub(crate) fn new(
        start: Instant,
        quiet: Duration,
        cap: Duration,
        owners: Option<Vec<String>>,
    ) -> Hold {
        Hold {
            start,
            quiet: quiet.min(cap),
            cap,
            owners,
        }
    }

    /// Time since the term started.
    pub(crate) fn age(&self, now: Instant) -> Duration {
        now.saturating_duration_since(self.start)
    }

    /// Whether a request about unknown keys must still wait at `now`, given
    /// whether any remount is in progress and which segments are mounted.
    pub(crate) fn holds(
        &self,
        now: Instant,
        remounting: bool,
        mounted: impl Fn(&str) -> bool,
    ) -> bool {
        let age = self.age(now);
        if age >= self.cap {
            return false;
        }
        let awaiting = match &self.owners {
            None => age < self.quiet,
            Some(names) => {
                age < self.quiet.min(PUBLISH_MARGIN) || names.iter().any(|n| !mounted(n))
            }
        };
        awaiting || remounting
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn without_an_owner_list_the_hold_lasts_the_quiet_window_then_while_remounts_run() {
        let t0 = Instant::now();
        let none = |_: &str| false;
        let h = Hold::new(t0, S, 10 * S, None);
        assert!(h.holds(t0, false, none));
        assert!(h.holds(t0 + S / 4, true, none));
        assert!(!h.holds(t0 + S, false, none));
        assert!(h.holds(t0 + 2 * S, true, none));
        assert!(!h.holds(t0 + 10 * S, true, none));
        // A quiet window longer than the cap is cut to it.
        let h = Hold::new(t0, 20 * S, 10 * S, None);
        assert!(h.holds(t0 + 9 * S, false, none));
        assert!(!h.holds(t0 + 10 * S, false, none));
    }

    #[test]
    fn with_an_owner_list_the_hold_lasts_until_every_owner_remounted() {
        let t0 = Instant::now();
        let h = Hold::new(t0, S, 10 * S, Some(vec!["a".into(), "b".into()]));
        let only_a = |n: &str| n == "a";
        let both = |n: &str| n == "a" || n == "b";
        // Past the quiet window, one owner still missing: held.
        assert!(h.holds(t0 + 2 * S, false, only_a));
        // Both back: over once the publication margin passed.
        assert!(h.holds(t0 + PUBLISH_MARGIN / 2, false, both));
        assert!(!h.holds(t0 + PUBLISH_MARGIN, false, both));
        assert!(h.holds(t0 + PUBLISH_MARGIN, true, both));
        // A missing owner is waited for up to the client TTL only.
        assert!(!h.holds(t0 + 10 * S, false, only_a));
        // An empty list (a new cluster): only the margin.
        let h = Hold::new(t0, S, 10 * S, Some(Vec::new()));
        assert!(h.holds(t0, false, only_a));
        assert!(!h.holds(t0 + PUBLISH_MARGIN, false, only_a));
    }
}
