//! PyO3 bindings: the single extension module `mooncake._native` shared by
//! `mooncake.store`, `mooncake.pg` and the `mooncake_master` entry point.

use pyo3::prelude::*;

mod engram;
mod engram_test_client; // TEMP engram test client

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    engram::register(m)?;
    m.add_class::<engram_test_client::EngramTestClient>()?; // TEMP engram test client
    Ok(())
}
