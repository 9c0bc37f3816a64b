//! The CUDA driver, loaded at run time (`libcuda.so.1`); the extension never
//! links it. Used to tell device pointers from host memory, and by the
//! `*_on_cuda` transfers, which need a driver and fail with a clear error
//! without one.

use crate::error::{EngineError, ErrorKind, Result};
use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::OnceLock;

/// `CU_POINTER_ATTRIBUTE_MEMORY_TYPE`.
const ATTR_MEMORY_TYPE: c_int = 2;
/// `CU_MEMORYTYPE_DEVICE`.
const MEMORYTYPE_DEVICE: u32 = 2;
/// `CU_MEMORYTYPE_UNIFIED`: host-accessible; treated as host memory.
const MEMORYTYPE_UNIFIED: u32 = 4;

type PointerGetAttribute = unsafe extern "C" fn(*mut c_void, c_int, u64) -> c_int;

/// The driver entry points this crate uses.
pub(crate) struct Driver {
    pointer_get_attribute: PointerGetAttribute,
}

const LIB: &CStr = c"libcuda.so.1";

fn symbol(handle: *mut c_void, name: &CStr) -> Option<*mut c_void> {
    // SAFETY: `handle` is a live dlopen handle and `name` is NUL-terminated.
    let p = unsafe { libc::dlsym(handle, name.as_ptr()) };
    (!p.is_null()).then_some(p)
}

fn dl_error() -> String {
    // SAFETY: dlerror returns NULL or a NUL-terminated message.
    let p: *const c_char = unsafe { libc::dlerror() };
    if p.is_null() {
        "unknown error".into()
    } else {
        // SAFETY: checked non-null above; valid until the next dl* call.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

fn open(flags: c_int) -> std::result::Result<&'static Driver, String> {
    // SAFETY: dlopen with a NUL-terminated name; the handle is never closed,
    // so symbols from it stay valid for the life of the process.
    let h = unsafe { libc::dlopen(LIB.as_ptr(), flags) };
    if h.is_null() {
        return Err(dl_error());
    }
    let Some(p) = symbol(h, c"cuPointerGetAttribute") else {
        return Err("libcuda.so.1 has no cuPointerGetAttribute".into());
    };
    // SAFETY: the symbol has this C signature in every CUDA driver.
    let f: PointerGetAttribute =
        unsafe { std::mem::transmute::<*mut c_void, PointerGetAttribute>(p) };
    Ok(Box::leak(Box::new(Driver {
        pointer_get_attribute: f,
    })))
}

/// The driver, loading it on first use.
pub(crate) fn driver() -> Result<&'static Driver> {
    static D: OnceLock<std::result::Result<&'static Driver, String>> = OnceLock::new();
    D.get_or_init(|| open(libc::RTLD_NOW | libc::RTLD_LOCAL))
        .as_ref()
        .copied()
        .map_err(|why| {
            EngineError::new(
                ErrorKind::Cuda,
                format!("no CUDA driver in this process ({why}): CUDA pointers and the *_on_cuda calls need one"),
            )
        })
}

/// Whether some library of this process already loaded the driver (only
/// then can CUDA pointers exist here).
pub(crate) fn loaded() -> bool {
    // SAFETY: RTLD_NOLOAD only looks the library up; nothing is loaded.
    let h = unsafe { libc::dlopen(LIB.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
    !h.is_null()
}

/// Whether `addr` is CUDA device memory (false when no driver is loaded:
/// no device memory can exist then).
pub(crate) fn is_device_pointer(addr: u64) -> bool {
    if !loaded() {
        return false;
    }
    let Ok(d) = driver() else { return false };
    let mut kind: u32 = 0;
    // SAFETY: `kind` is a valid u32 for the attribute to be written into.
    let r = unsafe {
        (d.pointer_get_attribute)((&mut kind as *mut u32).cast(), ATTR_MEMORY_TYPE, addr)
    };
    r == 0 && kind == MEMORYTYPE_DEVICE && kind != MEMORYTYPE_UNIFIED
}
