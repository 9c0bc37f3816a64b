//! The `MooncakeDistributedStore` class: holds the optional set-up client.
//!
//! Its methods live in the sibling modules (one `#[pymethods]` block each).
//! Every call goes through [`MooncakeDistributedStore::run`]: it takes a
//! clone of the client `Arc` (so a concurrent `close` cannot free it
//! mid-call), answers a store that is not set up with
//! [`Error::not_set_up`], and releases the GIL for the client call.

use mooncake_client::{Client, Error, Result};
use parking_lot::RwLock;
use pyo3::prelude::*;
use std::sync::Arc;

/// Drop-in replacement for upstream's `mooncake.store.MooncakeDistributedStore`.
#[pyclass(module = "mooncake.store", frozen, subclass)]
pub struct MooncakeDistributedStore {
    client: RwLock<Option<Arc<Client>>>,
}

impl MooncakeDistributedStore {
    /// The current client, if set up.
    pub(crate) fn current(&self) -> Option<Arc<Client>> {
        self.client.read().clone()
    }

    /// Run `f` on the client with the GIL released; `Err(not set up)` when
    /// there is none.
    pub(crate) fn run<T, F>(&self, py: Python<'_>, f: F) -> Result<T>
    where
        T: Send,
        F: FnOnce(&Client) -> Result<T> + Send,
    {
        let client = self.current().ok_or_else(Error::not_set_up)?;
        py.allow_threads(|| f(&client))
    }

    /// Replace the client, returning the previous one (to be closed by the caller).
    pub(crate) fn replace(&self, client: Option<Arc<Client>>) -> Option<Arc<Client>> {
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
