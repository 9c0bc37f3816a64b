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
use crate::family::method_family;
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

method_family! {
    #[allow(unused_variables)]
    fn method(&self, py: Python<'_>) -> PyResult<PyObject> {
        unsupported_raise(py, method)
    }
    #[pymethods] for MooncakeDistributedStore {
        /// Tier 2: replica descriptors of `key` (raises NotImplementedError).
        get_replica_desc(key: String) {}
        /// Tier 2: replica descriptors per key (raises NotImplementedError).
        batch_get_replica_desc(keys: Vec<String>) {}
        /// Tier 2: copy task (raises NotImplementedError).
        create_copy_task(key: String, targets: Vec<String>) {}
        /// Tier 2: move task (raises NotImplementedError).
        create_move_task(key: String, source: String, target: String) {}
        /// Tier 2: task status (raises NotImplementedError).
        query_task(task_id: &Bound<'_, PyAny>) {}
        /// Tier 2: mount an extra segment (raises NotImplementedError).
        #[pyo3(signature = (path, size, offset=UInt(0), protocol="tcp".to_string(), location=String::new()))]
        mount_segment(path: String, size: UInt, offset: UInt, protocol: String, location: String) {}
        /// Tier 2: allocate and mount an extra segment (raises NotImplementedError).
        #[pyo3(signature = (size, protocol="tcp".to_string(), location=String::new()))]
        allocate_and_mount_segment(size: UInt, protocol: String, location: String) {}
        /// Tier 2: clear replicas (raises NotImplementedError).
        #[pyo3(signature = (keys, segment_name=String::new()))]
        batch_replica_clear(keys: Vec<String>, segment_name: String) {}
    }
}

method_family! {
    #[pyo3(signature = (segment_ids, grace_period_seconds=UInt(0)))]
    fn method(&self, py: Python<'_>, segment_ids: Vec<String>, grace_period_seconds: UInt) -> i64 {
        let _ = grace_period_seconds;
        let r = self.run(py, |s| s.unmount_segments(method, &segment_ids));
        Call::new(py, method).code(None, r)
    }
    #[pymethods] for MooncakeDistributedStore {
        /// Unmount segments `mount_segment` added: 0 for `[]`, -1 for any id
        /// (this client has only its setup segment), -1 on a dummy client.
        unmount_segment {}
        /// Unmount and free segments `allocate_and_mount_segment` added: as
        /// `unmount_segment`.
        unmount_and_free_segment {}
    }
}

#[pymethods]
impl MooncakeDistributedStore {
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
}
