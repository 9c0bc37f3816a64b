//! Tier 2/3 methods that exist but are not implemented yet (store spec,
//! "Tiers": until implemented, a method returning `int` or `list[int]`
//! returns -1012 NOT_SUPPORTED (per item), any other raises
//! `NotImplementedError`, and either way logs the method name).
//! Signatures follow upstream so callers fail on the result, not on
//! argument binding.

use super::class::MooncakeDistributedStore;
use super::config::ReplicateConfig;
use crate::args::UInt;
use crate::report::Call;
use mooncake_client::Error;
use pyo3::exceptions::PyNotImplementedError;
use pyo3::prelude::*;

fn not_implemented() -> Error {
    Error::not_supported("not implemented (Tier 2/3)")
}

fn unsupported_int(py: Python<'_>, method: &'static str) -> i64 {
    Call::new(py, method).code::<()>(None, Err(not_implemented()))
}

fn unsupported_list(py: Python<'_>, method: &'static str, keys: &[String]) -> Vec<i64> {
    Call::new(py, method).codes::<()>(keys, Err(not_implemented()))
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

    /// Tier 2: returns -1012.
    #[pyo3(signature = (segment_ids, grace_period_seconds=UInt(0)))]
    fn unmount_segment(
        &self,
        py: Python<'_>,
        segment_ids: Vec<String>,
        grace_period_seconds: UInt,
    ) -> i64 {
        let _ = (segment_ids, grace_period_seconds);
        unsupported_int(py, "unmount_segment")
    }

    /// Tier 2: returns -1012.
    #[pyo3(signature = (segment_ids, grace_period_seconds=UInt(0)))]
    fn unmount_and_free_segment(
        &self,
        py: Python<'_>,
        segment_ids: Vec<String>,
        grace_period_seconds: UInt,
    ) -> i64 {
        let _ = (segment_ids, grace_period_seconds);
        unsupported_int(py, "unmount_and_free_segment")
    }

    /// Tier 3 (SSD offload): returns -1012.
    #[pyo3(signature = (grace_period_seconds=UInt(0)))]
    fn unmount_local_disk_segment(&self, py: Python<'_>, grace_period_seconds: UInt) -> i64 {
        let _ = grace_period_seconds;
        unsupported_int(py, "unmount_local_disk_segment")
    }

    /// Tier 3: returns -1012.
    fn setup_dummy(
        &self,
        py: Python<'_>,
        mem_pool_size: UInt,
        local_buffer_size: UInt,
        server_address: String,
    ) -> i64 {
        let _ = (mem_pool_size, local_buffer_size, server_address);
        unsupported_int(py, "setup_dummy")
    }

    /// Tier 3 (CUDA IPC): returns -1012.
    fn get_tensor_into_cuda(&self, py: Python<'_>, key: String, tensor: &Bound<'_, PyAny>) -> i64 {
        let _ = (key, tensor);
        unsupported_int(py, "get_tensor_into_cuda")
    }

    /// Tier 3 (CUDA IPC): -1012 per key.
    fn batch_get_tensor_into_cuda(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        tensors_list: &Bound<'_, PyAny>,
    ) -> Vec<i64> {
        let _ = tensors_list;
        unsupported_list(py, "batch_get_tensor_into_cuda", &keys)
    }

    /// Deprecated upstream entry point: returns -1012.
    fn init_all(&self, py: Python<'_>, arg0: String, arg1: String, arg2: UInt) -> i64 {
        let _ = (arg0, arg1, arg2);
        unsupported_int(py, "init_all")
    }

    /// Tier 3 (memory pool): returns -1012.
    fn alloc_from_mem_pool(&self, py: Python<'_>, arg0: UInt) -> i64 {
        let _ = arg0;
        unsupported_int(py, "alloc_from_mem_pool")
    }

    /// Tier 3 (SSD offload): returns -1012.
    fn get_offload_rpc_read_count(&self, py: Python<'_>) -> i64 {
        unsupported_int(py, "get_offload_rpc_read_count")
    }

    /// Not implemented yet: returns -1012.
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
        let _ = (
            key,
            buffer_ptr,
            metadata_buffer_ptr,
            size,
            metadata_size,
            config,
        );
        unsupported_int(py, "put_from_with_metadata")
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
