//! Cumulative per-client counters reported by `get_client_stats()`.

use mooncake_transfer::Path;
use std::sync::atomic::{AtomicU64, Ordering};

/// Bytes the engine moved one way (read or written), by path.
#[derive(Debug, Default)]
pub(crate) struct PathBytes {
    pub(crate) local: AtomicU64,
    pub(crate) same_host: AtomicU64,
    pub(crate) tcp: AtomicU64,
    /// TCP data requests sent: one scatter/gather list to one owner each
    /// (the engine may spread a large one over parallel connections,
    /// `MC_TCP_STREAMS`).
    pub(crate) tcp_requests: AtomicU64,
}

impl PathBytes {
    /// Counts one engine transfer of `n` bytes (one request when over TCP).
    pub(crate) fn count(&self, path: Path, n: u64) {
        let c = match path {
            Path::Local => &self.local,
            Path::SameHost => &self.same_host,
            Path::Tcp => {
                self.tcp_requests.fetch_add(1, Ordering::Relaxed);
                &self.tcp
            }
        };
        c.fetch_add(n, Ordering::Relaxed);
    }
}

/// Counters; tests assert on their deltas.
#[derive(Debug, Default)]
pub(crate) struct ClientStats {
    pub(crate) read: PathBytes,
    pub(crate) written: PathBytes,
    pub(crate) master_rpcs: AtomicU64,
    pub(crate) same_host_mappings: AtomicU64,
}

impl ClientStats {
    /// Snapshot as (name, value) pairs.
    pub(crate) fn snapshot(&self) -> Vec<(&'static str, u64)> {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let (r, w) = (&self.read, &self.written);
        vec![
            ("bytes_read_local", l(&r.local)),
            ("bytes_read_same_host", l(&r.same_host)),
            ("bytes_read_tcp", l(&r.tcp)),
            ("bytes_written_local", l(&w.local)),
            ("bytes_written_same_host", l(&w.same_host)),
            ("bytes_written_tcp", l(&w.tcp)),
            ("master_rpcs", l(&self.master_rpcs)),
            ("same_host_mappings", l(&self.same_host_mappings)),
            ("tcp_read_requests", l(&r.tcp_requests)),
            ("tcp_write_requests", l(&w.tcp_requests)),
        ]
    }
}
