//! What the HA runtime tells the rest of the master: the role of this
//! process, the term it serves, the leader it sees, and the lease clock that
//! decides whether it may still accept writes. `/health`, `/metrics` and the
//! RPC gate read it; only the election loop writes it.

use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Role of this master process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Not HA: the only master, always serving.
    Single,
    /// HA, waiting in the election (another master leads, or none yet).
    Standby,
    /// HA, elected and serving client RPCs.
    Leader,
}

impl Role {
    fn from_u8(v: u8) -> Role {
        match v {
            1 => Role::Standby,
            2 => Role::Leader,
            _ => Role::Single,
        }
    }
}

/// Milliseconds since the Unix epoch (0 if the clock is before it).
pub fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Deadline until which the leader's etcd lease is known to be alive, minus
/// a safety margin: the leader stops accepting writes when it passes, which
/// is before etcd can expire the lease and let another master win.
#[derive(Debug)]
pub struct LeaseClock {
    base: Instant,
    /// Microseconds after `base`; 0 = not valid.
    valid_until_us: AtomicU64,
}

impl Default for LeaseClock {
    fn default() -> Self {
        LeaseClock {
            base: Instant::now(),
            valid_until_us: AtomicU64::new(0),
        }
    }
}

impl LeaseClock {
    /// Whether the lease is still known to be alive now.
    pub fn valid(&self) -> bool {
        let until = self.valid_until_us.load(Ordering::Acquire);
        until != 0 && (self.base.elapsed().as_micros() as u64) < until
    }

    /// The lease was confirmed alive by a keep-alive sent at `sent`, with
    /// `ttl` left; it is safe to serve until `sent + ttl - margin`.
    pub fn confirm(&self, sent: Instant, ttl: Duration, margin: Duration) {
        let until = sent.saturating_duration_since(self.base) + ttl.saturating_sub(margin);
        let until = (until.as_micros() as u64).max(1);
        self.valid_until_us.fetch_max(until, Ordering::AcqRel);
    }

    /// Forget any confirmation (the lease is gone or replaced).
    pub fn invalidate(&self) {
        self.valid_until_us.store(0, Ordering::Release);
    }
}

/// Shared HA status of this process.
#[derive(Debug)]
pub struct HaStatus {
    enabled: bool,
    cluster_id: String,
    role: AtomicU8,
    epoch: AtomicU64,
    serving_since_ms: AtomicU64,
    last_write_ms: AtomicU64,
    leader_address: Mutex<Option<String>>,
    /// etcd create revision of the observed leader's campaign key.
    leader_rev: AtomicU64,
    lease_dead: AtomicBool,
    /// Times this process won an election.
    pub elections_won: AtomicU64,
    /// Times this process stopped serving (lost its lease or leadership).
    pub step_downs: AtomicU64,
    /// Leader changes this process observed in etcd (including its own wins).
    pub leader_changes: AtomicU64,
    /// The lease clock of the current term (HA only).
    pub lease: LeaseClock,
}

impl HaStatus {
    /// Status of a master without HA: always the serving master.
    pub fn single() -> HaStatus {
        HaStatus::new(false, String::new(), Role::Single)
    }

    /// Status of an HA master of `cluster_id`, starting as standby.
    pub fn ha(cluster_id: &str) -> HaStatus {
        HaStatus::new(true, cluster_id.to_string(), Role::Standby)
    }

    fn new(enabled: bool, cluster_id: String, role: Role) -> HaStatus {
        HaStatus {
            enabled,
            cluster_id,
            role: AtomicU8::new(match role {
                Role::Single => 0,
                Role::Standby => 1,
                Role::Leader => 2,
            }),
            epoch: AtomicU64::new(0),
            serving_since_ms: AtomicU64::new(if enabled { 0 } else { unix_ms() }),
            last_write_ms: AtomicU64::new(0),
            leader_address: Mutex::new(None),
            leader_rev: AtomicU64::new(0),
            lease_dead: AtomicBool::new(false),
            elections_won: AtomicU64::new(0),
            step_downs: AtomicU64::new(0),
            leader_changes: AtomicU64::new(0),
            lease: LeaseClock::default(),
        }
    }

    /// Whether HA is on.
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// The `--cluster_id` (empty without HA).
    pub fn cluster_id(&self) -> &str {
        &self.cluster_id
    }

    /// Current role.
    pub fn role(&self) -> Role {
        Role::from_u8(self.role.load(Ordering::Acquire))
    }

    /// Whether this process may serve client RPCs right now: always without
    /// HA; as leader only while its lease clock is valid.
    pub fn may_serve(&self) -> bool {
        match self.role() {
            Role::Single => true,
            Role::Leader => self.lease.valid(),
            Role::Standby => false,
        }
    }

    /// Term number (the etcd revision of the winning campaign; 0 without HA
    /// or before the first win).
    pub fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    /// Unix ms when the current (or last) term started serving.
    pub fn serving_since_ms(&self) -> u64 {
        self.serving_since_ms.load(Ordering::Acquire)
    }

    /// Unix ms of the last mutating request this process accepted.
    pub fn last_write_ms(&self) -> u64 {
        self.last_write_ms.load(Ordering::Acquire)
    }

    /// Record that a mutating request was accepted now.
    pub fn note_write(&self) {
        self.last_write_ms.fetch_max(unix_ms(), Ordering::AcqRel);
    }

    /// The leader's RPC address as last seen in etcd.
    pub fn leader_address(&self) -> Option<String> {
        self.leader_address.lock().clone()
    }

    /// etcd revision of the observed leader's campaign key (0: none seen).
    pub fn leader_rev(&self) -> u64 {
        self.leader_rev.load(Ordering::Acquire)
    }

    /// A leader was observed in etcd (`None`: no leader), with the create
    /// revision of its campaign key. An observation older than the one
    /// already recorded is ignored; changes are counted.
    pub fn observe_leader(&self, leader: Option<(String, u64)>) {
        let mut g = self.leader_address.lock();
        match leader {
            Some((addr, rev)) => {
                if rev < self.leader_rev.load(Ordering::Acquire) {
                    return;
                }
                self.leader_rev.store(rev, Ordering::Release);
                if g.as_deref() != Some(addr.as_str()) {
                    self.leader_changes.fetch_add(1, Ordering::Relaxed);
                    *g = Some(addr);
                }
            }
            None => *g = None,
        }
    }

    /// Whether etcd said the current lease no longer exists.
    pub fn lease_dead(&self) -> bool {
        self.lease_dead.load(Ordering::Acquire)
    }

    /// Record whether etcd said the current lease no longer exists.
    pub fn set_lease_dead(&self, dead: bool) {
        self.lease_dead.store(dead, Ordering::Release);
    }

    /// This process became leader of term `epoch`.
    pub fn become_leader(&self, epoch: u64) {
        self.epoch.store(epoch, Ordering::Release);
        self.serving_since_ms.store(unix_ms(), Ordering::Release);
        self.elections_won.fetch_add(1, Ordering::Relaxed);
        self.role.store(2, Ordering::Release);
    }

    /// This process stopped leading.
    pub fn become_standby(&self) {
        if self.role.swap(1, Ordering::AcqRel) == 2 {
            self.step_downs.fetch_add(1, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_clock_validity() {
        let c = LeaseClock::default();
        assert!(!c.valid());
        c.confirm(
            Instant::now(),
            Duration::from_secs(2),
            Duration::from_millis(500),
        );
        assert!(c.valid());
        c.invalidate();
        assert!(!c.valid());
        // A confirmation whose window has already passed does not validate.
        let old = Instant::now();
        c.confirm(old, Duration::from_millis(1), Duration::ZERO);
        std::thread::sleep(Duration::from_millis(5));
        assert!(!c.valid());
    }

    #[test]
    fn roles_and_counters() {
        let s = HaStatus::ha("c");
        assert!(s.enabled() && !s.may_serve());
        assert_eq!(s.role(), Role::Standby);
        s.become_leader(7);
        assert_eq!(s.role(), Role::Leader);
        assert!(
            !s.may_serve(),
            "a leader without a confirmed lease must not serve"
        );
        s.lease.confirm(
            Instant::now(),
            Duration::from_secs(2),
            Duration::from_millis(500),
        );
        assert!(s.may_serve());
        assert_eq!(s.epoch(), 7);
        s.become_standby();
        s.become_standby();
        assert_eq!(s.step_downs.load(Ordering::Relaxed), 1);
        s.observe_leader(Some(("a:1".into(), 5)));
        s.observe_leader(Some(("a:1".into(), 5)));
        s.observe_leader(None);
        s.observe_leader(Some(("b:1".into(), 9)));
        // A late message about an older leader does not win.
        s.observe_leader(Some(("a:1".into(), 5)));
        assert_eq!(s.leader_address().as_deref(), Some("b:1"));
        assert_eq!(s.leader_rev(), 9);
        assert_eq!(s.leader_changes.load(Ordering::Relaxed), 2);
        assert!(HaStatus::single().may_serve());
    }
}
