//! `BufferHandle`, the result of `get_buffer` (store spec, "Byte-value
//! API"): a private copy of the value that stays readable after `remove`,
//! `close` or eviction, exported through the buffer protocol as a 1-D,
//! itemsize 1, format `"b"`, writable buffer.

use crate::buffer::ByteView;
use mooncake_client::StagedValue;
use pyo3::exceptions::PyBufferError;
use pyo3::ffi;
use pyo3::prelude::*;
use std::ffi::{c_char, c_int, c_void};
use std::ptr;

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
    pub(crate) fn new(mut value: StagedValue) -> Self {
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
        let input = ByteView::new(data)?;
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
    ///
    /// # Safety
    /// Called by Python with the view `__getbuffer__` filled.
    unsafe fn __releasebuffer__(&self, _view: *mut ffi::Py_buffer) {}
}
