//! Cumulative per-client counters reported by `get_client_stats()`.

use std::sync::atomic::{AtomicU64, Ordering};

/// Counters; tests assert on their deltas.
#[derive(Debug, Default)]
pub(crate) struct ClientStats {
    pub(crate) bytes_read_local: AtomicU64,
    pub(crate) bytes_read_same_host: AtomicU64,
    pub(crate) bytes_read_tcp: AtomicU64,
    pub(crate) bytes_written_local: AtomicU64,
    pub(crate) bytes_written_same_host: AtomicU64,
    pub(crate) bytes_written_tcp: AtomicU64,
    pub(crate) master_rpcs: AtomicU64,
    pub(crate) same_host_mappings: AtomicU64,
    /// TCP data requests sent for reads: one scatter/gather list to one
    /// owner each (the engine may spread a large one over parallel
    /// connections, `MC_TCP_STREAMS`).
    pub(crate) tcp_read_requests: AtomicU64,
    /// TCP data requests sent for writes, counted likewise.
    pub(crate) tcp_write_requests: AtomicU64,
}

impl ClientStats {
    /// Snapshot as (name, value) pairs.
    pub(crate) fn snapshot(&self) -> Vec<(&'static str, u64)> {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        vec![
            ("bytes_read_local", l(&self.bytes_read_local)),
            ("bytes_read_same_host", l(&self.bytes_read_same_host)),
            ("bytes_read_tcp", l(&self.bytes_read_tcp)),
            ("bytes_written_local", l(&self.bytes_written_local)),
            ("bytes_written_same_host", l(&self.bytes_written_same_host)),
            ("bytes_written_tcp", l(&self.bytes_written_tcp)),
            ("master_rpcs", l(&self.master_rpcs)),
            ("same_host_mappings", l(&self.same_host_mappings)),
            ("tcp_read_requests", l(&self.tcp_read_requests)),
            ("tcp_write_requests", l(&self.tcp_write_requests)),
        ]
    }
}
