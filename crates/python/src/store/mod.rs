//! `mooncake.store` bindings:
//! `MooncakeDistributedStore` and its companion types (`ReplicateConfig`,
//! `SoftPinAction`, `ObjectDataType`, `BufferHandle`, `ErrorCode`,
//! `MooncakeHostMemAllocator`).
//!
//! The store class is split over several modules, one `#[pymethods]` block
//! each (pyo3 `multiple-pymethods`): lifecycle, byte-value API, zero-copy
//! API, removal, sessions and the Tier 2/3 methods. Each method converts its arguments,
//! runs the client call with the GIL released
//! ([`MooncakeDistributedStore::run`]) and turns the result into upstream's
//! return value and log line ([`crate::report::Call`]); the rules are the
//! client crate's.
//!
//! A new method, in four steps:
//!
//! 1. Convert arguments only: `String`/`Vec<String>` keys, [`crate::args::UInt`]
//!    for pointers and sizes, [`crate::args::Flag`] for booleans,
//!    `config: Option<ReplicateConfig>` passed on as [`options`]`(config)`,
//!    [`crate::buffer::ByteView`] for any bytes-like value, or
//!    [`crate::buffer::typed`] for a typed array. A wrong type raises
//!    `TypeError`; nothing else raises.
//! 2. Put every rule (defaults, validation, per-item checks, result shape)
//!    in `mooncake-client`, returning `Result<T>` (one item) or
//!    `Result<Vec<Result<T>>>` (a per-item batch; the outer error fails
//!    the whole call) with an `Error` that carries the code and reason.
//! 3. Call it through `self.run(py, |c| c.method(..))`: the GIL is released
//!    and a store that is not set up answers -600 by itself. Only `Send`
//!    data crosses (slices of a `ByteView`, `usize` addresses); a call that
//!    writes through a caller address is `unsafe` in the client, and the
//!    closure says why it is sound in its `// SAFETY:` comment.
//! 4. Return through a `Call::new(py, "method")`: `.code(Some(&key), r)`
//!    for an `int` (0, a size, a count, 1/0, or the code), `.ok(..)` for a
//!    value or `None`, `.codes(&keys, r)` / `.oks(&keys, r)` for per-item
//!    lists. Each logs exactly one line per failing call.

mod buffer_pool;
mod bytes_api;
pub(crate) mod capsule;
mod class;
mod config;
mod handle;
mod host_mem;
mod lifecycle;
mod removal;
mod replicas;
mod sessions;
mod setup;
mod tasks;
mod tensor;
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
    m.add(
        "BufferHandle",
        crate::buffer::exporting_type::<handle::BufferHandle>(m.py())?,
    )?;
    buffer_pool::register(m)?;
    m.add_class::<host_mem::MooncakeHostMemAllocator>()?;
    m.add("ErrorCode", config::error_code_enum(m.py())?)?;
    tensor::register(m)?;
    replicas::register(m)?;
    tasks::register(m)?;
    Ok(())
}
