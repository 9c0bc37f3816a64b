//! Methods of upstream's Tier 2/3 surface: those whose upstream behaviour
//! this build gives (segment unmounting, the SSD tier's drain and counter,
//! `put_from_with_metadata`, the deprecated `init_all`, the CUDA IPC reads'
//! errors), and those not implemented yet, which raise
//! `NotImplementedError` and log the method name.
//! Signatures follow upstream so callers fail on the result, not on
//! argument binding.

use super::class::MooncakeDistributedStore;
use super::config::{options, ReplicateConfig};
use crate::args::UInt;
use crate::report::Call;
use mooncake_client::{cuda_tensor_reads, Client, ClientConfig, Error};
use mooncake_standalone::Store;
use pyo3::exceptions::PyNotImplementedError;
use pyo3::prelude::*;

fn not_implemented() -> Error {
    Error::not_supported("not implemented (Tier 2/3)")
}

fn unsupported_raise<T>(py: Python<'_>, method: &'static str) -> PyResult<T> {
    Call::new(py, method).fail(None, &not_implemented());
    Err(PyNotImplementedError::new_err(format!(
        "MooncakeDistributedStore.{method} is not implemented"
    )))
}

#[pymethods]
impl MooncakeDistributedStore {
    /// Tier 2: replica descriptors of `key` (raises NotImplementedError).
    fn get_replica_desc(&self, py: Python<'_>, key: String) -> PyResult<PyObject> {
        let _ = key;
        unsupported_raise(py, "get_replica_desc")
    }

    /// Tier 2: replica descriptors per key (raises NotImplementedError).
    fn batch_get_replica_desc(&self, py: Python<'_>, keys: Vec<String>) -> PyResult<PyObject> {
        let _ = keys;
        unsupported_raise(py, "batch_get_replica_desc")
    }

    /// Tier 2: copy task (raises NotImplementedError).
    fn create_copy_task(
        &self,
        py: Python<'_>,
        key: String,
        targets: Vec<String>,
    ) -> PyResult<PyObject> {
        let _ = (key, targets);
        unsupported_raise(py, "create_copy_task")
    }

    /// Tier 2: move task (raises NotImplementedError).
    fn create_move_task(
        &self,
        py: Python<'_>,
        key: String,
        source: String,
        target: String,
    ) -> PyResult<PyObject> {
        let _ = (key, source, target);
        unsupported_raise(py, "create_move_task")
    }

    /// Tier 2: task status (raises NotImplementedError).
    fn query_task(&self, py: Python<'_>, task_id: &Bound<'_, PyAny>) -> PyResult<PyObject> {
        let _ = task_id;
        unsupported_raise(py, "query_task")
    }

    /// Tier 2: mount an extra segment (raises NotImplementedError).
    #[pyo3(signature = (path, size, offset=UInt(0), protocol="tcp".to_string(), location=String::new()))]
    fn mount_segment(
        &self,
        py: Python<'_>,
        path: String,
        size: UInt,
        offset: UInt,
        protocol: String,
        location: String,
    ) -> PyResult<PyObject> {
        let _ = (path, size, offset, protocol, location);
        unsupported_raise(py, "mount_segment")
    }

    /// Tier 2: allocate and mount an extra segment (raises NotImplementedError).
    #[pyo3(signature = (size, protocol="tcp".to_string(), location=String::new()))]
    fn allocate_and_mount_segment(
        &self,
        py: Python<'_>,
        size: UInt,
        protocol: String,
        location: String,
    ) -> PyResult<PyObject> {
        let _ = (size, protocol, location);
        unsupported_raise(py, "allocate_and_mount_segment")
    }

    /// Unmount segments `mount_segment` added: 0 for `[]`, -1 for any id
    /// (this client has only its setup segment), -1 on a dummy client.
    #[pyo3(signature = (segment_ids, grace_period_seconds=UInt(0)))]
    fn unmount_segment(
        &self,
        py: Python<'_>,
        segment_ids: Vec<String>,
        grace_period_seconds: UInt,
    ) -> i64 {
        let _ = grace_period_seconds;
        let r = self.run(py, |s| s.unmount_segments("unmount_segment", &segment_ids));
        Call::new(py, "unmount_segment").code(None, r)
    }

    /// Unmount and free segments `allocate_and_mount_segment` added: as
    /// `unmount_segment`.
    #[pyo3(signature = (segment_ids, grace_period_seconds=UInt(0)))]
    fn unmount_and_free_segment(
        &self,
        py: Python<'_>,
        segment_ids: Vec<String>,
        grace_period_seconds: UInt,
    ) -> i64 {
        let _ = grace_period_seconds;
        let r = self.run(py, |s| {
            s.unmount_segments("unmount_and_free_segment", &segment_ids)
        });
        Call::new(py, "unmount_and_free_segment").code(None, r)
    }

    /// Drain the SSD tier's local disk segment: 0 (SSD offload is never
    /// enabled here, nothing to drain; a WARNING says so), -1 on a dummy client.
    #[pyo3(signature = (grace_period_seconds=UInt(0)))]
    fn unmount_local_disk_segment(&self, py: Python<'_>, grace_period_seconds: UInt) -> i64 {
        let _ = grace_period_seconds;
        let call = Call::new(py, "unmount_local_disk_segment");
        let r = self.run(py, Store::drain_local_disk_segment);
        if r.is_ok() {
            call.note("SSD offload is not enabled; no local disk segment to drain");
        }
        call.code(None, r)
    }

    /// CUDA IPC read of `key` into a GPU tensor: -600 (needs CUDA; this
    /// build has none).
    fn get_tensor_into_cuda(&self, py: Python<'_>, key: String, tensor: &Bound<'_, PyAny>) -> i64 {
        let _ = tensor;
        let r = self.run(py, |_| {
            cuda_tensor_reads(1, 1)
                .pop()
                .unwrap_or_else(|| Err(Error::internal("no result")))
        });
        Call::new(py, "get_tensor_into_cuda").code(Some(&key), r)
    }

    /// CUDA IPC reads into GPU tensors: -600 per key (needs CUDA; this
    /// build has none).
    fn batch_get_tensor_into_cuda(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        tensors_list: &Bound<'_, PyAny>,
    ) -> Vec<i64> {
        let tensors = tensors_list.len().unwrap_or(0);
        let r = self.run(py, |_| Ok(cuda_tensor_reads(keys.len(), tensors)));
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
                if let Some(old) = self.replace(Some(Store::Local(client))) {
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
            s.put_from_with_metadata(
                &key,
                buffer_ptr.usize(),
                metadata_buffer_ptr.usize(),
                size.usize(),
                metadata_size.usize(),
                &cfg,
            )
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

    /// Tier 2: clear replicas (raises NotImplementedError).
    #[pyo3(signature = (keys, segment_name=String::new()))]
    fn batch_replica_clear(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        segment_name: String,
    ) -> PyResult<PyObject> {
        let _ = (keys, segment_name);
        unsupported_raise(py, "batch_replica_clear")
    }
}
