//! The CUDA driver, loaded at run time (`libcuda.so.1`); the extension never
//! links it. [`Driver`] is the real [`DeviceOps`](super::DeviceOps):
//! it tells device pointers from host memory, copies between them, allocates
//! pinned staging memory and exports/opens CUDA IPC handles. Without a
//! driver every CUDA entry point fails with [`no_driver`]'s message.
//!
//! Every call that needs a context first makes the context of the device
//! pointer involved current on the calling thread (threads of the engine
//! have none of their own).

use super::{DeviceOps, IpcExport, IPC_HANDLE_LEN};
use crate::engine::error::{EngineError, ErrorKind, Result};
use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::sync::OnceLock;

/// `CU_POINTER_ATTRIBUTE_CONTEXT`.
const ATTR_CONTEXT: c_int = 1;
/// `CU_POINTER_ATTRIBUTE_MEMORY_TYPE`.
const ATTR_MEMORY_TYPE: c_int = 2;
/// `CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL`.
const ATTR_DEVICE_ORDINAL: c_int = 9;
/// `CU_MEMORYTYPE_DEVICE` (unified memory reads as host: it is host-accessible).
const MEMORYTYPE_DEVICE: u32 = 2;
/// `CU_MEMHOSTALLOC_PORTABLE`: pinned for every context.
const HOSTALLOC_PORTABLE: c_uint = 1;
/// `CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS`.
const IPC_LAZY_PEER: c_uint = 1;

type CuResult = c_int;
type Ctx = *mut c_void;

type FnAttr = unsafe extern "C" fn(*mut c_void, c_int, u64) -> CuResult;
type FnCtx = unsafe extern "C" fn(Ctx) -> CuResult;
type FnStream = unsafe extern "C" fn(*mut c_void) -> CuResult;
type FnMemcpy = unsafe extern "C" fn(u64, u64, usize) -> CuResult;
type FnHostAlloc = unsafe extern "C" fn(*mut *mut c_void, usize, c_uint) -> CuResult;
type FnFreeHost = unsafe extern "C" fn(*mut c_void) -> CuResult;
type FnRange = unsafe extern "C" fn(*mut u64, *mut usize, u64) -> CuResult;
type FnIpcGet = unsafe extern "C" fn(*mut [u8; IPC_HANDLE_LEN], u64) -> CuResult;
type FnIpcOpen = unsafe extern "C" fn(*mut u64, [u8; IPC_HANDLE_LEN], c_uint) -> CuResult;
type FnIpcClose = unsafe extern "C" fn(u64) -> CuResult;
type FnInit = unsafe extern "C" fn(c_uint) -> CuResult;

/// The driver entry points the engine uses.
pub(crate) struct Driver {
    pointer_get_attribute: FnAttr,
    ctx_set_current: FnCtx,
    stream_synchronize: FnStream,
    memcpy: FnMemcpy,
    mem_host_alloc: FnHostAlloc,
    mem_free_host: FnFreeHost,
    mem_get_address_range: FnRange,
    ipc_get_mem_handle: FnIpcGet,
    ipc_open_mem_handle: FnIpcOpen,
    ipc_close_mem_handle: FnIpcClose,
    /// A context for host-only calls (pinned allocations) made before any
    /// device pointer was seen on the thread: the first one found.
    any_ctx: parking_lot::Mutex<Option<usize>>,
}

const LIB: &CStr = c"libcuda.so.1";

fn symbol(handle: *mut c_void, name: &CStr) -> std::result::Result<*mut c_void, String> {
    // SAFETY: `handle` is a live dlopen handle and `name` is NUL-terminated.
    let p = unsafe { libc::dlsym(handle, name.as_ptr()) };
    if p.is_null() {
        Err(format!("libcuda.so.1 has no {}", name.to_string_lossy()))
    } else {
        Ok(p)
    }
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

/// Resolve `$name` from `$h` as a function of the field's type.
macro_rules! sym {
    ($h:expr, $name:literal, $t:ty) => {{
        let p = symbol($h, $name)?;
        // SAFETY: the driver exports this symbol with the C signature of the
        // field it is stored in (CUDA driver API, 64-bit `CUdeviceptr`).
        unsafe { std::mem::transmute::<*mut c_void, $t>(p) }
    }};
}

fn open(flags: c_int) -> std::result::Result<&'static Driver, String> {
    // SAFETY: dlopen with a NUL-terminated name; the handle is never closed,
    // so symbols from it stay valid for the life of the process.
    let h = unsafe { libc::dlopen(LIB.as_ptr(), flags) };
    if h.is_null() {
        return Err(dl_error());
    }
    let init = sym!(h, c"cuInit", FnInit);
    // SAFETY: cuInit takes flags (0) and may be called any number of times.
    let r = unsafe { init(0) };
    if r != 0 {
        return Err(format!(
            "cuInit failed (CUresult {r}): no usable CUDA device"
        ));
    }
    Ok(Box::leak(Box::new(Driver {
        pointer_get_attribute: sym!(h, c"cuPointerGetAttribute", FnAttr),
        ctx_set_current: sym!(h, c"cuCtxSetCurrent", FnCtx),
        stream_synchronize: sym!(h, c"cuStreamSynchronize", FnStream),
        memcpy: sym!(h, c"cuMemcpy", FnMemcpy),
        mem_host_alloc: sym!(h, c"cuMemHostAlloc", FnHostAlloc),
        mem_free_host: sym!(h, c"cuMemFreeHost", FnFreeHost),
        mem_get_address_range: sym!(h, c"cuMemGetAddressRange_v2", FnRange),
        ipc_get_mem_handle: sym!(h, c"cuIpcGetMemHandle", FnIpcGet),
        ipc_open_mem_handle: sym!(h, c"cuIpcOpenMemHandle_v2", FnIpcOpen),
        ipc_close_mem_handle: sym!(h, c"cuIpcCloseMemHandle", FnIpcClose),
        any_ctx: parking_lot::Mutex::new(None),
    })))
}

/// The error of every CUDA entry point in a process without a driver.
pub(crate) fn no_driver(why: &str) -> EngineError {
    EngineError::new(
        ErrorKind::Cuda,
        format!(
            "no CUDA driver was found ({why}): CUDA device memory and the *_on_cuda calls need one"
        ),
    )
}

/// The driver, loading it on first use.
pub(crate) fn driver() -> Result<&'static Driver> {
    static D: OnceLock<std::result::Result<&'static Driver, String>> = OnceLock::new();
    D.get_or_init(|| open(libc::RTLD_NOW | libc::RTLD_LOCAL))
        .as_ref()
        .copied()
        .map_err(|why| no_driver(why))
}

/// Whether the driver library can be loaded. Asking neither initializes
/// it nor keeps it loaded: `cuInit` runs only when CUDA memory is first
/// used, so a process that never uses CUDA can still fork safely, and
/// [`loaded`] keeps telling whether another library loaded it.
pub(crate) fn loadable() -> bool {
    static L: OnceLock<bool> = OnceLock::new();
    *L.get_or_init(|| {
        // SAFETY: dlopen with a NUL-terminated name.
        let h = unsafe { libc::dlopen(LIB.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if h.is_null() {
            return false;
        }
        let ok = symbol(h, c"cuInit").is_ok();
        // SAFETY: the handle opened above; nothing from it is kept.
        unsafe { libc::dlclose(h) };
        ok
    })
}

/// Whether some library of this process already loaded the driver (only
/// then can CUDA pointers exist here). A driver once loaded stays loaded,
/// so a yes is remembered and later calls cost one atomic load. A no is
/// remembered until the process loads another library: looking a library
/// up by name searches the library path on disk (several failed `open`s),
/// too slow for a check made on every buffer of a batch, while the
/// loader's count of loaded objects costs no system call.
pub(crate) fn loaded() -> bool {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    static SEEN: AtomicBool = AtomicBool::new(false);
    /// The loader's object count when the driver was last found absent
    /// (0: never looked).
    static ABSENT_AT: AtomicU64 = AtomicU64::new(0);
    if SEEN.load(Ordering::Relaxed) {
        return true;
    }
    let adds = objects_loaded();
    if adds != 0 && ABSENT_AT.load(Ordering::Relaxed) == adds {
        return false;
    }
    // SAFETY: RTLD_NOLOAD only looks the library up; nothing is loaded.
    let h = unsafe { libc::dlopen(LIB.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
    if h.is_null() {
        ABSENT_AT.store(adds, Ordering::Relaxed);
        return false;
    }
    // SAFETY: `h` is the handle the lookup above returned (it took a
    // reference, which this gives back; the library stays loaded by the
    // library that loaded it).
    unsafe { libc::dlclose(h) };
    SEEN.store(true, Ordering::Relaxed);
    true
}

/// How many objects the dynamic loader has loaded into this process so
/// far (it only grows; 0 when the loader does not say).
fn objects_loaded() -> u64 {
    unsafe extern "C" fn first(
        info: *mut libc::dl_phdr_info,
        _size: libc::size_t,
        out: *mut libc::c_void,
    ) -> libc::c_int {
        // SAFETY: the loader passes a valid `info` for the duration of the
        // call, and `out` is the `u64` handed to `dl_iterate_phdr` below.
        unsafe { *(out as *mut u64) = (*info).dlpi_adds };
        1
    }
    let mut adds: u64 = 0;
    // SAFETY: `first` matches the callback's signature, writes only
    // through `out` (our local `adds`, alive for the call) and stops the
    // iteration after the first object.
    unsafe { libc::dl_iterate_phdr(Some(first), (&mut adds as *mut u64).cast()) };
    adds
}

fn check(r: CuResult, what: &str) -> Result<()> {
    if r == 0 {
        Ok(())
    } else {
        Err(EngineError::new(
            ErrorKind::Cuda,
            format!("{what} failed (CUresult {r})"),
        ))
    }
}

impl Driver {
    fn attribute<T: Default>(&self, attr: c_int, addr: u64) -> Option<T> {
        let mut v = T::default();
        // SAFETY: `v` is a valid, writable T of the size this attribute
        // writes (u32 memory type / ordinal, pointer-sized context).
        let r = unsafe { (self.pointer_get_attribute)((&mut v as *mut T).cast(), attr, addr) };
        (r == 0).then_some(v)
    }

    /// Make the context owning device pointer `addr` current on this thread.
    fn enter(&self, addr: u64) -> Result<()> {
        let ctx: usize = self.attribute(ATTR_CONTEXT, addr).ok_or_else(|| {
            EngineError::new(ErrorKind::Cuda, format!("{addr:#x} is not CUDA memory"))
        })?;
        *self.any_ctx.lock() = Some(ctx);
        // SAFETY: a context handle the driver just returned for a live
        // allocation.
        let r = unsafe { (self.ctx_set_current)(ctx as Ctx) };
        check(r, "cuCtxSetCurrent")
    }

    fn enter_any(&self) -> Result<()> {
        let ctx = (*self.any_ctx.lock()).ok_or_else(|| {
            EngineError::new(
                ErrorKind::Cuda,
                "no CUDA context seen yet (register or pass device memory first)",
            )
        })?;
        // SAFETY: a context handle the driver returned earlier; contexts of
        // live allocations outlive them.
        let r = unsafe { (self.ctx_set_current)(ctx as Ctx) };
        check(r, "cuCtxSetCurrent")
    }
}

impl DeviceOps for Driver {
    fn device_of(&self, addr: u64) -> Option<i32> {
        let kind: u32 = self.attribute(ATTR_MEMORY_TYPE, addr)?;
        if kind != MEMORYTYPE_DEVICE {
            return None;
        }
        Some(
            self.attribute::<i32>(ATTR_DEVICE_ORDINAL, addr)
                .unwrap_or(0),
        )
    }

    unsafe fn copy(&self, dst: u64, src: u64, len: usize) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        let dst_device = self.device_of(dst).is_some();
        if dst_device {
            self.enter(dst)?;
        } else if self.device_of(src).is_some() {
            self.enter(src)?;
        } else {
            self.enter_any()?;
        }
        // SAFETY: the caller guarantees both ranges (unified addressing lets
        // cuMemcpy infer each side's kind).
        check(unsafe { (self.memcpy)(dst, src, len) }, "cuMemcpy")?;
        if !dst_device {
            // Into host memory cuMemcpy returns once the bytes are there.
            return Ok(());
        }
        // Into device memory it may return before the copy lands (always
        // device to device, and from pageable memory): wait for the null
        // stream of the context, on which it was queued.
        // SAFETY: a context is current (entered above).
        let r = unsafe { (self.stream_synchronize)(std::ptr::null_mut()) };
        check(r, "cuStreamSynchronize")
    }

    fn alloc_pinned(&self, len: usize, near: u64) -> Result<u64> {
        if self.device_of(near).is_some() {
            self.enter(near)?;
        } else {
            self.enter_any()?;
        }
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: `p` receives the allocation; a context is current.
        let r = unsafe { (self.mem_host_alloc)(&mut p, len.max(1), HOSTALLOC_PORTABLE) };
        check(r, "cuMemHostAlloc")?;
        Ok(p as u64)
    }

    unsafe fn free_pinned(&self, addr: u64) {
        // SAFETY: the caller passes an address alloc_pinned returned, once.
        let _ = unsafe { (self.mem_free_host)(addr as usize as *mut c_void) };
    }

    fn synchronize_stream(&self, stream: u64, near: Option<u64>) -> Result<()> {
        match near {
            Some(a) => self.enter(a)?,
            None => self.enter_any()?,
        }
        // SAFETY: a context is current; `stream` is the caller's stream of
        // that context (0: its default stream).
        let r = unsafe { (self.stream_synchronize)(stream as usize as *mut c_void) };
        check(r, "cuStreamSynchronize")
    }

    fn ipc_export(&self, addr: u64) -> Result<IpcExport> {
        self.enter(addr)?;
        let (mut base, mut size) = (0u64, 0usize);
        // SAFETY: both outputs are valid; `addr` is device memory.
        let r = unsafe { (self.mem_get_address_range)(&mut base, &mut size, addr) };
        check(r, "cuMemGetAddressRange")?;
        let mut handle = [0u8; IPC_HANDLE_LEN];
        // SAFETY: `handle` has the 64 bytes of a CUipcMemHandle.
        let r = unsafe { (self.ipc_get_mem_handle)(&mut handle, base) };
        check(r, "cuIpcGetMemHandle")?;
        Ok(IpcExport {
            handle: handle.to_vec(),
            offset: addr - base,
            size: size as u64,
        })
    }

    fn ipc_open(&self, handle: &[u8], near: Option<u64>) -> Result<(u64, u64)> {
        let h: [u8; IPC_HANDLE_LEN] = handle.try_into().map_err(|_| {
            EngineError::new(ErrorKind::InvalidArgument, "a CUDA IPC handle has 64 bytes")
        })?;
        match near {
            Some(a) if self.device_of(a).is_some() => self.enter(a)?,
            _ => self.enter_any()?,
        }
        let mut p = 0u64;
        // SAFETY: `p` receives the mapping; a context is current.
        let r = unsafe { (self.ipc_open_mem_handle)(&mut p, h, IPC_LAZY_PEER) };
        check(r, "cuIpcOpenMemHandle")?;
        let (mut base, mut size) = (0u64, 0usize);
        // SAFETY: both outputs are valid; `p` is the mapping just made.
        let r = unsafe { (self.mem_get_address_range)(&mut base, &mut size, p) };
        if let Err(e) = check(r, "cuMemGetAddressRange") {
            // SAFETY: the mapping just made, closed once.
            unsafe { (self.ipc_close_mem_handle)(p) };
            return Err(e);
        }
        Ok((p, size as u64))
    }

    unsafe fn ipc_close(&self, base: u64) {
        // SAFETY: the caller passes a mapping ipc_open returned, once.
        let _ = unsafe { (self.ipc_close_mem_handle)(base) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_loader_count_grows_when_a_library_is_loaded() {
        let before = objects_loaded();
        assert!(before > 0, "the loader reports its objects");
        // Without a driver the answer is no, asked any number of times.
        let first = loaded();
        assert_eq!(loaded(), first);
        // SAFETY: dlopen of a system library with a NUL-terminated name;
        // the handle is closed below and nothing from it is used.
        let h = unsafe { libc::dlopen(c"libanl.so.1".as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if !h.is_null() {
            assert!(objects_loaded() > before, "a new object raises the count");
            // SAFETY: the handle opened above.
            unsafe { libc::dlclose(h) };
        }
        assert_eq!(loaded(), first, "loading another library changes nothing");
    }
}
