//! The two bodies every tensor method funnels into: a batch of writes and a
//! batch of reads. They convert arguments (torch tensors, buffers,
//! duck-typed requests), call the client's executor with the GIL released,
//! build the result tensors, and log every failure once on `mooncake.store`.

use super::args;
use super::torch;
use crate::store::class::{MooncakeDistributedStore, NOT_SET_UP, NOT_SET_UP_DETAIL};
use crate::store::config::{ReplicateConfig, WriteKind};
use crate::store::log;
use mooncake_client::{check_pub_config, object_source, TensorDest, TensorWrite};
use mooncake_common::ErrorCode;
use mooncake_tensor::{
    route_for, route_for_object, route_for_tp, ReadRequest, TensorError, TensorResult, WriteRoute,
};
use pyo3::prelude::*;
use std::fmt::Write;

/// Where a write item's bytes come from.
pub(crate) enum Src<'py> {
    /// A torch tensor.
    Tensor(Bound<'py, PyAny>),
    /// A caller buffer holding one whole tensor object (`_from` writes).
    Object {
        /// Buffer address.
        ptr: usize,
        /// Buffer size.
        size: u64,
    },
}

/// The route a write method asks for, before validation.
pub(crate) enum RouteArg<'py> {
    /// A FULL object (plain put/upsert/pub).
    Full,
    /// Legacy `*_with_tp`: every `K_tp_i` from the full tensor.
    Tp {
        /// `tp_size` (<= 1: a FULL write).
        size: i64,
        /// `split_dim`.
        split_dim: i64,
    },
    /// `*_with_parallelism`: a parallelism and/or a writer partition.
    Request {
        /// `parallelism` argument.
        parallelism: Option<Bound<'py, PyAny>>,
        /// `writer_partition` argument.
        writer: Option<Bound<'py, PyAny>>,
    },
}

/// One write item.
pub(crate) struct WriteItem<'py> {
    /// Base key.
    pub(crate) key: String,
    /// Source bytes.
    pub(crate) src: Src<'py>,
    /// Route.
    pub(crate) route: RouteArg<'py>,
}

/// How a write call is configured.
pub(crate) struct WriteCall<'a, 'py> {
    /// Method name for logs.
    pub(crate) method: &'a str,
    /// `config` (or its `replica` alias).
    pub(crate) config: Option<PyRef<'py, ReplicateConfig>>,
    /// Number of keys for a batch call (`group_ids` rule), `None` for a single write.
    pub(crate) batch: Option<usize>,
    /// Upsert instead of put.
    pub(crate) upsert: bool,
    /// The pub `preferred_segments` check applies to every route (the
    /// `pub_*` methods), not only the FULL one.
    pub(crate) pub_always: bool,
}

/// Resolve `config` and its `replica=` alias (spec §0 "Keyword alias").
pub(crate) fn config_or_replica<'py>(
    config: Option<PyRef<'py, ReplicateConfig>>,
    replica: Option<PyRef<'py, ReplicateConfig>>,
) -> PyResult<Option<PyRef<'py, ReplicateConfig>>> {
    match (config, replica) {
        (Some(_), Some(_)) => Err(pyo3::exceptions::PyTypeError::new_err(
            "pass either config= or its alias replica=, not both",
        )),
        (c, r) => Ok(c.or(r)),
    }
}

/// Log the failed items of a tensor call: one line naming the method, the
/// key(s), the code and the reason. INFO when every failure is OBJECT_NOT_FOUND.
pub(crate) fn log_failures(
    py: Python<'_>,
    method: &str,
    keys: &[String],
    errs: &[(usize, TensorError)],
    batch: bool,
) {
    if errs.is_empty() {
        return;
    }
    if !batch {
        let (i, e) = &errs[0];
        let key = keys.get(*i).map(String::as_str);
        log::fail(py, method, key, e.code() as i64, &e.reason);
        return;
    }
    let all_missing = errs
        .iter()
        .all(|(_, e)| e.code == ErrorCode::ObjectNotFound);
    let mut msg = format!("{method}: {} of {} items failed:", errs.len(), keys.len());
    for (n, (i, e)) in errs.iter().take(8).enumerate() {
        let key = keys.get(*i).map(String::as_str).unwrap_or("");
        let sep = if n == 0 { " " } else { "; " };
        let _ = write!(
            msg,
            "{sep}key={} {}: {}",
            log::show_key(key),
            log::describe(e.code() as i64),
            e.reason
        );
    }
    if errs.len() > 8 {
        let _ = write!(msg, "; and {} more", errs.len() - 8);
    }
    let level = if all_missing {
        log::Level::Info
    } else {
        log::Level::Warning
    };
    log::emit(py, level, &msg);
}

/// Log one failure that applies to every item of a call.
pub(crate) fn log_all(py: Python<'_>, method: &str, keys: &[String], batch: bool, e: &TensorError) {
    if batch {
        log::fail_all(py, method, keys.len(), e.code() as i64, &e.reason);
    } else {
        log::fail(
            py,
            method,
            keys.first().map(String::as_str),
            e.code() as i64,
            &e.reason,
        );
    }
}

fn route_of(route: &RouteArg<'_>, object_size: Option<u64>) -> TensorResult<WriteRoute> {
    let r = match route {
        RouteArg::Full => WriteRoute::Full,
        RouteArg::Tp { size, split_dim } => route_for_tp(*size, *split_dim)?,
        RouteArg::Request {
            parallelism,
            writer,
        } => {
            let p = args::opt_parallelism(parallelism.as_ref())?;
            let w = args::writer_partition(writer.as_ref())?;
            return match object_size {
                Some(size) => route_for_object(p, w, size),
                None => route_for(p, w),
            };
        }
    };
    Ok(match object_size {
        Some(size) => r.for_object(size),
        None => r,
    })
}

impl MooncakeDistributedStore {
    /// Write a batch of items (a single write is a batch of one); returns one
    /// code per item and logs the failures.
    pub(crate) fn tensor_writes<'py>(
        &self,
        py: Python<'py>,
        call: WriteCall<'_, 'py>,
        items: Vec<TensorResult<WriteItem<'py>>>,
        keys: &[String],
    ) -> PyResult<Vec<i32>> {
        let batch = call.batch.is_some();
        let method = call.method;
        // Tensor methods need torch even when they fail early (spec §0: ImportError).
        torch::torch(py)?;
        if items.is_empty() {
            return Ok(Vec::new());
        }
        let Some(client) = self.current() else {
            log_all(
                py,
                method,
                keys,
                batch,
                &TensorError::invalid(NOT_SET_UP_DETAIL),
            );
            return Ok(vec![NOT_SET_UP; items.len()]);
        };
        let cfg = match &call.config {
            Some(c) => c.to_write_config(WriteKind::Tensor, call.batch),
            None => ReplicateConfig::default().to_write_config(WriteKind::Tensor, call.batch),
        };
        let cfg = match cfg {
            Ok(c) => c,
            Err((code, why)) => {
                log_all(py, method, keys, batch, &TensorError::store(code, why));
                return Ok(vec![code.code(); items.len()]);
            }
        };
        drop(call.config);
        let mut keep: Vec<Bound<'py, PyAny>> = Vec::new();
        let mut writes: Vec<TensorResult<TensorWrite>> = Vec::with_capacity(items.len());
        for item in items {
            let w = match item {
                Err(e) => Err(e),
                Ok(item) => {
                    let converted = match &item.src {
                        Src::Tensor(t) => torch::tensor_in(t)?.map(|t| {
                            let (src, ptr) = (t.source.clone(), t.ptr);
                            keep.push(t.keep);
                            (src, ptr, None)
                        }),
                        Src::Object { ptr, size } => {
                            // SAFETY: the caller vouches for `ptr..ptr+size` (upstream contract).
                            let src = unsafe { object_source(*ptr, *size) };
                            src.map(|src| (src, *ptr, Some(*size)))
                        }
                    };
                    converted.and_then(|(source, ptr, object_size)| {
                        let route = route_of(&item.route, object_size)?;
                        let full = matches!(route, WriteRoute::Full | WriteRoute::Verbatim { .. });
                        if call.pub_always || full {
                            check_pub_config(&cfg)?;
                        }
                        Ok(TensorWrite {
                            key: item.key,
                            source,
                            ptr,
                            route,
                        })
                    })
                }
            };
            writes.push(w);
        }
        // SAFETY: every source pointer is a live tensor in `keep` or a caller
        // buffer (upstream contract); both outlive the call.
        let results =
            py.allow_threads(|| unsafe { client.write_tensors(writes, &cfg, call.upsert) });
        drop(keep);
        let errs: Vec<(usize, TensorError)> = results
            .iter()
            .enumerate()
            .filter_map(|(i, r)| r.as_ref().err().map(|e| (i, e.clone())))
            .collect();
        log_failures(py, method, keys, &errs, batch);
        Ok(results
            .into_iter()
            .map(|r| r.map_or_else(|e| e.code(), |()| 0))
            .collect())
    }

    /// Read a batch of requests; `into` gives each item's caller buffer
    /// (`_into` forms). Returns a tensor or `None` per item and logs the
    /// failures.
    pub(crate) fn tensor_reads<'py>(
        &self,
        py: Python<'py>,
        method: &str,
        keys: &[String],
        reqs: Vec<TensorResult<ReadRequest>>,
        into: Option<Vec<(usize, u64)>>,
        batch: bool,
    ) -> PyResult<Vec<Option<Bound<'py, PyAny>>>> {
        let n = reqs.len();
        torch::torch(py)?;
        let Some(client) = self.current() else {
            log_all(
                py,
                method,
                keys,
                batch,
                &TensorError::invalid(NOT_SET_UP_DETAIL),
            );
            return Ok((0..n).map(|_| None).collect());
        };
        if n == 0 {
            return Ok(Vec::new());
        }
        let reads = py.allow_threads(|| client.plan_tensor_reads(reqs));
        let mut dests: Vec<Option<TensorDest>> = Vec::with_capacity(n);
        let mut alloc_errs: Vec<(usize, TensorError)> = Vec::new();
        let mut fresh: Vec<Option<Bound<'py, PyAny>>> = Vec::with_capacity(n);
        for i in 0..n {
            match (reads.output(i), &into) {
                (Err(_), _) => {
                    dests.push(None);
                    fresh.push(None);
                }
                (Ok(_), Some(bufs)) => {
                    let (ptr, size) = bufs[i];
                    dests.push(Some(TensorDest::Into { ptr, size }));
                    fresh.push(None);
                }
                (Ok(out), None) => {
                    // A result that cannot be allocated fails its item, not the call.
                    match torch::empty(py, out.dtype, &out.shape)
                        .and_then(|t| torch::data_ptr(&t).map(|p| (t, p)))
                    {
                        Ok((t, ptr)) => {
                            dests.push(Some(TensorDest::Payload(ptr)));
                            fresh.push(Some(t));
                        }
                        Err(e) => {
                            alloc_errs.push((
                                i,
                                TensorError::invalid(format!("cannot allocate the result: {e}")),
                            ));
                            dests.push(None);
                            fresh.push(None);
                        }
                    }
                }
            }
        }
        // SAFETY: payload destinations are fresh tensors of exactly the
        // output size (kept in `fresh`); `_into` buffers are the caller's
        // (upstream contract) and their size is checked by the executor.
        let results = py.allow_threads(|| unsafe { reads.execute(&dests) });
        let mut errs = Vec::new();
        let mut out = Vec::with_capacity(n);
        for (i, (mut r, t)) in results.into_iter().zip(fresh).enumerate() {
            if let Some((_, e)) = alloc_errs.iter().find(|(j, _)| *j == i) {
                r = Err(e.clone());
            }
            match r {
                Err(e) => {
                    errs.push((i, e));
                    out.push(None);
                }
                Ok(o) => match (&into, t) {
                    (Some(bufs), _) => {
                        let payload = bufs[i].0 + mooncake_tensor::HEADER_SIZE;
                        // SAFETY: the payload was just written into the caller's
                        // buffer, which the caller keeps alive (spec §0 "Results").
                        let v =
                            unsafe { torch::view_of(py, payload, o.nbytes, o.dtype, &o.shape) }?;
                        out.push(Some(v));
                    }
                    (None, Some(t)) => out.push(Some(t)),
                    (None, None) => out.push(None),
                },
            }
        }
        log_failures(py, method, keys, &errs, batch);
        Ok(out)
    }
}
