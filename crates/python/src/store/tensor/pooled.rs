//! Result tensors over pooled memory: a [`ResultBlock`] of the client's
//! result pool wrapped in a Python object that exports it through the
//! buffer protocol ([`Exporter`]), so `torch.frombuffer` can build the
//! result tensor over it. The tensor's storage holds the object; when the
//! last tensor (or view) using it is freed, the block goes back to the pool.

use super::torch::tensor_over_buffer;
use crate::buffer::{export_object, exporter_new, Exporter};
use mooncake_client::ResultBlock;
use mooncake_tensor::DType;
use pyo3::prelude::*;
use std::ffi::CStr;

/// Owner of one pooled result block, exported as a 1-D, itemsize 1,
/// format `"B"`, writable buffer of the result's size.
#[pyclass(
    module = "mooncake.store",
    name = "_PooledMemoryBase",
    frozen,
    subclass
)]
pub(crate) struct PooledMemory {
    block: ResultBlock,
}

// SAFETY: the block is owned by the object and returns to the pool only
// when the object is dropped; its memory never moves.
unsafe impl Exporter for PooledMemory {
    const FORMAT: &'static CStr = c"B";
    const SUBCLASS_NAME: &'static CStr = c"mooncake.store.PooledMemory";

    fn region(slf: &Bound<'_, Self>) -> PyResult<(*mut u8, usize)> {
        let this = slf.get();
        Ok((this.block.ptr() as *mut u8, this.block.len() as usize))
    }
}

exporter_new!(PooledMemory);

#[pymethods]
impl PooledMemory {
    fn __len__(&self) -> usize {
        self.block.len() as usize
    }
}

/// The result tensor of `dtype` and `shape` over `block` (which holds its
/// bytes); the tensor keeps the block alive.
pub(crate) fn tensor_over<'py>(
    py: Python<'py>,
    block: ResultBlock,
    dtype: DType,
    shape: &[u64],
) -> PyResult<Bound<'py, PyAny>> {
    let owner = memory_object(py, block)?;
    tensor_over_buffer(&owner, dtype, shape)
}

/// `block` as a Python object exporting its bytes (the object owns it).
pub(crate) fn memory_object(py: Python<'_>, block: ResultBlock) -> PyResult<Bound<'_, PyAny>> {
    export_object(py, PooledMemory { block })
}
