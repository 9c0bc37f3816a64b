//! The legacy tensor-parallel wrappers (`*_with_tp`): one shard per rank
//! along `split_dim`, written and read under upstream's key layout.
//! `tp_rank` is ignored by every write (upstream).

use super::*;

method_family! {
    fn method<'py>(&self, py: Python<'py>, key: String, tensor: Bound<'py, PyAny>) -> PyResult<i64> {
        let _ = tp_rank;
        let (src, route) = (Src::Tensor(tensor), tp_route(tp_size, split_dim));
        self.tensor_write_one(py, method, key, src, route, config, mode)
    }
    #[pymethods] for MooncakeDistributedStore {
        /// Split the full `tensor` into `tp_size` chunks along `split_dim` and
        /// store all of `key_tp_0 ..`.
        #[pyo3(signature = (key, tensor, tp_rank=0, tp_size=1, split_dim=0))]
        put_tensor_with_tp(tp_rank: i64, tp_size: i64, split_dim: i64) {
            config: None,
            mode: WriteMode::Put,
        }
        /// `put_tensor_with_tp` with a `ReplicateConfig` (pub check first).
        #[pyo3(signature = (key, tensor, config=None, tp_rank=0, tp_size=1, split_dim=0))]
        pub_tensor_with_tp(config: Cfg, tp_rank: i64, tp_size: i64, split_dim: i64) {
            mode: WriteMode::Pub,
        }
    }
}

method_family! {
    fn method<'py>(
        &self,
        py: Python<'py>,
        base_keys: Vec<String>,
        tensors_list: Vec<Bound<'py, PyAny>>,
    ) -> PyResult<Vec<i64>> {
        let _ = tp_rank;
        let route = |_| tp_route(tp_size, split_dim);
        self.write_tensor_batch(py, method, base_keys, tensors_list, route, config, mode)
    }
    #[pymethods] for MooncakeDistributedStore {
        /// `put_tensor_with_tp` for many tensors (one batched write).
        #[pyo3(signature = (base_keys, tensors_list, tp_rank=0, tp_size=1, split_dim=0))]
        batch_put_tensor_with_tp(tp_rank: i64, tp_size: i64, split_dim: i64) {
            config: None,
            mode: WriteMode::Put,
        }
        /// `batch_put_tensor_with_tp` with a `ReplicateConfig` (pub check first).
        #[pyo3(signature = (base_keys, tensors_list, config=None, tp_rank=0, tp_size=1, split_dim=0))]
        batch_pub_tensor_with_tp(config: Cfg, tp_rank: i64, tp_size: i64, split_dim: i64) {
            mode: WriteMode::Pub,
        }
    }
}

#[pymethods]
impl MooncakeDistributedStore {
    /// The buffer holds a full tensor object; store all TP chunks of it
    /// (`tp_size <= 1`: `put_tensor_from`).
    #[pyo3(signature = (key, buffer_ptr, size, tp_rank=0, tp_size=1, split_dim=0))]
    #[allow(clippy::too_many_arguments)]
    fn put_tensor_with_tp_from(
        &self,
        py: Python<'_>,
        key: String,
        buffer_ptr: UInt,
        size: UInt,
        tp_rank: i64,
        tp_size: i64,
        split_dim: i64,
    ) -> PyResult<i64> {
        let _ = tp_rank;
        let (src, route) = (object_src(buffer_ptr, size), tp_route(tp_size, split_dim));
        let method = "put_tensor_with_tp_from";
        self.tensor_write_one(py, method, key, src, route, None, WriteMode::Put)
    }

    /// Batch `put_tensor_with_tp_from`; an invalid buffer fails its item.
    #[pyo3(signature = (base_keys, buffer_ptrs, sizes, tp_rank=0, tp_size=1, split_dim=0))]
    #[allow(clippy::too_many_arguments)]
    fn batch_put_tensor_with_tp_from(
        &self,
        py: Python<'_>,
        base_keys: Vec<String>,
        buffer_ptrs: Vec<UInt>,
        sizes: Vec<UInt>,
        tp_rank: i64,
        tp_size: i64,
        split_dim: i64,
    ) -> PyResult<Vec<i64>> {
        let _ = tp_rank;
        let method = "batch_put_tensor_with_tp_from";
        if let Err(e) = check_lengths(base_keys.len(), &[buffer_ptrs.len(), sizes.len()]) {
            return Ok(self.tensor_fail_batch(py, method, &base_keys, e));
        }
        let route = |_| tp_route(tp_size, split_dim);
        let items = object_items(&base_keys, &buffer_ptrs, &sizes, route);
        self.batch_writes(py, method, None, WriteMode::Put, items, &base_keys)
    }

    /// The `tp_rank` shard of `key` (re-sharded when `tp_size` differs from
    /// storage); `tp_size <= 1`: `get_tensor`. `split_dim` is advisory.
    #[pyo3(signature = (key, tp_rank=0, tp_size=1, split_dim=0))]
    fn get_tensor_with_tp<'py>(
        &self,
        py: Python<'py>,
        key: String,
        tp_rank: i64,
        tp_size: i64,
        split_dim: i64,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        let req = legacy_tp(&key, tp_rank, tp_size, Some(split_dim));
        self.tensor_read_one(py, "get_tensor_with_tp", key, req, None)
    }

    /// `get_tensor_with_tp` for many keys (split dim taken from storage).
    #[pyo3(signature = (base_keys, tp_rank=0, tp_size=1))]
    fn batch_get_tensor_with_tp<'py>(
        &self,
        py: Python<'py>,
        base_keys: Vec<String>,
        tp_rank: i64,
        tp_size: i64,
    ) -> PyResult<Vec<Option<Bound<'py, PyAny>>>> {
        let reqs = base_keys
            .iter()
            .map(|k| legacy_tp(k, tp_rank, tp_size, None))
            .collect();
        self.tensor_reads(py, "batch_get_tensor_with_tp", &base_keys, reqs, None, true)
    }

    /// `_into` form of `get_tensor_with_tp`.
    #[pyo3(signature = (key, buffer_ptr, size, tp_rank=0, tp_size=1, split_dim=0))]
    #[allow(clippy::too_many_arguments)]
    fn get_tensor_with_tp_into<'py>(
        &self,
        py: Python<'py>,
        key: String,
        buffer_ptr: UInt,
        size: UInt,
        tp_rank: i64,
        tp_size: i64,
        split_dim: i64,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        let req = legacy_tp(&key, tp_rank, tp_size, Some(split_dim));
        let into = Some((buffer_ptr, size));
        self.tensor_read_one(py, "get_tensor_with_tp_into", key, req, into)
    }

    /// `_into` form of `batch_get_tensor_with_tp`; argument errors are `[-600] * n`.
    #[pyo3(signature = (base_keys, buffer_ptrs, sizes, tp_rank=0, tp_size=1))]
    fn batch_get_tensor_with_tp_into<'py>(
        &self,
        py: Python<'py>,
        base_keys: Vec<String>,
        buffer_ptrs: Vec<UInt>,
        sizes: Vec<UInt>,
        tp_rank: i64,
        tp_size: i64,
    ) -> PyResult<Bound<'py, PyAny>> {
        let req = |k: &str| legacy_tp(k, tp_rank, tp_size, None);
        let method = "batch_get_tensor_with_tp_into";
        self.read_into_batch_ints(py, method, base_keys, buffer_ptrs, sizes, req)
    }
}
