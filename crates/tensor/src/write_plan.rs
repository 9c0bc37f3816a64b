//! Write planning: from a source tensor (dtype,
//! shape, where its C-ordered payload starts in the caller's buffer) and a
//! route, the objects to write — their keys, their header or manifest bytes,
//! and which byte runs of the source buffer form each payload. A shard cut
//! from a full tensor is a list of runs into the caller's memory, so the
//! executor gathers it straight into the store with no staging copy.

use crate::axis::{AxisKind, Parallelism, WriterPartition};
use crate::dtype::DType;
use crate::error::{TensorError, TensorResult};
use crate::geometry::{copy_runs, narrow, CopyRun, Region};
use crate::header::{payload_bytes, Layout, TensorHeader, HEADER_SIZE, MAX_NDIM};
use crate::keys;
use crate::manifest::Manifest;

/// The tensor a write takes its bytes from: C-contiguous elements of
/// `dtype` with `shape`, starting `payload_offset` bytes into the caller's
/// buffer (0 for a tensor's `data_ptr()`, the header's `data_offset` for a
/// `_from` buffer holding a whole object).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriteSource {
    /// Element type.
    pub dtype: DType,
    /// Shape (at most 8 dims).
    pub shape: Vec<u64>,
    /// Offset of the first payload byte in the caller's buffer.
    pub payload_offset: u64,
}

impl WriteSource {
    /// A tensor whose payload starts at the buffer's first byte.
    pub fn tensor(dtype: DType, shape: &[u64]) -> WriteSource {
        WriteSource {
            dtype,
            shape: shape.to_vec(),
            payload_offset: 0,
        }
    }

    /// Validate a caller buffer that must hold exactly one tensor object of
    /// `size` bytes (`_from` writes): `bytes` are its first bytes (at least
    /// the header). Returns the source and the decoded header.
    pub fn from_object(bytes: &[u8], size: u64) -> TensorResult<(WriteSource, TensorHeader)> {
        if size < HEADER_SIZE as u64 {
            return Err(TensorError::invalid(format!(
                "buffer of {size} bytes is smaller than the 304-byte tensor header"
            )));
        }
        let h = TensorHeader::decode(bytes, size).map_err(|e| {
            TensorError::invalid(format!(
                "buffer does not hold one valid tensor object of {size} bytes: {}",
                e.reason
            ))
        })?;
        let src = WriteSource {
            dtype: h.dtype,
            shape: h.local_shape.clone(),
            payload_offset: h.data_offset,
        };
        Ok((src, h))
    }
}

/// How a source is laid out into store objects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WriteRoute {
    /// A FULL object at `K` (`put_tensor`; the "none" route).
    Full,
    /// The caller's object bytes stored unchanged at `K` (`_from`, no request).
    Verbatim {
        /// Size of the caller's object.
        size: u64,
    },
    /// `writer_partition=(r, n, d)`: the source is full; write its r-th
    /// piece along d at `K__writer_{r}of{n}_sd{d}` plus `K__writer_manifest`.
    Writer(WriterPartition),
    /// `parallelism=P` with a tensor input: exactly `[TP]` means the source
    /// is that rank's shard; TP with other axes or an EP layout axis means
    /// the source is full and is narrowed; scope axes only store it as is.
    Parallelism(Parallelism),
    /// Every TP rank of P's scope from a full source, without a manifest
    /// (`put_tensor_with_tp`, and `_from` writes with a TP request). P's TP
    /// rank is ignored.
    AllTpRanks(Parallelism),
}

/// One object to write: `inline` bytes (a header or a manifest) followed by
/// `runs` of the source buffer (offset, length), in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedObject {
    /// Store key.
    pub key: String,
    /// Bytes owned by the plan, written first.
    pub inline: Vec<u8>,
    /// `(offset, len)` runs of the caller's buffer, written after `inline`.
    pub runs: Vec<(u64, u64)>,
    /// A manifest: committed only when every shard of its item succeeds.
    pub is_manifest: bool,
}

impl PlannedObject {
    /// Object size in bytes.
    pub fn size(&self) -> u64 {
        self.inline.len() as u64 + self.runs.iter().map(|r| r.1).sum::<u64>()
    }
}

/// The objects of one write item, shards first, manifest (if any) last.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct WritePlan {
    /// Objects in write order.
    pub objects: Vec<PlannedObject>,
}

fn shard_object(
    key: String,
    src: &WriteSource,
    p: &Parallelism,
    global: &[u64],
    source_box: &Region,
    shard_box: &Region,
) -> TensorResult<PlannedObject> {
    let local = shard_box.extent.clone();
    let header = TensorHeader {
        dtype: src.dtype,
        layout: Layout::Shard,
        flags: 0,
        data_offset: HEADER_SIZE as u64,
        data_bytes: payload_bytes(src.dtype, &local)
            .ok_or_else(|| TensorError::invalid("tensor byte size overflows"))?,
        global_shape: global.to_vec(),
        local_shape: local.clone(),
        axes: p.stored_axes(&local),
    };
    let mut runs: Vec<CopyRun> = Vec::new();
    copy_runs(src.dtype.itemsize(), source_box, shard_box, &mut runs);
    Ok(PlannedObject {
        key,
        inline: header.encode().to_vec(),
        runs: runs
            .into_iter()
            .map(|r| (src.payload_offset + r.src, r.len))
            .collect(),
        is_manifest: false,
    })
}

fn manifest_object(
    key: String,
    dtype: DType,
    global: &[u64],
    split_dim: usize,
    count: u32,
    layout: Option<Parallelism>,
) -> PlannedObject {
    let m = Manifest {
        dtype: dtype.code(),
        split_dim,
        shard_count: count,
        global_shape: global.to_vec(),
        layout,
    };
    PlannedObject {
        key,
        inline: m.encode(),
        runs: Vec::new(),
        is_manifest: true,
    }
}

/// Plan one write item: which objects `key` + `route` produce from `src`.
/// Every rule failure is an INVALID_PARAMS error with its reason, and
/// nothing is planned (so nothing is written).
pub fn plan_write(key: &str, src: &WriteSource, route: &WriteRoute) -> TensorResult<WritePlan> {
    if key.is_empty() {
        return Err(TensorError::invalid("empty key"));
    }
    let ndim = src.shape.len();
    if ndim > MAX_NDIM {
        return Err(TensorError::invalid(format!(
            "tensor has {ndim} dims; at most 8 are supported"
        )));
    }
    let nbytes = payload_bytes(src.dtype, &src.shape)
        .ok_or_else(|| TensorError::invalid("tensor byte size overflows"))?;
    let whole = Region::whole(&src.shape);
    let mut objects = Vec::new();
    match route {
        WriteRoute::Full => {
            let h = TensorHeader::full(src.dtype, &src.shape)
                .ok_or_else(|| TensorError::invalid("tensor shape is too large"))?;
            objects.push(PlannedObject {
                key: key.to_string(),
                inline: h.encode().to_vec(),
                runs: if nbytes > 0 {
                    vec![(src.payload_offset, nbytes)]
                } else {
                    Vec::new()
                },
                is_manifest: false,
            });
        }
        WriteRoute::Verbatim { size } => {
            objects.push(PlannedObject {
                key: key.to_string(),
                inline: Vec::new(),
                runs: vec![(0, *size)],
                is_manifest: false,
            });
        }
        WriteRoute::Writer(w) => {
            if w.split_dim >= ndim {
                return Err(TensorError::invalid(format!(
                    "writer_partition split_dim {} is outside the tensor's {ndim} dims",
                    w.split_dim
                )));
            }
            let shard = whole.split(w.split_dim, w.rank, w.size)?;
            let p = Parallelism::from_axes(vec![w.axis()]);
            objects.push(shard_object(
                keys::writer_shard_key(key, w),
                src,
                &p,
                &src.shape,
                &whole,
                &shard,
            )?);
            objects.push(manifest_object(
                keys::writer_manifest_key(key),
                src.dtype,
                &src.shape,
                w.split_dim,
                w.size,
                None,
            ));
        }
        WriteRoute::Parallelism(p) => {
            p.check_split_dims(ndim)?;
            if p.is_single_tp() {
                // The input is this rank's shard; the global shape is derived.
                let a = p.axes()[0];
                let d = a.split_dim.unwrap_or(0);
                let mut global = src.shape.clone();
                global[d] = global[d]
                    .checked_mul(u64::from(a.size))
                    .filter(|&g| g <= i64::MAX as u64)
                    .ok_or_else(|| TensorError::invalid("global shape overflows"))?;
                objects.push(shard_object(
                    keys::shard_key(key, p),
                    src,
                    p,
                    &global,
                    &whole,
                    &whole,
                )?);
                objects.push(manifest_object(
                    keys::parallelism_manifest_key(key),
                    src.dtype,
                    &global,
                    d,
                    a.size,
                    None,
                ));
            } else {
                // Full input narrowed along every layout axis (none for scope tags).
                let shard = narrow(&src.shape, p)?;
                objects.push(shard_object(
                    keys::shard_key(key, p),
                    src,
                    p,
                    &src.shape,
                    &whole,
                    &shard,
                )?);
                // The manifest carries the whole axis list, so a reader
                // finds and enumerates this set without being told its layout.
                let (d, n) = p
                    .tp()
                    .or_else(|| p.axes().iter().find(|a| a.is_layout()))
                    .map_or((0, 1), |a| (a.split_dim.unwrap_or(0), a.size));
                objects.push(manifest_object(
                    keys::parallelism_manifest_key(key),
                    src.dtype,
                    &src.shape,
                    d,
                    n,
                    Some(p.clone()),
                ));
            }
        }
        WriteRoute::AllTpRanks(p) => {
            p.check_split_dims(ndim)?;
            let Some(tp) = p.tp().copied() else {
                return Err(TensorError::invalid("request has no tp axis"));
            };
            for t in 0..tp.size {
                let q = p.replace(tp.at_rank(t));
                let shard = narrow(&src.shape, &q)?;
                objects.push(shard_object(
                    keys::shard_key(key, &q),
                    src,
                    &q,
                    &src.shape,
                    &whole,
                    &shard,
                )?);
            }
        }
    }
    debug_assert!(objects.iter().all(|o| o.is_manifest || !o.key.is_empty()));
    Ok(WritePlan { objects })
}

impl WriteRoute {
    /// The route for a `_from` buffer holding a whole object of `size`
    /// bytes: a FULL write stores the buffer verbatim.
    pub fn for_object(self, size: u64) -> WriteRoute {
        match self {
            WriteRoute::Full => WriteRoute::Verbatim { size },
            other => other,
        }
    }
}

/// The route of a single-tensor write request: `parallelism` and
/// `writer_partition` are mutually exclusive; neither is the FULL route.
pub fn route_for(
    parallelism: Option<Parallelism>,
    writer: Option<WriterPartition>,
) -> TensorResult<WriteRoute> {
    match (parallelism, writer) {
        (Some(_), Some(_)) => Err(TensorError::invalid(
            "parallelism and writer_partition are mutually exclusive",
        )),
        (Some(p), None) => Ok(WriteRoute::Parallelism(p)),
        (None, Some(w)) => Ok(WriteRoute::Writer(w)),
        (None, None) => Ok(WriteRoute::Full),
    }
}

/// The route of a `_from` write request: the
/// buffer is a whole object; with no request it is stored verbatim; a
/// request with a TP axis writes every TP rank of its scope from the buffer
/// as the full tensor (no manifest); other requests are planned as for a
/// tensor input.
pub fn route_for_object(
    parallelism: Option<Parallelism>,
    writer: Option<WriterPartition>,
    size: u64,
) -> TensorResult<WriteRoute> {
    match route_for(parallelism, writer)?.for_object(size) {
        WriteRoute::Parallelism(p) if p.axes().iter().any(|a| a.kind == AxisKind::Tp) => {
            Ok(WriteRoute::AllTpRanks(p))
        }
        other => Ok(other),
    }
}

/// The route of the legacy `put_tensor_with_tp(tensor, tp_rank, tp_size,
/// split_dim)` family: `tp_size <= 1` is a FULL write, otherwise
/// every `K_tp_i` from the full tensor, `tp_rank` ignored, no manifest.
pub fn route_for_tp(tp_size: i64, split_dim: i64) -> TensorResult<WriteRoute> {
    if tp_size <= 1 {
        return Ok(WriteRoute::Full);
    }
    let p = Parallelism::new(&[crate::axis::RawAxis::new("tp", 0, tp_size).split(split_dim)])?;
    Ok(WriteRoute::AllTpRanks(p))
}
