//! Tensor methods of `MooncakeDistributedStore` and the module helpers
//! (unified parallel tensor IO). This module converts only: Python arguments into the
//! values of `mooncake-tensor` and the client's executor (`tensor_io`),
//! results back into torch tensors. torch is imported lazily (`torch`); the
//! duck-typed arguments are read in `args`; `core` holds the two bodies
//! every method funnels into; `methods` lists upstream's surface; `pooled` builds large results over
//! the client's result pool.

mod args;
mod core;
mod helpers;
mod methods;
mod pooled;
mod safetensor;
mod torch;

use pyo3::prelude::*;

/// Add `_tensor_metadata_size`, `_serialize_tensor` and `_deserialize_tensor`.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(helpers::_tensor_metadata_size, m)?)?;
    m.add_function(wrap_pyfunction!(helpers::_result_memory, m)?)?;
    m.add_function(wrap_pyfunction!(helpers::_serialize_tensor, m)?)?;
    m.add_function(wrap_pyfunction!(helpers::_deserialize_tensor, m)?)?;
    Ok(())
}
