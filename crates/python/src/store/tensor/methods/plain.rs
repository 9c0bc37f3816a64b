//! The plain tensor methods: `put_tensor`/`get_tensor` and their upsert,
//! pub, batch, `_from` and `_into` forms.

use super::*;

method_family! {
    fn method<'py>(&self, py: Python<'py>, key: String, tensor: Bound<'py, PyAny>) -> PyResult<i64> {
        self.tensor_write_one(py, method, key, Src::Tensor(tensor), RouteArg::Full, config, mode)
    }
    #[pymethods] for MooncakeDistributedStore {
        /// Store `tensor` as a FULL object at `key`; 0 or a negative code.
        put_tensor { mode: WriteMode::Put, config: None }
        /// Insert or replace the tensor at `key`.
        upsert_tensor { mode: WriteMode::Upsert, config: None }
        /// `put_tensor` with a `ReplicateConfig`.
        #[pyo3(signature = (key, tensor, config=None))]
        pub_tensor(config: Cfg) { mode: WriteMode::Pub }
        /// `upsert_tensor` with a `ReplicateConfig`.
        #[pyo3(signature = (key, tensor, config=None))]
        upsert_pub_tensor(config: Cfg) { mode: WriteMode::UpsertPub }
    }
}

method_family! {
    fn method<'py>(
        &self,
        py: Python<'py>,
        keys: Vec<String>,
        tensors_list: Vec<Bound<'py, PyAny>>,
    ) -> PyResult<Vec<i64>> {
        let full = |_| RouteArg::Full;
        self.write_tensor_batch(py, method, keys, tensors_list, full, config, mode)
    }
    #[pymethods] for MooncakeDistributedStore {
        /// Store many tensors; one code per key.
        batch_put_tensor { mode: WriteMode::Put, config: None }
        /// Insert or replace many tensors.
        batch_upsert_tensor { mode: WriteMode::Upsert, config: None }
        /// `batch_put_tensor` with a `ReplicateConfig`.
        #[pyo3(signature = (keys, tensors_list, config=None))]
        batch_pub_tensor(config: Cfg) { mode: WriteMode::Pub }
        /// `batch_upsert_tensor` with a `ReplicateConfig`.
        #[pyo3(signature = (keys, tensors_list, config=None))]
        batch_upsert_pub_tensor(config: Cfg) { mode: WriteMode::UpsertPub }
    }
}

method_family! {
    #[pyo3(signature = (key, buffer_ptr, size))]
    fn method(&self, py: Python<'_>, key: String, buffer_ptr: UInt, size: UInt) -> PyResult<i64> {
        let src = object_src(buffer_ptr, size);
        self.tensor_write_one(py, method, key, src, RouteArg::Full, None, mode)
    }
    #[pymethods] for MooncakeDistributedStore {
        /// Store the tensor object (header + payload) held in `buffer_ptr..+size` byte for byte.
        put_tensor_from { mode: WriteMode::Put }
        /// Upsert form of `put_tensor_from`.
        upsert_tensor_from { mode: WriteMode::Upsert }
    }
}

method_family! {
    #[pyo3(signature = (keys, buffer_ptrs, sizes))]
    fn method(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        buffer_ptrs: Vec<UInt>,
        sizes: Vec<UInt>,
    ) -> PyResult<Vec<i64>> {
        if keys.is_empty() && buffer_ptrs.is_empty() && sizes.is_empty() {
            return Ok(Vec::new());
        }
        let lists = (keys, buffer_ptrs, sizes);
        self.write_object_batch_all_or_nothing(py, method, lists, None, mode)
    }
    #[pymethods] for MooncakeDistributedStore {
        /// Batch `put_tensor_from`; any invalid item or a length mismatch fails all.
        batch_put_tensor_from { mode: WriteMode::Put }
        /// Batch `upsert_tensor_from`; any invalid item or a length mismatch fails all.
        batch_upsert_tensor_from { mode: WriteMode::Upsert }
    }
}

#[pymethods]
impl MooncakeDistributedStore {
    /// The tensor stored at `key` (its local shape), or None.
    #[pyo3(signature = (key))]
    fn get_tensor<'py>(&self, py: Python<'py>, key: String) -> PyResult<Option<Bound<'py, PyAny>>> {
        let req = Ok(ReadRequest::plain(&key));
        self.tensor_read_one(py, "get_tensor", key, req, None)
    }

    /// The tensors stored at `keys`; None per failed key.
    #[pyo3(signature = (keys))]
    fn batch_get_tensor<'py>(
        &self,
        py: Python<'py>,
        keys: Vec<String>,
    ) -> PyResult<Vec<Option<Bound<'py, PyAny>>>> {
        let reqs = keys.iter().map(|k| Ok(ReadRequest::plain(k))).collect();
        self.tensor_reads(py, "batch_get_tensor", &keys, reqs, None, true)
    }

    /// Copy the object at `key` into `buffer_ptr..+size`; returns the tensor viewing `buffer_ptr + 304`.
    #[pyo3(signature = (key, buffer_ptr, size))]
    fn get_tensor_into<'py>(
        &self,
        py: Python<'py>,
        key: String,
        buffer_ptr: UInt,
        size: UInt,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        let req = Ok(ReadRequest::plain(&key));
        let into = Some((buffer_ptr, size));
        self.tensor_read_one(py, "get_tensor_into", key, req, into)
    }

    /// Batch `get_tensor_into`; a null pointer or a length mismatch is `[-600] * n`.
    #[pyo3(signature = (keys, buffer_ptrs, sizes))]
    fn batch_get_tensor_into<'py>(
        &self,
        py: Python<'py>,
        keys: Vec<String>,
        buffer_ptrs: Vec<UInt>,
        sizes: Vec<UInt>,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.read_into_batch_ints(py, "batch_get_tensor_into", keys, buffer_ptrs, sizes, |k| {
            Ok(ReadRequest::plain(k))
        })
    }
}
