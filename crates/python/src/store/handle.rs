//! `BufferHandle`, the result of `get_buffer` (store spec, "Byte-value
//! API"): a private copy of the value that stays readable after `remove`,
//! `close` or eviction, exported through the buffer protocol as a 1-D,
//! itemsize 1, format `"b"`, writable buffer.

use crate::buffer::{export_bytes, ByteView};
use mooncake_client::StagedValue;
use pyo3::exceptions::PyBufferError;
use pyo3::ffi;
use pyo3::prelude::*;
use std::ffi::c_int;

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
        // SAFETY: `view` is valid (checked non-null, given by Python); the
        // memory is owned by `slf`, never moves or shrinks, and lives as long
        // as the reference the view keeps.
        unsafe { export_bytes(view, slf.into_any(), buf, len, flags, c"b") };
        Ok(())
    }

    /// Nothing to free: the format string is static and the data is owned.
    ///
    /// # Safety
    /// Called by Python with the view `__getbuffer__` filled.
    unsafe fn __releasebuffer__(&self, _view: *mut ffi::Py_buffer) {}
}
