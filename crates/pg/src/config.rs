//! Tunables read from the environment when a group is created
//! (`MOONCAKE_PG_*`), plus the process-wide silence
//! timeouts that `set_collective_timeout_us` / `set_p2p_timeout_us` change.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Default silence timeout T: a peer that sent neither data nor PONG for T
/// while an op waits on it is declared failed, and survivors complete
/// within 2·T of the failure.
pub(crate) const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

static COLL_TIMEOUT_US: AtomicU64 = AtomicU64::new(0);
static P2P_TIMEOUT_US: AtomicU64 = AtomicU64::new(0);

/// Sets the process-wide collective silence timeout (0 restores the
/// environment's value); applies to waits from now on.
pub fn set_collective_timeout_us(us: u64) {
    COLL_TIMEOUT_US.store(us, Ordering::Relaxed);
}

/// Sets the process-wide P2P silence timeout (0 restores the environment's
/// value); applies to waits from now on.
pub fn set_p2p_timeout_us(us: u64) {
    P2P_TIMEOUT_US.store(us, Ordering::Relaxed);
}

/// Which transport carries collective data between same-host peers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Transport {
    /// Shared memory for same-host peers, TCP otherwise.
    Auto,
    /// TCP only.
    Tcp,
}

/// Engine tunables (`MOONCAKE_PG_*`).
#[derive(Clone, Debug)]
pub(crate) struct Config {
    /// Transport selection (`MOONCAKE_PG_TRANSPORT`).
    pub(crate) transport: Transport,
    /// Largest all_reduce payload that uses the one-round direct algorithm.
    pub(crate) small_bytes: usize,
    /// Bounded spin before sleeping (`MOONCAKE_PG_SPIN_US`, default 0).
    pub(crate) spin: Duration,
    /// P2P frame size on TCP.
    pub(crate) p2p_frame: usize,
    /// Let a thread blocked in `wait()` run queued ops itself
    /// (`MOONCAKE_PG_INLINE`, default 1).
    pub(crate) inline_wait: bool,
    /// Silence timeout T while a collective waits on a peer
    /// (`MOONCAKE_PG_COLLECTIVE_TIMEOUT_US`, default 10 s).
    pub(crate) coll_timeout: Duration,
    /// Silence timeout T while a P2P op waits on a peer
    /// (`MOONCAKE_PG_P2P_TIMEOUT_US`, default 10 s).
    pub(crate) p2p_timeout: Duration,
}

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(default)
}

impl Config {
    /// Reads the configuration from the environment.
    pub(crate) fn from_env() -> Self {
        let transport = match std::env::var("MOONCAKE_PG_TRANSPORT")
            .unwrap_or_default()
            .to_ascii_lowercase()
            .as_str()
        {
            "tcp" => Transport::Tcp,
            _ => Transport::Auto,
        };
        Config {
            transport,
            small_bytes: env_usize("MOONCAKE_PG_SMALL_BYTES", 64 * 1024),
            spin: Duration::from_micros(env_usize("MOONCAKE_PG_SPIN_US", 0) as u64),
            p2p_frame: 4 << 20,
            inline_wait: env_usize("MOONCAKE_PG_INLINE", 1) != 0,
            coll_timeout: env_timeout("MOONCAKE_PG_COLLECTIVE_TIMEOUT_US"),
            p2p_timeout: env_timeout("MOONCAKE_PG_P2P_TIMEOUT_US"),
        }
    }

    /// The collective silence timeout now in force.
    pub(crate) fn coll_timeout(&self) -> Duration {
        pick(&COLL_TIMEOUT_US, self.coll_timeout)
    }

    /// The P2P silence timeout now in force.
    pub(crate) fn p2p_timeout(&self) -> Duration {
        pick(&P2P_TIMEOUT_US, self.p2p_timeout)
    }
}

fn pick(over: &AtomicU64, dflt: Duration) -> Duration {
    match over.load(Ordering::Relaxed) {
        0 => dflt,
        us => Duration::from_micros(us),
    }
}

/// The collective silence timeout T in force for new work in this process
/// (the coordinator waits this long for a view-change acknowledgement).
pub(crate) fn collective_timeout() -> Duration {
    pick(
        &COLL_TIMEOUT_US,
        env_timeout("MOONCAKE_PG_COLLECTIVE_TIMEOUT_US"),
    )
}

/// Default reconciliation window (upstream's default).
const DEFAULT_WINDOW: Duration = Duration::from_secs(30);

static WINDOW_US: AtomicU64 = AtomicU64::new(0);

/// Sets the membership coordinator's fault-reconciliation window (0 restores
/// the default, 30 s). It bounds how long the coordinator hosted in this
/// process waits for link reports once a failure is reported; it decides
/// earlier when every member it did not hear suspected has reported (in a
/// group without auto-deactivation: has called `sync_after_failure`).
pub fn set_fault_reconciliation_window_us(us: u64) {
    WINDOW_US.store(us, Ordering::Relaxed);
}

/// The reconciliation window in force.
pub(crate) fn reconciliation_window() -> Duration {
    pick(&WINDOW_US, DEFAULT_WINDOW)
}

/// How long an activation waits for its targets to call `join_group`
/// (`MOONCAKE_PG_ADMISSION_TIMEOUT_US`, default 60 s).
pub(crate) fn admission_timeout() -> Duration {
    match env_usize("MOONCAKE_PG_ADMISSION_TIMEOUT_US", 0) {
        0 => Duration::from_secs(60),
        us => Duration::from_micros(us as u64),
    }
}

fn env_timeout(name: &str) -> Duration {
    match env_usize(name, 0) {
        0 => DEFAULT_TIMEOUT,
        us => Duration::from_micros(us as u64),
    }
}

/// True when `MOONCAKE_PG_LOG` (else `MC_LOG_LEVEL`) asks for info messages.
pub(crate) fn log_info() -> bool {
    let v = std::env::var("MOONCAKE_PG_LOG")
        .or_else(|_| std::env::var("MC_LOG_LEVEL"))
        .unwrap_or_default()
        .to_ascii_lowercase();
    matches!(v.as_str(), "info" | "debug" | "trace")
}
