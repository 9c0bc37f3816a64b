//! Tunables read from the environment when a group is created.

use std::time::Duration;

/// Which transport carries collective data between same-host peers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    /// Shared memory for same-host peers, TCP otherwise.
    Auto,
    /// TCP only.
    Tcp,
}

/// Engine tunables (`MOONCAKE_PG_*`).
#[derive(Clone, Debug)]
pub struct Config {
    /// Transport selection (`MOONCAKE_PG_TRANSPORT`).
    pub transport: Transport,
    /// Largest all_reduce payload that uses the one-round direct algorithm.
    pub small_bytes: usize,
    /// Bounded spin before sleeping (`MOONCAKE_PG_SPIN_US`, default 0).
    pub spin: Duration,
    /// P2P frame size on TCP.
    pub p2p_frame: usize,
    /// Let a thread blocked in `wait()` run queued ops itself
    /// (`MOONCAKE_PG_INLINE`, default 1).
    pub inline_wait: bool,
}

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(default)
}

impl Config {
    /// Reads the configuration from the environment.
    pub fn from_env() -> Self {
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
        }
    }
}
