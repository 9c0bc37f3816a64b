//! Result tensors over pooled memory: a [`ResultBlock`] of the client's
//! result pool wrapped in a Python object that exports it through the
//! buffer protocol, so `torch.frombuffer` can build the result tensor over
//! it. The tensor's storage holds the object; when the last tensor (or view)
//! using it is freed, the block goes back to the pool.

use super::torch::{torch, torch_dtype};
use crate::buffer::export_bytes;
use mooncake_client::ResultBlock;
use mooncake_tensor::DType;
use pyo3::exceptions::PyBufferError;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};
use std::ffi::c_int;

/// Owner of one pooled result block, exported as a 1-D, itemsize 1,
/// format `"B"`, writable buffer of the result's size.
#[pyclass(module = "mooncake.store", frozen)]
pub(crate) struct PooledMemory {
    block: ResultBlock,
}

#[pymethods]
impl PooledMemory {
    fn __len__(&self) -> usize {
        self.block.len() as usize
    }

    /// Buffer protocol export.
    ///
    /// # Safety
    /// Called by Python with a valid `view` (or null, which is rejected).
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        if view.is_null() {
            return Err(PyBufferError::new_err("PooledMemory: view is null"));
        }
        let (buf, len) = {
            let this = slf.get();
            (this.block.ptr() as *mut u8, this.block.len() as usize)
        };
        // SAFETY: `view` is valid (checked non-null, given by Python); the
        // memory is owned by `slf`, never moves or shrinks, and lives as long
        // as the reference the view keeps.
        unsafe { export_bytes(view, slf.into_any(), buf, len, flags, c"B") };
        Ok(())
    }

    /// Nothing to free per view: the format string is static and the block
    /// is owned by the object.
    ///
    /// # Safety
    /// Called by Python with the view `__getbuffer__` filled.
    unsafe fn __releasebuffer__(&self, _view: *mut ffi::Py_buffer) {}
}

/// The result tensor of `dtype` and `shape` over `block` (which holds its
/// bytes): `torch.frombuffer(...).view(dtype).reshape(shape)`; the tensor
/// keeps the block alive.
pub(crate) fn tensor_over<'py>(
    py: Python<'py>,
    block: ResultBlock,
    dtype: DType,
    shape: &[u64],
) -> PyResult<Bound<'py, PyAny>> {
    let owner = Bound::new(py, PooledMemory { block })?;
    let kwargs = PyDict::new(py);
    kwargs.set_item("dtype", torch_dtype(py, DType::Uint8)?)?;
    let bytes = torch(py)?
        .getattr("frombuffer")?
        .call((owner,), Some(&kwargs))?;
    let typed = bytes.call_method1("view", (torch_dtype(py, dtype)?,))?;
    typed.call_method1("reshape", (PyTuple::new(py, shape)?,))
}
