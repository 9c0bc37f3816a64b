//! The two bodies every tensor method funnels into: a batch of writes and a
//! batch of reads. They convert arguments (torch tensors, buffers,
//! duck-typed requests), call the client's executor with the GIL released,
//! build the result tensors, and report through [`Call`] (upstream's return
//! values, one log line per failing call).

use super::args;
use super::pooled;
use super::torch;
use crate::report::Call;
use crate::store::class::MooncakeDistributedStore;
use crate::store::config::{options, ReplicateConfig};
use mooncake_client::device_staging::HostStand;
use mooncake_client::{
    object_source, Error, Result, ResultBlock, TensorDest, TensorWrite, WriteMode,
};
use mooncake_tensor::ReadOutput;
use mooncake_tensor::{
    route_for, route_for_object, route_for_tp, ReadRequest, WriteRoute, HEADER_SIZE,
};
use pyo3::prelude::*;

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
pub(crate) struct WriteCall {
    /// Method name for logs.
    pub(crate) method: &'static str,
    /// `config` (or its `replica` alias).
    pub(crate) config: Option<ReplicateConfig>,
    /// A batch method (one result per key, `group_ids` per key).
    pub(crate) batch: bool,
    /// Put, upsert, and whether the pub `preferred_segments` check applies
    /// to every route (the `pub_*` methods), not only the FULL one.
    pub(crate) mode: WriteMode,
}

/// Resolve `config` and its `replica=` alias: every `*_with_parallelism`
/// write accepts either; passing both raises `TypeError`.
pub(crate) fn config_or_replica(
    config: Option<ReplicateConfig>,
    replica: Option<ReplicateConfig>,
) -> PyResult<Option<ReplicateConfig>> {
    match (config, replica) {
        (Some(_), Some(_)) => Err(pyo3::exceptions::PyTypeError::new_err(
            "pass either config= or its alias replica=, not both",
        )),
        (c, r) => Ok(c.or(r)),
    }
}

fn route_of(route: &RouteArg<'_>, object_size: Option<u64>) -> Result<WriteRoute> {
    let r = match route {
        RouteArg::Full => WriteRoute::Full,
        RouteArg::Tp { size, split_dim } => route_for_tp(*size, *split_dim)?,
        RouteArg::Request {
            parallelism,
            writer,
        } => {
            let p = args::opt_parallelism(parallelism.as_ref())?;
            let w = args::writer_partition(writer.as_ref())?;
            return Ok(match object_size {
                Some(size) => route_for_object(p, w, size)?,
                None => route_for(p, w)?,
            });
        }
    };
    Ok(match object_size {
        Some(size) => r.for_object(size),
        None => r,
    })
}

/// The memory a read result is copied into before it becomes a tensor.
enum Fresh<'py> {
    /// A fresh `torch.empty` tensor.
    Tensor(Bound<'py, PyAny>),
    /// A block of the client's result pool (results of at least
    /// `mooncake_client::POOL_MIN` bytes); the tensor is built over it.
    Block(ResultBlock),
}

/// Result memory made before a read, kept across the GIL-free read.
enum Made {
    /// A fresh `torch.empty` tensor.
    Tensor(Py<PyAny>),
    /// A block of the client's result pool.
    Block(ResultBlock),
}

/// The one result of a single-item call.
fn single<T>(r: Result<Vec<Result<T>>>) -> Result<T> {
    r.and_then(|mut v| v.pop().unwrap_or_else(|| Err(Error::internal("no result"))))
}

/// The executor's write of `item`; a tensor source is pushed to `keep`,
/// which must outlive the write. `Err` is a Python error reading a tensor.
fn tensor_write<'py>(
    item: WriteItem<'py>,
    keep: &mut Vec<Bound<'py, PyAny>>,
) -> PyResult<Result<TensorWrite>> {
    let converted = match &item.src {
        Src::Tensor(t) => torch::tensor_in(t)?.map_err(Error::from).map(|t| {
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
    Ok(converted.and_then(|(source, ptr, object_size)| {
        Ok(TensorWrite {
            key: item.key,
            source,
            ptr,
            route: route_of(&item.route, object_size)?,
        })
    }))
}

impl MooncakeDistributedStore {
    /// Write a batch of items (a single write is a batch of one): one code
    /// per item, failures logged once.
    pub(crate) fn tensor_writes<'py>(
        &self,
        py: Python<'py>,
        call: WriteCall,
        items: Vec<Result<WriteItem<'py>>>,
        keys: &[String],
    ) -> PyResult<Vec<i64>> {
        // Tensor methods need torch even when they fail early: without it they
        // raise ImportError, whatever the arguments.
        torch::torch(py)?;
        let report = Call::new(py, call.method);
        if items.is_empty() {
            return Ok(Vec::new());
        }
        let cfg = options(call.config);
        let mut keep: Vec<Bound<'py, PyAny>> = Vec::new();
        let mut writes: Vec<Result<TensorWrite>> = Vec::with_capacity(items.len());
        for item in items {
            writes.push(match item {
                Ok(item) => tensor_write(item, &mut keep)?,
                Err(e) => Err(e),
            });
        }
        let mode = call.mode;
        // SAFETY: every source pointer is a live tensor in `keep` or a caller
        // buffer (upstream contract); both outlive the call.
        let r = self.run(py, |c| unsafe { c.write_tensors(writes, &cfg, mode) });
        drop(keep);
        Ok(if call.batch {
            report.codes(keys, r)
        } else {
            vec![report.code(keys.first().map(String::as_str), single(r))]
        })
    }

    /// Read a batch of requests; `into` gives each item's caller buffer
    /// (`_into` forms). A tensor or `None` per item, failures logged once.
    pub(crate) fn tensor_reads<'py>(
        &self,
        py: Python<'py>,
        method: &'static str,
        keys: &[String],
        reqs: Vec<Result<ReadRequest>>,
        into: Option<Vec<(usize, u64)>>,
        batch: bool,
    ) -> PyResult<Vec<Option<Bound<'py, PyAny>>>> {
        torch::torch(py)?;
        let report = Call::new(py, method);
        let results = self.read_tensors(py, reqs, into.as_deref())?;
        Ok(if batch {
            report.oks(keys, results)
        } else {
            vec![report.ok(keys.first().map(String::as_str), single(results))]
        })
    }

    fn read_tensors<'py>(
        &self,
        py: Python<'py>,
        reqs: Vec<Result<ReadRequest>>,
        into: Option<&[(usize, u64)]>,
    ) -> PyResult<Result<Vec<Result<Bound<'py, PyAny>>>>> {
        let n = reqs.len();
        let Some(store) = self.store() else {
            return Ok(Err(Error::not_set_up()));
        };
        if n == 0 {
            return Ok(Ok(Vec::new()));
        }
        // CUDA destinations are read into host stand-ins, then copied over.
        let stand = into.map(|b| {
            let (p, s): (Vec<usize>, Vec<usize>) = b.iter().map(|&(p, s)| (p, s as usize)).unzip();
            HostStand::destinations(&p, &s)
        });
        let host_into: Option<Vec<(usize, u64)>> = into
            .zip(stand.as_ref().filter(|st| st.any()))
            .map(|(b, st)| b.iter().zip(&st.ptrs).map(|(&(_, s), &p)| (p, s)).collect());
        let (into, cuda_into) = (host_into.as_deref().or(into), into);
        // Destinations are chosen once the plans say what each read
        // produces (with the GIL, from the call's thread); `made` keeps the
        // result memory until the tensors are built.
        let mut made: Vec<Result<Option<Made>>> = Vec::with_capacity(n);
        let mut raised: Option<PyErr> = None;
        let alloc = |outs: &[Result<ReadOutput>]| -> Vec<Option<TensorDest>> {
            Python::with_gil(|py| {
                let mut dests: Vec<Option<TensorDest>> = Vec::with_capacity(n);
                for (i, out) in outs.iter().enumerate() {
                    match (out, into) {
                        (Err(_), _) => {
                            dests.push(None);
                            made.push(Ok(None));
                        }
                        (Ok(_), Some(bufs)) => {
                            let (ptr, size) = bufs[i];
                            dests.push(Some(TensorDest::Into { ptr, size }));
                            made.push(Ok(None));
                        }
                        (Ok(out), None) => {
                            // Large results go into pooled memory (pages already in
                            // memory when a block is reused); the tensor is built
                            // over it after the copy.
                            if let Some(block) = ResultBlock::for_result(out.nbytes) {
                                dests.push(Some(TensorDest::Payload(block.ptr())));
                                made.push(Ok(Some(Made::Block(block))));
                                continue;
                            }
                            // A result that cannot be allocated fails its item, not the call.
                            match torch::empty(py, out.dtype, &out.shape)
                                .and_then(|t| torch::data_ptr(&t).map(|p| (t, p)))
                            {
                                Ok((t, ptr)) => {
                                    dests.push(Some(TensorDest::Payload(ptr)));
                                    made.push(Ok(Some(Made::Tensor(t.unbind()))));
                                }
                                Err(e) => {
                                    dests.push(None);
                                    made.push(Err(Error::invalid(format!(
                                        "cannot allocate the result: {e}"
                                    ))));
                                    raised.get_or_insert(e);
                                }
                            }
                        }
                    }
                }
                dests
            })
        };
        // SAFETY: payload destinations are fresh tensors or pool blocks of
        // at least the output size (kept in `fresh`); `_into` buffers are the caller's
        // (upstream contract) and their size is checked by the executor.
        let results = py.allow_threads(|| unsafe { store.read_tensors(reqs, Box::new(alloc)) });
        if let Some(e) = raised.filter(|e| e.is_instance_of::<pyo3::exceptions::PyImportError>(py))
        {
            return Err(e);
        }
        made.resize_with(n, || Ok(None));
        let fresh = made.into_iter().map(|m| {
            m.map(|m| {
                m.map(|m| match m {
                    Made::Tensor(t) => Fresh::Tensor(t.into_bound(py)),
                    Made::Block(b) => Fresh::Block(b),
                })
            })
        });
        let mut out = Vec::with_capacity(n);
        for (i, (r, t)) in results.into_iter().zip(fresh).enumerate() {
            out.push(match (r, t, into) {
                (_, Err(e), _) | (Err(e), _, _) => Err(e),
                (Ok(o), Ok(_), Some(_)) if stand.as_ref().is_some_and(|st| st.is_staged(i)) => {
                    let at = cuda_into.map_or(0, |b| b[i].0);
                    let total = HEADER_SIZE as u64 + o.nbytes;
                    // SAFETY: the caller's destination is device memory of at
                    // least the object's size (checked by the read).
                    match stand.as_ref().map(|st| unsafe { st.deliver_one(i, total) }) {
                        Some(Err(e)) => Err(e),
                        _ => Ok(crate::store::tier2::cuda_view_of(py, at + HEADER_SIZE, &o)?),
                    }
                }
                (Ok(o), Ok(_), Some(bufs)) => {
                    let payload = bufs[i].0 + HEADER_SIZE;
                    // SAFETY: the payload was just written into the caller's
                    // buffer, which the caller keeps alive (an `_into` read
                    // returns a view of the caller's buffer).
                    let v = unsafe { torch::view_of(py, payload, &o) }?;
                    Ok(v)
                }
                (Ok(_), Ok(Some(Fresh::Tensor(t))), None) => Ok(t),
                (Ok(o), Ok(Some(Fresh::Block(b))), None) => {
                    Ok(pooled::tensor_over(py, b, o.dtype, &o.shape)?)
                }
                (Ok(_), Ok(None), None) => Err(Error::internal("no result tensor")),
            });
        }
        Ok(Ok(out))
    }
}
