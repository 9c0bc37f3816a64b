//! PyO3 bindings: the single extension module `mooncake._native` shared by
//! `mooncake.store`, `mooncake.engine`, `mooncake.pg` and the
//! `mooncake_master` and `mooncake_client` entry points.
//!
//! This crate converts only: Python arguments into the domain crates'
//! types, and their results into upstream's return values, log lines and
//! exceptions. Every rule (defaults, validation, config semantics, batch
//! result shapes) lives once in `mooncake-client`, `mooncake-transfer`
//! (its `engine` module), `mooncake-engram` or `mooncake-pg`. The shared helpers:
//!
//! - `args`: argument types (`UInt`, `Flag`, `arg0`/`key` aliases);
//! - `family`: one `#[pymethods]` body stamped out as several methods;
//! - `pybuf`: the C buffer protocol (outside the 3.10 stable ABI);
//! - `buffer`: buffer-protocol input and output over it;
//! - `report`: a domain error to a return code plus one log line
//!   (store), or to the documented exception (EngramStore);
//! - `store::capsule`: the client capsule shared with EngramStore.

use pyo3::prelude::*;

/// Every Rust allocation of the extension (the store client, and the master
/// and daemons it hosts) comes from mimalloc (`mooncake_common::alloc`).
#[global_allocator]
static ALLOC: mooncake_common::alloc::Allocator = mooncake_common::alloc::Allocator;

mod args;
mod buffer;
mod engine;
mod engram;
mod family;
mod meta;
mod pg;
mod pybuf;
mod report;
mod store;

/// Run the master in this process with `argv` (program name first) and
/// return its exit code. The GIL is released for the whole run.
#[pyfunction]
fn run_master(py: Python<'_>, argv: Vec<String>) -> i32 {
    py.allow_threads(|| mooncake_master::server::run_master(argv))
}

/// Bytes of a size string (`"4GB"`, `"512 MiB"`, `"1.5g"`, `"infinite"`;
/// see `mooncake_common::size::parse_size`); `ValueError` otherwise.
#[pyfunction]
fn parse_size(text: &str) -> PyResult<u64> {
    mooncake_common::size::parse_size(text)
        .ok_or_else(|| pyo3::exceptions::PyValueError::new_err(format!("invalid size: {text:?}")))
}

/// Run the standalone store daemon (`mooncake_client`) in this process with
/// `argv` (program name first) and return its exit code. The GIL is
/// released for the whole run.
#[pyfunction]
fn run_client(py: Python<'_>, argv: Vec<String>) -> i32 {
    py.allow_threads(|| mooncake_standalone::run_client(argv))
}

/// Run `transfer_engine_bench` in this process with `argv` (program name
/// first) and return its exit code. The GIL is released for the whole run.
#[pyfunction]
fn run_transfer_engine_bench(py: Python<'_>, argv: Vec<String>) -> i32 {
    py.allow_threads(|| mooncake_bench::run_transfer_engine_bench(argv))
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_function(wrap_pyfunction!(run_master, m)?)?;
    m.add_function(wrap_pyfunction!(parse_size, m)?)?;
    m.add_function(wrap_pyfunction!(meta::run_http_metadata_server, m)?)?;
    m.add_class::<meta::PyMetadataServer>()?;
    m.add_function(wrap_pyfunction!(run_client, m)?)?;
    m.add_function(wrap_pyfunction!(run_transfer_engine_bench, m)?)?;
    store::register(m)?;
    engine::register(m)?;
    engram::register(m)?;
    pg::register(m)?;
    Ok(())
}
