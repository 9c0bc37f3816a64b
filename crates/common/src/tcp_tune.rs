//! Congestion control for bulk data connections (store transfers, PG rank
//! links): the one socket setting those connections choose for themselves.
//!
//! It lives here because the transfer crate (client pool and data server)
//! and the PG engine (rank links) apply the same rule to their sockets.
//!
//! The rule, applied to both ends of every data connection:
//!
//! - **Same host** (loopback, or the same address on both ends, which Linux
//!   routes over the loopback device): `reno`. Such a connection has no
//!   bottleneck link to pace for, but a pacing algorithm still paces it:
//!   under `bbr` (the system default on the reference VM, and on many cloud
//!   images) the sender spaces its segments with a per-socket timer at the
//!   rate it has estimated. Measured on the reference VM (two vCPUs): a
//!   1 MiB read over four loopback connections fell from 3.6 to 2.2 GB/s
//!   after a 32 MiB batch on the same connections under `bbr`, and stayed
//!   at 3.8–4.1 under `reno` (`cubic` the same).
//! - **Another host, system default in the `bbr` family**: `cubic` (`reno`
//!   where the kernel does not let this process select `cubic`). A data
//!   connection carries request/response traffic: a burst of up to a few
//!   MiB, then nothing until the next request, so `bbr` sees it
//!   application-limited nearly all the time and its bandwidth and RTT
//!   model goes stale between bursts. The sender then holds the rest of a
//!   response behind its pacing timer: in a capture across two network
//!   namespaces joined by a veth pair, a 256 KiB response left as 5
//!   segments, then nothing for 95 ms with the window open, then in slow-
//!   start-like doublings. One read in a hundred of 1 MiB took 57–100 ms,
//!   and a bare C client/server pair under `bbr` showed the same (16 MiB
//!   transfers: p99 129 ms, against 26–45 ms under `reno` or `cubic`).
//!   `cubic` is the kernel's default, keeps per-connection state across
//!   idle periods without a pacer, and holds up on the links a cluster
//!   runs on.
//! - **Another host, any other system default** (`cubic`, `reno`, `dctcp`,
//!   ...): left alone, as the administrator chose it for the links.
//!
//! `MC_TCP_CONGESTION` overrides: `system` leaves every connection alone,
//! and an algorithm's name (e.g. `cubic`) is applied to every data
//! connection, same host or not. A setting the kernel refuses (an unknown
//! name, or one not in `net.ipv4.tcp_allowed_congestion_control` for an
//! unprivileged process; `reno` is always allowed) leaves the connection as
//! it was, or falls back to the next candidate.

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

/// The algorithms `policy` picks for a connection between `local` and
/// `peer` that currently runs `current`, in the order to try them (none:
/// leave the connection alone).
fn choice<'a>(
    policy: &'a Policy,
    local: &SocketAddr,
    peer: &SocketAddr,
    current: Option<&str>,
) -> Vec<&'a str> {
    match policy {
        Policy::System => Vec::new(),
        Policy::Always(name) => vec![name.as_str()],
        Policy::Auto if same_host(local, peer) => vec!["reno"],
        Policy::Auto if current.is_some_and(paces) => vec!["cubic", "reno"],
        Policy::Auto => Vec::new(),
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
/// was left as it was (the rule keeps the system's choice,
/// `MC_TCP_CONGESTION=system`, or the kernel refused every candidate).
pub fn tune_data_stream(s: &TcpStream) -> Option<&'static str> {
    let (Ok(local), Ok(peer)) = (s.local_addr(), s.peer_addr()) else {
        return None;
    };
    let current = congestion_of(s);
    choice(policy(), &local, &peer, current.as_deref())
        .into_iter()
        .find(|name| set_congestion(s, name))
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
    fn auto_picks_reno_on_one_host_and_cubic_over_a_pacing_default() {
        let a = Policy::Auto;
        let lo = addr("127.0.0.1:1");
        let none: Vec<&str> = Vec::new();
        for cur in [None, Some("bbr"), Some("cubic")] {
            assert_eq!(choice(&a, &lo, &addr("127.0.0.1:2"), cur), vec!["reno"]);
        }
        assert_eq!(
            choice(&a, &addr("[::1]:1"), &addr("[::1]:2"), Some("bbr")),
            vec!["reno"]
        );
        assert_eq!(
            choice(
                &a,
                &addr("[::ffff:127.0.0.1]:1"),
                &addr("[::ffff:127.0.0.1]:2"),
                None
            ),
            vec!["reno"]
        );
        // The host's own address on both ends routes over loopback too.
        assert_eq!(
            choice(&a, &addr("10.1.2.3:1"), &addr("10.1.2.3:2"), Some("cubic")),
            vec!["reno"]
        );
        // Another host: a pacing default is replaced, any other one kept.
        let (l, p) = (addr("10.1.2.3:1"), addr("10.1.2.4:2"));
        assert_eq!(choice(&a, &l, &p, Some("bbr")), vec!["cubic", "reno"]);
        assert_eq!(choice(&a, &l, &p, Some("bbr2")), vec!["cubic", "reno"]);
        for kept in [Some("cubic"), Some("reno"), Some("dctcp"), None] {
            assert_eq!(choice(&a, &l, &p, kept), none);
        }
        assert_eq!(choice(&Policy::System, &lo, &lo, Some("bbr")), none);
        let always = Policy::Always("cubic".into());
        assert_eq!(choice(&always, &l, &p, Some("reno")), vec!["cubic"]);
        assert_eq!(choice(&always, &lo, &lo, None), vec!["cubic"]);
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
