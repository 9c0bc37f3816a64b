//! The unified `*_with_parallelism` writes and reads: a parallelism (or a
//! writer partition) per call or per key, and a read target.

use super::*;

method_family! {
    #[pyo3(signature = (key, tensor, parallelism=None, config=None, writer_partition=None, *, replica=None))]
    fn method<'py>(
        &self,
        py: Python<'py>,
        key: String,
        tensor: Bound<'py, PyAny>,
        parallelism: Option<Bound<'py, PyAny>>,
        config: Cfg,
        writer_partition: Option<Bound<'py, PyAny>>,
        replica: Cfg,
    ) -> PyResult<i64> {
        let (src, requests) = (Src::Tensor(tensor), (parallelism, writer_partition));
        self.request_write_one(py, method, (key, src), requests, (config, replica), mode)
    }
    #[pymethods] for MooncakeDistributedStore {
        /// Store `tensor` per a `TensorParallelism` request or a writer partition.
        put_tensor_with_parallelism { mode: WriteMode::Put }
        /// Upsert form of `put_tensor_with_parallelism`.
        upsert_tensor_with_parallelism { mode: WriteMode::Upsert }
    }
}

method_family! {
    #[pyo3(signature = (key, buffer_ptr, size, parallelism=None, config=None, writer_partition=None, *, replica=None))]
    fn method<'py>(
        &self,
        py: Python<'py>,
        key: String,
        buffer_ptr: UInt,
        size: UInt,
        parallelism: Option<Bound<'py, PyAny>>,
        config: Cfg,
        writer_partition: Option<Bound<'py, PyAny>>,
        replica: Cfg,
    ) -> PyResult<i64> {
        let src = object_src(buffer_ptr, size);
        let requests = (parallelism, writer_partition);
        self.request_write_one(py, method, (key, src), requests, (config, replica), mode)
    }
    #[pymethods] for MooncakeDistributedStore {
        /// `put_tensor_with_parallelism` from a buffer holding a tensor object
        /// (a TP request writes every TP rank from it as the full tensor).
        put_tensor_with_parallelism_from { mode: WriteMode::Put }
        /// Upsert form of `put_tensor_with_parallelism_from`.
        upsert_tensor_with_parallelism_from { mode: WriteMode::Upsert }
    }
}

method_family! {
    #[pyo3(signature = (keys, tensors_list, parallelisms=None, config=None, writer_partitions=None, *, replica=None))]
    fn method<'py>(
        &self,
        py: Python<'py>,
        keys: Vec<String>,
        tensors_list: Vec<Bound<'py, PyAny>>,
        parallelisms: Option<Bound<'py, PyAny>>,
        config: Cfg,
        writer_partitions: Option<Bound<'py, PyAny>>,
        replica: Cfg,
    ) -> PyResult<Vec<i64>> {
        let batch = (keys, BatchSources::Tensors(tensors_list));
        let (requests, configs) = ((parallelisms, writer_partitions), (config, replica));
        self.with_parallelism_batch(py, method, batch, requests, configs, mode)
    }
    #[pymethods] for MooncakeDistributedStore {
        /// Batch form of `put_tensor_with_parallelism` (one batched write).
        batch_put_tensor_with_parallelism { mode: WriteMode::Put }
        /// Batch form of `upsert_tensor_with_parallelism`.
        batch_upsert_tensor_with_parallelism { mode: WriteMode::Upsert }
    }
}

method_family! {
    #[pyo3(signature = (keys, buffer_ptrs, sizes, parallelisms=None, config=None, writer_partitions=None, *, replica=None))]
    fn method<'py>(
        &self,
        py: Python<'py>,
        keys: Vec<String>,
        buffer_ptrs: Vec<UInt>,
        sizes: Vec<UInt>,
        parallelisms: Option<Bound<'py, PyAny>>,
        config: Cfg,
        writer_partitions: Option<Bound<'py, PyAny>>,
        replica: Cfg,
    ) -> PyResult<Vec<i64>> {
        let batch = (keys, BatchSources::Objects(buffer_ptrs, sizes));
        let (requests, configs) = ((parallelisms, writer_partitions), (config, replica));
        self.with_parallelism_batch(py, method, batch, requests, configs, mode)
    }
    #[pymethods] for MooncakeDistributedStore {
        /// Batch form of `put_tensor_with_parallelism_from`.
        batch_put_tensor_with_parallelism_from { mode: WriteMode::Put }
        /// Batch form of `upsert_tensor_with_parallelism_from`.
        batch_upsert_tensor_with_parallelism_from { mode: WriteMode::Upsert }
    }
}

/// One read request per key: `targets` absent, or one target per key.
fn target_requests(
    keys: &[String],
    targets: Result<Option<Vec<Bound<'_, PyAny>>>>,
) -> Result<Vec<Result<ReadRequest>>> {
    Ok(match targets? {
        None => keys.iter().map(|k| Ok(ReadRequest::plain(k))).collect(),
        Some(ts) => keys
            .iter()
            .zip(&ts)
            .map(|(k, t)| args::read_request(k, Some(t)))
            .collect(),
    })
}

#[pymethods]
impl MooncakeDistributedStore {
    /// Read `key` per a `ReadTarget` (`None`: `get_tensor`).
    #[pyo3(signature = (key, target=None))]
    fn get_tensor_with_parallelism<'py>(
        &self,
        py: Python<'py>,
        key: String,
        target: Option<Bound<'py, PyAny>>,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        let req = args::read_request(&key, target.as_ref());
        self.tensor_read_one(py, "get_tensor_with_parallelism", key, req, None)
    }

    /// Batch form of `get_tensor_with_parallelism`.
    #[pyo3(signature = (keys, targets=None))]
    fn batch_get_tensor_with_parallelism<'py>(
        &self,
        py: Python<'py>,
        keys: Vec<String>,
        targets: Option<Bound<'py, PyAny>>,
    ) -> PyResult<Vec<Option<Bound<'py, PyAny>>>> {
        let method = "batch_get_tensor_with_parallelism";
        let targets = args::per_item(targets.as_ref(), keys.len(), "targets");
        match target_requests(&keys, targets) {
            Ok(reqs) => self.tensor_reads(py, method, &keys, reqs, None, true),
            Err(e) => Ok(Call::new(py, method).oks(&keys, Err(e))),
        }
    }

    /// `_into` form of `get_tensor_with_parallelism`.
    #[pyo3(signature = (key, buffer_ptr, size, target=None))]
    fn get_tensor_with_parallelism_into<'py>(
        &self,
        py: Python<'py>,
        key: String,
        buffer_ptr: UInt,
        size: UInt,
        target: Option<Bound<'py, PyAny>>,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        let req = args::read_request(&key, target.as_ref());
        let into = Some((buffer_ptr, size));
        self.tensor_read_one(py, "get_tensor_with_parallelism_into", key, req, into)
    }

    /// `_into` form of `batch_get_tensor_with_parallelism`; argument errors are `[None] * n`.
    #[pyo3(signature = (keys, buffer_ptrs, sizes, targets=None))]
    fn batch_get_tensor_with_parallelism_into<'py>(
        &self,
        py: Python<'py>,
        keys: Vec<String>,
        buffer_ptrs: Vec<UInt>,
        sizes: Vec<UInt>,
        targets: Option<Bound<'py, PyAny>>,
    ) -> PyResult<Vec<Option<Bound<'py, PyAny>>>> {
        let method = "batch_get_tensor_with_parallelism_into";
        let raw: Vec<usize> = buffer_ptrs.iter().map(|p| p.usize()).collect();
        let targets = check_into_lists(keys.len(), &raw, sizes.len())
            .and_then(|()| args::per_item(targets.as_ref(), keys.len(), "targets"));
        let reqs = match target_requests(&keys, targets) {
            Ok(reqs) => reqs,
            Err(e) => return Ok(Call::new(py, method).oks(&keys, Err(e))),
        };
        let bufs = raw.into_iter().zip(sizes.iter().map(|s| s.0)).collect();
        self.tensor_reads(py, method, &keys, reqs, Some(bufs), true)
    }
}
