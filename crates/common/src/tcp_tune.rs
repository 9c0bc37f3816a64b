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
//! The algorithm is chosen before the connection exists wherever possible:
//! on a listening socket (its accepted connections inherit it) and on a
//! socket before `connect`. A connection that starts under `bbr` keeps the
//! kernel's per-socket pacing timer after it is switched to another
//! algorithm (the switch does not turn pacing off), and that timer then
//! paces at a rate derived from the window: across two network namespaces
//! under a `bbr` default, a bare client/server pair moved 16 MiB responses
//! at 1.7 GB/s when both ends switched to `cubic` after connecting, and at
//! 4.5–4.8 GB/s when the listener and the client socket were set to `cubic`
//! before the handshake (1 MiB: 4.6 against 4.7–5.0). After connecting, the
//! rule is applied again with both addresses known (a same-host connection
//! set to `cubic` in advance moves to `reno`; neither paces).
//!
//! `MC_TCP_CONGESTION` overrides: `system` leaves every connection alone,
//! and an algorithm's name (e.g. `cubic`) is applied to every data
//! connection, same host or not. A setting the kernel refuses (an unknown
//! name, or one not in `net.ipv4.tcp_allowed_congestion_control` for an
//! unprivileged process; `reno` is always allowed) leaves the connection as
//! it was, or falls back to the next candidate.

use nix::sys::socket::{getsockopt, setsockopt, sockopt::TcpCongestion};
use socket2::{Domain, Protocol, Socket, Type};
use std::ffi::OsString;
use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::sync::OnceLock;
use std::time::Duration;

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

/// The algorithms to set on a socket before it has a connection: a
/// listener (`peer` unknown: its connections may come from anywhere) or a
/// socket about to connect to `peer`. Same-host connections are recognised
/// here only by a loopback `peer`; the rule runs again once connected.
fn choice_before<'a>(
    policy: &'a Policy,
    peer: Option<&SocketAddr>,
    current: Option<&str>,
) -> Vec<&'a str> {
    match policy {
        Policy::System => Vec::new(),
        Policy::Always(name) => vec![name.as_str()],
        Policy::Auto if peer.is_some_and(|p| p.ip().to_canonical().is_loopback()) => {
            vec!["reno"]
        }
        Policy::Auto if current.is_some_and(paces) => vec!["cubic", "reno"],
        Policy::Auto => Vec::new(),
    }
}

fn set_congestion<F: AsFd>(s: &F, name: &str) -> bool {
    setsockopt(s, TcpCongestion, &OsString::from(name)).is_ok()
}

/// The congestion-control algorithm of a TCP socket (a stream, or a
/// listener: the one its accepted connections start with), as the kernel
/// reports it (the option's fixed-size buffer comes back NUL-padded).
pub fn congestion_of<F: AsFd>(s: &F) -> Option<String> {
    let name = getsockopt(s, TcpCongestion).ok()?.into_string().ok()?;
    Some(name.trim_end_matches('\0').to_string())
}

/// Sets the algorithm the data listener `l`'s connections start with (see
/// the module comment); call [`tune_data_stream`] on each accepted stream
/// as well. Returns the algorithm set, or `None` when the listener was left
/// with the system's.
pub fn tune_data_listener(l: &TcpListener) -> Option<&'static str> {
    let current = congestion_of(l);
    apply(l, choice_before(policy(), None, current.as_deref()))
}

/// Opens a data connection to `addr` within `timeout`, its congestion
/// control chosen before the handshake and checked again after it (see the
/// module comment).
pub fn connect_data(addr: &SocketAddr, timeout: Duration) -> io::Result<TcpStream> {
    let sock = Socket::new(
        Domain::for_address(*addr),
        Type::STREAM,
        Some(Protocol::TCP),
    )?;
    let current = congestion_of(&sock);
    apply(
        &sock,
        choice_before(policy(), Some(addr), current.as_deref()),
    );
    sock.connect_timeout(&(*addr).into(), timeout)?;
    let s: TcpStream = sock.into();
    tune_data_stream(&s);
    Ok(s)
}

/// Sets the first candidate the kernel accepts and returns it.
fn apply<F: AsFd>(s: &F, candidates: Vec<&'static str>) -> Option<&'static str> {
    candidates.into_iter().find(|name| set_congestion(s, name))
}

/// Whether a connected stream runs over the loopback device (its peer is
/// this host: a loopback address, or the same address as its own end).
pub fn over_loopback(s: &TcpStream) -> bool {
    match (s.local_addr(), s.peer_addr()) {
        (Ok(local), Ok(peer)) => same_host(&local, &peer),
        _ => false,
    }
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
    apply(s, choice(policy(), &local, &peer, current.as_deref()))
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
    fn before_a_connection_exists_the_rule_uses_what_is_known() {
        let a = Policy::Auto;
        let lo = addr("127.0.0.1:9");
        let far = addr("10.1.2.3:9");
        // A listener may take connections from anywhere: over a pacing
        // default it starts with cubic; any other default is kept.
        assert_eq!(choice_before(&a, None, Some("bbr")), vec!["cubic", "reno"]);
        assert!(choice_before(&a, None, Some("cubic")).is_empty());
        // A client socket knows its peer: loopback is reno from the start.
        assert_eq!(choice_before(&a, Some(&lo), Some("bbr")), vec!["reno"]);
        assert_eq!(choice_before(&a, Some(&lo), Some("cubic")), vec!["reno"]);
        assert_eq!(
            choice_before(&a, Some(&far), Some("bbr")),
            vec!["cubic", "reno"]
        );
        assert!(choice_before(&a, Some(&far), Some("reno")).is_empty());
        assert!(choice_before(&Policy::System, None, Some("bbr")).is_empty());
        let always = Policy::Always("cubic".into());
        assert_eq!(
            choice_before(&always, Some(&lo), Some("bbr")),
            vec!["cubic"]
        );
    }

    #[test]
    fn accepted_and_dialled_streams_start_under_the_chosen_algorithm() {
        // Whatever the machine's default, a listener set to reno hands reno
        // to the connections it accepts, and a loopback client dialled with
        // connect_data runs reno (the same-host rule) from its first byte.
        let l = TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("bind: {e}"));
        assert!(set_congestion(&l, "reno"));
        assert_eq!(congestion_of(&l).as_deref(), Some("reno"));
        let at = l.local_addr().unwrap_or_else(|e| panic!("addr: {e}"));
        let c = connect_data(&at, Duration::from_secs(5)).unwrap_or_else(|e| panic!("{e}"));
        let (s, _) = l.accept().unwrap_or_else(|e| panic!("accept: {e}"));
        assert_eq!(congestion_of(&s).as_deref(), Some("reno"));
        if matches!(policy(), Policy::Auto) {
            assert_eq!(congestion_of(&c).as_deref(), Some("reno"));
        }
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

    #[test]
    fn a_connection_to_this_host_runs_over_loopback() {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let c = TcpStream::connect(l.local_addr().expect("addr")).expect("connect");
        let (accepted, _) = l.accept().expect("accept");
        assert!(over_loopback(&c));
        assert!(over_loopback(&accepted));
        // The same address on both ends is this host too; another is not.
        assert!(same_host(&addr("10.1.2.3:5"), &addr("10.1.2.3:9")));
        assert!(!same_host(&addr("10.1.2.3:5"), &addr("10.1.2.4:9")));
    }
}
