//! The `MooncakeDistributedStore` class: holds the optional set-up store,
//! a `StoreApi` (an in-process client after `setup`, a dummy client of the
//! host's `mooncake_client` daemon after `setup_dummy`).
//!
//! Its methods live in the sibling modules (one `#[pymethods]` block each).
//! Every call goes through [`MooncakeDistributedStore::run`]: it takes a
//! clone of the store (so a concurrent `close` cannot free it mid-call),
//! answers a store that is not set up with [`Error::not_set_up`], and
//! releases the GIL for the call.

use mooncake_client::{Client, Error, Result, StoreApi};
use parking_lot::RwLock;
use pyo3::prelude::*;
use std::sync::Arc;

/// A set-up store, whichever kind.
pub(crate) type Store = dyn StoreApi;

/// Drop-in replacement for upstream's `mooncake.store.MooncakeDistributedStore`.
#[pyclass(module = "mooncake.store", frozen, subclass)]
pub struct MooncakeDistributedStore {
    store: RwLock<Option<Arc<Store>>>,
}

impl MooncakeDistributedStore {
    /// The in-process client, if set up with `setup`.
    pub(crate) fn current(&self) -> Option<Arc<Client>> {
        self.store().and_then(|s| s.client())
    }

    /// The store, if set up (either way).
    pub(crate) fn store(&self) -> Option<Arc<Store>> {
        self.store.read().clone()
    }

    /// Run `f` on the store with the GIL released; `Err(not set up)` when
    /// there is none.
    pub(crate) fn run<T, F>(&self, py: Python<'_>, f: F) -> Result<T>
    where
        T: Send,
        F: FnOnce(&Store) -> Result<T> + Send,
    {
        let store = self.store().ok_or_else(Error::not_set_up)?;
        py.allow_threads(|| f(&*store))
    }

    /// Replace the store, returning the previous one (to be closed by the caller).
    pub(crate) fn replace(&self, store: Option<Arc<Store>>) -> Option<Arc<Store>> {
        std::mem::replace(&mut *self.store.write(), store)
    }
}

#[pymethods]
impl MooncakeDistributedStore {
    /// A store that is not set up yet; call `setup` (or `setup_dummy`) next.
    #[new]
    fn py_new() -> Self {
        MooncakeDistributedStore {
            store: RwLock::new(None),
        }
    }
}

impl Drop for MooncakeDistributedStore {
    fn drop(&mut self) {
        // Close when this object held the last reference (no capsule or
        // in-flight call shares the client); otherwise the last holder's
        // drop is responsible.
        let last = match self.store.get_mut().take() {
            Some(s) if Arc::strong_count(&s) == 1 => Some(s),
            _ => None,
        };
        if let Some(s) = last {
            Python::with_gil(|py| py.allow_threads(|| s.close()));
        }
    }
}
