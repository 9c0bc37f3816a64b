//! The standalone HTTP metadata server (`mooncake_master::meta_server`):
//! the `mooncake_http_metadata_server` command and the server object behind
//! `mooncake.http_metadata_server.KVBootstrapServer`.

use mooncake_master::meta_server::{self, MetaServerError};
use parking_lot::Mutex;
use pyo3::exceptions::{PyOSError, PyRuntimeError};
use pyo3::prelude::*;
use std::time::Duration;

/// Serve on `host:port` until SIGINT/SIGTERM and return the exit code (1,
/// with the reason on stderr, when it cannot start). The GIL is released
/// for the whole run.
#[pyfunction]
pub(crate) fn run_http_metadata_server(
    py: Python<'_>,
    host: String,
    port: u16,
    log_level: String,
) -> i32 {
    py.allow_threads(|| meta_server::run_http_metadata_server(&host, port, &log_level))
}

/// A metadata server running in this process until `stop()`.
#[pyclass(module = "mooncake._native", name = "MetadataServer")]
pub(crate) struct PyMetadataServer {
    inner: Mutex<Option<meta_server::MetadataServer>>,
    port: u16,
}

#[pymethods]
impl PyMetadataServer {
    /// Bind `host:port` (0: a free port) and start serving; `OSError` when
    /// the address cannot be bound.
    #[new]
    fn new(py: Python<'_>, host: String, port: u16) -> PyResult<Self> {
        let started = py.allow_threads(|| {
            let auth = mooncake_common::auth::AuthKey::from_env()?;
            meta_server::MetadataServer::start(&host, port, auth)
        });
        match started {
            Ok(s) => Ok(PyMetadataServer {
                port: s.local_addr().port(),
                inner: Mutex::new(Some(s)),
            }),
            Err(e @ MetaServerError::Bind { .. }) => Err(PyOSError::new_err(e.to_string())),
            Err(e) => Err(PyRuntimeError::new_err(e.to_string())),
        }
    }

    /// The port it listens on.
    #[getter]
    fn port(&self) -> u16 {
        self.port
    }

    /// Whether it is still serving.
    fn running(&self) -> bool {
        self.inner.lock().as_ref().is_some_and(|s| s.running())
    }

    /// Wait until it stops, at most `timeout` seconds (`None`: for ever);
    /// true when it has stopped. The GIL is released meanwhile; a signal
    /// handler's exception (`KeyboardInterrupt`) ends the wait.
    #[pyo3(signature = (timeout=None))]
    fn wait(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<bool> {
        let timeout = timeout.map(|t| Duration::from_secs_f64(t.max(0.0)));
        let step = Duration::from_millis(200);
        let deadline = timeout.map(|t| std::time::Instant::now() + t);
        loop {
            // Short waits, so that `stop()` from another thread (which
            // takes the server out) is never blocked behind this one.
            let stopped = py.allow_threads(|| match self.inner.lock().as_ref() {
                Some(s) => s.wait(Some(step)),
                None => true,
            });
            if stopped {
                return Ok(true);
            }
            if deadline.is_some_and(|d| std::time::Instant::now() >= d) {
                return Ok(false);
            }
            py.check_signals()?;
        }
    }

    /// Stop serving and close its connections.
    fn stop(&self, py: Python<'_>) {
        let taken = self.inner.lock().take();
        if let Some(mut s) = taken {
            py.allow_threads(|| s.stop());
        }
    }
}
