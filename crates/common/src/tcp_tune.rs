//! Congestion control for bulk data connections (store transfers, PG rank
//! links): the one socket setting those connections choose for themselves.
//!
//! It lives here because the transfer crate (client pool and data server)
//! and the PG engine (rank links) apply the same rule to their sockets.
//!
//! The rule: a connection whose two ends are on this host (loopback, or the
//! same address on both ends, which Linux routes over the loopback device)
//! uses `reno`. Such a connection has no bottleneck link to pace for, but a
//! pacing algorithm still paces it: under `bbr` (the system default on the
//! reference VM, and on many cloud images) the sender spaces its segments
//! with a per-socket timer at the rate it has estimated, so after one large
//! transfer has grown that estimate's state, the next 256 KiB–1 MiB
//! responses go out timer slice by timer slice. Measured on the reference
//! VM (two vCPUs): a 1 MiB read over four loopback connections fell from
//! 3.6 to 2.2 GB/s after a 32 MiB batch on the same connections under `bbr`,
//! and stayed at 3.8–4.1 under `reno` (`cubic` the same); the 32 MiB batch
//! itself moved at 3.1 GB/s under `bbr` and 7.6 under `reno`. `reno` is the
//! algorithm every kernel has and any unprivileged process may select.
//! Connections to other hosts keep the system's algorithm: that is the
//! administrator's choice for real links.
//!
//! `MC_TCP_CONGESTION` overrides: `system` leaves every connection alone,
//! and an algorithm's name (e.g. `cubic`) is applied to every data
//! connection, same host or not. A setting the kernel refuses (an unknown
//! name, or one not in `net.ipv4.tcp_allowed_congestion_control` for an
//! unprivileged process) leaves the connection as it was.

use nix::sys::socket::{getsockopt, setsockopt, sockopt::TcpCongestion};
use std::ffi::OsString;
use std::net::{SocketAddr, TcpStream};
use std::sync::OnceLock;

/// What `MC_TCP_CONGESTION` asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Policy {
    /// Same-host connections use `reno`; others keep the system's choice.
    Auto,
    /// Never change a connection's algorithm.
    System,
    /// This algorithm on every data connection.
    Always(String),
}

fn parse_policy(v: Option<&str>) -> Policy {
    match v.map(str::trim) {
        None | Some("") => Policy::Auto,
        Some(s) if s.eq_ignore_ascii_case("auto") => Policy::Auto,
        Some(s) if s.eq_ignore_ascii_case("system") || s.eq_ignore_ascii_case("off") => {
            Policy::System
        }
        Some(s) => Policy::Always(s.to_string()),
    }
}

fn policy() -> &'static Policy {
    static P: OnceLock<Policy> = OnceLock::new();
    P.get_or_init(|| parse_policy(std::env::var("MC_TCP_CONGESTION").ok().as_deref()))
}

/// Whether a connection between `local` and `peer` stays on this host.
fn same_host(local: &SocketAddr, peer: &SocketAddr) -> bool {
    let (l, p) = (local.ip().to_canonical(), peer.ip().to_canonical());
    p.is_loopback() || l == p
}

/// The algorithm `policy` picks for a connection between `local` and `peer`.
fn choice<'a>(policy: &'a Policy, local: &SocketAddr, peer: &SocketAddr) -> Option<&'a str> {
    match policy {
        Policy::System => None,
        Policy::Always(name) => Some(name),
        Policy::Auto => same_host(local, peer).then_some("reno"),
    }
}

fn set_congestion(s: &TcpStream, name: &str) -> bool {
    setsockopt(s, TcpCongestion, &OsString::from(name)).is_ok()
}

/// The congestion-control algorithm of `s`, as the kernel reports it
/// (the option's fixed-size buffer comes back NUL-padded).
pub fn congestion_of(s: &TcpStream) -> Option<String> {
    let name = getsockopt(s, TcpCongestion).ok()?.into_string().ok()?;
    Some(name.trim_end_matches('\0').to_string())
}

/// Whether congestion-control algorithm `name` paces its sender by itself
/// (the `bbr` family), which holds one flow to its estimated rate.
pub fn paces(name: &str) -> bool {
    name.starts_with("bbr")
}

/// Apply the data-connection congestion rule (see the module comment) to a
/// connected stream. Returns the algorithm set, or `None` when the stream
/// was left as it was (other host, `MC_TCP_CONGESTION=system`, or the
/// kernel refused the setting).
pub fn tune_data_stream(s: &TcpStream) -> Option<&'static str> {
    let (Ok(local), Ok(peer)) = (s.local_addr(), s.peer_addr()) else {
        return None;
    };
    let name = choice(policy(), &local, &peer)?;
    set_congestion(s, name).then_some(name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn policy_parses_the_documented_values() {
        assert_eq!(parse_policy(None), Policy::Auto);
        assert_eq!(parse_policy(Some(" ")), Policy::Auto);
        assert_eq!(parse_policy(Some("AUTO")), Policy::Auto);
        assert_eq!(parse_policy(Some("system")), Policy::System);
        assert_eq!(parse_policy(Some("off")), Policy::System);
        assert_eq!(parse_policy(Some("cubic")), Policy::Always("cubic".into()));
    }

    #[test]
    fn auto_picks_reno_only_for_same_host_pairs() {
        let a = Policy::Auto;
        let lo = addr("127.0.0.1:1");
        assert_eq!(choice(&a, &lo, &addr("127.0.0.1:2")), Some("reno"));
        assert_eq!(choice(&a, &addr("[::1]:1"), &addr("[::1]:2")), Some("reno"));
        assert_eq!(
            choice(
                &a,
                &addr("[::ffff:127.0.0.1]:1"),
                &addr("[::ffff:127.0.0.1]:2")
            ),
            Some("reno")
        );
        // The host's own address on both ends routes over loopback too.
        assert_eq!(
            choice(&a, &addr("10.1.2.3:1"), &addr("10.1.2.3:2")),
            Some("reno")
        );
        assert_eq!(choice(&a, &addr("10.1.2.3:1"), &addr("10.1.2.4:2")), None);
        assert_eq!(choice(&Policy::System, &lo, &lo), None);
        let always = Policy::Always("cubic".into());
        assert_eq!(
            choice(&always, &addr("10.1.2.3:1"), &addr("10.1.2.4:2")),
            Some("cubic")
        );
    }

    #[test]
    fn a_loopback_connection_is_switched_to_reno() {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let c = TcpStream::connect(l.local_addr().expect("addr")).expect("connect");
        let (srv, _) = l.accept().expect("accept");
        assert_eq!(tune_data_stream(&c), Some("reno"));
        assert_eq!(congestion_of(&c).as_deref(), Some("reno"));
        assert_eq!(tune_data_stream(&srv), Some("reno"));
        assert_eq!(congestion_of(&srv).as_deref(), Some("reno"));
    }

    #[test]
    fn only_the_bbr_family_paces() {
        assert!(paces("bbr"));
        assert!(paces("bbr2"));
        assert!(!paces("reno"));
        assert!(!paces("cubic"));
    }

    #[test]
    fn an_unknown_algorithm_leaves_the_connection_alone() {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let c = TcpStream::connect(l.local_addr().expect("addr")).expect("connect");
        let before = congestion_of(&c);
        assert!(before.is_some());
        assert!(!set_congestion(&c, "no-such-algorithm"));
        assert_eq!(congestion_of(&c), before);
    }
}
