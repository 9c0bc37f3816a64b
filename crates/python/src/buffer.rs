//! Buffer-protocol input and output, over the protocol declared in
//! [`crate::pybuf`]. Input is a held [`Typed`] export; the one hand-filled
//! view is [`export_bytes`], shared by every object that exports memory it
//! owns ([`Exporter`]):
//!
//! * [`ByteView`]: the C-order bytes of any buffer-protocol object,
//!   whatever its element format: a value is any buffer-protocol object
//!   and is stored as its C-order byte image (non-contiguous inputs are
//!   copied first).
//! * [`typed`] / [`typed_out`]: a C-contiguous `Typed<T>` of a typed
//!   array (ids as `i64`, tables and outputs as `f32`, `u16` bits or
//!   [`Half`]), with its elements as a slice ([`elements`], [`half_bits`]).
//! * [`uninit_bytes`]: a new `bytes` object to be filled with the GIL
//!   released (a read copies its value exactly once).
//! * [`export_bytes`]: the one output side by hand — a writable 1-D byte
//!   view of memory a Python object owns (`BufferHandle`, pooled tensor
//!   results), for their `__getbuffer__`.
//!
//! A view holds the exporter's buffer until dropped, so the memory stays
//! valid while the GIL is released around a client call; `Typed` is
//! `Send`, and releases the buffer with the GIL on drop.

use crate::args::short_repr;
use crate::pybuf::{
    Element, RawBuffer, Typed, PYBUF_FORMAT, PYBUF_ND, PYBUF_STRIDES, PY_BF_GETBUFFER,
};
use parking_lot::Mutex;
use pyo3::exceptions::{PyBufferError, PyTypeError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes, PyTuple, PyType};
use pyo3::PyClass;
use std::any::{Any, TypeId};
use std::cell::RefCell;
use std::ffi::{c_int, c_uint, c_void, CStr};

/// The C-contiguous bytes of a buffer-protocol object.
pub(crate) struct ByteView(Typed<u8>);

impl ByteView {
    /// The C-order bytes of `obj`. `bytes` and `bytearray` are used in
    /// place; any other exporter is viewed as bytes
    /// (`memoryview(obj).cast("B")`), and a non-contiguous or non-native
    /// layout is copied (`memoryview(obj).tobytes()`). `TypeError` when
    /// `obj` does not support the buffer protocol.
    pub(crate) fn new(obj: &Bound<'_, PyAny>) -> PyResult<Self> {
        if obj.is_exact_instance_of::<PyBytes>() || obj.is_exact_instance_of::<PyByteArray>() {
            return Typed::<u8>::get(obj).map(ByteView);
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
        Typed::<u8>::get(&flat).map(ByteView)
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
        // `self` (the `Typed`) is dropped; a `u8` buffer needs no alignment.
        unsafe { std::slice::from_raw_parts(self.0.ptr() as *const u8, self.len()) }
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
pub(crate) fn typed<T: Element>(obj: &Bound<'_, PyAny>) -> PyResult<Typed<T>> {
    let buf = Typed::<T>::get(obj)?;
    if !buf.is_c_contiguous() {
        return Err(PyBufferError::new_err("the array is not C-contiguous"));
    }
    Ok(buf)
}

/// [`typed`] for an output written in place: a read-only buffer is a
/// `BufferError` too. Returns the buffer and its address and byte length.
pub(crate) fn typed_out<T: Element>(obj: &Bound<'_, PyAny>) -> PyResult<(Typed<T>, usize, usize)> {
    let buf = typed::<T>(obj)?;
    if buf.readonly() && buf.len_bytes() > 0 {
        return Err(PyBufferError::new_err("the output is read-only"));
    }
    let (ptr, len) = (buf.ptr() as usize, buf.len_bytes());
    Ok((buf, ptr, len))
}

/// The elements of a C-contiguous typed buffer, valid while `buf` lives.
pub(crate) fn elements<T: Element>(buf: &Typed<T>) -> &[T] {
    let n = buf.item_count();
    if n == 0 {
        return &[];
    }
    // SAFETY: `typed` checked C-contiguity and `Typed::get` the element
    // type and alignment; the export keeps the `n` elements alive while
    // `buf` lives. Python may mutate them concurrently only through other
    // extensions, as with any buffer-protocol consumer.
    unsafe { std::slice::from_raw_parts(buf.ptr() as *const T, n) }
}

/// One IEEE half-precision element (buffer format `e`, little-endian or
/// native), as its bits: lets `Typed` view float16 arrays.
#[derive(Clone, Copy)]
#[repr(transparent)]
pub(crate) struct Half(u16);

// SAFETY: `Half` is a plain 2-byte value without invalid bit patterns, and
// only the 2-byte little-endian/native `e` format is accepted (the targets
// are little-endian), so every element read through it is a valid `Half`.
unsafe impl Element for Half {
    fn is_compatible_format(format: &CStr) -> bool {
        crate::pybuf::native_code(format) == Some(b'e')
    }
}

/// The bits of a C-contiguous `Half` buffer, valid while `buf` lives.
pub(crate) fn half_bits(buf: &Typed<Half>) -> &[u16] {
    let n = buf.item_count();
    if n == 0 {
        return &[];
    }
    // SAFETY: as `elements`; `Half` is a transparent `u16`.
    unsafe { std::slice::from_raw_parts(buf.ptr() as *const u16, n) }
}

/// A new, uninitialised `bytes` object of `n` bytes and its data address.
/// The caller must fill all `n` bytes before the object is shared.
pub(crate) fn uninit_bytes(py: Python<'_>, n: usize) -> Option<(Py<PyBytes>, usize)> {
    let len = ffi::Py_ssize_t::try_from(n).ok()?;
    // SAFETY: a NULL source asks CPython for an uninitialised buffer of
    // `len` bytes; we hold the GIL. On failure the error is cleared.
    unsafe {
        let obj = ffi::PyBytes_FromStringAndSize(std::ptr::null(), len);
        if obj.is_null() {
            ffi::PyErr_Clear();
            return None;
        }
        let data = ffi::PyBytes_AsString(obj) as usize;
        let b: Bound<'_, PyBytes> = Bound::from_owned_ptr(py, obj).downcast_into_unchecked();
        Some((b.unbind(), data))
    }
}

/// A class whose instances export memory they own through the buffer
/// protocol, as a writable one-dimensional byte view. Python sees it as its
/// [`exporting_type`]: a subclass that adds the `Py_bf_getbuffer` slot
/// (pyo3 declares that slot only for the stable ABI of 3.11 on); instances
/// are made by [`export_object`], through the class's `#[new]`
/// ([`exporter_new!`]), which takes the value [`take_pending`] hands it.
///
/// # Safety
/// [`Exporter::region`] must name memory that stays valid, unmoved and
/// writable for as long as the object lives.
pub(crate) unsafe trait Exporter: PyClass {
    /// The struct-module format of the bytes (`c"b"`, `c"B"`).
    const FORMAT: &'static CStr;
    /// `module.Name` of the exporting subclass (CPython keeps the pointer).
    const SUBCLASS_NAME: &'static CStr;
    /// The exported memory: its address and length.
    fn region(slf: &Bound<'_, Self>) -> PyResult<(*mut u8, usize)>;
}

/// The `#[new]` of an [`Exporter`] class: it takes the value
/// [`export_object`] is placing, and is a `TypeError` from Python.
macro_rules! exporter_new {
    ($class:ident) => {
        #[pyo3::pymethods]
        impl $class {
            #[new]
            fn py_new() -> pyo3::PyResult<Self> {
                $crate::buffer::take_pending()
            }
        }
    };
}

pub(crate) use exporter_new;

/// The exporting subclass of each [`Exporter`] made so far, by class.
static SUBCLASSES: Mutex<Vec<(TypeId, Py<PyType>)>> = Mutex::new(Vec::new());

thread_local! {
    /// The value the next exporter `#[new]` on this thread takes.
    static PENDING: RefCell<Option<Box<dyn Any>>> = const { RefCell::new(None) };
}

/// The exporting subclass of `T`, made on first use.
pub(crate) fn exporting_type<T: Exporter>(py: Python<'_>) -> PyResult<Bound<'_, PyType>> {
    let find = |made: &[(TypeId, Py<PyType>)]| {
        let (_, ty) = made.iter().find(|(id, _)| *id == TypeId::of::<T>())?;
        Some(ty.bind(py).clone())
    };
    if let Some(ty) = find(&SUBCLASSES.lock()) {
        return Ok(ty);
    }
    // Made without the lock held: creating a type may run Python code.
    let ty = new_exporting_type::<T>(py)?;
    let mut made = SUBCLASSES.lock();
    if let Some(first) = find(&made) {
        return Ok(first);
    }
    made.push((TypeId::of::<T>(), ty.clone().unbind()));
    Ok(ty)
}

fn new_exporting_type<T: Exporter>(py: Python<'_>) -> PyResult<Bound<'_, PyType>> {
    let mut slots = [
        ffi::PyType_Slot {
            slot: PY_BF_GETBUFFER,
            pfunc: getbuffer::<T> as *mut c_void,
        },
        ffi::PyType_Slot {
            slot: 0,
            pfunc: std::ptr::null_mut(),
        },
    ];
    let mut spec = ffi::PyType_Spec {
        name: T::SUBCLASS_NAME.as_ptr(),
        basicsize: 0,
        itemsize: 0,
        flags: ffi::Py_TPFLAGS_DEFAULT as c_uint,
        slots: slots.as_mut_ptr(),
    };
    let bases = PyTuple::new(py, [py.get_type::<T>()])?;
    // SAFETY: the spec and slots are read during the call; the name is
    // static; the base is a pyo3 class declared `subclass`, whose layout
    // the new type inherits (basicsize 0).
    let ty = unsafe { ffi::PyType_FromSpecWithBases(&mut spec, bases.as_ptr()) };
    // SAFETY: a new reference, or null with an exception set.
    let ty = unsafe { Bound::from_owned_ptr_or_err(py, ty) }?;
    Ok(ty.downcast_into::<PyType>()?)
}

/// A new exporting object holding `value`.
pub(crate) fn export_object<T: Exporter>(py: Python<'_>, value: T) -> PyResult<Bound<'_, PyAny>> {
    let ty = exporting_type::<T>(py)?;
    PENDING.with(|p| *p.borrow_mut() = Some(Box::new(value)));
    let made = ty.call0();
    PENDING.with(|p| p.borrow_mut().take());
    made
}

/// For the `#[new]` of an [`Exporter`]: the value [`export_object`] is
/// placing; a `TypeError` when called from Python.
pub(crate) fn take_pending<T: Exporter>() -> PyResult<T> {
    PENDING
        .with(|p| p.borrow_mut().take())
        .and_then(|v| v.downcast::<T>().ok())
        .map(|v| *v)
        .ok_or_else(|| PyTypeError::new_err("No constructor defined"))
}

/// The `Py_bf_getbuffer` slot of an exporting subclass.
unsafe extern "C" fn getbuffer<T: Exporter>(
    obj: *mut ffi::PyObject,
    view: *mut RawBuffer,
    flags: c_int,
) -> c_int {
    let filled = std::panic::catch_unwind(|| {
        // SAFETY: CPython calls the slot with the GIL held and `obj` alive.
        let py = unsafe { Python::assume_gil_acquired() };
        // SAFETY: as above; the borrow lasts for this call.
        let any = unsafe { Bound::from_borrowed_ptr(py, obj) };
        let export = || -> PyResult<()> {
            if view.is_null() {
                return Err(PyBufferError::new_err("view is null"));
            }
            let (buf, len) = T::region(any.downcast::<T>()?)?;
            // SAFETY: `view` is non-null and given by CPython to fill; the
            // `Exporter` contract keeps the memory valid while `any` lives,
            // and the view holds a reference to it.
            unsafe { export_bytes(view, any.clone(), buf, len, flags, T::FORMAT) };
            Ok(())
        };
        export().map_err(|e| e.restore(py)).is_ok()
    });
    match filled {
        Ok(true) => 0,
        Ok(false) => -1,
        Err(_) => {
            // SAFETY: still inside CPython's call, with the GIL.
            let py = unsafe { Python::assume_gil_acquired() };
            PyBufferError::new_err("buffer export failed").restore(py);
            -1
        }
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
unsafe fn export_bytes(
    view: *mut RawBuffer,
    owner: Bound<'_, PyAny>,
    buf: *mut u8,
    len: usize,
    flags: c_int,
    format: &'static CStr,
) {
    let wants = |f: c_int| flags & f == f;
    // SAFETY: the caller's contract: `view` is valid to write, the memory
    // outlives `owner`, whose reference the view now holds.
    unsafe {
        (*view).obj = owner.into_ptr();
        (*view).buf = buf.cast();
        (*view).len = len as ffi::Py_ssize_t;
        (*view).readonly = 0;
        (*view).itemsize = 1;
        (*view).format = if wants(PYBUF_FORMAT) {
            format.as_ptr().cast_mut()
        } else {
            std::ptr::null_mut()
        };
        (*view).ndim = 1;
        (*view).shape = if wants(PYBUF_ND) {
            &mut (*view).len
        } else {
            std::ptr::null_mut()
        };
        (*view).strides = if wants(PYBUF_STRIDES) {
            &mut (*view).itemsize
        } else {
            std::ptr::null_mut()
        };
        (*view).suboffsets = std::ptr::null_mut();
        (*view).internal = std::ptr::null_mut();
    }
}
