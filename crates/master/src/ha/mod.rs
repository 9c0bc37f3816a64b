//! High availability of `mooncake_master` on etcd (upstream's `--enable_ha`,
//! `--ha_backend_type=etcd`, `--ha_backend_connstring`, legacy
//! `--etcd_endpoints`, `--cluster_id`).
//!
//! Several masters of one cluster campaign in one etcd election; the winner
//! publishes its RPC address as the election value and serves, the others
//! wait as standbys and answer client RPCs with UNAVAILABLE_IN_CURRENT_STATUS.
//! Clients given `etcd://h1:2379;h2:2379` read and follow that value. A new
//! leader starts with empty metadata and rebuilds it from what the clients
//! re-report when they remount (see the recovery module): no master state is
//! replicated, so there is no log to keep and nothing is lost with a master.
//!
//! `election` runs the campaign and lease loop; `status` is what the rest of
//! the master reads (role, term, lease clock, observed leader).

mod election;
mod status;

pub use election::{current_leader, HaError, HaRuntime, Terms, STARTUP_TIMEOUT};
pub use status::{unix_ms, HaStatus, LeaseClock, Role};

use std::time::Duration;

/// Environment variable overriding the leader lease TTL in seconds
/// (default [`DEFAULT_LEASE_TTL_SECS`]; etcd raises values below its own
/// minimum, 2 s with etcd's default election timeout).
pub const LEASE_TTL_ENV: &str = "MC_HA_LEASE_TTL_SEC";

/// Default leader lease TTL: a killed leader is replaced about this long
/// after its last keep-alive.
pub const DEFAULT_LEASE_TTL_SECS: u64 = 2;

/// HA settings of one master.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HaConfig {
    /// etcd endpoints, each `http://host:port`.
    pub endpoints: Vec<String>,
    /// `--cluster_id`: masters and clients of one cluster share it.
    pub cluster_id: String,
    /// The RPC address clients are given (`rpc_address:rpc_port`).
    pub advertise: String,
    /// Leader lease TTL.
    pub lease_ttl: Duration,
}

impl HaConfig {
    /// The lease TTL in whole seconds (etcd's unit), at least 1.
    pub fn lease_ttl_secs(&self) -> i64 {
        self.lease_ttl.as_secs().max(1) as i64
    }
}

/// The lease TTL from [`LEASE_TTL_ENV`], else the default.
pub fn lease_ttl_from_env() -> Duration {
    let secs = std::env::var(LEASE_TTL_ENV)
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|&s| s > 0)
        .unwrap_or(DEFAULT_LEASE_TTL_SECS);
    Duration::from_secs(secs)
}
