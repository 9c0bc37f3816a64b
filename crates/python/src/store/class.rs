//! The `MooncakeDistributedStore` class: holds the optional set-up client.
//!
//! Its methods live in the sibling modules (one `#[pymethods]` block each).
//! Every method first takes a clone of the client `Arc` (so a concurrent
//! `close` cannot free it mid-call), then releases the GIL for the call.

use super::log;
use mooncake_client::Client;
use mooncake_common::ErrorCode;
use parking_lot::RwLock;
use pyo3::prelude::*;
use std::sync::Arc;

/// Drop-in replacement for upstream's `mooncake.store.MooncakeDistributedStore`.
#[pyclass(module = "mooncake.store", frozen, subclass)]
pub struct MooncakeDistributedStore {
    client: RwLock<Option<Arc<Client>>>,
}

/// The code every `int` method returns on a store that is not set up.
pub const NOT_SET_UP: i32 = ErrorCode::InvalidParams as i32;
/// Detail text for log lines about a store that is not set up.
pub const NOT_SET_UP_DETAIL: &str = "store is not set up (or closed)";

impl MooncakeDistributedStore {
    /// The current client, if set up.
    pub fn current(&self) -> Option<Arc<Client>> {
        self.client.read().clone()
    }

    /// The current client, or log the not-set-up failure for `method`/`key`
    /// and return `None`.
    pub fn client_or_log(
        &self,
        py: Python<'_>,
        method: &str,
        key: Option<&str>,
    ) -> Option<Arc<Client>> {
        let client = self.current();
        if client.is_none() {
            log::fail(py, method, key, NOT_SET_UP as i64, NOT_SET_UP_DETAIL);
        }
        client
    }

    /// Like [`Self::client_or_log`] for batch methods with `n` items.
    pub fn client_or_log_all(&self, py: Python<'_>, method: &str, n: usize) -> Option<Arc<Client>> {
        let client = self.current();
        if client.is_none() {
            log::fail_all(py, method, n, NOT_SET_UP as i64, NOT_SET_UP_DETAIL);
        }
        client
    }

    /// Replace the client, returning the previous one (to be closed by the caller).
    pub fn replace(&self, client: Option<Arc<Client>>) -> Option<Arc<Client>> {
        std::mem::replace(&mut *self.client.write(), client)
    }
}

#[pymethods]
impl MooncakeDistributedStore {
    /// A store that is not set up yet; call `setup` next.
    #[new]
    fn py_new() -> Self {
        MooncakeDistributedStore {
            client: RwLock::new(None),
        }
    }
}

impl Drop for MooncakeDistributedStore {
    fn drop(&mut self) {
        // Close when this object held the last reference (no capsule or
        // in-flight call shares the client); otherwise the last holder's
        // drop is responsible.
        if let Some(client) = self.client.get_mut().take() {
            if Arc::strong_count(&client) == 1 {
                Python::with_gil(|py| py.allow_threads(|| client.close()));
            }
        }
    }
}
