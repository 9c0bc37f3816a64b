//! The tensor methods of `MooncakeDistributedStore` with upstream's names,
//! argument order, keywords and defaults, one family per module: the plain
//! API (`plain`), the legacy TP wrappers (`tp`), the unified
//! `*_with_parallelism` writes and reads (`parallelism`). Each converts its
//! arguments and calls one of the two bodies in `core` through the helpers
//! here; the rules are in `mooncake-tensor` and the client's executor.

mod parallelism;
mod plain;
mod tp;

use super::args;
use super::core::{config_or_replica, RouteArg, Src, WriteCall, WriteItem};
use crate::args::UInt;
use crate::family::method_family;
use crate::report::Call;
use crate::store::class::MooncakeDistributedStore;
use crate::store::config::ReplicateConfig;
use mooncake_client::{
    check_into_lists, check_lengths, check_object_sources, item_requests, Error, ItemRequest,
    Result, WriteMode,
};
use mooncake_tensor::ReadRequest;
use pyo3::prelude::*;

type Cfg = Option<ReplicateConfig>;

/// The `parallelism(s)` and `writer_partition(s)` arguments of a
/// `*_with_parallelism` write.
type Requests<'py> = (Option<Bound<'py, PyAny>>, Option<Bound<'py, PyAny>>);

/// The sources of a batch write: tensors, or the tensor objects at
/// `buffer_ptrs[i]..+sizes[i]` (`_from` forms).
enum BatchSources<'py> {
    /// `tensors_list`.
    Tensors(Vec<Bound<'py, PyAny>>),
    /// `buffer_ptrs` and `sizes`.
    Objects(Vec<UInt>, Vec<UInt>),
}

/// The source of a `_from` write: the tensor object at `ptr..ptr+size`.
fn object_src(ptr: UInt, size: UInt) -> Src<'static> {
    Src::Object {
        ptr: ptr.usize(),
        size: size.0,
    }
}

/// The route of a legacy `*_with_tp` write: `tp_size` shards along `split_dim`.
fn tp_route<'py>(size: i64, split_dim: i64) -> RouteArg<'py> {
    RouteArg::Tp { size, split_dim }
}

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
                src: object_src(*p, *s),
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
    Ok(item_requests(ps, ws)?.map(|reqs| {
        reqs.into_iter()
            .map(|r| match r {
                ItemRequest::Parallelism(p) => RouteArg::Request {
                    parallelism: Some(p),
                    writer: None,
                },
                ItemRequest::Writer(w) => RouteArg::Request {
                    parallelism: None,
                    writer: Some(w),
                },
            })
            .collect()
    }))
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
        mode: WriteMode,
    ) -> PyResult<i64> {
        let keys = [key.clone()];
        let call = WriteCall {
            method,
            config,
            batch: false,
            mode,
        };
        let codes = self.tensor_writes(py, call, vec![Ok(WriteItem { key, src, route })], &keys)?;
        Ok(codes.first().copied().unwrap_or(-1))
    }

    /// One batch write call over its converted items.
    fn batch_writes<'py>(
        &self,
        py: Python<'py>,
        method: &'static str,
        config: Cfg,
        mode: WriteMode,
        items: Vec<Result<WriteItem<'py>>>,
        keys: &[String],
    ) -> PyResult<Vec<i64>> {
        let call = WriteCall {
            method,
            config,
            batch: true,
            mode,
        };
        self.tensor_writes(py, call, items, keys)
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
        mode: WriteMode,
    ) -> PyResult<Vec<i64>> {
        if let Err(e) = check_lengths(keys.len(), &[tensors.len()]) {
            return Ok(self.tensor_fail_batch(py, method, &keys, e));
        }
        let items = tensor_items(&keys, &tensors, route);
        self.batch_writes(py, method, config, mode, items, &keys)
    }

    /// `batch_put_tensor_from` and friends: any invalid buffer fails every
    /// item and writes nothing, as upstream does.
    fn write_object_batch_all_or_nothing<'py>(
        &self,
        py: Python<'py>,
        method: &'static str,
        (keys, ptrs, sizes): (Vec<String>, Vec<UInt>, Vec<UInt>),
        config: Cfg,
        mode: WriteMode,
    ) -> PyResult<Vec<i64>> {
        if let Err(e) = check_lengths(keys.len(), &[ptrs.len(), sizes.len()]) {
            return Ok(self.tensor_fail_batch(py, method, &keys, e));
        }
        let bufs: Vec<(usize, u64)> = ptrs
            .iter()
            .zip(&sizes)
            .map(|(p, s)| (p.usize(), s.0))
            .collect();
        // SAFETY: the caller vouches for each buffer (upstream contract).
        if let Err(e) = unsafe { check_object_sources(&keys, &bufs) } {
            return Ok(self.tensor_fail_batch(py, method, &keys, e));
        }
        let items = object_items(&keys, &ptrs, &sizes, |_| RouteArg::Full);
        self.batch_writes(py, method, config, mode, items, &keys)
    }

    /// The per-item routes of a `*_with_parallelism` batch whose other
    /// lists have `lens`; `Err` holds the codes that fail every item (a
    /// length mismatch, a bad request list).
    fn batch_routes<'py>(
        &self,
        py: Python<'py>,
        method: &'static str,
        keys: &[String],
        lens: &[usize],
        (parallelisms, writer_partitions): Requests<'py>,
    ) -> std::result::Result<Option<Vec<RouteArg<'py>>>, Vec<i64>> {
        check_lengths(keys.len(), lens)
            .and_then(|()| {
                request_routes(
                    keys.len(),
                    parallelisms.as_ref(),
                    writer_partitions.as_ref(),
                )
            })
            .map_err(|e| self.tensor_fail_batch(py, method, keys, e))
    }

    /// `put_tensor_with_parallelism` and its upsert and `_from` forms: one
    /// item routed per its request.
    fn request_write_one<'py>(
        &self,
        py: Python<'py>,
        method: &'static str,
        (key, src): (String, Src<'py>),
        (parallelism, writer): Requests<'py>,
        (config, replica): (Cfg, Cfg),
        mode: WriteMode,
    ) -> PyResult<i64> {
        let config = config_or_replica(config, replica)?;
        let route = RouteArg::Request {
            parallelism,
            writer,
        };
        self.tensor_write_one(py, method, key, src, route, config, mode)
    }

    /// A batch `*_with_parallelism` write: its routes per `requests`, or
    /// with none given, the plain batch write of its sources.
    fn with_parallelism_batch<'py>(
        &self,
        py: Python<'py>,
        method: &'static str,
        (keys, sources): (Vec<String>, BatchSources<'py>),
        requests: Requests<'py>,
        (config, replica): (Cfg, Cfg),
        mode: WriteMode,
    ) -> PyResult<Vec<i64>> {
        let config = config_or_replica(config, replica)?;
        let lens = match &sources {
            BatchSources::Tensors(tensors) => vec![tensors.len()],
            BatchSources::Objects(ptrs, sizes) => vec![ptrs.len(), sizes.len()],
        };
        if keys.is_empty() && lens.iter().all(|&n| n == 0) {
            return Ok(Vec::new());
        }
        let routes = match self.batch_routes(py, method, &keys, &lens, requests) {
            Ok(routes) => routes,
            Err(codes) => return Ok(codes),
        };
        let requested = routes.is_some();
        let mut routes = routes.map(Vec::into_iter);
        let route = |_| {
            routes
                .as_mut()
                .and_then(Iterator::next)
                .unwrap_or(RouteArg::Full)
        };
        match sources {
            BatchSources::Tensors(tensors) => {
                self.write_tensor_batch(py, method, keys, tensors, route, config, mode)
            }
            // No requests: exactly batch_put_tensor_from (all or nothing).
            BatchSources::Objects(ptrs, sizes) if !requested => {
                let lists = (keys, ptrs, sizes);
                self.write_object_batch_all_or_nothing(py, method, lists, config, mode)
            }
            BatchSources::Objects(ptrs, sizes) => {
                let items = object_items(&keys, &ptrs, &sizes, route);
                self.batch_writes(py, method, config, mode, items, &keys)
            }
        }
    }

    fn tensor_read_one<'py>(
        &self,
        py: Python<'py>,
        method: &'static str,
        key: String,
        req: Result<ReadRequest>,
        into: Option<(UInt, UInt)>,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        let keys = [key];
        let into = into.map(|(ptr, size)| (ptr.usize(), size.0));
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
