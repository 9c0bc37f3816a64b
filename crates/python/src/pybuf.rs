//! The C buffer protocol, declared here because the extension is built for
//! the stable ABI of Python 3.10 (abi3), whose headers leave it out: the
//! `Py_buffer` struct, `PyObject_GetBuffer`, `PyBuffer_Release` and the
//! `Py_bf_getbuffer` type slot joined the stable ABI in 3.11 unchanged.
//! The struct has had this layout since Python 3.3, both functions are
//! exported by every CPython 3 interpreter, and `PyType_FromSpec` accepts
//! the buffer slots from 3.9 on, so one abi3 build uses them on 3.10 to 3.13.
//!
//! [`Typed`] is a held export of another object's memory (input);
//! [`RawBuffer`] is also the view an exporting type fills
//! ([`crate::buffer::export_bytes`]).

use pyo3::exceptions::PyBufferError;
use pyo3::ffi;
use pyo3::prelude::*;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::marker::PhantomData;

/// CPython's `Py_buffer`, field for field.
#[repr(C)]
pub(crate) struct RawBuffer {
    pub(crate) buf: *mut c_void,
    pub(crate) obj: *mut ffi::PyObject,
    pub(crate) len: ffi::Py_ssize_t,
    pub(crate) itemsize: ffi::Py_ssize_t,
    pub(crate) readonly: c_int,
    pub(crate) ndim: c_int,
    pub(crate) format: *mut c_char,
    pub(crate) shape: *mut ffi::Py_ssize_t,
    pub(crate) strides: *mut ffi::Py_ssize_t,
    pub(crate) suboffsets: *mut ffi::Py_ssize_t,
    pub(crate) internal: *mut c_void,
}

extern "C" {
    fn PyObject_GetBuffer(obj: *mut ffi::PyObject, view: *mut RawBuffer, flags: c_int) -> c_int;
    fn PyBuffer_Release(view: *mut RawBuffer);
}

/// `PyBUF_FORMAT`: the consumer wants the format string.
pub(crate) const PYBUF_FORMAT: c_int = 0x0004;
/// `PyBUF_ND`: the consumer wants the shape.
pub(crate) const PYBUF_ND: c_int = 0x0008;
/// `PyBUF_STRIDES`: the consumer wants the strides (implies `PyBUF_ND`).
pub(crate) const PYBUF_STRIDES: c_int = 0x0010 | PYBUF_ND;
/// `PyBUF_FULL_RO`: any layout (suboffsets included), read-only allowed.
const PYBUF_FULL_RO: c_int = 0x0100 | PYBUF_STRIDES | PYBUF_FORMAT;
/// `PyBUF_WRITE`: a writable memoryview (`PyMemoryView_FromMemory`).
pub(crate) const PYBUF_WRITE: c_int = 0x200;
/// The `Py_bf_getbuffer` type slot id.
pub(crate) const PY_BF_GETBUFFER: c_int = 1;

/// An element type a typed buffer may hold.
///
/// # Safety
/// Only for plain types without invalid bit patterns, whose size is what
/// [`Element::is_compatible_format`] accepts.
pub(crate) unsafe trait Element: Copy {
    /// Whether a buffer with this `struct`-module format holds `Self`.
    fn is_compatible_format(format: &CStr) -> bool;
}

/// The type code of a native-order, native-size single-element format
/// (`"f"`, `"@f"`, `"=f"`, `"<f"` on this little-endian target).
pub(crate) fn native_code(format: &CStr) -> Option<u8> {
    match format.to_bytes() {
        [c] | [b'@', c] => Some(*c),
        [b'=' | b'<', c] => Some(*c),
        _ => None,
    }
}

macro_rules! element {
    ($t:ty, $($code:literal)|+) => {
        // SAFETY: a plain integer or float; the codes named are its size.
        unsafe impl Element for $t {
            fn is_compatible_format(format: &CStr) -> bool {
                matches!(native_code(format), Some($($code)|+))
            }
        }
    };
}

element!(u8, b'B' | b'c');
element!(u16, b'H');
element!(i64, b'q' | b'l');
element!(f32, b'f');

/// A held export of an object's memory as `T` elements; released (with
/// the GIL) on drop, so the memory stays valid while the GIL is released.
pub(crate) struct Typed<T> {
    view: Box<RawBuffer>,
    _t: PhantomData<T>,
}

// SAFETY: the view is only a description of memory the exporter keeps
// valid until release; release takes the GIL (as pyo3's `PyBuffer` does).
unsafe impl<T> Send for Typed<T> {}
// SAFETY: as above; shared access reads the description only.
unsafe impl<T> Sync for Typed<T> {}

impl<T: Element> Typed<T> {
    /// `obj`'s buffer as `T`: a `BufferError` when its element type, size
    /// or alignment is not `T`'s (or `obj` exports no buffer).
    pub(crate) fn get(obj: &Bound<'_, PyAny>) -> PyResult<Self> {
        let mut view = Box::new(RawBuffer {
            buf: std::ptr::null_mut(),
            obj: std::ptr::null_mut(),
            len: 0,
            itemsize: 0,
            readonly: 0,
            ndim: 0,
            format: std::ptr::null_mut(),
            shape: std::ptr::null_mut(),
            strides: std::ptr::null_mut(),
            suboffsets: std::ptr::null_mut(),
            internal: std::ptr::null_mut(),
        });
        // SAFETY: `view` is a writable, boxed (unmoving) Py_buffer; we hold
        // the GIL through `obj`.
        if unsafe { PyObject_GetBuffer(obj.as_ptr(), &mut *view, PYBUF_FULL_RO) } != 0 {
            return Err(PyErr::fetch(obj.py()));
        }
        // From here the view is released on drop, on every path.
        let typed = Typed {
            view,
            _t: PhantomData,
        };
        let name = std::any::type_name::<T>();
        let format = match typed.view.format.is_null() {
            true => c"B",
            // SAFETY: a non-null format is a NUL-terminated string the
            // exporter keeps until release.
            false => unsafe { CStr::from_ptr(typed.view.format) },
        };
        if typed.view.itemsize as usize != std::mem::size_of::<T>()
            || !T::is_compatible_format(format)
        {
            return Err(PyBufferError::new_err(format!(
                "buffer contents are not compatible with {name}"
            )));
        }
        if !(typed.view.buf as usize).is_multiple_of(std::mem::align_of::<T>()) {
            return Err(PyBufferError::new_err(format!(
                "buffer contents are insufficiently aligned for {name}"
            )));
        }
        Ok(typed)
    }

    /// The address of the first element.
    pub(crate) fn ptr(&self) -> *mut c_void {
        self.view.buf
    }

    /// Size in bytes.
    pub(crate) fn len_bytes(&self) -> usize {
        self.view.len as usize
    }

    /// Number of elements.
    pub(crate) fn item_count(&self) -> usize {
        self.len_bytes() / std::mem::size_of::<T>()
    }

    /// Whether the exporter forbids writes.
    pub(crate) fn readonly(&self) -> bool {
        self.view.readonly != 0
    }

    /// Whether the elements lie in C order without gaps (CPython's rule:
    /// dimensions of one element may have any stride).
    pub(crate) fn is_c_contiguous(&self) -> bool {
        let v = &*self.view;
        if v.len == 0 || v.strides.is_null() {
            return true;
        }
        if !v.suboffsets.is_null() || v.shape.is_null() {
            return false;
        }
        let ndim = v.ndim.max(0) as usize;
        // SAFETY: with PyBUF_FULL_RO the exporter gave `ndim` shape and
        // stride entries, valid until release.
        let (shape, strides) = unsafe {
            (
                std::slice::from_raw_parts(v.shape, ndim),
                std::slice::from_raw_parts(v.strides, ndim),
            )
        };
        let mut expect = v.itemsize;
        for (dim, stride) in shape.iter().zip(strides).rev() {
            if *dim > 1 && *stride != expect {
                return false;
            }
            expect *= *dim;
        }
        true
    }
}

impl<T> Drop for Typed<T> {
    fn drop(&mut self) {
        // SAFETY: the view was filled by a successful PyObject_GetBuffer
        // and is released exactly once, with the GIL.
        Python::with_gil(|_| unsafe { PyBuffer_Release(&mut *self.view) });
    }
}
