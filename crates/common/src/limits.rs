//! Connection admission for every listener of the stack: a cap
//! on open connections in total and per peer, an idle timeout, the back-off
//! an accept loop takes when the process runs out of descriptors, the
//! blocking accept loop itself, the set of open connections a server closes
//! when it stops, and the check a connection pool makes before reusing an
//! idle connection.
//!
//! It lives here, beside the framing, because the master (RPC and HTTP),
//! the data server and the same-host mapping server all apply the same
//! rules; each listener picks its own numbers.

use crate::tcp_tune::tune_data_stream;
use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

/// Caps of one listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnLimits {
    /// Most connections open at once.
    pub max_total: usize,
    /// Most connections open at once from one peer address.
    pub max_per_peer: usize,
    /// Close a connection that stays silent this long (`None`: never).
    pub idle_timeout: Option<Duration>,
}

impl ConnLimits {
    /// Caps scaled to this process's descriptor limit (`RLIMIT_NOFILE`),
    /// so that one listener can never take more than a quarter of the
    /// descriptors, nor one peer more than half of the listener's share;
    /// `max_total` and `max_per_peer` bound them from above.
    pub fn scaled_to_fd_limit(max_total: usize, max_per_peer: usize, idle: Duration) -> ConnLimits {
        let share = (fd_limit() / 4).max(8);
        let total = max_total.min(share).max(1);
        ConnLimits {
            max_total: total,
            max_per_peer: max_per_peer.min((total / 2).max(1)).max(1),
            idle_timeout: Some(idle).filter(|d| !d.is_zero()),
        }
    }

    /// Override the caps from environment variables `<prefix>_MAX_CONNS`,
    /// `<prefix>_MAX_CONNS_PER_PEER` and `<prefix>_IDLE_TIMEOUT_S` (0 = no
    /// idle timeout); unparsable values are ignored.
    pub fn with_env(mut self, prefix: &str) -> ConnLimits {
        let num = |name: &str| -> Option<u64> {
            std::env::var(format!("{prefix}_{name}"))
                .ok()
                .and_then(|v| v.trim().parse().ok())
        };
        if let Some(n) = num("MAX_CONNS").filter(|n| *n > 0) {
            self.max_total = usize::try_from(n).unwrap_or(usize::MAX);
        }
        if let Some(n) = num("MAX_CONNS_PER_PEER").filter(|n| *n > 0) {
            self.max_per_peer = usize::try_from(n).unwrap_or(usize::MAX);
        }
        if let Some(s) = num("IDLE_TIMEOUT_S") {
            self.idle_timeout = Some(Duration::from_secs(s)).filter(|d| !d.is_zero());
        }
        self
    }
}

/// This process's soft descriptor limit (1024 if it cannot be read).
pub fn fd_limit() -> usize {
    use nix::sys::resource::{getrlimit, Resource, RLIM_INFINITY};
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Err(_) => 1024,
        Ok((soft, _)) if soft == RLIM_INFINITY => usize::MAX / 8,
        Ok((soft, _)) => usize::try_from(soft).unwrap_or(usize::MAX / 8),
    }
}

/// A pooled connection idle for less than this is reused without asking
/// the kernel whether the peer closed it (listeners close connections only
/// after tens of seconds of silence; this keeps a syscall off hot paths).
pub const POOL_RECHECK_AFTER: Duration = Duration::from_secs(1);

/// Whether a connection idle in a pool since `since` may be reused: younger
/// than `max_idle`, and, once idle for [`POOL_RECHECK_AFTER`], not closed
/// by its peer meanwhile.
pub fn reusable<S: std::os::fd::AsFd>(
    sock: &S,
    since: std::time::Instant,
    max_idle: Duration,
) -> bool {
    let idle = since.elapsed();
    idle < max_idle && (idle < POOL_RECHECK_AFTER || !peer_closed(sock))
}

/// Whether the peer of an idle pooled connection has closed it (or sent
/// something unexpected): a pool checks this before reusing a connection.
pub fn peer_closed<S: std::os::fd::AsFd>(sock: &S) -> bool {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    // A peer's close makes the socket readable (EOF); hang-ups and errors
    // are always reported.
    let mut fds = [PollFd::new(sock.as_fd(), PollFlags::POLLIN)];
    // Readable, hung up, an error, or the poll itself failing: not reusable.
    poll(&mut fds, PollTimeout::ZERO) != Ok(0)
}

/// Why a connection was not admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The listener has `max_total` connections open.
    #[error("connection limit reached")]
    Total,
    /// This peer has `max_per_peer` connections open.
    #[error("per-peer connection limit reached")]
    PerPeer,
}

#[derive(Debug, Default)]
struct Counts {
    total: usize,
    per_peer: HashMap<IpAddr, usize>,
}

/// Counts the open connections of one listener.
#[derive(Debug)]
pub struct ConnTracker {
    limits: ConnLimits,
    counts: Mutex<Counts>,
}

impl ConnTracker {
    /// A tracker enforcing `limits`.
    pub fn new(limits: ConnLimits) -> Arc<ConnTracker> {
        Arc::new(ConnTracker {
            limits,
            counts: Mutex::new(Counts::default()),
        })
    }

    /// The caps this tracker enforces.
    pub fn limits(&self) -> ConnLimits {
        self.limits
    }

    fn counts(&self) -> MutexGuard<'_, Counts> {
        // Counting cannot leave the map inconsistent; a panic elsewhere
        // while holding the lock does not make the numbers wrong.
        self.counts.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Admit one connection from `peer`; the permit releases the slot when
    /// dropped (when the connection closes).
    pub fn try_acquire(self: &Arc<Self>, peer: IpAddr) -> Result<ConnPermit, Refusal> {
        let mut c = self.counts();
        if c.total >= self.limits.max_total {
            return Err(Refusal::Total);
        }
        let n = c.per_peer.entry(peer).or_insert(0);
        if *n >= self.limits.max_per_peer {
            return Err(Refusal::PerPeer);
        }
        *n += 1;
        c.total += 1;
        Ok(ConnPermit {
            tracker: Arc::clone(self),
            peer,
        })
    }

    /// Connections open now.
    pub fn open(&self) -> usize {
        self.counts().total
    }
}

/// One admitted connection; dropping it frees the slot.
#[derive(Debug)]
pub struct ConnPermit {
    tracker: Arc<ConnTracker>,
    peer: IpAddr,
}

impl Drop for ConnPermit {
    fn drop(&mut self) {
        let mut c = self.tracker.counts();
        c.total = c.total.saturating_sub(1);
        if let Some(n) = c.per_peer.get_mut(&self.peer) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                c.per_peer.remove(&self.peer);
            }
        }
    }
}

/// The pause an accept loop takes after an error: growing from 10 ms to
/// 1 s while the process is out of descriptors or memory (`EMFILE`,
/// `ENFILE`, `ENOBUFS`, `ENOMEM`), none after an error of one connection.
#[derive(Debug, Clone, Default)]
pub struct AcceptBackoff {
    delay: Option<Duration>,
}

impl AcceptBackoff {
    const FIRST: Duration = Duration::from_millis(10);
    const MAX: Duration = Duration::from_secs(1);

    /// How long to sleep after `e` before accepting again (`None`: retry now).
    pub fn on_error(&mut self, e: &io::Error) -> Option<Duration> {
        let starved = matches!(
            e.raw_os_error(),
            Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
        );
        if !starved {
            return None;
        }
        let next = match self.delay {
            None => Self::FIRST,
            Some(d) => (d * 2).min(Self::MAX),
        };
        self.delay = Some(next);
        Some(next)
    }

    /// An accept succeeded: the next error starts the back-off afresh.
    pub fn on_success(&mut self) {
        self.delay = None;
    }

    /// The connection a blocking `accept` of `server` returned, or `None`
    /// after an error, once the back-off pause (if any: logged) has been
    /// slept.
    pub fn settle<T>(&mut self, accepted: io::Result<T>, server: &str) -> Option<T> {
        match accepted {
            Ok(c) => {
                self.on_success();
                Some(c)
            }
            Err(e) => {
                if let Some(pause) = self.on_error(&e) {
                    tracing::warn!(error = %e, pause_ms = pause.as_millis() as u64, "{server}: accept failed; backing off");
                    std::thread::sleep(pause);
                }
                None
            }
        }
    }
}

/// A blocking accept loop: accept with `accept` until `stopped()` holds
/// (checked each time `accept` returns, so a connection made to wake the
/// loop ends it), taking the [`AcceptBackoff`] pause after an error, and
/// hand every accepted connection to `admit`. `server` names the loop in
/// the back-off's log line.
pub fn accept_until<C>(
    server: &str,
    stopped: impl Fn() -> bool,
    mut accept: impl FnMut() -> io::Result<C>,
    mut admit: impl FnMut(C),
) {
    let mut backoff = AcceptBackoff::default();
    loop {
        let accepted = accept();
        if stopped() {
            return;
        }
        if let Some(c) = backoff.settle(accepted, server) {
            admit(c);
        }
    }
}

/// [`accept_until`] on a data listener (until `stopped` is set): each
/// connection must get a permit from `tracker` (a refused one goes to
/// `refused`, then is closed), is tuned for bulk data (no Nagle, the
/// [`tune_data_stream`] rule) and goes to `admit` with its permit.
pub fn accept_data_conns(
    server: &str,
    listener: &TcpListener,
    stopped: &AtomicBool,
    tracker: &Arc<ConnTracker>,
    refused: impl Fn(SocketAddr, Refusal),
    mut admit: impl FnMut(TcpStream, SocketAddr, ConnPermit),
) {
    accept_until(
        server,
        || stopped.load(Ordering::Acquire),
        || listener.accept(),
        |(sock, peer)| {
            let permit = match tracker.try_acquire(peer.ip()) {
                Ok(p) => p,
                Err(why) => return refused(peer, why),
            };
            let _ = sock.set_nodelay(true);
            tune_data_stream(&sock);
            admit(sock, peer, permit);
        },
    );
}

/// A connection another thread can shut down (both directions).
pub trait ShutdownBoth {
    /// Shut both directions down, ignoring errors.
    fn shutdown_both(&self);
}

impl ShutdownBoth for TcpStream {
    fn shutdown_both(&self) {
        let _ = self.shutdown(Shutdown::Both);
    }
}

impl ShutdownBoth for UnixStream {
    fn shutdown_both(&self) {
        let _ = self.shutdown(Shutdown::Both);
    }
}

/// The open connections of a server, held weakly: one goes away with the
/// thread that serves it, and [`OpenConns::shutdown_all`] closes the rest
/// when the server stops.
pub struct OpenConns<S> {
    conns: Mutex<Vec<Weak<S>>>,
}

impl<S> Default for OpenConns<S> {
    fn default() -> Self {
        OpenConns {
            conns: Mutex::new(Vec::new()),
        }
    }
}

impl<S: ShutdownBoth> OpenConns<S> {
    fn list(&self) -> MutexGuard<'_, Vec<Weak<S>>> {
        // A list of weak references stays consistent whatever panicked.
        self.conns.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Track `s` (and forget the connections that are gone).
    pub fn track(&self, s: &Arc<S>) {
        let mut g = self.list();
        g.retain(|w| w.strong_count() > 0);
        g.push(Arc::downgrade(s));
    }

    /// Shut down every tracked connection still open, and forget them all.
    pub fn shutdown_all(&self) {
        for c in self.list().drain(..) {
            if let Some(c) = c.upgrade() {
                c.shutdown_both();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([127, 0, 0, last])
    }

    #[test]
    fn caps_total_and_per_peer_and_releases_on_drop() {
        let t = ConnTracker::new(ConnLimits {
            max_total: 3,
            max_per_peer: 2,
            idle_timeout: None,
        });
        let a1 = t.try_acquire(ip(1)).expect("a1");
        let _a2 = t.try_acquire(ip(1)).expect("a2");
        assert_eq!(t.try_acquire(ip(1)).err(), Some(Refusal::PerPeer));
        let b1 = t.try_acquire(ip(2)).expect("b1");
        assert_eq!(t.try_acquire(ip(3)).err(), Some(Refusal::Total));
        assert_eq!(t.open(), 3);
        drop(a1);
        let _a3 = t.try_acquire(ip(1)).expect("a3");
        drop(b1);
        assert_eq!(t.open(), 2);
        let _c = t.try_acquire(ip(3)).expect("c");
    }

    #[test]
    fn scaled_limits_leave_descriptors_free() {
        let l = ConnLimits::scaled_to_fd_limit(1 << 20, 1 << 20, Duration::from_secs(60));
        assert!(l.max_total <= fd_limit() / 4 || l.max_total == 8);
        assert!(l.max_per_peer <= l.max_total);
        assert_eq!(l.idle_timeout, Some(Duration::from_secs(60)));
        let l = ConnLimits::scaled_to_fd_limit(10, 100, Duration::ZERO);
        assert!(l.max_total <= 10 && l.max_per_peer <= 5);
        assert_eq!(l.idle_timeout, None);
    }

    #[test]
    fn closed_peers_are_noticed() {
        use std::io::Write;
        let (mut a, b) = std::os::unix::net::UnixStream::pair().expect("pair");
        assert!(!peer_closed(&b));
        a.write_all(b"x").expect("write");
        assert!(peer_closed(&b), "unexpected data also disqualifies");
        let (a, b) = std::os::unix::net::UnixStream::pair().expect("pair");
        drop(a);
        assert!(peer_closed(&b));
    }

    #[test]
    fn pooled_connections_are_rechecked_once_idle_a_while() {
        let now = std::time::Instant::now();
        let Some(old) = now.checked_sub(POOL_RECHECK_AFTER * 2) else {
            return;
        };
        let max = Duration::from_secs(30);
        let (a, b) = std::os::unix::net::UnixStream::pair().expect("pair");
        assert!(reusable(&b, now, max) && reusable(&b, old, max));
        assert!(!reusable(&b, old, POOL_RECHECK_AFTER));
        drop(a);
        // Just used: trusted without a syscall; idle a while: checked.
        assert!(reusable(&b, now, max));
        assert!(!reusable(&b, old, max));
    }

    #[test]
    fn backoff_grows_only_when_starved() {
        let mut b = AcceptBackoff::default();
        let aborted = io::Error::from_raw_os_error(libc::ECONNABORTED);
        assert_eq!(b.on_error(&aborted), None);
        let emfile = io::Error::from_raw_os_error(libc::EMFILE);
        assert_eq!(b.on_error(&emfile), Some(Duration::from_millis(10)));
        assert_eq!(b.on_error(&emfile), Some(Duration::from_millis(20)));
        for _ in 0..20 {
            b.on_error(&emfile);
        }
        assert_eq!(
            b.on_error(&io::Error::from_raw_os_error(libc::ENFILE)),
            Some(Duration::from_secs(1))
        );
        b.on_success();
        assert_eq!(b.on_error(&emfile), Some(Duration::from_millis(10)));
    }

    #[test]
    fn settle_passes_a_connection_and_drops_an_error() {
        let mut b = AcceptBackoff::default();
        b.on_error(&io::Error::from_raw_os_error(libc::EMFILE));
        assert_eq!(b.settle(Ok(7), "test"), Some(7));
        // The success reset the back-off.
        assert_eq!(
            b.on_error(&io::Error::from_raw_os_error(libc::EMFILE)),
            Some(Duration::from_millis(10))
        );
        let aborted = io::Error::from_raw_os_error(libc::ECONNABORTED);
        assert_eq!(b.settle::<u8>(Err(aborted), "test"), None);
    }

    #[test]
    fn accept_until_admits_until_stopped_and_skips_errors() {
        let mut script = vec![Ok(1), Err(io::Error::other("one connection")), Ok(2), Ok(3)];
        script.reverse();
        let calls = std::cell::Cell::new(0);
        let mut admitted = Vec::new();
        accept_until(
            "test",
            || calls.get() > 3,
            || {
                calls.set(calls.get() + 1);
                script.pop().unwrap_or(Ok(0))
            },
            |c| admitted.push(c),
        );
        // The fourth accept returned after the stop: not admitted.
        assert_eq!(admitted, [1, 2]);
    }

    #[test]
    fn open_conns_shut_down_the_live_ones() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let client = TcpStream::connect(l.local_addr().expect("addr")).expect("connect");
        let (served, _) = l.accept().expect("accept");
        let conns = OpenConns::default();
        let served = Arc::new(served);
        conns.track(&served);
        let gone = Arc::new(TcpStream::connect(l.local_addr().expect("addr")).expect("connect"));
        conns.track(&gone);
        drop(gone);
        conns.shutdown_all();
        let mut buf = [0u8; 1];
        assert_eq!(io::Read::read(&mut &client, &mut buf).expect("eof"), 0);
        assert!(conns.list().is_empty());
    }
}
