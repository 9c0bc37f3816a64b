//! PyO3 bindings: the single extension module `mooncake._native` shared by
//! `mooncake.store`, `mooncake.pg` and the `mooncake_master` entry point.

use pyo3::prelude::*;

mod pg;

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    pg::register(m)?;
    Ok(())
}
