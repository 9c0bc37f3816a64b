//! Result tensors over pooled memory: a [`ResultBlock`] of the client's
//! result pool wrapped in a Python object that exports it through the
//! buffer protocol ([`Exporter`]), so `torch.frombuffer` can build the
//! result tensor over it. The tensor's storage holds the object; when the
//! last tensor (or view) using it is freed, the block goes back to the pool.

use super::torch::{torch, torch_dtype};
use crate::buffer::{export_object, take_pending, Exporter};
use mooncake_client::ResultBlock;
use mooncake_tensor::DType;
use pyo3::prelude::*;
use pyo3::sync::GILOnceCell;
use pyo3::types::{PyDict, PyTuple, PyType};
use std::cell::RefCell;
use std::ffi::CStr;
use std::thread::LocalKey;

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

thread_local! {
    static PENDING: RefCell<Option<PooledMemory>> = const { RefCell::new(None) };
}
static SUBCLASS: GILOnceCell<Py<PyType>> = GILOnceCell::new();

// SAFETY: the block is owned by the object and returns to the pool only
// when the object is dropped; its memory never moves.
unsafe impl Exporter for PooledMemory {
    const FORMAT: &'static CStr = c"B";
    const SUBCLASS_NAME: &'static CStr = c"mooncake.store.PooledMemory";

    fn region(slf: &Bound<'_, Self>) -> PyResult<(*mut u8, usize)> {
        let this = slf.get();
        Ok((this.block.ptr() as *mut u8, this.block.len() as usize))
    }

    fn subclass() -> &'static GILOnceCell<Py<PyType>> {
        &SUBCLASS
    }

    fn pending() -> &'static LocalKey<RefCell<Option<Self>>> {
        &PENDING
    }
}

#[pymethods]
impl PooledMemory {
    /// Made only for a result tensor, never from Python.
    #[new]
    fn py_new() -> PyResult<Self> {
        take_pending()
    }

    fn __len__(&self) -> usize {
        self.block.len() as usize
    }
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
    let owner = export_object(py, PooledMemory { block })?;
    let kwargs = PyDict::new(py);
    kwargs.set_item("dtype", torch_dtype(py, DType::Uint8)?)?;
    let bytes = torch(py)?
        .getattr("frombuffer")?
        .call((owner,), Some(&kwargs))?;
    let typed = bytes.call_method1("view", (torch_dtype(py, dtype)?,))?;
    typed.call_method1("reshape", (PyTuple::new(py, shape)?,))
}
