//! The standalone HTTP metadata server (`mooncake_http_metadata_server`,
//! and `KVBootstrapServer` in Python): the service the master embeds with
//! `--enable_http_metadata_server` ([`crate::http_meta`]: the same routes,
//! codes and `rpc_meta` rule), over its own in-memory [`MetadataKv`], with
//! the master's default connection limits, on a runtime thread of its own.
//! With a cluster token in `MC_AUTH_TOKEN`/`MC_AUTH_TOKEN_FILE`, writes must
//! be signed as on the master.

use std::net::SocketAddr;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use mooncake_common::auth::{AuthError, AuthKey};
use parking_lot::{Condvar, Mutex};

use crate::config::MasterConfig;
use crate::http_meta::metadata_router;
use crate::listener::LimitedListener;
use crate::metadata_kv::MetadataKv;
use crate::server::host_port;
use mooncake_common::binary::{self, StopSignals};

/// Why the standalone metadata server could not start.
#[derive(Debug, thiserror::Error)]
pub enum MetaServerError {
    /// The address could not be bound (in use, not local, no permission).
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// `host:port` as asked.
        addr: String,
        /// The bind error.
        source: std::io::Error,
    },
    /// The runtime or its thread could not be started.
    #[error("cannot start the server's runtime: {0}")]
    Runtime(#[source] std::io::Error),
    /// The cluster token in the environment could not be loaded.
    #[error("{0}")]
    Auth(#[from] AuthError),
}

/// Set once the server has stopped serving (for any reason).
#[derive(Default)]
struct Done {
    stopped: Mutex<bool>,
    cv: Condvar,
}

impl Done {
    fn set(&self) {
        *self.stopped.lock() = true;
        self.cv.notify_all();
    }
}

/// A running standalone metadata server; stopped by [`MetadataServer::stop`]
/// or when dropped.
pub struct MetadataServer {
    local: SocketAddr,
    kv: Arc<MetadataKv>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
    done: Arc<Done>,
}

impl MetadataServer {
    /// Bind `host:port` (port 0: a free one) and serve the metadata API
    /// there; `auth` makes writes require a signed challenge.
    pub fn start(
        host: &str,
        port: u16,
        auth: Option<AuthKey>,
    ) -> Result<MetadataServer, MetaServerError> {
        let addr = host_port(host, port);
        let bind_err = |source| MetaServerError::Bind {
            addr: addr.clone(),
            source,
        };
        let std_listener = std::net::TcpListener::bind(&addr).map_err(bind_err)?;
        std_listener.set_nonblocking(true).map_err(bind_err)?;
        let local = std_listener.local_addr().map_err(bind_err)?;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(MetaServerError::Runtime)?;
        let kv = Arc::new(MetadataKv::new());
        let done = Arc::new(Done::default());
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let router = metadata_router(Arc::clone(&kv), auth);
        let limits = MasterConfig::default().http_limits();
        let finished = Arc::clone(&done);
        let thread = std::thread::Builder::new()
            .name("mc-metadata".into())
            .spawn(move || {
                rt.block_on(async move {
                    match tokio::net::TcpListener::from_std(std_listener) {
                        Ok(l) => {
                            let listener = LimitedListener::new(l, limits, "metadata");
                            tokio::select! {
                                r = axum::serve(listener, router) => {
                                    if let Err(e) = r {
                                        tracing::error!("HTTP metadata server stopped: {e}");
                                    }
                                }
                                _ = stop_rx => {}
                            }
                        }
                        Err(e) => tracing::error!("HTTP metadata server cannot listen: {e}"),
                    }
                });
                rt.shutdown_timeout(Duration::from_secs(1));
                finished.set();
            })
            .map_err(MetaServerError::Runtime)?;
        Ok(MetadataServer {
            local,
            kv,
            stop: Some(stop_tx),
            thread: Some(thread),
            done,
        })
    }

    /// The address it listens on (the bound port when 0 was asked).
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// The store behind it.
    pub fn store(&self) -> &Arc<MetadataKv> {
        &self.kv
    }

    /// Whether it is still serving.
    pub fn running(&self) -> bool {
        !*self.done.stopped.lock()
    }

    /// Wait until it stops, at most `timeout` (`None`: for ever); true when
    /// it has stopped.
    pub fn wait(&self, timeout: Option<Duration>) -> bool {
        let mut stopped = self.done.stopped.lock();
        match timeout {
            None => {
                while !*stopped {
                    self.done.cv.wait(&mut stopped);
                }
            }
            Some(t) => {
                let deadline = std::time::Instant::now() + t;
                while !*stopped {
                    if self.done.cv.wait_until(&mut stopped, deadline).timed_out() {
                        break;
                    }
                }
            }
        }
        *stopped
    }

    /// Stop serving (open connections are closed) and join the thread.
    pub fn stop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for MetadataServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// `mooncake_http_metadata_server`: serve on `host:port` until SIGINT or
/// SIGTERM; `log_level` is a log filter (`info`, `debug`, ...;
/// `MC_LOG_LEVEL` overrides it). Returns the exit code: 0 after a signal,
/// 1 when it cannot start (the reason on stderr).
pub fn run_http_metadata_server(host: &str, port: u16, log_level: &str) -> i32 {
    binary::start_logging(log_level, None, &[]);
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("ERROR: cannot start the runtime: {e}");
            return 1;
        }
    };
    rt.block_on(async {
        let mut stop = match StopSignals::install() {
            Ok(s) => s,
            Err(e) => {
                eprintln!("ERROR: failed to install signal handlers: {e}");
                return 1;
            }
        };
        let server = match AuthKey::from_env()
            .map_err(MetaServerError::from)
            .and_then(|auth| MetadataServer::start(host, port, auth))
        {
            Ok(s) => s,
            Err(e) => {
                eprintln!("ERROR: mooncake_http_metadata_server: {e}");
                return 1;
            }
        };
        tracing::info!(
            "HTTP Metadata Server started on {}",
            host_port(host, server.local_addr().port())
        );
        let done = Arc::clone(&server.done);
        let stopped = tokio::task::spawn_blocking(move || {
            let mut s = done.stopped.lock();
            while !*s {
                done.cv.wait(&mut s);
            }
        });
        let code = tokio::select! {
            _ = stop.recv() => 0,
            _ = stopped => 1,
        };
        let mut server = server;
        let _ = tokio::task::spawn_blocking(move || server.stop()).await;
        tracing::info!("HTTP Metadata Server stopped");
        code
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(addr: SocketAddr, req: &str) -> String {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(addr).expect("connect");
        s.write_all(req.as_bytes()).expect("write");
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        out
    }

    #[test]
    fn serves_stops_and_refuses_a_taken_port() {
        let mut server = MetadataServer::start("127.0.0.1", 0, None).expect("start");
        let addr = server.local_addr();
        let put = call(
            addr,
            "PUT /metadata?key=k HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nConnection: close\r\n\r\nv1",
        );
        assert!(put.starts_with("HTTP/1.1 200"), "{put}");
        assert_eq!(server.store().get("k").as_deref(), Some(&b"v1"[..]));
        let taken = MetadataServer::start("127.0.0.1", addr.port(), None);
        match taken {
            Err(MetaServerError::Bind { source, .. }) => {
                assert_eq!(source.kind(), std::io::ErrorKind::AddrInUse)
            }
            Err(e) => panic!("unexpected error {e}"),
            Ok(_) => panic!("bound a port in use"),
        }
        assert!(server.running());
        assert!(!server.wait(Some(Duration::from_millis(10))));
        server.stop();
        assert!(!server.running());
        assert!(server.wait(None));
        assert!(std::net::TcpStream::connect(addr).is_err());
    }
}
