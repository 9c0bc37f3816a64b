//! Connection admission for the master's HTTP servers (metadata and
//! admin): an [`axum::serve::Listener`] that admits each connection
//! against the listener's caps (in total and per peer address), backs off
//! when accepting fails for lack of descriptors, and wraps each connection
//! so that it is closed after the idle timeout without traffic.

use mooncake_common::limits::{AcceptBackoff, ConnLimits, ConnPermit, ConnTracker};
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::{Instant, Sleep};

/// A TCP listener that admits connections against [`ConnLimits`].
#[derive(Debug)]
pub struct LimitedListener {
    inner: TcpListener,
    tracker: Arc<ConnTracker>,
    backoff: AcceptBackoff,
    what: &'static str,
}

impl LimitedListener {
    /// Wrap a bound listener; `what` names it in logs.
    pub fn new(inner: TcpListener, limits: ConnLimits, what: &'static str) -> LimitedListener {
        LimitedListener {
            inner,
            tracker: ConnTracker::new(limits),
            backoff: AcceptBackoff::default(),
            what,
        }
    }
}

impl axum::serve::Listener for LimitedListener {
    type Io = LimitedStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (LimitedStream, SocketAddr) {
        loop {
            let (sock, peer) = match self.inner.accept().await {
                Ok(c) => {
                    self.backoff.on_success();
                    c
                }
                Err(e) => {
                    if let Some(pause) = self.backoff.on_error(&e) {
                        tracing::warn!(server = self.what, error = %e, "accept failed; backing off");
                        tokio::time::sleep(pause).await;
                    }
                    continue;
                }
            };
            match self.tracker.try_acquire(peer.ip()) {
                Ok(permit) => {
                    let idle = self.tracker.limits().idle_timeout;
                    return (LimitedStream::new(sock, idle, permit), peer);
                }
                Err(why) => {
                    tracing::warn!(server = self.what, %peer, reason = %why, "refusing connection");
                }
            }
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }
}

/// Serves `app` on `listener`, admitting connections against `limits`,
/// until the task is dropped (runtime shutdown) or the listener fails;
/// `what` names the server in logs.
pub(crate) async fn serve(
    listener: TcpListener,
    limits: ConnLimits,
    what: &'static str,
    app: axum::Router,
) {
    let listener = LimitedListener::new(listener, limits, what);
    if let Err(e) = axum::serve(listener, app).await {
        tracing::error!("{what} HTTP server stopped: {e}");
    }
}

/// An admitted connection: fails its pending read or write with
/// `TimedOut` once it has moved no bytes for the idle timeout, and frees
/// its admission slot when dropped.
#[derive(Debug)]
pub struct LimitedStream {
    inner: TcpStream,
    idle: Option<(Duration, Pin<Box<Sleep>>)>,
    _permit: ConnPermit,
}

impl LimitedStream {
    fn new(inner: TcpStream, idle: Option<Duration>, permit: ConnPermit) -> LimitedStream {
        LimitedStream {
            inner,
            idle: idle.map(|d| (d, Box::pin(tokio::time::sleep(d)))),
            _permit: permit,
        }
    }

    /// Record traffic: the idle clock starts again.
    fn touched(&mut self) {
        if let Some((d, sleep)) = &mut self.idle {
            sleep.as_mut().reset(Instant::now() + *d);
        }
    }

    /// With the inner operation pending: `TimedOut` once idle too long.
    fn idle_expired(&mut self, cx: &mut Context<'_>) -> bool {
        match &mut self.idle {
            Some((_, sleep)) => sleep.as_mut().poll(cx).is_ready(),
            None => false,
        }
    }

    /// The inner operation's poll result `r`: noted as activity when it is
    /// ready; while it is pending, `TimedOut` once idle too long.
    fn watch<T>(&mut self, cx: &mut Context<'_>, r: Poll<io::Result<T>>) -> Poll<io::Result<T>> {
        match r {
            Poll::Ready(r) => {
                self.touched();
                Poll::Ready(r)
            }
            Poll::Pending if self.idle_expired(cx) => Poll::Ready(Err(timed_out())),
            Poll::Pending => Poll::Pending,
        }
    }
}

fn timed_out() -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, "connection idle too long")
}

impl AsyncRead for LimitedStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let me = &mut *self;
        let r = Pin::new(&mut me.inner).poll_read(cx, buf);
        me.watch(cx, r)
    }
}

impl AsyncWrite for LimitedStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let me = &mut *self;
        let r = Pin::new(&mut me.inner).poll_write(cx, buf);
        me.watch(cx, r)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let me = &mut *self;
        let r = Pin::new(&mut me.inner).poll_write_vectored(cx, bufs);
        me.watch(cx, r)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::serve::Listener;
    use tokio::io::AsyncReadExt;

    fn limits(total: usize, per_peer: usize, idle_ms: u64) -> ConnLimits {
        ConnLimits {
            max_total: total,
            max_per_peer: per_peer,
            idle_timeout: Some(Duration::from_millis(idle_ms)),
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn caps_connections_and_closes_idle_ones() {
        let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = l.local_addr().expect("addr");
        let mut ll = LimitedListener::new(l, limits(8, 2, 300), "test");
        let server = tokio::spawn(async move {
            let mut held = Vec::new();
            for _ in 0..2 {
                held.push(ll.accept().await.0);
            }
            // A third connection from the same peer is refused (closed);
            // accept() only returns once a slot frees up.
            let pending = tokio::spawn(async move { ll.accept().await.1 });
            let mut first = held.remove(0);
            let mut b = [0u8; 1];
            let r = first.read(&mut b).await;
            pending.abort();
            (r.map_err(|e| e.kind()), held)
        });
        let _c1 = TcpStream::connect(addr).await.expect("c1");
        let _c2 = TcpStream::connect(addr).await.expect("c2");
        let mut c3 = TcpStream::connect(addr).await.expect("c3");
        let mut b = [0u8; 1];
        // The refused connection is closed by the server.
        let n = tokio::time::timeout(Duration::from_secs(20), c3.read(&mut b))
            .await
            .expect("refused connection must be closed");
        assert!(matches!(n, Ok(0) | Err(_)));
        // The idle server side times out instead of waiting forever.
        let (r, _held) = tokio::time::timeout(Duration::from_secs(20), server)
            .await
            .expect("idle read must end")
            .expect("join");
        assert_eq!(r, Err(io::ErrorKind::TimedOut));
    }
}
