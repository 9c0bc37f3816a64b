//! `mooncake.store` bindings (store spec, `shared/spec/store.md`):
//! `MooncakeDistributedStore` and its companion types (`ReplicateConfig`,
//! `SoftPinAction`, `ObjectDataType`, `BufferHandle`, `ErrorCode`).
//!
//! The store class is split over several modules, one `#[pymethods]` block
//! each (pyo3 `multiple-pymethods`): lifecycle, byte-value API, zero-copy
//! API, removal and the Tier 2/3 stubs. Each method converts its arguments,
//! runs the client call with the GIL released
//! ([`MooncakeDistributedStore::run`]) and turns the result into upstream's
//! return value and log line ([`crate::report::Call`]); the rules are the
//! client crate's.

mod bytes_api;
pub(crate) mod capsule;
mod class;
mod config;
mod handle;
mod lifecycle;
mod removal;
mod setup;
mod tier2;
mod zero_copy;

use pyo3::prelude::*;

pub(crate) use class::MooncakeDistributedStore;
pub(crate) use config::{options, ReplicateConfig};

/// Add the store classes (and the `ErrorCode` IntEnum) to the extension module.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<MooncakeDistributedStore>()?;
    m.add_class::<ReplicateConfig>()?;
    m.add_class::<config::SoftPinAction>()?;
    m.add_class::<config::ObjectDataType>()?;
    m.add_class::<handle::BufferHandle>()?;
    m.add("ErrorCode", config::error_code_enum(m.py())?)?;
    Ok(())
}
