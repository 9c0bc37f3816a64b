//! The torch glue of the tensor methods: torch is imported lazily on first
//! use (the extension never links libtorch; a missing torch raises
//! `ImportError`), tensors are read as `data_ptr()` + byte count, and result
//! tensors are created with `torch.empty` or as views of caller memory.

use mooncake_tensor::{DType, ReadOutput, TensorError, TensorResult, WriteSource, MAX_NDIM};
use pyo3::exceptions::PyValueError;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::sync::GILOnceCell;
use pyo3::types::{PyDict, PyTuple};
use std::ffi::c_char;

static TORCH: GILOnceCell<Py<PyModule>> = GILOnceCell::new();

/// The `torch` module (imported on first use; `ImportError` if missing).
pub(crate) fn torch(py: Python<'_>) -> PyResult<&Bound<'_, PyModule>> {
    TORCH
        .get_or_try_init(py, || py.import("torch").map(Bound::unbind))
        .map(|m| m.bind(py))
}

/// A tensor input ready to be read by the executor: its bytes start at
/// `ptr`, and `keep` (the contiguous host tensor) keeps them alive.
pub(crate) struct TensorIn<'py> {
    /// Element type and shape.
    pub(crate) source: WriteSource,
    /// `data_ptr()` of the contiguous host tensor.
    pub(crate) ptr: usize,
    /// The tensor the pointer belongs to.
    pub(crate) keep: Bound<'py, PyAny>,
}

fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "object".into())
}

fn py_err(e: PyErr, what: &str) -> TensorError {
    TensorError::invalid(format!("{what}: {e}"))
}

/// Read a tensor argument: any
/// `torch.Tensor` (subclasses such as `nn.Parameter` included) of one of
/// the 15 dtypes and at most 8 dims; gradients are detached, non-CPU
/// tensors copied to host and non-contiguous ones made contiguous.
pub(crate) fn tensor_in<'py>(obj: &Bound<'py, PyAny>) -> PyResult<TensorResult<TensorIn<'py>>> {
    let py = obj.py();
    let torch = torch(py)?;
    let tensor_type = torch.getattr("Tensor")?;
    if !obj.is_instance(&tensor_type)? {
        return Ok(Err(TensorError::invalid(format!(
            "expected a torch.Tensor, got {}",
            type_name(obj)
        ))));
    }
    Ok(inspect(obj))
}

fn inspect<'py>(obj: &Bound<'py, PyAny>) -> TensorResult<TensorIn<'py>> {
    let dtype_name: String = obj
        .getattr("dtype")
        .and_then(|d| d.str())
        .map(|s| s.to_string())
        .map_err(|e| py_err(e, "cannot read the tensor dtype"))?;
    let dtype = DType::from_torch_name(&dtype_name)?;
    let ndim: usize = obj
        .getattr("ndim")
        .and_then(|n| n.extract())
        .map_err(|e| py_err(e, "cannot read the tensor ndim"))?;
    if ndim > MAX_NDIM {
        return Err(TensorError::invalid(format!(
            "tensor has {ndim} dims; at most 8 are supported"
        )));
    }
    let mut t = obj
        .call_method0("detach")
        .map_err(|e| py_err(e, "detach failed"))?;
    let on_cpu: bool = t
        .getattr("device")
        .and_then(|d| d.getattr("type"))
        .and_then(|s| s.extract::<String>())
        .map(|s| s == "cpu")
        .map_err(|e| py_err(e, "cannot read the tensor device"))?;
    if !on_cpu {
        t = t
            .call_method0("cpu")
            .map_err(|e| py_err(e, "copy to host failed"))?;
    }
    let contiguous: bool = t
        .call_method0("is_contiguous")
        .and_then(|c| c.extract())
        .map_err(|e| py_err(e, "is_contiguous failed"))?;
    if !contiguous {
        t = t
            .call_method0("contiguous")
            .map_err(|e| py_err(e, "contiguous failed"))?;
    }
    let shape: Vec<u64> = t
        .getattr("shape")
        .and_then(|s| s.extract())
        .map_err(|e| py_err(e, "cannot read the tensor shape"))?;
    let ptr: usize = t
        .call_method0("data_ptr")
        .and_then(|p| p.extract())
        .map_err(|e| py_err(e, "data_ptr failed"))?;
    Ok(TensorIn {
        source: WriteSource::tensor(dtype, &shape),
        ptr,
        keep: t,
    })
}

/// `torch.<dtype>`.
pub(crate) fn torch_dtype<'py>(py: Python<'py>, dtype: DType) -> PyResult<Bound<'py, PyAny>> {
    torch(py)?.getattr(dtype.torch_name())
}

/// A fresh, uninitialised host tensor of `dtype` and `shape`.
pub(crate) fn empty<'py>(
    py: Python<'py>,
    dtype: DType,
    shape: &[u64],
) -> PyResult<Bound<'py, PyAny>> {
    let kwargs = PyDict::new(py);
    kwargs.set_item("dtype", torch_dtype(py, dtype)?)?;
    let shape = PyTuple::new(py, shape)?;
    torch(py)?.getattr("empty")?.call((shape,), Some(&kwargs))
}

/// `data_ptr()` of a tensor.
pub(crate) fn data_ptr(t: &Bound<'_, PyAny>) -> PyResult<usize> {
    t.call_method0("data_ptr")?.extract()
}

/// A tensor viewing the payload of the read output `out` (its `nbytes`
/// bytes, as its `dtype` and `shape`) in caller memory at `ptr` (the
/// `_into` result; the caller keeps the memory alive).
///
/// # Safety
/// `ptr..ptr+out.nbytes` must stay valid and writable while the tensor is used.
pub(crate) unsafe fn view_of<'py>(
    py: Python<'py>,
    ptr: usize,
    out: &ReadOutput,
) -> PyResult<Bound<'py, PyAny>> {
    let (dtype, shape) = (out.dtype, &out.shape[..]);
    if out.nbytes == 0 {
        return empty(py, dtype, shape);
    }
    let len = ffi::Py_ssize_t::try_from(out.nbytes)
        .map_err(|_| PyValueError::new_err("tensor is too large"))?;
    // SAFETY: the caller vouches for the memory; the memoryview does not own it.
    let mv =
        unsafe { ffi::PyMemoryView_FromMemory(ptr as *mut c_char, len, crate::pybuf::PYBUF_WRITE) };
    // SAFETY: a new reference or null with an exception set.
    let mv = unsafe { Bound::from_owned_ptr_or_err(py, mv) }?;
    tensor_over_buffer(&mv, dtype, shape)
}

/// The tensor of `dtype` and `shape` over the bytes `buffer` exports:
/// `torch.frombuffer(buffer, dtype=torch.uint8).view(dtype).reshape(shape)`;
/// the tensor keeps `buffer` alive.
pub(crate) fn tensor_over_buffer<'py>(
    buffer: &Bound<'py, PyAny>,
    dtype: DType,
    shape: &[u64],
) -> PyResult<Bound<'py, PyAny>> {
    let py = buffer.py();
    let kwargs = PyDict::new(py);
    kwargs.set_item("dtype", torch_dtype(py, DType::Uint8)?)?;
    let bytes = torch(py)?
        .getattr("frombuffer")?
        .call((buffer,), Some(&kwargs))?;
    let typed = bytes.call_method1("view", (torch_dtype(py, dtype)?,))?;
    typed.call_method1("reshape", (PyTuple::new(py, shape)?,))
}
