//! CUDA device memory in the store's zero-copy calls: device buffers are
//! staged through host memory, so the store's data path only ever touches
//! host memory.
//!
//! Rules:
//! - A pointer is device memory when the CUDA driver says so
//!   ([`mooncake_transfer::engine::device::classify`]; without a driver loaded by any
//!   library of the process no pointer is, and nothing is loaded to ask).
//! - A write (`put_from`, `batch_put_from`, ...) copies each device source
//!   into host memory first; host sources are used as they are.
//! - A read (`get_into`, `batch_get_into`, ...) reads each device
//!   destination into host memory, then copies the bytes read (the item's
//!   result) into the device; a failed item copies nothing.
//! - `get_tensor_into_cuda` / `batch_get_tensor_into_cuda` read into CUDA
//!   tensors of a dummy client (upstream reads them through CUDA IPC only
//!   there): the destination's dtype, shape and byte size must match the
//!   stored tensor's; the result is the tensor's payload bytes. Any
//!   failure is INVALID_PARAMS (-600) for that item, as upstream.

use crate::error::{Error, Result};
use mooncake_tensor::{DType, TensorHeader, HEADER_SIZE};
use mooncake_transfer::engine::device;

/// Whether `ptr` is CUDA device memory.
pub fn is_device(ptr: usize) -> bool {
    ptr != 0 && device::classify(ptr as u64).is_some()
}

fn device_copy(dst: usize, src: usize, len: usize) -> impl FnOnce() -> Result<()> {
    move || {
        let dev = device::current().map_err(|e| Error::invalid(e.to_string()))?;
        // SAFETY: callers pass a device range the caller of the store call
        // vouched for and a host buffer of `len` bytes this module owns.
        unsafe { dev.copy(dst as u64, src as u64, len as u64) }
            .map_err(|e| Error::internal(format!("device copy failed: {e}")))
    }
}

/// Host stand-ins for the device buffers of one call.
#[derive(Debug, Default)]
pub struct HostStand {
    /// The pointers to pass on: the caller's, with device ones replaced.
    pub ptrs: Vec<usize>,
    /// `(index, device pointer, host buffer)` per device buffer.
    staged: Vec<(usize, usize, Vec<u8>)>,
}

impl HostStand {
    fn new(ptrs: &[usize], sizes: &[usize]) -> HostStand {
        let mut s = HostStand {
            ptrs: ptrs.to_vec(),
            staged: Vec::new(),
        };
        for (i, (&p, &n)) in ptrs.iter().zip(sizes).enumerate() {
            if n > 0 && is_device(p) {
                let mut host = vec![0u8; n];
                s.ptrs[i] = host.as_mut_ptr() as usize;
                s.staged.push((i, p, host));
            }
        }
        s
    }

    /// Whether any buffer is device memory.
    pub fn any(&self) -> bool {
        !self.staged.is_empty()
    }

    /// Sources of a write: device ones copied into host memory.
    ///
    /// # Safety
    /// Every device `ptrs[i]..+sizes[i]` must be readable device memory.
    pub unsafe fn sources(ptrs: &[usize], sizes: &[usize]) -> Result<HostStand> {
        let s = HostStand::new(ptrs, sizes);
        for (_, dev, host) in &s.staged {
            device_copy(host.as_ptr() as usize, *dev, host.len())()?;
        }
        Ok(s)
    }

    /// Destinations of a read: host memory in place of device memory.
    pub fn destinations(ptrs: &[usize], sizes: &[usize]) -> HostStand {
        HostStand::new(ptrs, sizes)
    }

    /// Whether buffer `i` is device memory (read into a host stand-in).
    pub fn is_staged(&self, i: usize) -> bool {
        self.staged.iter().any(|s| s.0 == i)
    }

    /// Copy the first `n` bytes of buffer `i`'s stand-in into its device
    /// destination (nothing for a host buffer).
    ///
    /// # Safety
    /// The device destination must still be writable device memory.
    pub unsafe fn deliver_one(&self, i: usize, n: u64) -> Result<()> {
        match self.staged.iter().find(|s| s.0 == i) {
            Some((_, dev, host)) => {
                let n = (n as usize).min(host.len());
                device_copy(*dev, host.as_ptr() as usize, n)()
            }
            None => Ok(()),
        }
    }

    /// Copy what each read delivered (`results[i]`: bytes read) into its
    /// device destination; an item whose copy fails gets the error.
    ///
    /// # Safety
    /// Every device destination must still be writable device memory.
    pub unsafe fn deliver(&self, results: &mut [Result<u64>]) {
        for (i, dev, host) in &self.staged {
            let Some(r) = results.get_mut(*i) else {
                continue;
            };
            if let Ok(n) = r {
                let n = (*n as usize).min(host.len());
                if let Err(e) = device_copy(*dev, host.as_ptr() as usize, n)() {
                    *r = Err(e);
                }
            }
        }
    }
}

/// A write from `ptrs` (any of them device memory) through `put`.
///
/// # Safety
/// Every `ptrs[i]..+sizes[i]` must be readable (host or device) memory.
pub unsafe fn put_staged<R>(
    ptrs: &[usize],
    sizes: &[usize],
    put: impl FnOnce(&[usize]) -> Result<R>,
) -> Result<R> {
    // SAFETY: the caller's contract.
    let s = unsafe { HostStand::sources(ptrs, sizes) }?;
    put(&s.ptrs)
}

/// A batch read into `ptrs` (any of them device memory) through `get`.
///
/// # Safety
/// Every `ptrs[i]..+sizes[i]` must be writable (host or device) memory.
pub unsafe fn get_staged(
    ptrs: &[usize],
    sizes: &[usize],
    get: impl FnOnce(&[usize]) -> Result<Vec<Result<u64>>>,
) -> Result<Vec<Result<u64>>> {
    let s = HostStand::destinations(ptrs, sizes);
    let mut results = get(&s.ptrs)?;
    // SAFETY: the caller's contract.
    unsafe { s.deliver(&mut results) };
    Ok(results)
}

/// A read of one item into `ptr` (host or device memory) through `get`.
///
/// # Safety
/// `ptr..ptr+size` must be writable (host or device) memory.
pub unsafe fn get_one_staged(
    ptr: usize,
    size: usize,
    get: impl FnOnce(usize) -> Result<u64>,
) -> Result<u64> {
    let s = HostStand::destinations(&[ptr], &[size]);
    let mut r = [get(s.ptrs[0])];
    // SAFETY: the caller's contract.
    unsafe { s.deliver(&mut r) };
    let [r] = r;
    r
}

/// A multi-buffer call (`batch_put_from_multi_buffers`,
/// `batch_get_into_multi_buffers` and their ranged forms) through `call`
/// with every device buffer replaced by a host copy of it. For a read
/// (`read`), each device buffer of a key that succeeded is copied back
/// whole (bytes the read left alone keep their value: the copy started
/// from the device's).
///
/// # Safety
/// Every `all_ptrs[i][j]..+all_sizes[i][j]` must be readable (and, for a
/// read, writable) host or device memory.
pub unsafe fn nested_staged<R>(
    all_ptrs: &[Vec<usize>],
    all_sizes: &[Vec<usize>],
    read: bool,
    call: impl FnOnce(&[Vec<usize>]) -> Result<Vec<Result<R>>>,
) -> Result<Vec<Result<R>>> {
    let mut ptrs = all_ptrs.to_vec();
    let mut staged: Vec<(usize, usize, Vec<u8>)> = Vec::new();
    for (i, (ps, ns)) in all_ptrs.iter().zip(all_sizes).enumerate() {
        for (j, (&p, &n)) in ps.iter().zip(ns).enumerate() {
            if n > 0 && is_device(p) {
                let host = vec![0u8; n];
                device_copy(host.as_ptr() as usize, p, n)()?;
                ptrs[i][j] = host.as_ptr() as usize;
                staged.push((i, p, host));
            }
        }
    }
    let mut results = call(&ptrs)?;
    if read {
        for (i, dev, host) in &staged {
            if let Some(r @ Ok(_)) = results.get_mut(*i) {
                if let Err(e) = device_copy(*dev, host.as_ptr() as usize, host.len())() {
                    *r = Err(e);
                }
            }
        }
    }
    Ok(results)
}

/// Calls that move bytes into registered host regions only
/// (`get_into_ranges`): a device buffer is refused, naming the call to use.
pub fn host_only(ptrs: &[usize], method: &str) -> Result<()> {
    match ptrs.iter().position(|&p| is_device(p)) {
        Some(i) => Err(Error::invalid(format!(
            "buffer {i} is CUDA device memory: {method} reads into host memory only \
             (get_into and batch_get_into accept device memory)"
        ))),
        None => Ok(()),
    }
}

/// A CUDA tensor to read a stored tensor into.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CudaTensorDest {
    /// `data_ptr()`; must be device memory.
    pub ptr: usize,
    /// Its element type.
    pub dtype: DType,
    /// Its shape.
    pub shape: Vec<u64>,
    /// Its bytes (`numel * itemsize`).
    pub nbytes: u64,
    /// Whether it is contiguous.
    pub contiguous: bool,
}

/// The rule of `get_tensor_into_cuda` before any read: a dummy client
/// (upstream reads into CUDA tensors through CUDA IPC only there), a
/// contiguous destination in CUDA device memory.
pub fn check_cuda_dest(dummy: bool, dest: &CudaTensorDest) -> Result<()> {
    if !dummy {
        return Err(Error::invalid(
            "CUDA IPC tensor read requires a dummy client",
        ));
    }
    if !dest.contiguous {
        return Err(Error::invalid("the destination tensor is not contiguous"));
    }
    if dest.nbytes > 0 && !is_device(dest.ptr) {
        let why = match device::current() {
            Ok(_) => "the destination tensor is not CUDA device memory".to_string(),
            Err(e) => format!("the destination tensor is not CUDA device memory: {e}"),
        };
        return Err(Error::invalid(why));
    }
    Ok(())
}

/// Read a stored tensor into a CUDA tensor: `get(ptr, len)` reads the
/// object into `len` bytes of host memory (returning its size); the header
/// must match the destination's dtype, shape and bytes; then the payload is
/// copied into the device. Returns the payload bytes (0 for an empty
/// tensor whose stored twin is empty too).
pub fn read_tensor_into_device(
    dest: &CudaTensorDest,
    get: impl FnOnce(usize, usize) -> Result<u64>,
) -> Result<u64> {
    let len = HEADER_SIZE + dest.nbytes as usize;
    let mut host = vec![0u8; len];
    // Any failure to read it (a missing key included) is INVALID_PARAMS,
    // upstream's code for every item of this call that cannot be served.
    let n = get(host.as_mut_ptr() as usize, len)
        .map_err(|e| Error::invalid(format!("cannot read the stored tensor: {e}")))?;
    let h = TensorHeader::decode(&host[..(n as usize).min(len)], n)
        .map_err(|e| Error::invalid(e.to_string()))?;
    if h.dtype != dest.dtype || h.local_shape != dest.shape || h.data_bytes != dest.nbytes {
        return Err(Error::invalid(format!(
            "destination tensor mismatch: stored {:?} {:?}, destination {:?} {:?}",
            h.dtype, h.local_shape, dest.dtype, dest.shape
        )));
    }
    if dest.nbytes == 0 {
        return Ok(0);
    }
    let start = h.data_offset as usize;
    if start + dest.nbytes as usize > len {
        return Err(Error::invalid(
            "the stored tensor's payload lies past its object",
        ));
    }
    device_copy(
        dest.ptr,
        host.as_ptr() as usize + start,
        dest.nbytes as usize,
    )()?;
    Ok(dest.nbytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use mooncake_transfer::engine::device::HostDevice;

    /// The stand-in device is one per process: tests take turns.
    static TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());

    fn fake() -> &'static HostDevice {
        static F: std::sync::OnceLock<&'static HostDevice> = std::sync::OnceLock::new();
        F.get_or_init(|| {
            let h = HostDevice::leak();
            device::install(h, 64 << 10);
            h
        })
    }

    fn read(addr: usize, n: usize) -> Vec<u8> {
        // SAFETY: test buffers are leaked allocations of at least n bytes.
        unsafe { std::slice::from_raw_parts(addr as *const u8, n) }.to_vec()
    }

    #[test]
    fn device_sources_are_copied_to_host_before_the_write() {
        let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
        let f = fake();
        let d = f.alloc(100, 0) as usize;
        // SAFETY: `d` holds 100 bytes.
        unsafe { std::ptr::write_bytes(d as *mut u8, 7, 100) };
        let host = [9u8; 50];
        let hp = host.as_ptr() as usize;
        let mut seen = Vec::new();
        // SAFETY: both buffers are readable.
        unsafe {
            put_staged(&[d, hp], &[100, 50], |p| {
                assert_ne!(p[0], d, "the device source is replaced");
                assert_eq!(p[1], hp, "host sources are passed as they are");
                seen = read(p[0], 100);
                Ok(())
            })
        }
        .unwrap();
        assert_eq!(seen, vec![7u8; 100]);
    }

    #[test]
    fn reads_deliver_the_bytes_read_to_device_destinations_only_on_success() {
        let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
        let f = fake();
        let (a, b) = (f.alloc(64, 0) as usize, f.alloc(64, 0) as usize);
        // SAFETY: both buffers are writable.
        let r = unsafe {
            get_staged(&[a, b], &[64, 64], |p| {
                for &q in p {
                    // SAFETY: the stand-ins hold 64 bytes each.
                    std::ptr::write_bytes(q as *mut u8, 5, 64);
                }
                Ok(vec![Ok(10), Err(Error::invalid("missing"))])
            })
        }
        .unwrap();
        assert_eq!(r[0], Ok(10));
        assert!(r[1].is_err());
        assert_eq!(
            read(a, 11),
            [&[5u8; 10][..], &[0]].concat(),
            "only the bytes read"
        );
        assert_eq!(read(b, 64), vec![0u8; 64], "a failed item copies nothing");
        // One item.
        // SAFETY: `a` holds 64 writable bytes.
        let n = unsafe {
            get_one_staged(a, 64, |q| {
                // SAFETY: the stand-in holds 64 bytes.
                std::ptr::write_bytes(q as *mut u8, 3, 64);
                Ok(64)
            })
        }
        .unwrap();
        assert_eq!((n, read(a, 64)), (64, vec![3u8; 64]));
    }

    #[test]
    fn multi_buffer_reads_copy_whole_device_buffers_back_for_keys_that_succeeded() {
        let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
        let f = fake();
        let (a, b, c) = (
            f.alloc(8, 0) as usize,
            f.alloc(8, 0) as usize,
            f.alloc(8, 0) as usize,
        );
        // SAFETY: each holds 8 bytes.
        unsafe {
            std::ptr::write_bytes(a as *mut u8, 1, 8);
            std::ptr::write_bytes(c as *mut u8, 1, 8);
        }
        let host = [0u8; 8];
        let hp = host.as_ptr() as usize;
        let ptrs = vec![vec![a, hp], vec![b], vec![c]];
        let sizes = vec![vec![8, 8], vec![8], vec![8]];
        // SAFETY: every buffer holds its 8 bytes.
        let r = unsafe {
            nested_staged(&ptrs, &sizes, true, |p| {
                assert_eq!(p[0][1], hp, "host buffers are passed as they are");
                assert_eq!(
                    read(p[0][0], 8),
                    vec![1u8; 8],
                    "stand-ins start as the device bytes"
                );
                // Key 0 writes 4 bytes of its first buffer; key 2 fails.
                std::ptr::write_bytes(p[0][0] as *mut u8, 7, 4);
                std::ptr::write_bytes(p[2][0] as *mut u8, 9, 8);
                Ok(vec![Ok(4u64), Ok(0), Err(Error::invalid("gone"))])
            })
        }
        .unwrap();
        assert_eq!(r.len(), 3);
        assert_eq!(read(a, 8), [7, 7, 7, 7, 1, 1, 1, 1]);
        assert_eq!(read(c, 8), vec![1u8; 8], "a failed key copies nothing back");
        assert!(host_only(&[hp], "get_into_ranges").is_ok());
        assert!(host_only(&[hp, b], "get_into_ranges")
            .unwrap_err()
            .to_string()
            .contains("buffer 1 is CUDA device memory"));
    }

    #[test]
    fn a_failed_device_copy_fails_its_item() {
        let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
        let f = fake();
        let a = f.alloc(64, 0) as usize;
        f.fail_copy.store(
            f.copy_count() as u64 + 1,
            std::sync::atomic::Ordering::Relaxed,
        );
        // SAFETY: `a` holds 64 writable bytes.
        let r = unsafe { get_one_staged(a, 64, |_| Ok(64)) };
        assert!(r.is_err());
    }

    #[test]
    fn cuda_tensor_reads_check_the_destination_and_copy_the_payload() {
        let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
        let f = fake();
        let shape = vec![2u64, 3];
        let h = TensorHeader::full(DType::Float32, &shape).unwrap();
        let payload: Vec<u8> = (0..24u8).collect();
        let object = [&h.encode()[..], &payload].concat();
        let d = f.alloc(24, 0) as usize;
        let dest = CudaTensorDest {
            ptr: d,
            dtype: DType::Float32,
            shape: shape.clone(),
            nbytes: 24,
            contiguous: true,
        };
        assert!(check_cuda_dest(false, &dest)
            .unwrap_err()
            .to_string()
            .contains("requires a dummy client"));
        check_cuda_dest(true, &dest).unwrap();
        let host = [0u8; 24];
        let on_host = CudaTensorDest {
            ptr: host.as_ptr() as usize,
            ..dest.clone()
        };
        assert!(check_cuda_dest(true, &on_host).is_err());
        let get = |p: usize, len: usize| {
            assert!(len >= object.len());
            // SAFETY: the host stand-in holds `len` bytes.
            unsafe { std::ptr::copy_nonoverlapping(object.as_ptr(), p as *mut u8, object.len()) };
            Ok(object.len() as u64)
        };
        assert_eq!(read_tensor_into_device(&dest, get).unwrap(), 24);
        assert_eq!(read(d, 24), payload);
        let wrong = CudaTensorDest {
            shape: vec![3, 2],
            ..dest.clone()
        };
        assert!(read_tensor_into_device(&wrong, get)
            .unwrap_err()
            .to_string()
            .contains("mismatch"));
        // An empty destination still has to match the stored tensor.
        let empty = CudaTensorDest {
            shape: vec![0],
            nbytes: 0,
            ..dest.clone()
        };
        let short = |p: usize, len: usize| {
            let n = len.min(object.len());
            // SAFETY: the host stand-in holds `len` bytes.
            unsafe { std::ptr::copy_nonoverlapping(object.as_ptr(), p as *mut u8, n) };
            Ok(object.len() as u64)
        };
        assert!(read_tensor_into_device(&empty, short).is_err());
        let h0 = TensorHeader::full(DType::Float32, &[0]).unwrap().encode();
        let empty_object = |p: usize, _: usize| {
            // SAFETY: the host stand-in holds at least the header.
            unsafe { std::ptr::copy_nonoverlapping(h0.as_ptr(), p as *mut u8, h0.len()) };
            Ok(h0.len() as u64)
        };
        assert_eq!(read_tensor_into_device(&empty, empty_object).unwrap(), 0);
        let missing = |_: usize, _: usize| Err(Error::internal("no such key"));
        let e = read_tensor_into_device(&dest, missing).unwrap_err();
        assert_eq!(
            e.code(),
            Error::invalid("").code(),
            "a missing key is INVALID_PARAMS"
        );
    }
}
