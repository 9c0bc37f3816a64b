//! How many parallel TCP connections one transfer is split over. The
//! store's data path and the upstream-compatible engine split their TCP
//! transfers by this one rule: parts of at least [`TCP_PART_MIN`] bytes
//! ([`TCP_PART_MIN_PACED`] towards a peer whose connections pace), at most
//! [`tcp_streams`] of them ([`local_tcp_streams`] towards a peer on this
//! host).

/// Bytes each connection of a split TCP transfer carries at least, when
/// the peer's connections are not paced (every data connection under the
/// default congestion rule: `reno` on one host, `cubic` or the system's
/// non-pacing choice across hosts; see `mooncake_common::tcp_tune`). A
/// transfer is split into
/// `total / part_min` parts, at most [`tcp_streams`]. On the reference VM
/// (two vCPUs) one unpaced loopback connection moves a 1 MiB response at
/// 5.8–6.2 GB/s against 3.5–4.6 split four ways (the receiver copies on one
/// core while the sender's stack runs on the other; more streams only
/// contend for the two cores), while 4 and 16 MiB still gain from four
/// 1 MiB+ parts.
pub(crate) const TCP_PART_MIN: u64 = 1 << 20;
/// The same for connections whose congestion control paces (`bbr`, kept
/// only when `MC_TCP_CONGESTION` asks for it or leaves connections alone):
/// one paced flow is held to its estimated rate, so smaller parts over
/// more connections move more on average (in network namespaces on the
/// reference VM a 1 MiB read moved at 3.2–3.8 GB/s in four parts against
/// 1.9–3.3 in one), at the cost of the pacing stalls the congestion rule
/// avoids by default.
pub(crate) const TCP_PART_MIN_PACED: u64 = 256 << 10;

/// Most parallel TCP streams for one transfer: `MC_TCP_STREAMS`, default 4
/// (read once).
pub(crate) fn tcp_streams() -> u64 {
    static STREAMS: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *STREAMS.get_or_init(|| {
        std::env::var("MC_TCP_STREAMS")
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(4)
            .clamp(1, 16)
    })
}

/// Most parallel TCP streams for one transfer to a peer on this host (over
/// the loopback device): each stream keeps a sending and a receiving core
/// of this host busy, so more streams than half its cores only take turns
/// on them (on two cores one stream moved a single 16 MiB read at 4.9-5.3
/// GB/s, four at 2.8-2.9). Never more than [`tcp_streams`].
///
/// Read once: the core count comes from the affinity mask and the cgroup's
/// files, too slow to ask for on every transfer.
pub(crate) fn local_tcp_streams() -> u64 {
    static STREAMS: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *STREAMS.get_or_init(|| {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get() as u64);
        (cores / 2).clamp(1, tcp_streams())
    })
}

/// How many connections a TCP transfer of `total` bytes is split over,
/// given whether the peer's connections are paced.
pub(crate) fn tcp_parts(total: u64, paced: bool, streams: u64) -> u64 {
    let part_min = if paced {
        TCP_PART_MIN_PACED
    } else {
        TCP_PART_MIN
    };
    (total / part_min).clamp(1, streams.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tcp_parts_keep_each_part_at_least_the_minimum() {
        const K: u64 = 1 << 10;
        const M: u64 = 1 << 20;
        // Unpaced (same-host reno): parts of at least 1 MiB.
        assert_eq!(tcp_parts(0, false, 4), 1);
        assert_eq!(tcp_parts(M, false, 4), 1);
        assert_eq!(tcp_parts(2 * M - 1, false, 4), 1);
        assert_eq!(tcp_parts(2 * M, false, 4), 2);
        assert_eq!(tcp_parts(4 * M, false, 4), 4);
        assert_eq!(tcp_parts(64 * M, false, 4), 4);
        assert_eq!(tcp_parts(64 * M, false, 2), 2);
        // Paced: parts of at least 256 KiB.
        assert_eq!(tcp_parts(256 * K - 1, true, 4), 1);
        assert_eq!(tcp_parts(512 * K, true, 4), 2);
        assert_eq!(tcp_parts(M, true, 4), 4);
        assert_eq!(tcp_parts(64 * M, true, 0), 1);
    }
}
