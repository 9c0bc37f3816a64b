//! PyO3 bindings: the single extension module `mooncake._native` shared by
//! `mooncake.store`, `mooncake.pg` and the `mooncake_master` entry point.

use pyo3::prelude::*;

pub mod store;

/// Run the master in this process with `argv` (program name first) and
/// return its exit code. The GIL is released for the whole run.
#[pyfunction]
fn run_master(py: Python<'_>, argv: Vec<String>) -> i32 {
    py.allow_threads(|| mooncake_master::server::run_master(argv))
}
mod engram;
mod pg;

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_function(wrap_pyfunction!(run_master, m)?)?;
    store::register(m)?;
    engram::register(m)?;
    pg::register(m)?;
    Ok(())
}
