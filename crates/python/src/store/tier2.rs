//! Methods of upstream's Tier 2/3 surface: segments added after setup and
//! their unmounting, the SSD tier's drain and counter,
//! `put_from_with_metadata`, the deprecated `init_all`, the reads into CUDA
//! tensors. Signatures follow upstream so callers fail on the result, not
//! on argument binding.

use super::class::MooncakeDistributedStore;
use super::config::{options, ReplicateConfig};
use crate::args::UInt;
use crate::family::method_family;
use crate::report::Call;
use mooncake_client::device_staging::{check_cuda_dest, read_tensor_into_device, CudaTensorDest};
use mooncake_client::{Client, ClientConfig, Dst, Error, MountSource, Result, Src};
use mooncake_tensor::{DType, ReadOutput};
use pyo3::prelude::*;
use pyo3::types::PyDict;

/// A protocol or location the added segment cannot use is noted: data
/// moves over TCP and same-host mappings in this build.
fn note_transport(call: Call<'_>, protocol: &str, location: &str) {
    if protocol != "tcp" {
        call.note(&format!(
            "protocol {protocol:?}: this build serves the segment over tcp and same-host mappings"
        ));
    }
    if !location.is_empty() {
        call.note(&format!(
            "location {location:?}: this build places segments in host memory only"
        ));
    }
}

impl MooncakeDistributedStore {
    /// Mount `src` as a segment of this client for `method`
    /// (`mount_segment` / `allocate_and_mount_segment`), noting the
    /// transport arguments first; the dict both return: `ret` (0 or the
    /// failure's code), `segment_ids` (the new segment's id, or none) and,
    /// for an allocated segment, `allocated_size`.
    fn mount<'py>(
        &self,
        py: Python<'py>,
        method: &'static str,
        src: MountSource,
        protocol: &str,
        location: &str,
    ) -> PyResult<Bound<'py, PyDict>> {
        let call = Call::new(py, method);
        note_transport(call, protocol, location);
        let allocated = matches!(src, MountSource::Allocate { .. });
        let r = self.run(py, |s| s.mount_segment(method, &src));
        let d = PyDict::new(py);
        let (ret, ids, size) = match r {
            Ok((id, size)) => (0, vec![id], size),
            Err(e) => (call.code::<()>(None, Err(e)), Vec::new(), 0),
        };
        d.set_item("ret", ret)?;
        d.set_item("segment_ids", ids)?;
        if allocated {
            d.set_item("allocated_size", size)?;
        }
        Ok(d)
    }
}

#[pymethods]
impl MooncakeDistributedStore {
    /// Mount `size` bytes of the file (or `/dev/shm` object) at `path` as
    /// a segment of this client: `{"ret", "segment_ids"}`. `offset` must
    /// be 0 (-600 otherwise); a dummy client gets -1.
    #[pyo3(signature = (path, size, offset=UInt(0), protocol="tcp".to_string(), location=String::new()))]
    fn mount_segment<'py>(
        &self,
        py: Python<'py>,
        path: String,
        size: UInt,
        offset: UInt,
        protocol: String,
        location: String,
    ) -> PyResult<Bound<'py, PyDict>> {
        let src = MountSource::File {
            path,
            size: size.0,
            offset: offset.0,
        };
        self.mount(py, "mount_segment", src, &protocol, &location)
    }

    /// Allocate `size` bytes (rounded up to whole pages) and mount them as
    /// a segment of this client: `{"ret", "segment_ids", "allocated_size"}`;
    /// a dummy client gets -1.
    #[pyo3(signature = (size, protocol="tcp".to_string(), location=String::new()))]
    fn allocate_and_mount_segment<'py>(
        &self,
        py: Python<'py>,
        size: UInt,
        protocol: String,
        location: String,
    ) -> PyResult<Bound<'py, PyDict>> {
        let src = MountSource::Allocate { size: size.0 };
        self.mount(py, "allocate_and_mount_segment", src, &protocol, &location)
    }
}

method_family! {
    #[pyo3(signature = (segment_ids, grace_period_seconds=UInt(0)))]
    fn method(&self, py: Python<'_>, segment_ids: Vec<String>, grace_period_seconds: UInt) -> i64 {
        let grace = std::time::Duration::from_secs(grace_period_seconds.0);
        let r = self.run(py, |s| s.unmount_segments(method, &segment_ids, grace));
        Call::new(py, method).code(None, r)
    }
    #[pymethods] for MooncakeDistributedStore {
        /// Unmount segments `mount_segment` added, after
        /// `grace_period_seconds` (their objects go with them): 0, or -1
        /// for an id this client did not mount from a file (nothing is
        /// unmounted then) and on a dummy client.
        unmount_segment {}
        /// Unmount and free segments `allocate_and_mount_segment` added:
        /// as `unmount_segment`.
        unmount_and_free_segment {}
    }
}

#[pymethods]
impl MooncakeDistributedStore {
    /// Drain this client's SSD tier: the master forgets every copy in it
    /// (objects with no memory replica are gone) and sends it no more;
    /// then wait `grace_period_seconds`. 0 when drained, or when the client
    /// has no SSD tier (a WARNING says so, no wait); -1 on a dummy client
    /// or when the master refuses.
    #[pyo3(signature = (grace_period_seconds=UInt(0)))]
    fn unmount_local_disk_segment(&self, py: Python<'_>, grace_period_seconds: UInt) -> i64 {
        let call = Call::new(py, "unmount_local_disk_segment");
        let grace = std::time::Duration::from_secs(grace_period_seconds.0);
        let r = self.run(py, |s| s.drain_local_disk_segment(grace));
        if matches!(r, Ok(false)) {
            call.note("SSD offload is not enabled; no local disk segment to drain");
        }
        call.code(None, r.map(|_| ()))
    }

    /// Read the tensor stored at `key` into the CUDA tensor `tensor` (a
    /// dummy client's call, as upstream): its payload bytes, or -600 (not
    /// set up, not a dummy, no CUDA driver, not a contiguous CUDA tensor, or
    /// a dtype/shape/size other than the stored tensor's).
    fn get_tensor_into_cuda(&self, py: Python<'_>, key: String, tensor: &Bound<'_, PyAny>) -> i64 {
        let keys = [key];
        let r = self.cuda_reads(py, &keys, vec![tensor.clone()]);
        let r = r.and_then(|mut v| v.pop().unwrap_or_else(|| Err(Error::internal("no result"))));
        let [key] = keys;
        Call::new(py, "get_tensor_into_cuda").code(Some(&key), r)
    }

    /// `get_tensor_into_cuda` per key; lists of different lengths (or a
    /// call that cannot run at all) give -600 for every key.
    fn batch_get_tensor_into_cuda(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        tensors_list: &Bound<'_, PyAny>,
    ) -> Vec<i64> {
        let tensors: Result<Vec<Bound<'_, PyAny>>> = tensors_list
            .try_iter()
            .and_then(|it| it.collect::<PyResult<Vec<_>>>())
            .map_err(|e| Error::invalid(format!("tensors_list is not a list: {e}")));
        let r = tensors.and_then(|t| self.cuda_reads(py, &keys, t));
        Call::new(py, "batch_get_tensor_into_cuda").codes(&keys, r)
    }

    /// Deprecated upstream entry point `init_all(protocol, device_name,
    /// mount_segment_size)`: `setup` with upstream's fixed arguments
    /// (`ClientConfig::init_all`); -600 when the store is already set up.
    fn init_all(&self, py: Python<'_>, arg0: String, arg1: String, arg2: UInt) -> i64 {
        let call = Call::new(py, "init_all");
        if self.store().is_some() {
            return call.code::<()>(None, Err(Error::invalid("the store is already set up")));
        }
        let cfg = ClientConfig::init_all(&arg0, &arg1, arg2.0);
        let mut notes = Vec::new();
        let r = cfg
            .check(&mut notes)
            .and_then(|()| py.allow_threads(|| Client::setup(cfg)));
        for n in &notes {
            call.note(n);
        }
        call.code(
            None,
            r.map(|client| {
                if let Some(old) = self.replace(Some(client)) {
                    py.allow_threads(|| old.close());
                }
            }),
        )
    }

    /// Reads served from the SSD tier over RPC: 0 (no SSD tier).
    fn get_offload_rpc_read_count(&self) -> i64 {
        self.store()
            .map_or(0, |s| s.offload_rpc_read_count() as i64)
    }

    /// Store `metadata_size` bytes at `metadata_buffer_ptr` followed by
    /// `size` bytes at `buffer_ptr` as one object (no staging); `size == 0`
    /// stores nothing and returns 0.
    #[pyo3(signature = (key, buffer_ptr, metadata_buffer_ptr, size, metadata_size, config=None))]
    #[allow(clippy::too_many_arguments)]
    fn put_from_with_metadata(
        &self,
        py: Python<'_>,
        key: String,
        buffer_ptr: UInt,
        metadata_buffer_ptr: UInt,
        size: UInt,
        metadata_size: UInt,
        config: Option<ReplicateConfig>,
    ) -> i64 {
        let cfg = options(config);
        // SAFETY: the caller vouches for both ranges (upstream contract).
        let r = self.run(py, |s| unsafe {
            let src = Src::new(buffer_ptr.usize(), size.usize());
            let metadata = Src::new(metadata_buffer_ptr.usize(), metadata_size.usize());
            s.put_from_with_metadata(&key, src, metadata, &cfg)
        });
        let call = Call::new(py, "put_from_with_metadata");
        if r.is_ok() && size.0 == 0 {
            call.note(&format!(
                "key={}: size 0; nothing stored",
                crate::report::show_key(&key)
            ));
        }
        call.code(Some(&key), r)
    }
}

impl MooncakeDistributedStore {
    /// Reads into CUDA tensors (see `device_staging`): call-level failures
    /// first (not set up, lengths, no CUDA driver, not a dummy client), then
    /// one result per key.
    fn cuda_reads(
        &self,
        py: Python<'_>,
        keys: &[String],
        tensors: Vec<Bound<'_, PyAny>>,
    ) -> Result<Vec<Result<u64>>> {
        let store = self.store().ok_or_else(Error::not_set_up)?;
        if keys.len() != tensors.len() {
            return Err(Error::invalid(format!(
                "keys and tensors size mismatch ({} keys, {} tensors)",
                keys.len(),
                tensors.len()
            )));
        }
        if let Err(e) = mooncake_transfer::engine::device::current() {
            return Err(Error::invalid(format!(
                "reads into CUDA tensors need CUDA: {e} (no CUDA support in this process)"
            )));
        }
        let dummy = std::sync::Arc::clone(&store).client().is_none();
        if !dummy {
            return Err(Error::invalid(
                "CUDA IPC tensor read requires a dummy client",
            ));
        }
        let dests: Vec<Result<CudaTensorDest>> = tensors
            .iter()
            .map(|t| cuda_dest(t).and_then(|d| check_cuda_dest(dummy, &d).map(|()| d)))
            .collect();
        Ok(py.allow_threads(|| {
            keys.iter()
                .zip(dests)
                .map(|(k, d)| {
                    d.and_then(|d| {
                        read_tensor_into_device(&d, |p, len| {
                            // SAFETY: `p..p+len` is the host buffer the
                            // reader just allocated for this object.
                            unsafe { store.get_into(k, Dst::new(p, len)) }
                        })
                    })
                })
                .collect()
        }))
    }
}

/// What a read into a CUDA tensor needs to know of `t`.
fn cuda_dest(t: &Bound<'_, PyAny>) -> Result<CudaTensorDest> {
    let read = || -> PyResult<(String, Vec<u64>, usize, u64, bool)> {
        Ok((
            t.getattr("dtype")?.str()?.to_string(),
            t.getattr("shape")?.extract()?,
            t.call_method0("data_ptr")?.extract()?,
            t.getattr("nbytes")?.extract()?,
            t.call_method0("is_contiguous")?.extract()?,
        ))
    };
    let (dtype, shape, ptr, nbytes, contiguous) =
        read().map_err(|e| Error::invalid(format!("the destination is not a tensor: {e}")))?;
    let dtype = DType::from_torch_name(&dtype).map_err(|e| Error::invalid(e.to_string()))?;
    Ok(CudaTensorDest {
        ptr,
        dtype,
        shape,
        nbytes,
        contiguous,
    })
}

/// A CUDA tensor viewing the payload of the read output `out` (its
/// `nbytes` bytes, as its `dtype` and `shape`) in device memory at `ptr`
/// (not owning it), made through `__cuda_array_interface__`.
pub(crate) fn cuda_view_of<'py>(
    py: Python<'py>,
    ptr: usize,
    out: &ReadOutput,
) -> PyResult<Bound<'py, PyAny>> {
    use pyo3::types::{PyDict, PyTuple};
    let (nbytes, dtype, shape) = (out.nbytes, out.dtype, &out.shape[..]);
    let torch = py.import("torch")?;
    let device = mooncake_transfer::engine::device::classify(ptr as u64).unwrap_or(0);
    let kw = PyDict::new(py);
    kw.set_item("device", format!("cuda:{device}"))?;
    let typed = if nbytes == 0 {
        kw.set_item("dtype", torch.getattr(dtype.torch_name())?)?;
        return torch
            .getattr("empty")?
            .call((PyTuple::new(py, shape)?,), Some(&kw));
    } else {
        let iface = PyDict::new(py);
        iface.set_item("shape", (nbytes,))?;
        iface.set_item("typestr", "|u1")?;
        iface.set_item("data", (ptr, false))?;
        iface.set_item("version", 3)?;
        let attrs = PyDict::new(py);
        attrs.set_item("__cuda_array_interface__", iface)?;
        let holder = py
            .import("types")?
            .getattr("SimpleNamespace")?
            .call((), Some(&attrs))?;
        let bytes = torch.getattr("as_tensor")?.call((holder,), Some(&kw))?;
        bytes.call_method1("view", (torch.getattr(dtype.torch_name())?,))?
    };
    typed.call_method1("reshape", (PyTuple::new(py, shape)?,))
}
