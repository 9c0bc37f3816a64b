//! The registered clients: when each was last heard from, and the segments
//! it mounted.
//!
//! A client is registered by its first mount (or remount) and refreshed by
//! every heartbeat. One silent for longer than [`SUSPECT_AFTER`] is
//! suspect (placement avoids its segments while others fit); one silent for
//! longer than the TTL expires, and its segments with it.
//!
//! Silence is counted only while the master runs: the TTL checks run every
//! 200 ms, and a gap between two checks longer than [`TTL_CHECK_STALL`]
//! means the master itself was stopped, paused with its VM or starved of
//! CPU, so it could not read heartbeats either. Each client's last
//! heartbeat then moves forward by the gap (to the present at most), so a
//! paused master does not drop every segment, and with them every object.

use mooncake_common::proto::HEARTBEAT_INTERVAL_MS;
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// A client silent this long has missed a heartbeat: its segments are
/// suspect (placement avoids them while others fit).
pub(crate) const SUSPECT_AFTER: Duration = Duration::from_millis(HEARTBEAT_INTERVAL_MS * 3 / 2);

/// A gap between two client TTL checks longer than this means the master
/// itself did not run meanwhile: that time is not counted as the clients'
/// silence.
pub(crate) const TTL_CHECK_STALL: Duration = Duration::from_secs(1);

/// A registered client.
#[derive(Debug)]
pub(crate) struct ClientEntry {
    last_ping: Instant,
    /// Names of the segments it mounted.
    pub segments: Vec<String>,
}

impl ClientEntry {
    /// Whether the client has missed a heartbeat at `now`.
    pub(crate) fn is_suspect(&self, now: Instant) -> bool {
        now.saturating_duration_since(self.last_ping) > SUSPECT_AFTER
    }
}

/// What a TTL check found.
#[derive(Debug, Default)]
pub(crate) struct TtlCheck {
    /// The master did not run for this long before the check (not counted
    /// against anyone's TTL).
    pub stalled: Option<Duration>,
    /// The clients that expired, taken out of the table.
    pub expired: Vec<(String, ClientEntry)>,
}

/// The registered clients (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct Clients {
    by_id: HashMap<String, ClientEntry>,
    /// When the TTLs were last checked.
    checked: Option<Instant>,
}

impl Clients {
    /// A heartbeat from `id` at `now`; false when the client is unknown
    /// (it must remount).
    pub(crate) fn ping(&mut self, id: &str, now: Instant) -> bool {
        match self.by_id.get_mut(id) {
            Some(c) => {
                c.last_ping = now;
                true
            }
            None => false,
        }
    }

    /// `id` mounts at `now`: registered if new, heard from either way.
    pub(crate) fn register(&mut self, id: &str, now: Instant) -> &mut ClientEntry {
        let c = self
            .by_id
            .entry(id.to_string())
            .or_insert_with(|| ClientEntry {
                last_ping: now,
                segments: Vec::new(),
            });
        c.last_ping = now;
        c
    }

    /// Record that `id` mounted segment `name` (once).
    pub(crate) fn add_segment(&mut self, id: &str, name: &str) {
        if let Some(c) = self.by_id.get_mut(id) {
            if !c.segments.iter().any(|s| s == name) {
                c.segments.push(name.to_string());
            }
        }
    }

    /// Record that `id` unmounted segment `name`.
    pub(crate) fn remove_segment(&mut self, id: &str, name: &str) {
        if let Some(c) = self.by_id.get_mut(id) {
            c.segments.retain(|s| s != name);
        }
    }

    /// The client `id`.
    pub(crate) fn get(&self, id: &str) -> Option<&ClientEntry> {
        self.by_id.get(id)
    }

    /// Whether `id` is registered.
    pub(crate) fn contains(&self, id: &str) -> bool {
        self.by_id.contains_key(id)
    }

    /// `id` leaves: its entry, taken out.
    pub(crate) fn remove(&mut self, id: &str) -> Option<ClientEntry> {
        self.by_id.remove(id)
    }

    /// Number of registered clients.
    pub(crate) fn len(&self) -> usize {
        self.by_id.len()
    }

    /// The TTL check at `now`: first the master's own stall is taken out of
    /// everyone's silence (see the module docs), then the clients silent
    /// for longer than `ttl` are taken out and returned.
    pub(crate) fn check_ttl(&mut self, now: Instant, ttl: Duration) -> TtlCheck {
        let stalled = self
            .checked
            .replace(now)
            .map(|t| now.saturating_duration_since(t))
            .filter(|gap| *gap > TTL_CHECK_STALL);
        if let Some(gap) = stalled {
            for c in self.by_id.values_mut() {
                c.last_ping = c.last_ping.checked_add(gap).map_or(now, |t| t.min(now));
            }
        }
        let dead: Vec<String> = self
            .by_id
            .iter()
            .filter(|(_, c)| now.saturating_duration_since(c.last_ping) > ttl)
            .map(|(id, _)| id.clone())
            .collect();
        let expired = dead
            .into_iter()
            .filter_map(|id| self.by_id.remove(&id).map(|c| (id, c)))
            .collect();
        TtlCheck { stalled, expired }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn a_client_expires_after_its_ttl_of_silence_and_pings_keep_it() {
        let t0 = Instant::now();
        let ttl = Duration::from_secs(2);
        let mut c = Clients::default();
        assert!(!c.ping("a", t0), "unknown: must remount");
        c.register("a", t0);
        c.register("b", t0);
        c.add_segment("a", "seg1");
        c.add_segment("a", "seg1");
        c.add_segment("a", "seg2");
        c.remove_segment("a", "seg2");
        assert_eq!(
            c.get("a").map(|e| e.segments.clone()),
            Some(vec!["seg1".to_string()])
        );
        // Checks every 200 ms; "b" keeps pinging, "a" is silent.
        let mut t = t0;
        let mut expired = Vec::new();
        while expired.is_empty() {
            t += 200 * MS;
            assert!(c.ping("b", t));
            let check = c.check_ttl(t, ttl);
            assert!(check.stalled.is_none());
            expired = check.expired;
        }
        assert_eq!(
            t - t0,
            ttl + 200 * MS,
            "expired at the first check past the TTL"
        );
        assert_eq!(expired.len(), 1);
        assert_eq!(expired[0].0, "a");
        assert_eq!(expired[0].1.segments, vec!["seg1".to_string()]);
        assert!(!c.contains("a") && c.contains("b") && c.len() == 1);
    }

    #[test]
    fn a_stalled_master_does_not_count_its_pause_as_silence() {
        let t0 = Instant::now();
        let ttl = Duration::from_secs(2);
        let mut c = Clients::default();
        c.register("a", t0);
        assert!(c.check_ttl(t0, ttl).expired.is_empty());
        // The master stops for 30 s (no check, no heartbeat read).
        let t1 = t0 + Duration::from_secs(30);
        let check = c.check_ttl(t1, ttl);
        assert_eq!(check.stalled, Some(Duration::from_secs(30)));
        assert!(
            check.expired.is_empty(),
            "the pause is not the client's silence"
        );
        // Silence counts again from there: just under the TTL, still there.
        assert!(c.check_ttl(t1 + 1000 * MS, ttl).expired.is_empty());
        assert!(c.check_ttl(t1 + 1999 * MS, ttl).expired.is_empty());
        assert_eq!(c.check_ttl(t1 + 2001 * MS, ttl).expired.len(), 1);
    }

    #[test]
    fn a_client_is_suspect_after_one_and_a_half_heartbeats() {
        let t0 = Instant::now();
        let mut c = Clients::default();
        c.register("a", t0);
        let e = c.get("a").expect("registered");
        assert!(!e.is_suspect(t0 + SUSPECT_AFTER));
        assert!(e.is_suspect(t0 + SUSPECT_AFTER + MS));
        assert!(c.ping("a", t0 + SUSPECT_AFTER));
        assert!(!c.get("a").expect("a").is_suspect(t0 + SUSPECT_AFTER + MS));
        assert!(c.remove("a").is_some() && c.remove("a").is_none());
    }
}
