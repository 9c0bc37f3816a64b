//! Pooled connections to peers, one type for every stream kind.
//!
//! A [`ConnPool`] keeps idle connections per endpoint and per cluster
//! token; a connection is reused only while younger than [`POOL_IDLE_MAX`]
//! and not closed by the peer (servers close connections idle for 60 s),
//! youngest first. A caller that sees a connection fail drops it together
//! with the endpoint's idle ones ([`ConnPool::forget`]): they lead to the
//! same peer, which is likely gone.
//!
//! For TCP, [`ConnPool::tcp`] takes an idle connection or dials a new one
//! (no Nagle, IO timeouts, the handshake of the service it is for) and
//! records what the endpoint's connections run over ([`Link`]), which
//! decides how finely a transfer to it is split.

use mooncake_common::framing::{client_handshake, Service};
use mooncake_common::limits::reusable;
use mooncake_common::tcp_tune::{congestion_of, connect_data, over_loopback, paces};
use mooncake_common::AuthKey;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::io;
use std::net::{TcpStream, ToSocketAddrs};
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

/// A pooled connection idle longer than this is closed rather than
/// reused (well inside the servers' idle timeout).
pub const POOL_IDLE_MAX: Duration = Duration::from_secs(30);
/// Longest wait for a TCP connection to be accepted.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// What an endpoint's TCP connections run over, from its newest one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Link {
    /// Their congestion control paces the sender.
    pub paced: bool,
    /// They run over the loopback device (the peer is on this host).
    pub loopback: bool,
}

/// The fingerprint of the token a connection authenticated with (0: none).
fn token_id(key: Option<&AuthKey>) -> u64 {
    key.map_or(0, |k| k.fingerprint())
}

/// An idle connection, when it went idle, and its token's fingerprint.
struct Idle<S> {
    conn: S,
    since: Instant,
    token: u64,
}

/// Idle connections of one stream kind, by endpoint and cluster token.
pub struct ConnPool<S> {
    idle: Mutex<HashMap<String, Vec<Idle<S>>>>,
    /// Idle connections kept per endpoint.
    max_idle: usize,
    /// Per TCP endpoint, from its newest connection.
    links: Mutex<HashMap<String, Link>>,
}

impl<S: AsFd> ConnPool<S> {
    /// An empty pool that keeps at most `max_idle` idle connections per
    /// endpoint.
    pub fn new(max_idle: usize) -> Self {
        ConnPool {
            idle: Mutex::new(HashMap::new()),
            max_idle,
            links: Mutex::new(HashMap::new()),
        }
    }

    /// The youngest idle connection to `endpoint` made with `key`'s token
    /// that is still usable; stale ones found on the way are closed.
    pub fn take(&self, endpoint: &str, key: Option<&AuthKey>) -> Option<S> {
        let token = token_id(key);
        loop {
            let found = self.idle.lock().get_mut(endpoint).and_then(|v| {
                let at = v.iter().rposition(|c| c.token == token)?;
                Some(v.swap_remove(at))
            })?;
            if reusable(&found.conn, found.since, POOL_IDLE_MAX) {
                return Some(found.conn);
            }
        }
    }

    /// Return a healthy connection for reuse (closed instead when the
    /// endpoint already has `max_idle` idle ones).
    pub fn give(&self, endpoint: &str, key: Option<&AuthKey>, conn: S) {
        let mut g = self.idle.lock();
        let entry = match g.get_mut(endpoint) {
            Some(v) => v,
            None => g.entry(endpoint.to_string()).or_default(),
        };
        if entry.len() < self.max_idle {
            entry.push(Idle {
                conn,
                since: Instant::now(),
                token: token_id(key),
            });
        }
    }

    /// Close the idle connections to `endpoint` (a connection to it
    /// failed).
    pub fn forget(&self, endpoint: &str) {
        self.idle.lock().remove(endpoint);
    }

    /// What connections to `endpoint` run over (`None` before the first).
    pub fn link(&self, endpoint: &str) -> Option<Link> {
        self.links.lock().get(endpoint).copied()
    }
}

impl ConnPool<TcpStream> {
    /// An idle connection to `endpoint` (`host:port`), or a new one that
    /// completed `service`'s handshake with `key`; reads and writes on it
    /// time out after `io_timeout`. Every address the name resolves to is
    /// tried in turn.
    pub fn tcp(
        &self,
        endpoint: &str,
        service: Service,
        key: Option<&AuthKey>,
        io_timeout: Duration,
    ) -> io::Result<TcpStream> {
        if let Some(s) = self.take(endpoint, key) {
            return Ok(s);
        }
        let mut last = io::Error::new(io::ErrorKind::NotFound, "the name resolves to no address");
        for addr in endpoint.to_socket_addrs()? {
            match connect_data(&addr, CONNECT_TIMEOUT.min(io_timeout)) {
                Ok(mut s) => {
                    s.set_nodelay(true)?;
                    let link = Link {
                        paced: congestion_of(&s).is_none_or(|cc| paces(&cc)),
                        loopback: over_loopback(&s),
                    };
                    if self.links.lock().insert(endpoint.to_string(), link) != Some(link) {
                        tracing::debug!(peer = endpoint, ?link, "connection path");
                    }
                    s.set_read_timeout(Some(io_timeout))?;
                    s.set_write_timeout(Some(io_timeout))?;
                    client_handshake(&mut s, service, key)?;
                    return Ok(s);
                }
                Err(e) => last = e,
            }
        }
        Err(last)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::net::tcp_pair;
    use std::net::TcpListener;

    #[test]
    fn idle_connections_are_kept_per_endpoint_and_token_up_to_the_cap() {
        let key = AuthKey::new("a cluster token").unwrap_or_else(|e| panic!("key: {e}"));
        let pool = ConnPool::new(2);
        let mut servers = Vec::new();
        for _ in 0..3 {
            let (c, s) = tcp_pair();
            servers.push(s);
            pool.give("a:1", None, c);
        }
        // The third was closed: the cap is two per endpoint.
        assert!(pool.take("a:1", None).is_some());
        assert!(pool.take("a:1", None).is_some());
        assert!(pool.take("a:1", None).is_none());
        // A connection made with one token never serves another.
        let (c, s) = tcp_pair();
        servers.push(s);
        pool.give("a:1", Some(&key), c);
        assert!(pool.take("a:1", None).is_none());
        assert!(pool.take("b:1", Some(&key)).is_none());
        assert!(pool.take("a:1", Some(&key)).is_some());
        // Forgetting an endpoint closes its idle connections.
        let (c, s) = tcp_pair();
        servers.push(s);
        pool.give("a:1", None, c);
        pool.forget("a:1");
        assert!(pool.take("a:1", None).is_none());
    }

    #[test]
    fn a_connection_its_peer_closed_is_not_reused_once_it_was_idle_a_while() {
        let pool = ConnPool::new(4);
        let (c, s) = tcp_pair();
        drop(s);
        // Idle long enough that the pool checks the peer before reuse.
        pool.idle
            .lock()
            .entry("a:1".into())
            .or_default()
            .push(Idle {
                conn: c,
                since: Instant::now() - Duration::from_secs(5),
                token: 0,
            });
        assert!(pool.take("a:1", None).is_none());
        assert!(pool.idle.lock().get("a:1").is_none_or(Vec::is_empty));
    }

    #[test]
    fn dialing_records_what_the_endpoint_runs_over() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("bind: {e}"));
        let ep = l.local_addr().unwrap_or_else(|e| panic!("{e}")).to_string();
        let pool: ConnPool<TcpStream> = ConnPool::new(4);
        assert_eq!(pool.link(&ep), None);
        // The server side answers the handshake.
        let server = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap_or_else(|e| panic!("accept: {e}"));
            mooncake_common::framing::server_handshake(&mut s, Service::Data, None)
        });
        let s = pool.tcp(&ep, Service::Data, None, Duration::from_secs(5));
        assert!(s.is_ok(), "{s:?}");
        assert!(server.join().is_ok_and(|r| r.is_ok()));
        let link = pool.link(&ep).unwrap_or_else(|| panic!("no link recorded"));
        assert!(link.loopback);
        // Nothing listens there any more: the dial fails with the cause.
        let dead = "127.0.0.1:1";
        assert!(pool
            .tcp(dead, Service::Data, None, Duration::from_secs(1))
            .is_err());
        assert_eq!(pool.link(dead), None);
    }
}
