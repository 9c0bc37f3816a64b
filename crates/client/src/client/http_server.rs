//! The client's HTTP endpoints (`setup(..., enable_client_http_server=True,
//! client_http_port=P)`, the daemon's `--enable_http_server --http_port`),
//! upstream's routes on `0.0.0.0:P`:
//!
//! * `GET /health`: `{"status": "healthy"|"not_initialized"|
//!   "master_unreachable", "code": N}` (the `health_check()` code), 200
//!   when healthy, else 503.
//! * `GET /metrics`: the client's counters in Prometheus text format
//!   (`mooncake_transfer_read_bytes` / `mooncake_transfer_write_bytes` as
//!   upstream names them, and one `mooncake_client_<counter>` per
//!   `get_client_stats()` entry); 503 once the client is closed.
//! * `GET /metrics/summary`: the same counters as `name: value` lines.
//!
//! A port that cannot be bound is logged and the client runs without the
//! endpoints, as upstream's does. The server stops when the client closes.

use super::{Client, HEALTHY, HEALTH_CLOSED, HEALTH_PING_FAILED};
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use std::fmt::Write as _;
use std::io;
use std::sync::{Arc, Weak};

/// A running server; dropping it stops it.
pub(crate) struct HttpServer {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl HttpServer {
    /// Serve `client`'s endpoints on `0.0.0.0:port` from a thread of its own.
    pub(crate) fn start(port: u16, client: Weak<Client>) -> io::Result<HttpServer> {
        let listener = std::net::TcpListener::bind(("0.0.0.0", port))?;
        listener.set_nonblocking(true)?;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let app = router(client);
        let thread = std::thread::Builder::new()
            .name("mc-client-http".into())
            .spawn(move || {
                rt.block_on(async move {
                    let listener = match tokio::net::TcpListener::from_std(listener) {
                        Ok(l) => l,
                        Err(e) => {
                            tracing::warn!(error = %e, "client HTTP server cannot listen");
                            return;
                        }
                    };
                    let served = axum::serve(listener, app)
                        .with_graceful_shutdown(async {
                            let _ = stopped.await;
                        })
                        .await;
                    if let Err(e) = served {
                        tracing::warn!(error = %e, "client HTTP server stopped");
                    }
                });
            })?;
        tracing::info!(port, "client HTTP server started");
        Ok(HttpServer {
            stop: Some(stop),
            thread: Some(thread),
        })
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            if t.thread().id() != std::thread::current().id() {
                let _ = t.join();
            }
        }
    }
}

fn router(client: Weak<Client>) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .route("/metrics/summary", get(summary))
        .with_state(client)
}

/// The status word of a `health_check()` code.
pub(crate) fn health_status(code: i32) -> &'static str {
    match code {
        HEALTHY => "healthy",
        HEALTH_CLOSED => "not_initialized",
        HEALTH_PING_FAILED => "master_unreachable",
        _ => "unknown",
    }
}

fn live(client: &Weak<Client>) -> Option<Arc<Client>> {
    client.upgrade().filter(|c| !c.is_closed())
}

async fn health(State(client): State<Weak<Client>>) -> Response {
    let code = live(&client).map_or(HEALTH_CLOSED, |c| c.health());
    let body = format!(r#"{{"status":"{}","code":{code}}}"#, health_status(code));
    let status = if code == HEALTHY {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

fn closed() -> Response {
    (StatusCode::SERVICE_UNAVAILABLE, "client not initialized").into_response()
}

/// The counters in Prometheus text format (see the module doc).
pub(crate) fn prometheus_text(stats: &[(&'static str, u64)]) -> String {
    let get = |name: &str| {
        stats
            .iter()
            .filter(|(n, _)| n.starts_with(name))
            .map(|(_, v)| *v)
            .sum::<u64>()
    };
    let mut out = String::new();
    for (name, help, value) in [
        (
            "mooncake_transfer_read_bytes",
            "Total bytes read",
            get("bytes_read_"),
        ),
        (
            "mooncake_transfer_write_bytes",
            "Total bytes written",
            get("bytes_written_"),
        ),
    ] {
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} counter\n{name} {value}"
        );
    }
    for (name, value) in stats {
        let _ = writeln!(
            out,
            "# HELP mooncake_client_{name} get_client_stats()[\"{name}\"]\n\
             # TYPE mooncake_client_{name} counter\nmooncake_client_{name} {value}"
        );
    }
    out
}

async fn metrics(State(client): State<Weak<Client>>) -> Response {
    let Some(c) = live(&client) else {
        return closed();
    };
    let text = prometheus_text(&c.stats());
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        text,
    )
        .into_response()
}

async fn summary(State(client): State<Weak<Client>>) -> Response {
    let Some(c) = live(&client) else {
        return closed();
    };
    let mut text = String::new();
    for (name, value) in c.stats() {
        let _ = writeln!(text, "{name}: {value}");
    }
    (StatusCode::OK, [(header::CONTENT_TYPE, "text/plain")], text).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn health_words_are_upstreams() {
        assert_eq!(health_status(HEALTHY), "healthy");
        assert_eq!(health_status(HEALTH_CLOSED), "not_initialized");
        assert_eq!(health_status(HEALTH_PING_FAILED), "master_unreachable");
    }

    #[test]
    fn prometheus_text_sums_the_paths() {
        let t = prometheus_text(&[
            ("bytes_read_local", 3),
            ("bytes_read_tcp", 4),
            ("bytes_written_tcp", 5),
        ]);
        assert!(t.contains("\nmooncake_transfer_read_bytes 7\n"), "{t}");
        assert!(t.contains("\nmooncake_transfer_write_bytes 5\n"), "{t}");
        assert!(
            t.contains(
                "# TYPE mooncake_client_bytes_read_tcp counter\nmooncake_client_bytes_read_tcp 4\n"
            ),
            "{t}"
        );
    }
}
