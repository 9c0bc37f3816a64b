//! Buffer-protocol input and output. Input goes through pyo3's supported
//! [`PyBuffer`] only; the one hand-filled `Py_buffer` is [`export_bytes`],
//! shared by every object that exports memory it owns:
//!
//! * [`ByteView`]: the C-order bytes of any buffer-protocol object,
//!   whatever its element format (store spec, "Byte-value API": a value is
//!   any buffer-protocol object and is stored as its C-order byte image;
//!   non-contiguous inputs are copied first).
//! * [`typed`] / [`typed_out`]: a C-contiguous `PyBuffer<T>` of a typed
//!   array (ids as `i64`, tables and outputs as `f32`, `u16` bits or
//!   [`Half`]), with its elements as a slice ([`elements`], [`half_bits`]).
//! * [`uninit_bytes`]: a new `bytes` object to be filled with the GIL
//!   released (a read copies its value exactly once).
//! * [`export_bytes`]: the one output side by hand — a writable 1-D byte
//!   view of memory a Python object owns (`BufferHandle`, pooled tensor
//!   results), for their `__getbuffer__`.
//!
//! A view holds the exporter's buffer until dropped, so the memory stays
//! valid while the GIL is released around a client call; `PyBuffer` is
//! `Send`, and releases the buffer with the GIL on drop.

use crate::args::short_repr;
use pyo3::buffer::{Element, PyBuffer};
use pyo3::exceptions::{PyBufferError, PyTypeError};
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes};
use std::ffi::CStr;

/// The C-contiguous bytes of a buffer-protocol object.
pub(crate) struct ByteView(PyBuffer<u8>);

impl ByteView {
    /// The C-order bytes of `obj`. `bytes` and `bytearray` are used in
    /// place; any other exporter is viewed as bytes
    /// (`memoryview(obj).cast("B")`), and a non-contiguous or non-native
    /// layout is copied (`memoryview(obj).tobytes()`). `TypeError` when
    /// `obj` does not support the buffer protocol.
    pub(crate) fn new(obj: &Bound<'_, PyAny>) -> PyResult<Self> {
        if obj.is_exact_instance_of::<PyBytes>() || obj.is_exact_instance_of::<PyByteArray>() {
            return PyBuffer::<u8>::get(obj).map(ByteView);
        }
        let py = obj.py();
        let not_buffer = || {
            let kind = obj
                .get_type()
                .name()
                .map(|n| n.to_string())
                .unwrap_or_else(|_| short_repr(obj));
            PyTypeError::new_err(format!(
                "a bytes-like object (buffer protocol) is required, not '{kind}'"
            ))
        };
        let view = py
            .import("builtins")?
            .getattr("memoryview")?
            .call1((obj,))
            .map_err(|_| not_buffer())?;
        let contiguous: bool = view.getattr("c_contiguous")?.extract()?;
        let flat = match contiguous {
            true => view.call_method1("cast", ("B",)).ok(),
            false => None,
        };
        let flat = match flat {
            Some(f) => f,
            None => view.call_method0("tobytes").map_err(|_| not_buffer())?,
        };
        PyBuffer::<u8>::get(&flat).map(ByteView)
    }

    /// Size in bytes.
    pub(crate) fn len(&self) -> usize {
        self.0.len_bytes()
    }

    /// The bytes, valid while `self` lives.
    pub(crate) fn as_slice(&self) -> &[u8] {
        if self.len() == 0 {
            return &[];
        }
        // SAFETY: the export keeps `buf[..len]` alive and C-contiguous until
        // `self` (the `PyBuffer`) is dropped; a `u8` buffer needs no alignment.
        unsafe { std::slice::from_raw_parts(self.0.buf_ptr() as *const u8, self.len()) }
    }
}

/// Views of every object of `values` (`TypeError` on the first non-buffer).
pub(crate) fn byte_views<'py>(
    values: impl IntoIterator<Item = Bound<'py, PyAny>>,
) -> PyResult<Vec<ByteView>> {
    values.into_iter().map(|v| ByteView::new(&v)).collect()
}

/// A C-contiguous `T` buffer of `obj` (a `BufferError` for any other
/// element type or layout).
pub(crate) fn typed<T: Element>(obj: &Bound<'_, PyAny>) -> PyResult<PyBuffer<T>> {
    let buf = PyBuffer::<T>::get(obj)?;
    if !buf.is_c_contiguous() {
        return Err(PyBufferError::new_err("the array is not C-contiguous"));
    }
    Ok(buf)
}

/// [`typed`] for an output written in place: a read-only buffer is a
/// `BufferError` too. Returns the buffer and its address and byte length.
pub(crate) fn typed_out<T: Element>(
    obj: &Bound<'_, PyAny>,
) -> PyResult<(PyBuffer<T>, usize, usize)> {
    let buf = typed::<T>(obj)?;
    if buf.readonly() && buf.len_bytes() > 0 {
        return Err(PyBufferError::new_err("the output is read-only"));
    }
    let (ptr, len) = (buf.buf_ptr() as usize, buf.len_bytes());
    Ok((buf, ptr, len))
}

/// The elements of a C-contiguous typed buffer, valid while `buf` lives.
pub(crate) fn elements<T: Element>(buf: &PyBuffer<T>) -> &[T] {
    let n = buf.item_count();
    if n == 0 {
        return &[];
    }
    // SAFETY: `typed` checked C-contiguity and `PyBuffer::get` the element
    // type and alignment; the export keeps the `n` elements alive while
    // `buf` lives. Python may mutate them concurrently only through other
    // extensions, as with any buffer-protocol consumer.
    unsafe { std::slice::from_raw_parts(buf.buf_ptr() as *const T, n) }
}

/// One IEEE half-precision element (buffer format `e`, little-endian or
/// native), as its bits: lets `PyBuffer` export float16 arrays.
#[derive(Clone, Copy)]
#[repr(transparent)]
pub(crate) struct Half(u16);

// SAFETY: `Half` is a plain 2-byte value without invalid bit patterns, and
// only the 2-byte little-endian/native `e` format is accepted (the targets
// are little-endian), so every element read through it is a valid `Half`.
unsafe impl Element for Half {
    fn is_compatible_format(format: &CStr) -> bool {
        matches!(format.to_bytes(), b"e" | b"@e" | b"=e" | b"<e")
    }
}

/// The bits of a C-contiguous `Half` buffer, valid while `buf` lives.
pub(crate) fn half_bits(buf: &PyBuffer<Half>) -> &[u16] {
    let n = buf.item_count();
    if n == 0 {
        return &[];
    }
    // SAFETY: as `elements`; `Half` is a transparent `u16`.
    unsafe { std::slice::from_raw_parts(buf.buf_ptr() as *const u16, n) }
}

/// A new, uninitialised `bytes` object of `n` bytes and its data address.
/// The caller must fill all `n` bytes before the object is shared.
pub(crate) fn uninit_bytes(py: Python<'_>, n: usize) -> Option<(Py<PyBytes>, usize)> {
    let len = pyo3::ffi::Py_ssize_t::try_from(n).ok()?;
    // SAFETY: a NULL source asks CPython for an uninitialised buffer of
    // `len` bytes; we hold the GIL. On failure the error is cleared.
    unsafe {
        let obj = pyo3::ffi::PyBytes_FromStringAndSize(std::ptr::null(), len);
        if obj.is_null() {
            pyo3::ffi::PyErr_Clear();
            return None;
        }
        let data = pyo3::ffi::PyBytes_AsString(obj) as usize;
        let b: Bound<'_, PyBytes> = Bound::from_owned_ptr(py, obj).downcast_into_unchecked();
        Some((b.unbind(), data))
    }
}

/// Fills `view` as a writable one-dimensional byte view of `buf[..len]`,
/// owned by `owner` (stored in `view.obj`, so kept alive until the view is
/// released), with `format` (a struct-module code such as `c"B"`) and the
/// shape and strides given only when `flags` asks for them.
///
/// # Safety
/// `view` must be a valid, non-null `Py_buffer` to fill, and `buf..buf+len`
/// must stay valid, unmoved and writable for as long as `owner` lives.
pub(crate) unsafe fn export_bytes(
    view: *mut pyo3::ffi::Py_buffer,
    owner: Bound<'_, PyAny>,
    buf: *mut u8,
    len: usize,
    flags: std::ffi::c_int,
    format: &'static CStr,
) {
    use pyo3::ffi;
    let wants = |f: std::ffi::c_int| flags & f == f;
    // SAFETY: the caller's contract: `view` is valid to write, the memory
    // outlives `owner`, whose reference the view now holds.
    unsafe {
        (*view).obj = owner.into_ptr();
        (*view).buf = buf.cast();
        (*view).len = len as ffi::Py_ssize_t;
        (*view).readonly = 0;
        (*view).itemsize = 1;
        (*view).format = if wants(ffi::PyBUF_FORMAT) {
            format.as_ptr().cast_mut()
        } else {
            std::ptr::null_mut()
        };
        (*view).ndim = 1;
        (*view).shape = if wants(ffi::PyBUF_ND) {
            &mut (*view).len
        } else {
            std::ptr::null_mut()
        };
        (*view).strides = if wants(ffi::PyBUF_STRIDES) {
            &mut (*view).itemsize
        } else {
            std::ptr::null_mut()
        };
        (*view).suboffsets = std::ptr::null_mut();
        (*view).internal = std::ptr::null_mut();
    }
}
