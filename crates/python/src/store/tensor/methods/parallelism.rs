//! The unified `*_with_parallelism` writes and reads: a parallelism (or a
//! writer partition) per call or per key, and a read target.

use super::*;

#[pymethods]
impl MooncakeDistributedStore {
    /// Store `tensor` per a `TensorParallelism` request or a writer partition.
    #[pyo3(signature = (key, tensor, parallelism=None, config=None, writer_partition=None, *, replica=None))]
    #[allow(clippy::too_many_arguments)]
    fn put_tensor_with_parallelism<'py>(
        &self,
        py: Python<'py>,
        key: String,
        tensor: Bound<'py, PyAny>,
        parallelism: Option<Bound<'py, PyAny>>,
        config: Cfg,
        writer_partition: Option<Bound<'py, PyAny>>,
        replica: Cfg,
    ) -> PyResult<i64> {
        let config = config_or_replica(config, replica)?;
        let route = RouteArg::Request {
            parallelism,
            writer: writer_partition,
        };
        self.tensor_write_one(
            py,
            "put_tensor_with_parallelism",
            key,
            Src::Tensor(tensor),
            route,
            config,
            WriteMode::Put,
        )
    }

    /// Upsert form of `put_tensor_with_parallelism`.
    #[pyo3(signature = (key, tensor, parallelism=None, config=None, writer_partition=None, *, replica=None))]
    #[allow(clippy::too_many_arguments)]
    fn upsert_tensor_with_parallelism<'py>(
        &self,
        py: Python<'py>,
        key: String,
        tensor: Bound<'py, PyAny>,
        parallelism: Option<Bound<'py, PyAny>>,
        config: Cfg,
        writer_partition: Option<Bound<'py, PyAny>>,
        replica: Cfg,
    ) -> PyResult<i64> {
        let config = config_or_replica(config, replica)?;
        let route = RouteArg::Request {
            parallelism,
            writer: writer_partition,
        };
        self.tensor_write_one(
            py,
            "upsert_tensor_with_parallelism",
            key,
            Src::Tensor(tensor),
            route,
            config,
            WriteMode::Upsert,
        )
    }

    /// Batch form of `put_tensor_with_parallelism` (one batched write).
    #[pyo3(signature = (keys, tensors_list, parallelisms=None, config=None, writer_partitions=None, *, replica=None))]
    #[allow(clippy::too_many_arguments)]
    fn batch_put_tensor_with_parallelism<'py>(
        &self,
        py: Python<'py>,
        keys: Vec<String>,
        tensors_list: Vec<Bound<'py, PyAny>>,
        parallelisms: Option<Bound<'py, PyAny>>,
        config: Cfg,
        writer_partitions: Option<Bound<'py, PyAny>>,
        replica: Cfg,
    ) -> PyResult<Vec<i64>> {
        let config = config_or_replica(config, replica)?;
        self.with_parallelism_batch(
            py,
            "batch_put_tensor_with_parallelism",
            keys,
            tensors_list,
            parallelisms,
            config,
            writer_partitions,
            WriteMode::Put,
        )
    }

    /// Batch form of `upsert_tensor_with_parallelism`.
    #[pyo3(signature = (keys, tensors_list, parallelisms=None, config=None, writer_partitions=None, *, replica=None))]
    #[allow(clippy::too_many_arguments)]
    fn batch_upsert_tensor_with_parallelism<'py>(
        &self,
        py: Python<'py>,
        keys: Vec<String>,
        tensors_list: Vec<Bound<'py, PyAny>>,
        parallelisms: Option<Bound<'py, PyAny>>,
        config: Cfg,
        writer_partitions: Option<Bound<'py, PyAny>>,
        replica: Cfg,
    ) -> PyResult<Vec<i64>> {
        let config = config_or_replica(config, replica)?;
        self.with_parallelism_batch(
            py,
            "batch_upsert_tensor_with_parallelism",
            keys,
            tensors_list,
            parallelisms,
            config,
            writer_partitions,
            WriteMode::Upsert,
        )
    }

    /// `put_tensor_with_parallelism` from a buffer holding a tensor object
    /// (a TP request writes every TP rank from it as the full tensor).
    #[pyo3(signature = (key, buffer_ptr, size, parallelism=None, config=None, writer_partition=None, *, replica=None))]
    #[allow(clippy::too_many_arguments)]
    fn put_tensor_with_parallelism_from<'py>(
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
        let config = config_or_replica(config, replica)?;
        let src = Src::Object {
            ptr: buffer_ptr.usize(),
            size: size.0,
        };
        let route = RouteArg::Request {
            parallelism,
            writer: writer_partition,
        };
        self.tensor_write_one(
            py,
            "put_tensor_with_parallelism_from",
            key,
            src,
            route,
            config,
            WriteMode::Put,
        )
    }

    /// Upsert form of `put_tensor_with_parallelism_from`.
    #[pyo3(signature = (key, buffer_ptr, size, parallelism=None, config=None, writer_partition=None, *, replica=None))]
    #[allow(clippy::too_many_arguments)]
    fn upsert_tensor_with_parallelism_from<'py>(
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
        let config = config_or_replica(config, replica)?;
        let src = Src::Object {
            ptr: buffer_ptr.usize(),
            size: size.0,
        };
        let route = RouteArg::Request {
            parallelism,
            writer: writer_partition,
        };
        self.tensor_write_one(
            py,
            "upsert_tensor_with_parallelism_from",
            key,
            src,
            route,
            config,
            WriteMode::Upsert,
        )
    }

    /// Batch form of `put_tensor_with_parallelism_from`.
    #[pyo3(signature = (keys, buffer_ptrs, sizes, parallelisms=None, config=None, writer_partitions=None, *, replica=None))]
    #[allow(clippy::too_many_arguments)]
    fn batch_put_tensor_with_parallelism_from<'py>(
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
        let config = config_or_replica(config, replica)?;
        self.with_parallelism_from_batch(
            py,
            "batch_put_tensor_with_parallelism_from",
            keys,
            buffer_ptrs,
            sizes,
            parallelisms,
            config,
            writer_partitions,
            WriteMode::Put,
        )
    }

    /// Batch form of `upsert_tensor_with_parallelism_from`.
    #[pyo3(signature = (keys, buffer_ptrs, sizes, parallelisms=None, config=None, writer_partitions=None, *, replica=None))]
    #[allow(clippy::too_many_arguments)]
    fn batch_upsert_tensor_with_parallelism_from<'py>(
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
        let config = config_or_replica(config, replica)?;
        self.with_parallelism_from_batch(
            py,
            "batch_upsert_tensor_with_parallelism_from",
            keys,
            buffer_ptrs,
            sizes,
            parallelisms,
            config,
            writer_partitions,
            WriteMode::Upsert,
        )
    }

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
        let reqs = match args::per_item(targets.as_ref(), keys.len(), "targets") {
            Err(e) => return Ok(Call::new(py, method).oks(&keys, Err(e))),
            Ok(None) => keys.iter().map(|k| Ok(ReadRequest::plain(k))).collect(),
            Ok(Some(ts)) => keys
                .iter()
                .zip(&ts)
                .map(|(k, t)| args::read_request(k, Some(t)))
                .collect(),
        };
        self.tensor_reads(py, method, &keys, reqs, None, true)
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
        self.tensor_read_one(
            py,
            "get_tensor_with_parallelism_into",
            key,
            req,
            Some((buffer_ptr.usize(), size.0)),
        )
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
        let checked = check_into_lists(keys.len(), &raw, sizes.len())
            .and_then(|()| args::per_item(targets.as_ref(), keys.len(), "targets"));
        let reqs: Vec<Result<ReadRequest>> = match checked {
            Err(e) => return Ok(Call::new(py, method).oks(&keys, Err(e))),
            Ok(None) => keys.iter().map(|k| Ok(ReadRequest::plain(k))).collect(),
            Ok(Some(ts)) => keys
                .iter()
                .zip(&ts)
                .map(|(k, t)| args::read_request(k, Some(t)))
                .collect(),
        };
        let bufs = raw.into_iter().zip(sizes.iter().map(|s| s.0)).collect();
        self.tensor_reads(py, method, &keys, reqs, Some(bufs), true)
    }
}
