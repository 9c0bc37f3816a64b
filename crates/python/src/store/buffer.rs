//! Buffer-protocol plumbing.
//!
//! * [`InputBuffer`]: the C-order bytes of any buffer-protocol value,
//!   exported with `PyBUF_C_CONTIGUOUS`; non-contiguous exporters are copied
//!   through `memoryview(obj).tobytes()` first. The export is held until the
//!   guard is dropped (with the GIL held), so the memory stays valid while
//!   the GIL is released around the client call.
//! * [`BufferHandle`]: the result of `get_buffer`, exporting its own copy of
//!   the value as a 1-D, itemsize 1, format `"b"`, writable buffer.

use super::args::short_repr;
use mooncake_client::StagedValue;
use pyo3::exceptions::{PyBufferError, PyTypeError};
use pyo3::ffi;
use pyo3::prelude::*;
use std::ffi::{c_char, c_int, c_void};
use std::ptr;

/// An exported, C-contiguous view of a Python value.
///
/// Not `Send`: it must be created and dropped with the GIL held. Borrow its
/// bytes with [`InputBuffer::as_slice`] before releasing the GIL.
pub struct InputBuffer {
    view: Box<ffi::Py_buffer>,
}

impl InputBuffer {
    /// Export `obj`'s bytes. Raises `TypeError` when `obj` does not support
    /// the buffer protocol (or cannot be converted to contiguous bytes).
    pub fn acquire(obj: &Bound<'_, PyAny>) -> PyResult<Self> {
        let py = obj.py();
        if let Some(buf) = Self::export(obj) {
            return Ok(buf);
        }
        // SAFETY: `obj` is a valid object and we hold the GIL.
        let supports_buffer = unsafe { ffi::PyObject_CheckBuffer(obj.as_ptr()) } == 1;
        let not_buffer = || {
            PyTypeError::new_err(format!(
                "a bytes-like object (buffer protocol) is required, not '{}'",
                obj.get_type()
                    .name()
                    .map(|n| n.to_string())
                    .unwrap_or_else(|_| short_repr(obj))
            ))
        };
        if !supports_buffer {
            return Err(not_buffer());
        }
        // Non-contiguous exporter: take the C-order byte image.
        let copied = py
            .import("builtins")?
            .getattr("memoryview")?
            .call1((obj,))
            .and_then(|mv| mv.call_method0("tobytes"))
            .map_err(|_| not_buffer())?;
        Self::export(&copied).ok_or_else(not_buffer)
    }

    /// One `PyObject_GetBuffer(obj, PyBUF_C_CONTIGUOUS)` attempt; clears the
    /// Python error on failure.
    fn export(obj: &Bound<'_, PyAny>) -> Option<Self> {
        let mut view: Box<ffi::Py_buffer> = Box::new(ffi::Py_buffer::new());
        // SAFETY: valid object, writable view storage, GIL held.
        let rc =
            unsafe { ffi::PyObject_GetBuffer(obj.as_ptr(), &mut *view, ffi::PyBUF_C_CONTIGUOUS) };
        if rc == 0 {
            Some(InputBuffer { view })
        } else {
            drop(PyErr::take(obj.py()));
            None
        }
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        usize::try_from(self.view.len).unwrap_or(0)
    }

    /// The exported bytes; valid while `self` lives.
    pub fn as_slice(&self) -> &[u8] {
        let len = self.len();
        if len == 0 || self.view.buf.is_null() {
            return &[];
        }
        // SAFETY: the export keeps `buf[..len]` alive and C-contiguous until
        // `PyBuffer_Release` in `drop`.
        unsafe { std::slice::from_raw_parts(self.view.buf as *const u8, len) }
    }
}

impl Drop for InputBuffer {
    fn drop(&mut self) {
        // Dropping happens with the GIL held in practice; `with_gil` makes it
        // sound regardless (it is a no-op when the GIL is already held).
        Python::with_gil(|_| unsafe { ffi::PyBuffer_Release(&mut *self.view) });
    }
}

/// Acquire every element of `values` (TypeError on the first non-buffer).
pub fn acquire_all<'py>(values: &[Bound<'py, PyAny>]) -> PyResult<Vec<InputBuffer>> {
    values.iter().map(InputBuffer::acquire).collect()
}

/// The value returned by `get_buffer`: owns a private copy of the object's
/// bytes (and its staging reservation), and exports them through the buffer
/// protocol as a 1-D, itemsize 1, format `"b"`, writable buffer.
#[pyclass(module = "mooncake.store")]
pub struct BufferHandle {
    /// The bytes; never resized, so exported pointers stay valid.
    data: Vec<u8>,
    /// Keeps the staging reservation of the read until the handle is dropped.
    _staged: Option<StagedValue>,
}

impl BufferHandle {
    /// Wrap a staged read (takes over its bytes and its reservation).
    pub fn new(mut value: StagedValue) -> Self {
        let data = std::mem::take(&mut value.data);
        BufferHandle {
            data,
            _staged: Some(value),
        }
    }
}

static FORMAT_B: &[u8; 2] = b"b\0";

#[pymethods]
impl BufferHandle {
    /// A handle over a private copy of `data` (internal; for tests and tools).
    #[staticmethod]
    fn _from_bytes(data: &Bound<'_, PyAny>) -> PyResult<Self> {
        let input = InputBuffer::acquire(data)?;
        Ok(BufferHandle {
            data: input.as_slice().to_vec(),
            _staged: None,
        })
    }

    /// Address of the first byte.
    fn ptr(&self) -> usize {
        self.data.as_ptr() as usize
    }

    /// Size in bytes.
    fn size(&self) -> usize {
        self.data.len()
    }

    fn __len__(&self) -> usize {
        self.data.len()
    }

    fn __repr__(&self) -> String {
        format!("<BufferHandle ptr={:#x} size={}>", self.ptr(), self.size())
    }

    /// Buffer protocol export (1-D, itemsize 1, format "b", writable).
    ///
    /// # Safety
    /// Called by Python with a valid `view` (or null, which is rejected).
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        if view.is_null() {
            return Err(PyBufferError::new_err("BufferHandle: view is null"));
        }
        let (buf, len) = {
            let mut this = slf.borrow_mut();
            let data = &mut this.data;
            (data.as_mut_ptr(), data.len())
        };
        // SAFETY: `view` is valid; `buf[..len]` is owned by `slf`, whose
        // reference is stored in `view.obj` and kept until release. The
        // vector is never resized, so the pointer stays valid.
        unsafe {
            (*view).obj = slf.into_any().into_ptr();
            (*view).buf = buf as *mut c_void;
            (*view).len = len as ffi::Py_ssize_t;
            (*view).readonly = 0;
            (*view).itemsize = 1;
            (*view).format = if flags & ffi::PyBUF_FORMAT == ffi::PyBUF_FORMAT {
                FORMAT_B.as_ptr() as *mut c_char
            } else {
                ptr::null_mut()
            };
            (*view).ndim = 1;
            (*view).shape = if flags & ffi::PyBUF_ND == ffi::PyBUF_ND {
                &mut (*view).len
            } else {
                ptr::null_mut()
            };
            (*view).strides = if flags & ffi::PyBUF_STRIDES == ffi::PyBUF_STRIDES {
                &mut (*view).itemsize
            } else {
                ptr::null_mut()
            };
            (*view).suboffsets = ptr::null_mut();
            (*view).internal = ptr::null_mut();
        }
        Ok(())
    }

    /// Nothing to free: the format string is static and the data is owned.
    unsafe fn __releasebuffer__(&self, _view: *mut ffi::Py_buffer) {}
}
