//! Module-level tensor helpers of `mooncake.store`, which read and write the
//! stored tensor format: `_tensor_metadata_size()`, `_serialize_tensor(t)` and
//! `_deserialize_tensor(b)`. Invalid input raises `ValueError`.

use super::torch;
use mooncake_tensor::{TensorHeader, HEADER_SIZE};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyTuple};

/// Size of the tensor object header (304).
#[pyfunction]
pub(crate) fn _tensor_metadata_size() -> usize {
    HEADER_SIZE
}

/// `(header_bytes, data_ptr, nbytes, owner)` for a tensor: the 304-byte
/// FULL header, the address and length of its C-ordered host bytes, and the
/// tensor that owns them (keep it alive while using the pointer).
#[pyfunction]
pub(crate) fn _serialize_tensor<'py>(t: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyTuple>> {
    let py = t.py();
    let input = torch::tensor_in(t)?.map_err(|e| PyValueError::new_err(e.reason))?;
    let header = TensorHeader::full(input.source.dtype, &input.source.shape)
        .ok_or_else(|| PyValueError::new_err("tensor shape is too large"))?;
    let bytes = PyBytes::new(py, &header.encode());
    let items: [Bound<'py, PyAny>; 4] = [
        bytes.into_any(),
        input.ptr.into_pyobject(py)?.into_any(),
        header.data_bytes.into_pyobject(py)?.into_any(),
        input.keep,
    ];
    PyTuple::new(py, items)
}

/// A new tensor from a serialized object (header + payload); `ValueError`
/// when the bytes are not one valid tensor object.
#[pyfunction]
pub(crate) fn _deserialize_tensor<'py>(py: Python<'py>, b: &[u8]) -> PyResult<Bound<'py, PyAny>> {
    let h = TensorHeader::decode(b, b.len() as u64).map_err(|e| PyValueError::new_err(e.reason))?;
    let t = torch::empty(py, h.dtype, &h.local_shape)?;
    let n = h.data_bytes as usize;
    if n > 0 {
        let dst = torch::data_ptr(&t)?;
        let start = h.data_offset as usize;
        let src = &b[start..start + n];
        // SAFETY: `dst` is a fresh tensor of exactly `n` bytes; `src` is in bounds
        // (the header was validated against the length of `b`).
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst as *mut u8, n) };
    }
    Ok(t)
}

/// Writable memory for one read result of `nbytes` from the client's result
/// pool (a buffer-protocol object; the block returns to the pool when the
/// last view over it is freed), or `None` when the pool does not serve that
/// size (below its minimum, or turned off).
#[pyfunction]
pub(crate) fn _result_memory(py: Python<'_>, nbytes: u64) -> PyResult<Option<Bound<'_, PyAny>>> {
    match mooncake_client::ResultBlock::for_result(nbytes) {
        Some(block) => Ok(Some(super::pooled::memory_object(py, block)?)),
        None => Ok(None),
    }
}
