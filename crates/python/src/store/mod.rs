//! `mooncake.store` bindings: `MooncakeDistributedStore` and its companion
//! types (`ReplicateConfig`, `SoftPinAction`, `ObjectDataType`,
//! `BufferHandle`, `ErrorCode`).
//!
//! The store class is split over several modules, one `#[pymethods]` block
//! each (pyo3 `multiple-pymethods`): lifecycle, byte-value API, zero-copy
//! API, removal and the Tier 2/3 stubs.

mod args;
mod batch;
mod buffer;
mod bytes_api;
mod class;
mod config;
mod lifecycle;
mod log;
mod removal;
mod setup;
mod tensor;
mod tier2;
mod zero_copy;

use mooncake_client::Client;
use pyo3::prelude::*;
use pyo3::types::PyCapsule;
use std::sync::Arc;

pub use buffer::BufferHandle;
pub use class::MooncakeDistributedStore;
pub use config::{ObjectDataType, ReplicateConfig, SoftPinAction};

/// Name of the capsule returned by `_get_pyclient_capsule()` (upstream's name).
pub const CLIENT_CAPSULE_NAME: &str = "mooncake.PyClient.shared_ptr";

/// Add the store classes (and the `ErrorCode` IntEnum) to the extension module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<MooncakeDistributedStore>()?;
    m.add_class::<ReplicateConfig>()?;
    m.add_class::<SoftPinAction>()?;
    m.add_class::<ObjectDataType>()?;
    m.add_class::<BufferHandle>()?;
    m.add("ErrorCode", config::error_code_enum(m.py())?)?;
    tensor::register(m)?;
    Ok(())
}

/// The set-up client behind a store object, for other bindings (e.g. `EngramStore`).
///
/// Accepts a `MooncakeDistributedStore` directly, or any object whose
/// `_get_pyclient_capsule()` returns a capsule named
/// [`CLIENT_CAPSULE_NAME`]. Returns `None` when the store is not set up,
/// when the object is neither, or when the wrapper method fails; callers
/// that need to tell these apart should inspect the object themselves.
pub fn client_from_store(obj: &Bound<'_, PyAny>) -> Option<Arc<Client>> {
    if let Ok(store) = obj.downcast::<MooncakeDistributedStore>() {
        return store.get().current();
    }
    let capsule = obj.call_method0("_get_pyclient_capsule").ok()?;
    client_from_capsule(capsule.downcast::<PyCapsule>().ok()?)
}

/// The client held by a capsule made by `_get_pyclient_capsule()`, or `None`
/// if the capsule has another name.
pub fn client_from_capsule(capsule: &Bound<'_, PyCapsule>) -> Option<Arc<Client>> {
    let name = capsule.name().ok()??;
    if name.to_bytes() != CLIENT_CAPSULE_NAME.as_bytes() {
        return None;
    }
    // SAFETY: only `_get_pyclient_capsule` creates capsules with this name in
    // this extension, and it always stores an `Arc<Client>`.
    let client: &Arc<Client> = unsafe { capsule.reference::<Arc<Client>>() };
    Some(Arc::clone(client))
}
