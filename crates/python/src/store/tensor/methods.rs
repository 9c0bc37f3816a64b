//! The tensor methods of `MooncakeDistributedStore` with upstream's names,
//! argument order, keywords and defaults: the plain
//! API, the legacy TP wrappers, the unified `*_with_parallelism` writes and
//! reads. Each converts its arguments and calls one of the two bodies in
//! `core`; the rules are in `mooncake-tensor` and the client's executor.

use super::args;
use super::core::{config_or_replica, RouteArg, Src, WriteCall, WriteItem};
use crate::args::UInt;
use crate::report::Call;
use crate::store::class::MooncakeDistributedStore;
use crate::store::config::ReplicateConfig;
use mooncake_client::{check_into_lists, Error, Result};
use mooncake_tensor::ReadRequest;
use pyo3::prelude::*;

type Cfg = Option<ReplicateConfig>;

fn legacy_tp(key: &str, rank: i64, size: i64, split_dim: Option<i64>) -> Result<ReadRequest> {
    Ok(ReadRequest::legacy_tp(key, rank, size, split_dim)?)
}

fn tensor_items<'py>(
    keys: &[String],
    tensors: &[Bound<'py, PyAny>],
    mut route: impl FnMut(usize) -> RouteArg<'py>,
) -> Vec<Result<WriteItem<'py>>> {
    keys.iter()
        .zip(tensors)
        .enumerate()
        .map(|(i, (k, t))| {
            Ok(WriteItem {
                key: k.clone(),
                src: Src::Tensor(t.clone()),
                route: route(i),
            })
        })
        .collect()
}

fn object_items<'py>(
    keys: &[String],
    ptrs: &[UInt],
    sizes: &[UInt],
    mut route: impl FnMut(usize) -> RouteArg<'py>,
) -> Vec<Result<WriteItem<'py>>> {
    keys.iter()
        .zip(ptrs.iter().zip(sizes))
        .enumerate()
        .map(|(i, (k, (p, s)))| {
            Ok(WriteItem {
                key: k.clone(),
                src: Src::Object {
                    ptr: p.usize(),
                    size: s.0,
                },
                route: route(i),
            })
        })
        .collect()
}

/// Per-item requests of a batch `*_with_parallelism` call: each list is
/// absent or has one entry per key; both given is INVALID_PARAMS.
fn request_routes<'py>(
    n: usize,
    parallelisms: Option<&Bound<'py, PyAny>>,
    writer_partitions: Option<&Bound<'py, PyAny>>,
) -> Result<Option<Vec<RouteArg<'py>>>> {
    let ps = args::per_item(parallelisms, n, "parallelisms")?;
    let ws = args::per_item(writer_partitions, n, "writer_partitions")?;
    Ok(match (ps, ws) {
        (Some(_), Some(_)) => {
            return Err(Error::invalid(
                "parallelisms and writer_partitions are mutually exclusive",
            ))
        }
        (None, None) => None,
        (Some(ps), None) => Some(
            ps.into_iter()
                .map(|p| RouteArg::Request {
                    parallelism: Some(p),
                    writer: None,
                })
                .collect(),
        ),
        (None, Some(ws)) => Some(
            ws.into_iter()
                .map(|w| RouteArg::Request {
                    parallelism: None,
                    writer: Some(w),
                })
                .collect(),
        ),
    })
}

fn lengths_differ(n: usize, others: &[usize]) -> Option<Error> {
    others.iter().any(|&m| m != n).then(|| {
        Error::invalid(format!(
            "argument lists differ in length ({n} keys, {others:?})"
        ))
    })
}

impl MooncakeDistributedStore {
    #[allow(clippy::too_many_arguments)]
    fn tensor_write_one<'py>(
        &self,
        py: Python<'py>,
        method: &'static str,
        key: String,
        src: Src<'py>,
        route: RouteArg<'py>,
        config: Cfg,
        upsert: bool,
        pub_always: bool,
    ) -> PyResult<i64> {
        let keys = [key.clone()];
        let call = WriteCall {
            method,
            config,
            batch: false,
            upsert,
            pub_always,
        };
        let codes = self.tensor_writes(py, call, vec![Ok(WriteItem { key, src, route })], &keys)?;
        Ok(codes.first().copied().unwrap_or(-1))
    }

    fn tensor_fail_batch(
        &self,
        py: Python<'_>,
        method: &'static str,
        keys: &[String],
        e: Error,
    ) -> Vec<i64> {
        Call::new(py, method).codes::<()>(keys, Err(e))
    }

    #[allow(clippy::too_many_arguments)]
    fn write_tensor_batch<'py>(
        &self,
        py: Python<'py>,
        method: &'static str,
        keys: Vec<String>,
        tensors: Vec<Bound<'py, PyAny>>,
        route: impl FnMut(usize) -> RouteArg<'py>,
        config: Cfg,
        upsert: bool,
        pub_always: bool,
    ) -> PyResult<Vec<i64>> {
        if let Some(e) = lengths_differ(keys.len(), &[tensors.len()]) {
            return Ok(self.tensor_fail_batch(py, method, &keys, e));
        }
        let items = tensor_items(&keys, &tensors, route);
        let call = WriteCall {
            method,
            config,
            batch: true,
            upsert,
            pub_always,
        };
        self.tensor_writes(py, call, items, &keys)
    }

    /// `batch_put_tensor_from` and friends: any invalid buffer fails every
    /// item and writes nothing, as upstream does.
    fn write_object_batch_all_or_nothing<'py>(
        &self,
        py: Python<'py>,
        method: &'static str,
        (keys, ptrs, sizes): (Vec<String>, Vec<UInt>, Vec<UInt>),
        config: Cfg,
        upsert: bool,
    ) -> PyResult<Vec<i64>> {
        if let Some(e) = lengths_differ(keys.len(), &[ptrs.len(), sizes.len()]) {
            return Ok(self.tensor_fail_batch(py, method, &keys, e));
        }
        for (i, (p, s)) in ptrs.iter().zip(&sizes).enumerate() {
            // SAFETY: the caller vouches for each buffer (upstream contract).
            if let Err(e) = unsafe { mooncake_client::object_source(p.usize(), s.0) } {
                let e = e.context(format!("item {i} ({:?})", keys[i]));
                return Ok(self.tensor_fail_batch(py, method, &keys, e));
            }
        }
        let items = object_items(&keys, &ptrs, &sizes, |_| RouteArg::Full);
        let call = WriteCall {
            method,
            config,
            batch: true,
            upsert,
            pub_always: false,
        };
        self.tensor_writes(py, call, items, &keys)
    }

    #[allow(clippy::too_many_arguments)]
    fn with_parallelism_batch<'py>(
        &self,
        py: Python<'py>,
        method: &'static str,
        keys: Vec<String>,
        tensors: Vec<Bound<'py, PyAny>>,
        parallelisms: Option<Bound<'py, PyAny>>,
        config: Cfg,
        writer_partitions: Option<Bound<'py, PyAny>>,
        upsert: bool,
    ) -> PyResult<Vec<i64>> {
        if keys.is_empty() && tensors.is_empty() {
            return Ok(Vec::new());
        }
        if let Some(e) = lengths_differ(keys.len(), &[tensors.len()]) {
            return Ok(self.tensor_fail_batch(py, method, &keys, e));
        }
        let routes = match request_routes(
            keys.len(),
            parallelisms.as_ref(),
            writer_partitions.as_ref(),
        ) {
            Ok(r) => r,
            Err(e) => return Ok(self.tensor_fail_batch(py, method, &keys, e)),
        };
        let mut routes = routes.map(Vec::into_iter);
        self.write_tensor_batch(
            py,
            method,
            keys,
            tensors,
            |_| {
                routes
                    .as_mut()
                    .and_then(Iterator::next)
                    .unwrap_or(RouteArg::Full)
            },
            config,
            upsert,
            false,
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn with_parallelism_from_batch<'py>(
        &self,
        py: Python<'py>,
        method: &'static str,
        keys: Vec<String>,
        ptrs: Vec<UInt>,
        sizes: Vec<UInt>,
        parallelisms: Option<Bound<'py, PyAny>>,
        config: Cfg,
        writer_partitions: Option<Bound<'py, PyAny>>,
        upsert: bool,
    ) -> PyResult<Vec<i64>> {
        if keys.is_empty() && ptrs.is_empty() && sizes.is_empty() {
            return Ok(Vec::new());
        }
        if let Some(e) = lengths_differ(keys.len(), &[ptrs.len(), sizes.len()]) {
            return Ok(self.tensor_fail_batch(py, method, &keys, e));
        }
        let routes = match request_routes(
            keys.len(),
            parallelisms.as_ref(),
            writer_partitions.as_ref(),
        ) {
            Ok(r) => r,
            Err(e) => return Ok(self.tensor_fail_batch(py, method, &keys, e)),
        };
        let Some(routes) = routes else {
            // No requests: exactly batch_put_tensor_from (all or nothing).
            return self.write_object_batch_all_or_nothing(
                py,
                method,
                (keys, ptrs, sizes),
                config,
                upsert,
            );
        };
        let mut routes = routes.into_iter();
        let items = object_items(&keys, &ptrs, &sizes, |_| {
            routes.next().unwrap_or(RouteArg::Full)
        });
        let call = WriteCall {
            method,
            config,
            batch: true,
            upsert,
            pub_always: false,
        };
        self.tensor_writes(py, call, items, &keys)
    }

    fn tensor_read_one<'py>(
        &self,
        py: Python<'py>,
        method: &'static str,
        key: String,
        req: Result<ReadRequest>,
        into: Option<(usize, u64)>,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        let keys = [key];
        let mut out =
            self.tensor_reads(py, method, &keys, vec![req], into.map(|b| vec![b]), false)?;
        Ok(out.pop().flatten())
    }

    /// `_into` batch reads whose argument errors are `[-600] * n` ints
    /// (`batch_get_tensor_into`, `batch_get_tensor_with_tp_into`).
    fn read_into_batch_ints<'py>(
        &self,
        py: Python<'py>,
        method: &'static str,
        keys: Vec<String>,
        ptrs: Vec<UInt>,
        sizes: Vec<UInt>,
        req: impl Fn(&str) -> Result<ReadRequest>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let raw: Vec<usize> = ptrs.iter().map(|p| p.usize()).collect();
        if let Err(e) = check_into_lists(keys.len(), &raw, sizes.len()) {
            let codes = self.tensor_fail_batch(py, method, &keys, e);
            return codes.into_pyobject(py).map(Bound::into_any);
        }
        let reqs = keys.iter().map(|k| req(k)).collect();
        let bufs = raw.into_iter().zip(sizes.iter().map(|s| s.0)).collect();
        let out = self.tensor_reads(py, method, &keys, reqs, Some(bufs), true)?;
        out.into_pyobject(py).map(Bound::into_any)
    }
}

#[pymethods]
impl MooncakeDistributedStore {
    // ---- plain API: FULL objects, one key per tensor ----

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
            false,
            false,
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
            true,
            false,
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
            false,
            true,
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
            true,
            true,
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
            false,
            false,
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
            true,
            false,
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
            false,
            true,
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
            true,
            true,
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
            false,
            false,
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
            true,
            false,
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
            false,
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
            true,
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

    // ---- legacy TP wrappers: one shard per TP rank ----

    /// Split the full `tensor` into `tp_size` chunks along `split_dim` and
    /// store all of `key_tp_0 ..`; `tp_rank` is ignored (upstream).
    #[pyo3(signature = (key, tensor, tp_rank=0, tp_size=1, split_dim=0))]
    fn put_tensor_with_tp<'py>(
        &self,
        py: Python<'py>,
        key: String,
        tensor: Bound<'py, PyAny>,
        tp_rank: i64,
        tp_size: i64,
        split_dim: i64,
    ) -> PyResult<i64> {
        let _ = tp_rank;
        let route = RouteArg::Tp {
            size: tp_size,
            split_dim,
        };
        self.tensor_write_one(
            py,
            "put_tensor_with_tp",
            key,
            Src::Tensor(tensor),
            route,
            None,
            false,
            false,
        )
    }

    /// `put_tensor_with_tp` for many tensors (one batched write).
    #[pyo3(signature = (base_keys, tensors_list, tp_rank=0, tp_size=1, split_dim=0))]
    fn batch_put_tensor_with_tp<'py>(
        &self,
        py: Python<'py>,
        base_keys: Vec<String>,
        tensors_list: Vec<Bound<'py, PyAny>>,
        tp_rank: i64,
        tp_size: i64,
        split_dim: i64,
    ) -> PyResult<Vec<i64>> {
        let _ = tp_rank;
        let route = |_| RouteArg::Tp {
            size: tp_size,
            split_dim,
        };
        self.write_tensor_batch(
            py,
            "batch_put_tensor_with_tp",
            base_keys,
            tensors_list,
            route,
            None,
            false,
            false,
        )
    }

    /// `put_tensor_with_tp` with a `ReplicateConfig` (pub check first).
    #[pyo3(signature = (key, tensor, config=None, tp_rank=0, tp_size=1, split_dim=0))]
    #[allow(clippy::too_many_arguments)]
    fn pub_tensor_with_tp<'py>(
        &self,
        py: Python<'py>,
        key: String,
        tensor: Bound<'py, PyAny>,
        config: Cfg,
        tp_rank: i64,
        tp_size: i64,
        split_dim: i64,
    ) -> PyResult<i64> {
        let _ = tp_rank;
        let route = RouteArg::Tp {
            size: tp_size,
            split_dim,
        };
        self.tensor_write_one(
            py,
            "pub_tensor_with_tp",
            key,
            Src::Tensor(tensor),
            route,
            config,
            false,
            true,
        )
    }

    /// `batch_put_tensor_with_tp` with a `ReplicateConfig` (pub check first).
    #[pyo3(signature = (base_keys, tensors_list, config=None, tp_rank=0, tp_size=1, split_dim=0))]
    #[allow(clippy::too_many_arguments)]
    fn batch_pub_tensor_with_tp<'py>(
        &self,
        py: Python<'py>,
        base_keys: Vec<String>,
        tensors_list: Vec<Bound<'py, PyAny>>,
        config: Cfg,
        tp_rank: i64,
        tp_size: i64,
        split_dim: i64,
    ) -> PyResult<Vec<i64>> {
        let _ = tp_rank;
        let route = |_| RouteArg::Tp {
            size: tp_size,
            split_dim,
        };
        self.write_tensor_batch(
            py,
            "batch_pub_tensor_with_tp",
            base_keys,
            tensors_list,
            route,
            config,
            false,
            true,
        )
    }

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
        let src = Src::Object {
            ptr: buffer_ptr.usize(),
            size: size.0,
        };
        let route = RouteArg::Tp {
            size: tp_size,
            split_dim,
        };
        self.tensor_write_one(
            py,
            "put_tensor_with_tp_from",
            key,
            src,
            route,
            None,
            false,
            false,
        )
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
        if let Some(e) = lengths_differ(base_keys.len(), &[buffer_ptrs.len(), sizes.len()]) {
            return Ok(self.tensor_fail_batch(py, method, &base_keys, e));
        }
        let items = object_items(&base_keys, &buffer_ptrs, &sizes, |_| RouteArg::Tp {
            size: tp_size,
            split_dim,
        });
        let call = WriteCall {
            method,
            config: None,
            batch: true,
            upsert: false,
            pub_always: false,
        };
        self.tensor_writes(py, call, items, &base_keys)
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
        self.tensor_read_one(
            py,
            "get_tensor_with_tp_into",
            key,
            req,
            Some((buffer_ptr.usize(), size.0)),
        )
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
        self.read_into_batch_ints(
            py,
            "batch_get_tensor_with_tp_into",
            base_keys,
            buffer_ptrs,
            sizes,
            |k| legacy_tp(k, tp_rank, tp_size, None),
        )
    }

    // ---- unified writes: `*_with_parallelism` ----

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
            false,
            false,
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
            true,
            false,
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
            false,
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
            true,
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
            false,
            false,
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
            true,
            false,
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
            false,
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
            true,
        )
    }

    // ---- unified reads: `*_with_parallelism` ----

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
