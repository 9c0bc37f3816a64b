//! The client capsule, through pyo3's supported `PyCapsule` API only: the
//! store makes it (`_get_pyclient_capsule()`), and other bindings
//! (`EngramStore`) read the client back out of it: a `PyCapsule` named
//! `mooncake.PyClient.shared_ptr` referencing the store's client, and how
//! an `EngramStore`'s `store` argument is resolved, with its exact
//! `RuntimeError` messages.

use super::class::MooncakeDistributedStore;
use mooncake_client::Client;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::PyCapsule;
use std::ffi::CStr;
use std::sync::Arc;

/// Name of the capsule returned by `_get_pyclient_capsule()` (upstream's name).
pub(crate) const CLIENT_CAPSULE_NAME: &CStr = c"mooncake.PyClient.shared_ptr";

/// A capsule holding a reference to `client`.
pub(crate) fn client_capsule(
    py: Python<'_>,
    client: Arc<Client>,
) -> PyResult<Bound<'_, PyCapsule>> {
    PyCapsule::new(py, client, Some(CLIENT_CAPSULE_NAME.to_owned()))
}

/// The client a capsule made by [`client_capsule`] holds, or `None` when
/// the capsule has another name.
pub(crate) fn client_from_capsule(capsule: &Bound<'_, PyCapsule>) -> Option<Arc<Client>> {
    if capsule.name().ok()? != Some(CLIENT_CAPSULE_NAME) {
        return None;
    }
    // SAFETY: only `client_capsule` creates capsules with this name in this
    // extension, and it always stores an `Arc<Client>`.
    let client: &Arc<Client> = unsafe { capsule.reference::<Arc<Client>>() };
    Some(Arc::clone(client))
}

/// The usable client behind a `store` argument now: `Ok(None)` when there
/// is none (not set up, closed, or the wrapper returns `None`). A
/// `MooncakeDistributedStore` is used directly; any other object's
/// `_get_pyclient_capsule()` is called, and a failure raises EngramStore's
/// `RuntimeError`.
pub(crate) fn store_client(store: &Bound<'_, PyAny>) -> PyResult<Option<Arc<Client>>> {
    let client = if let Ok(s) = store.downcast_exact::<MooncakeDistributedStore>() {
        s.get().current()
    } else {
        let cap = store.call_method0("_get_pyclient_capsule").map_err(|e| {
            let msg = e
                .value(store.py())
                .str()
                .map(|s| s.to_string())
                .unwrap_or_default();
            PyRuntimeError::new_err(format!(
                "Failed to unwrap store wrapper for EngramStore: {msg}"
            ))
        })?;
        if cap.is_none() {
            return Ok(None);
        }
        let cap = cap.downcast::<PyCapsule>().map_err(|_| {
            PyRuntimeError::new_err("store wrapper returned a non-capsule PyClient handle")
        })?;
        Some(client_from_capsule(cap).ok_or_else(|| {
            PyRuntimeError::new_err("store wrapper returned an unexpected PyClient capsule type")
        })?)
    };
    Ok(client.filter(|c| !c.is_closed()))
}
