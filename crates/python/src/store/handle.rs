//! `BufferHandle`, the result of `get_buffer`: a private copy of the value that stays readable after `remove`,
//! `close` or eviction, exported through the buffer protocol as a 1-D,
//! itemsize 1, format `"b"`, writable buffer. Python's `BufferHandle` is
//! the exporting subclass of this class ([`crate::buffer::Exporter`]).

use crate::buffer::{export_object, exporter_new, ByteView, Exporter};
use mooncake_client::StagedValue;
use pyo3::prelude::*;
use std::ffi::CStr;

/// The value returned by `get_buffer`: owns a private copy of the object's
/// bytes (and its staging reservation), and exports them through the buffer
/// protocol as a 1-D, itemsize 1, format `"b"`, writable buffer.
#[pyclass(module = "mooncake.store", name = "_BufferHandleBase", subclass)]
pub struct BufferHandle {
    /// The bytes; never resized, so exported pointers stay valid.
    data: Vec<u8>,
    /// Keeps the staging reservation of the read until the handle is dropped.
    _staged: Option<StagedValue>,
}

impl BufferHandle {
    /// A `BufferHandle` over a staged read (takes over its bytes and its
    /// reservation).
    pub(crate) fn wrap(py: Python<'_>, mut value: StagedValue) -> PyResult<Bound<'_, PyAny>> {
        let data = std::mem::take(&mut value.data);
        let handle = BufferHandle {
            data,
            _staged: Some(value),
        };
        export_object(py, handle)
    }
}

// SAFETY: the bytes are a Vec owned by the object, never resized or moved
// out, so the region is valid and writable while the object lives.
unsafe impl Exporter for BufferHandle {
    const FORMAT: &'static CStr = c"b";
    const SUBCLASS_NAME: &'static CStr = c"mooncake.store.BufferHandle";

    fn region(slf: &Bound<'_, Self>) -> PyResult<(*mut u8, usize)> {
        let mut this = slf.try_borrow_mut()?;
        Ok((this.data.as_mut_ptr(), this.data.len()))
    }
}

exporter_new!(BufferHandle);

#[pymethods]
impl BufferHandle {
    /// A handle over a private copy of `data` (internal; for tests and tools).
    #[staticmethod]
    fn _from_bytes<'py>(data: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        let input = ByteView::new(data)?;
        let handle = BufferHandle {
            data: input.as_slice().to_vec(),
            _staged: None,
        };
        export_object(data.py(), handle)
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
}
