//! The plain tensor methods: `put_tensor`/`get_tensor` and their upsert,
//! pub, batch, `_from` and `_into` forms.

use super::*;

#[pymethods]
impl MooncakeDistributedStore {
    /// Store `tensor` as a FULL object at `key`; 0 or a negative code.
    #[pyo3(signature = (key, tensor))]
    fn put_tensor(&self, py: Python<'_>, key: String, tensor: Bound<'_, PyAny>) -> PyResult<i64> {
        self.tensor_write_one(
            py,
            "put_tensor",
            key,
            Src::Tensor(tensor),
            RouteArg::Full,
            None,
            WriteMode::Put,
        )
    }

    /// Insert or replace the tensor at `key`.
    #[pyo3(signature = (key, tensor))]
    fn upsert_tensor(
        &self,
        py: Python<'_>,
        key: String,
        tensor: Bound<'_, PyAny>,
    ) -> PyResult<i64> {
        self.tensor_write_one(
            py,
            "upsert_tensor",
            key,
            Src::Tensor(tensor),
            RouteArg::Full,
            None,
            WriteMode::Upsert,
        )
    }

    /// `put_tensor` with a `ReplicateConfig`.
    #[pyo3(signature = (key, tensor, config=None))]
    fn pub_tensor<'py>(
        &self,
        py: Python<'py>,
        key: String,
        tensor: Bound<'py, PyAny>,
        config: Cfg,
    ) -> PyResult<i64> {
        self.tensor_write_one(
            py,
            "pub_tensor",
            key,
            Src::Tensor(tensor),
            RouteArg::Full,
            config,
            WriteMode::Pub,
        )
    }

    /// `upsert_tensor` with a `ReplicateConfig`.
    #[pyo3(signature = (key, tensor, config=None))]
    fn upsert_pub_tensor<'py>(
        &self,
        py: Python<'py>,
        key: String,
        tensor: Bound<'py, PyAny>,
        config: Cfg,
    ) -> PyResult<i64> {
        self.tensor_write_one(
            py,
            "upsert_pub_tensor",
            key,
            Src::Tensor(tensor),
            RouteArg::Full,
            config,
            WriteMode::UpsertPub,
        )
    }

    /// Store many tensors; one code per key.
    #[pyo3(signature = (keys, tensors_list))]
    fn batch_put_tensor<'py>(
        &self,
        py: Python<'py>,
        keys: Vec<String>,
        tensors_list: Vec<Bound<'py, PyAny>>,
    ) -> PyResult<Vec<i64>> {
        self.write_tensor_batch(
            py,
            "batch_put_tensor",
            keys,
            tensors_list,
            |_| RouteArg::Full,
            None,
            WriteMode::Put,
        )
    }

    /// Insert or replace many tensors.
    #[pyo3(signature = (keys, tensors_list))]
    fn batch_upsert_tensor<'py>(
        &self,
        py: Python<'py>,
        keys: Vec<String>,
        tensors_list: Vec<Bound<'py, PyAny>>,
    ) -> PyResult<Vec<i64>> {
        self.write_tensor_batch(
            py,
            "batch_upsert_tensor",
            keys,
            tensors_list,
            |_| RouteArg::Full,
            None,
            WriteMode::Upsert,
        )
    }

    /// `batch_put_tensor` with a `ReplicateConfig`.
    #[pyo3(signature = (keys, tensors_list, config=None))]
    fn batch_pub_tensor<'py>(
        &self,
        py: Python<'py>,
        keys: Vec<String>,
        tensors_list: Vec<Bound<'py, PyAny>>,
        config: Cfg,
    ) -> PyResult<Vec<i64>> {
        self.write_tensor_batch(
            py,
            "batch_pub_tensor",
            keys,
            tensors_list,
            |_| RouteArg::Full,
            config,
            WriteMode::Pub,
        )
    }

    /// `batch_upsert_tensor` with a `ReplicateConfig`.
    #[pyo3(signature = (keys, tensors_list, config=None))]
    fn batch_upsert_pub_tensor<'py>(
        &self,
        py: Python<'py>,
        keys: Vec<String>,
        tensors_list: Vec<Bound<'py, PyAny>>,
        config: Cfg,
    ) -> PyResult<Vec<i64>> {
        self.write_tensor_batch(
            py,
            "batch_upsert_pub_tensor",
            keys,
            tensors_list,
            |_| RouteArg::Full,
            config,
            WriteMode::UpsertPub,
        )
    }

    /// Store the tensor object (header + payload) held in `buffer_ptr..+size` byte for byte.
    #[pyo3(signature = (key, buffer_ptr, size))]
    fn put_tensor_from(
        &self,
        py: Python<'_>,
        key: String,
        buffer_ptr: UInt,
        size: UInt,
    ) -> PyResult<i64> {
        let src = Src::Object {
            ptr: buffer_ptr.usize(),
            size: size.0,
        };
        self.tensor_write_one(
            py,
            "put_tensor_from",
            key,
            src,
            RouteArg::Full,
            None,
            WriteMode::Put,
        )
    }

    /// Upsert form of `put_tensor_from`.
    #[pyo3(signature = (key, buffer_ptr, size))]
    fn upsert_tensor_from(
        &self,
        py: Python<'_>,
        key: String,
        buffer_ptr: UInt,
        size: UInt,
    ) -> PyResult<i64> {
        let src = Src::Object {
            ptr: buffer_ptr.usize(),
            size: size.0,
        };
        self.tensor_write_one(
            py,
            "upsert_tensor_from",
            key,
            src,
            RouteArg::Full,
            None,
            WriteMode::Upsert,
        )
    }

    /// Batch `put_tensor_from`; any invalid item or a length mismatch fails all.
    #[pyo3(signature = (keys, buffer_ptrs, sizes))]
    fn batch_put_tensor_from(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        buffer_ptrs: Vec<UInt>,
        sizes: Vec<UInt>,
    ) -> PyResult<Vec<i64>> {
        if keys.is_empty() && buffer_ptrs.is_empty() && sizes.is_empty() {
            return Ok(Vec::new());
        }
        self.write_object_batch_all_or_nothing(
            py,
            "batch_put_tensor_from",
            (keys, buffer_ptrs, sizes),
            None,
            WriteMode::Put,
        )
    }

    /// Batch `upsert_tensor_from`; any invalid item or a length mismatch fails all.
    #[pyo3(signature = (keys, buffer_ptrs, sizes))]
    fn batch_upsert_tensor_from(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        buffer_ptrs: Vec<UInt>,
        sizes: Vec<UInt>,
    ) -> PyResult<Vec<i64>> {
        if keys.is_empty() && buffer_ptrs.is_empty() && sizes.is_empty() {
            return Ok(Vec::new());
        }
        self.write_object_batch_all_or_nothing(
            py,
            "batch_upsert_tensor_from",
            (keys, buffer_ptrs, sizes),
            None,
            WriteMode::Upsert,
        )
    }

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
        self.tensor_read_one(
            py,
            "get_tensor_into",
            key,
            req,
            Some((buffer_ptr.usize(), size.0)),
        )
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
