//! Read planning: turns a request and
//! what is known about stored objects into byte ranges
//! `(key, src_offset, dst_offset, len)` that assemble the result directly in
//! its final memory.
//!
//! Planning is a pure function of the request and the *observations* (size
//! and first 304 bytes of each probed key). [`resolve`] either asks for more
//! keys to be probed, or answers with a [`ReadPlan`] or a failure. Every
//! request needs at most two probe rounds: the candidates and manifests
//! (round 1), then, when re-sharding or rebuilding, the members of the set
//! the round-1 objects describe (round 2). The executor batches each round
//! of a whole batch into one master lookup and one data round, so a batch
//! read costs a constant number of master RPCs whatever its size.

use crate::axis::{Axis, AxisKind, Parallelism};
use crate::dtype::DType;
use crate::error::{TensorError, TensorResult};
use crate::geometry::{copy_runs, CopyRun, Region};
use crate::header::{Layout, TensorHeader, HEADER_SIZE};
use crate::keys;
use crate::manifest::Manifest;
use mooncake_common::ErrorCode;
use std::collections::HashMap;

/// How many bytes of each probed object the planner needs.
pub const PROBE_PREFIX: usize = HEADER_SIZE;
/// Most objects one rebuild or re-shard may combine (protects against
/// corrupt manifests and absurd requests).
pub const MAX_SET_MEMBERS: u64 = 1 << 16;

/// `ReadTarget.mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReadMode {
    /// The stored object itself.
    AsStored,
    /// A target shard (possibly re-sharded from the stored set).
    Shard,
    /// The reconstructed whole tensor.
    Full,
}

impl ReadMode {
    /// Parse a mode case-insensitively.
    pub fn parse(s: &str) -> TensorResult<ReadMode> {
        match s.to_ascii_lowercase().as_str() {
            "as_stored" => Ok(ReadMode::AsStored),
            "shard" => Ok(ReadMode::Shard),
            "full" => Ok(ReadMode::Full),
            _ => Err(TensorError::invalid(format!(
                "unsupported ReadTarget mode {s:?}"
            ))),
        }
    }
}

/// One read request.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ReadRequest {
    /// Base key `K`.
    pub key: String,
    /// Materialisation mode.
    pub mode: ReadMode,
    /// Target layout (validated).
    pub parallelism: Option<Parallelism>,
    /// Legacy TP wrappers: the TP split dim is advisory, storage decides.
    pub advisory_split_dim: bool,
}

impl ReadRequest {
    /// `get_tensor(key)`.
    pub fn plain(key: &str) -> ReadRequest {
        ReadRequest {
            key: key.to_string(),
            mode: ReadMode::AsStored,
            parallelism: None,
            advisory_split_dim: false,
        }
    }

    /// `get_tensor_with_tp(key, tp_rank, tp_size, split_dim)`: `tp_size <= 1`
    /// is a plain read; otherwise a shard read of `[TP(rank, size, split_dim)]`
    /// whose split dim is advisory (`None` or negative: taken from storage;
    /// upstream never checked it).
    pub fn legacy_tp(
        key: &str,
        tp_rank: i64,
        tp_size: i64,
        split_dim: Option<i64>,
    ) -> TensorResult<ReadRequest> {
        if tp_size <= 1 {
            return Ok(ReadRequest::plain(key));
        }
        let raw =
            crate::axis::RawAxis::new("tp", tp_rank, tp_size).split(split_dim.unwrap_or(0).max(0));
        Ok(ReadRequest {
            key: key.to_string(),
            mode: ReadMode::Shard,
            parallelism: Some(Parallelism::new(&[raw])?),
            advisory_split_dim: true,
        })
    }
}

/// What the executor learned about one probed key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Observed {
    /// The key could not be read (missing, not ready, ...): why.
    Missing(TensorError),
    /// The object exists with `size` bytes; `prefix` holds its first
    /// `min(size, 304)` bytes.
    Found {
        /// Object size.
        size: u64,
        /// First bytes.
        prefix: Vec<u8>,
    },
}

/// Observations by key.
pub type Observations = HashMap<String, Observed>;

/// One object a plan reads from.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PlanSource {
    /// Store key.
    pub key: String,
    /// Object size when it was probed (a changed size means the object changed).
    pub size: u64,
}

/// One byte range: `len` bytes at `src_offset` of source `source` go to
/// `dst_offset` of the result payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PlanRange {
    /// Index into [`ReadPlan::sources`].
    pub source: usize,
    /// Offset in the stored object.
    pub src_offset: u64,
    /// Offset in the result payload.
    pub dst_offset: u64,
    /// Length.
    pub len: u64,
}

/// The result a plan produces.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadOutput {
    /// Element type.
    pub dtype: DType,
    /// Shape of the result tensor.
    pub shape: Vec<u64>,
    /// Payload bytes (`prod(shape) * itemsize`).
    pub nbytes: u64,
    /// The header an `_into` read writes in front of the payload: the
    /// stored header for stored objects, FULL for full reads, SHARD with the
    /// request's axes for re-sharded or sliced shards.
    pub header: [u8; HEADER_SIZE],
}

/// A resolved read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadPlan {
    /// Objects read.
    pub sources: Vec<PlanSource>,
    /// Ranges, in increasing destination order per source.
    pub ranges: Vec<PlanRange>,
    /// The result.
    pub output: ReadOutput,
}

/// What [`resolve`] concluded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Probe these keys (size + first 304 bytes), then call again.
    Probe(Vec<String>),
    /// Read these ranges.
    Read(Box<ReadPlan>),
    /// The read yields `None`, for this reason.
    Fail(TensorError),
}

/// Lookups against the observations, recording what is not observed yet.
struct Cx<'a> {
    obs: &'a Observations,
    need: Vec<String>,
}

/// A probed object: size, raw prefix, decoded header.
#[derive(Clone)]
struct Obj<'a> {
    key: String,
    size: u64,
    prefix: &'a [u8],
    header: TensorHeader,
}

impl<'a> Cx<'a> {
    /// Mark `key` as needed if it has not been observed.
    fn declare(&mut self, key: &str) {
        if !self.obs.contains_key(key) && !self.need.iter().any(|k| k == key) {
            self.need.push(key.to_string());
        }
    }

    fn pending(&self) -> bool {
        !self.need.is_empty()
    }

    fn take(&mut self) -> Step {
        Step::Probe(std::mem::take(&mut self.need))
    }

    /// The decoded tensor object at `key` (declares it when unobserved;
    /// errors say whether it is missing or not a tensor object).
    fn object(&mut self, key: &str) -> TensorResult<Obj<'a>> {
        match self.obs.get(key) {
            None => {
                self.declare(key);
                Err(TensorError::not_found(format!("{key:?} is not probed yet")))
            }
            Some(Observed::Missing(e)) if e.code == ErrorCode::ObjectNotFound => {
                Err(TensorError::not_found(format!("no object at {key:?}")))
            }
            Some(Observed::Missing(e)) => {
                Err(TensorError::store(e.code, format!("{key:?}: {}", e.reason)))
            }
            Some(Observed::Found { size, prefix }) => {
                let header = TensorHeader::decode(prefix, *size)
                    .map_err(|e| e.context(format!("{key:?}")))?;
                Ok(Obj {
                    key: key.to_string(),
                    size: *size,
                    prefix,
                    header,
                })
            }
        }
    }

    /// The manifest at `key`, if present and valid.
    fn manifest(&mut self, key: &str) -> Option<Manifest> {
        match self.obs.get(key) {
            None => {
                self.declare(key);
                None
            }
            Some(Observed::Found { prefix, .. }) => Manifest::decode(prefix).ok(),
            Some(Observed::Missing(_)) => None,
        }
    }
}

/// Round-1 keys of a request: every candidate and manifest any resolution
/// step may consult without first reading another object.
fn round1(req: &ReadRequest) -> Vec<String> {
    let k = req.key.as_str();
    let p = req.parallelism.as_ref();
    let mut v: Vec<String> = Vec::new();
    match (req.mode, p) {
        (ReadMode::AsStored, None) => v.push(k.to_string()),
        (ReadMode::AsStored, Some(p)) => v.push(keys::shard_key(k, p)),
        (ReadMode::Shard, None) => {}
        (ReadMode::Shard, Some(p)) => {
            v.push(keys::shard_key(k, p));
            if p.tp().is_some() {
                v.push(keys::parallelism_manifest_key(k));
            }
            if p.is_single_tp() {
                let a = p.axes()[0];
                v.push(writer_key(k, &a));
                v.push(keys::writer_manifest_key(k));
                v.push(keys::tp_key(k, 0));
                v.push(k.to_string());
            }
        }
        (ReadMode::Full, None) => {
            v.push(keys::writer_manifest_key(k));
            v.push(k.to_string());
            v.push(keys::tp_key(k, 0));
        }
        (ReadMode::Full, Some(p)) if p.tp().is_some() || p.has_ep_layout() => {
            if p.tp().is_some() {
                v.push(keys::parallelism_manifest_key(k));
            }
            if p.is_single_tp() {
                v.push(keys::tp_key(k, 0));
                v.push(keys::writer_manifest_key(k));
            }
        }
        (ReadMode::Full, Some(p)) => v.push(keys::shard_key(k, p)),
    }
    v
}

fn writer_key(base: &str, tp: &Axis) -> String {
    format!(
        "{base}__writer_{}of{}_sd{}",
        tp.rank,
        tp.size,
        tp.split_dim.unwrap_or(0)
    )
}

/// Resolve `req` against what has been observed so far.
pub fn resolve(req: &ReadRequest, obs: &Observations) -> Step {
    let mut cx = Cx {
        obs,
        need: Vec::new(),
    };
    for key in round1(req) {
        cx.declare(&key);
    }
    if cx.pending() {
        return cx.take();
    }
    let result = match (req.mode, req.parallelism.as_ref()) {
        (ReadMode::AsStored, p) => as_stored(&mut cx, req, p),
        (ReadMode::Shard, None) => Err(TensorError::invalid(
            "parallelism is required for a shard read",
        )),
        (ReadMode::Shard, Some(p)) => shard(&mut cx, req, p),
        (ReadMode::Full, None) => full_unscoped(&mut cx, req),
        (ReadMode::Full, Some(p)) => full(&mut cx, req, p),
    };
    if cx.pending() {
        return cx.take();
    }
    match result {
        Ok(plan) => Step::Read(Box::new(plan)),
        Err(e) => Step::Fail(e),
    }
}

/// The stored header bytes of `o` as an `_into` read writes them (payload
/// directly after the header).
fn stored_header_bytes(o: &Obj<'_>) -> [u8; HEADER_SIZE] {
    if o.header.data_offset == HEADER_SIZE as u64 && o.prefix.len() >= HEADER_SIZE {
        let mut b = [0u8; HEADER_SIZE];
        b.copy_from_slice(&o.prefix[..HEADER_SIZE]);
        b
    } else {
        let mut h = o.header.clone();
        h.data_offset = HEADER_SIZE as u64;
        h.encode()
    }
}

/// Read a stored object as it is.
fn whole(o: &Obj<'_>) -> ReadPlan {
    let h = &o.header;
    ReadPlan {
        sources: vec![PlanSource {
            key: o.key.clone(),
            size: o.size,
        }],
        ranges: if h.data_bytes > 0 {
            vec![PlanRange {
                source: 0,
                src_offset: h.data_offset,
                dst_offset: 0,
                len: h.data_bytes,
            }]
        } else {
            Vec::new()
        },
        output: ReadOutput {
            dtype: h.dtype,
            shape: h.local_shape.clone(),
            nbytes: h.data_bytes,
            header: stored_header_bytes(o),
        },
    }
}

/// A stored object's place in the global index space, from its header.
fn shard_box(h: &TensorHeader) -> TensorResult<Region> {
    let mut b = Region::whole(&h.local_shape);
    let mut split = vec![false; h.ndim()];
    for a in &h.axes {
        let Ok(d) = usize::try_from(a.split_dim) else {
            continue;
        };
        let local = h.local_shape[d];
        if local.checked_mul(a.shard_count as u64) != Some(h.global_shape[d]) {
            return Err(TensorError::corrupt(format!(
                "shard extent {local} x {} does not make the global extent {} along dim {d}",
                a.shard_count, h.global_shape[d]
            )));
        }
        b.origin[d] = local * a.shard_rank as u64;
        split[d] = true;
    }
    for (d, &is_split) in split.iter().enumerate() {
        if !is_split && h.local_shape[d] != h.global_shape[d] {
            return Err(TensorError::corrupt(format!(
                "dim {d} is not split but its local extent {} differs from the global {}",
                h.local_shape[d], h.global_shape[d]
            )));
        }
    }
    Ok(b)
}

/// Assemble `target` (a box of the global space of `dtype`) from sources.
fn gather(
    dtype: DType,
    sources: &[Obj<'_>],
    target: &Region,
    header: [u8; HEADER_SIZE],
) -> TensorResult<ReadPlan> {
    let itemsize = dtype.itemsize();
    let mut plan_sources = Vec::new();
    let mut ranges = Vec::new();
    let mut covered = 0u64;
    let mut runs: Vec<CopyRun> = Vec::new();
    for o in sources {
        let b = shard_box(&o.header).map_err(|e| e.context(format!("{:?}", o.key)))?;
        runs.clear();
        let n = copy_runs(itemsize, &b, target, &mut runs);
        if n == 0 {
            continue;
        }
        covered += n;
        let idx = plan_sources.len();
        plan_sources.push(PlanSource {
            key: o.key.clone(),
            size: o.size,
        });
        ranges.extend(runs.iter().map(|r| PlanRange {
            source: idx,
            src_offset: o.header.data_offset + r.src,
            dst_offset: r.dst,
            len: r.len,
        }));
    }
    if covered != target.volume() {
        return Err(TensorError::corrupt(
            "the stored shards do not cover the requested range exactly",
        ));
    }
    let nbytes = target.volume() * itemsize;
    Ok(ReadPlan {
        sources: plan_sources,
        ranges,
        output: ReadOutput {
            dtype,
            shape: target.extent.clone(),
            nbytes,
            header,
        },
    })
}

fn full_header(dtype: DType, shape: &[u64]) -> TensorResult<[u8; HEADER_SIZE]> {
    TensorHeader::full(dtype, shape)
        .map(|h| h.encode())
        .ok_or_else(|| TensorError::corrupt("result shape is too large"))
}

fn shard_header(
    dtype: DType,
    global: &[u64],
    local: &[u64],
    p: &Parallelism,
) -> TensorResult<[u8; HEADER_SIZE]> {
    let mut h = TensorHeader::full(dtype, local)
        .ok_or_else(|| TensorError::corrupt("result shape is too large"))?;
    h.layout = Layout::Shard;
    h.global_shape = global.to_vec();
    h.axes = p.stored_axes(local);
    Ok(h.encode())
}

fn as_stored(
    cx: &mut Cx<'_>,
    req: &ReadRequest,
    p: Option<&Parallelism>,
) -> TensorResult<ReadPlan> {
    let key = match p {
        Some(p) => keys::shard_key(&req.key, p),
        None => req.key.clone(),
    };
    let o = cx.object(&key)?;
    if let Some(p) = p {
        if !p.matches(&o.header) {
            return Err(TensorError::not_found(format!(
                "the object at {key:?} does not match the requested parallelism"
            )));
        }
    }
    Ok(whole(&o))
}

/// A stored set of shards split along one dim (a TP or writer set).
struct SetSpec {
    /// Stored split dim and count.
    split_dim: usize,
    count: u32,
    /// From the manifest (or the probed member 0), when known.
    global: Option<Vec<u64>>,
    dtype: Option<i32>,
    /// Expected member (key, axes) pairs.
    members: Vec<(String, Parallelism)>,
}

fn check_members(n: u64) -> TensorResult<()> {
    if n > MAX_SET_MEMBERS {
        return Err(TensorError::corrupt(format!(
            "a set of {n} shards is more than the {MAX_SET_MEMBERS} supported"
        )));
    }
    Ok(())
}

/// The TP set in P's scope: count and split dim
/// from `K__parallelism_manifest`; for single-axis P without it, from
/// `K_tp_0`'s header, then from the writer set; for multi-axis P, from P.
fn tp_set(cx: &mut Cx<'_>, req: &ReadRequest, p: &Parallelism) -> TensorResult<SetSpec> {
    let k = req.key.as_str();
    let Some(tp) = p.tp().copied() else {
        return Err(TensorError::invalid("request has no tp axis"));
    };
    let want_d = tp.split_dim.unwrap_or(0);
    let from_manifest = cx.manifest(&keys::parallelism_manifest_key(k));
    let (d, m, global, dtype, writer) = if let Some(mf) = from_manifest {
        (
            mf.split_dim,
            mf.shard_count,
            Some(mf.global_shape),
            Some(mf.dtype),
            false,
        )
    } else if p.is_single_tp() {
        let tp0 = cx.object(&keys::tp_key(k, 0));
        match tp0 {
            Ok(o) if o.header.axes.len() == 1 && o.header.axes[0].kind == AxisKind::Tp.code() => {
                let a = o.header.axes[0];
                let d = usize::try_from(a.split_dim)
                    .map_err(|_| TensorError::corrupt(format!("{:?} has no split dim", o.key)))?;
                (
                    d,
                    a.shard_count as u32,
                    Some(o.header.global_shape.clone()),
                    Some(o.header.dtype.code()),
                    false,
                )
            }
            _ => match cx.manifest(&keys::writer_manifest_key(k)) {
                Some(mf) => (
                    mf.split_dim,
                    mf.shard_count,
                    Some(mf.global_shape),
                    Some(mf.dtype),
                    true,
                ),
                None => {
                    return Err(TensorError::not_found(format!(
                        "no TP shard set found for {k:?} (no manifest, no {k}_tp_0, no writer set)"
                    )))
                }
            },
        }
    } else {
        (want_d, tp.size, None, None, false)
    };
    if d != want_d && !req.advisory_split_dim {
        return Err(TensorError::invalid(format!(
            "requested TP split_dim {want_d} differs from the stored split_dim {d}"
        )));
    }
    check_members(u64::from(m))?;
    let members = (0..m)
        .map(|t| {
            let axis = Axis::tp(t, m, d);
            let q = p.replace(axis);
            let key = if writer {
                writer_key(k, &axis)
            } else {
                keys::shard_key(k, &q)
            };
            (key, q)
        })
        .collect();
    Ok(SetSpec {
        split_dim: d,
        count: m,
        global,
        dtype,
        members,
    })
}

/// The writer set of `K` from its manifest, if the manifest exists.
fn writer_set(cx: &mut Cx<'_>, k: &str) -> Option<TensorResult<SetSpec>> {
    let mf = cx.manifest(&keys::writer_manifest_key(k))?;
    if let Err(e) = check_members(u64::from(mf.shard_count)) {
        return Some(Err(e));
    }
    let members = (0..mf.shard_count)
        .map(|t| {
            let axis = Axis::tp(t, mf.shard_count, mf.split_dim);
            (writer_key(k, &axis), Parallelism::from_axes(vec![axis]))
        })
        .collect();
    Some(Ok(SetSpec {
        split_dim: mf.split_dim,
        count: mf.shard_count,
        global: Some(mf.global_shape),
        dtype: Some(mf.dtype),
        members,
    }))
}

/// Fetch (or declare) every member and check that they agree with each
/// other and with the set description. Returns the members and their
/// common dtype and global shape.
fn load_members<'a>(
    cx: &mut Cx<'a>,
    members: &[(String, Parallelism)],
    global: Option<&[u64]>,
    dtype: Option<i32>,
) -> TensorResult<(Vec<Obj<'a>>, DType, Vec<u64>)> {
    let mut objs = Vec::with_capacity(members.len());
    let mut first_err = None;
    for (key, q) in members {
        match cx.object(key) {
            Ok(o) => {
                if !q.matches(&o.header) {
                    first_err.get_or_insert(TensorError::corrupt(format!(
                        "{key:?} does not carry the expected parallelism axes"
                    )));
                }
                objs.push(o);
            }
            Err(e) => {
                first_err.get_or_insert(e);
            }
        }
    }
    if cx.pending() {
        return Err(TensorError::not_found("set members are not probed yet"));
    }
    if let Some(e) = first_err {
        return Err(e.context("shard set incomplete or invalid"));
    }
    let Some(first) = objs.first() else {
        return Err(TensorError::not_found("empty shard set"));
    };
    let dt = first.header.dtype;
    let g = first.header.global_shape.clone();
    for o in &objs {
        if o.header.dtype != dt {
            return Err(TensorError::corrupt(format!(
                "shards disagree on dtype ({:?} is {}, {:?} is {})",
                first.key,
                dt.torch_name(),
                o.key,
                o.header.dtype.torch_name()
            )));
        }
        if o.header.global_shape != g {
            return Err(TensorError::corrupt(format!(
                "shards disagree on the global shape ({:?} vs {:?})",
                first.key, o.key
            )));
        }
    }
    if dtype.is_some_and(|d| d != dt.code()) {
        return Err(TensorError::corrupt(
            "the manifest and the shards disagree on dtype",
        ));
    }
    if global.is_some_and(|gm| gm != g.as_slice()) {
        return Err(TensorError::corrupt(
            "the manifest and the shards disagree on the global shape",
        ));
    }
    Ok((objs, dt, g))
}

/// Re-shard (or rebuild, when `p` is `None`) from a loaded set.
fn from_set(cx: &mut Cx<'_>, set: &SetSpec, p: Option<&Parallelism>) -> TensorResult<ReadPlan> {
    let (objs, dtype, global) = load_members(cx, &set.members, set.global.as_deref(), set.dtype)?;
    let g = global.get(set.split_dim).copied().unwrap_or(0);
    if g % u64::from(set.count) != 0 {
        return Err(TensorError::corrupt("the stored split is not uniform"));
    }
    match p {
        None => {
            let target = Region::whole(&global);
            gather(dtype, &objs, &target, full_header(dtype, &global)?)
        }
        Some(p) => {
            // The requested shard, with the TP axis on the stored split dim.
            let tp = p
                .tp()
                .copied()
                .ok_or_else(|| TensorError::invalid("request has no tp axis"))?;
            let q = p.replace(Axis {
                split_dim: Some(set.split_dim),
                ..tp
            });
            let mut target = Region::whole(&global);
            for a in q.axes() {
                if let Some(d) = a.split_dim {
                    target = target.split(d, a.rank, a.size)?;
                }
            }
            let header = shard_header(dtype, &global, &target.extent, &q)?;
            gather(dtype, &objs, &target, header)
        }
    }
}

fn shard(cx: &mut Cx<'_>, req: &ReadRequest, p: &Parallelism) -> TensorResult<ReadPlan> {
    let k = req.key.as_str();
    let adv = req.advisory_split_dim;
    // S1: the exact object.
    let exact = keys::shard_key(k, p);
    if let Ok(o) = cx.object(&exact) {
        if p.matches_with(&o.header, adv) {
            return Ok(whole(&o));
        }
    }
    let single = p.is_single_tp();
    // S2: the writer shard of the same (rank, size, split_dim).
    if single {
        if let Ok(o) = cx.object(&writer_key(k, &p.axes()[0])) {
            if p.matches_with(&o.header, adv) {
                return Ok(whole(&o));
            }
        }
    }
    let mut last = TensorError::not_found(format!("no shard of {k:?} matches the request"));
    // S3: re-shard the stored TP set.
    if p.tp().is_some() {
        match tp_set(cx, req, p).and_then(|set| from_set(cx, &set, Some(p))) {
            Ok(plan) => return Ok(plan),
            Err(e) => {
                if cx.pending() {
                    return Err(e);
                }
                last = e;
            }
        }
    }
    if single {
        let tp = p.axes()[0];
        // S4: slice a FULL object at K.
        if let Ok(o) = cx.object(k) {
            if o.header.layout == Layout::Full {
                let d = tp.split_dim.unwrap_or(0);
                let target = Region::whole(&o.header.global_shape).split(d, tp.rank, tp.size);
                if let Ok(target) = target {
                    let header =
                        shard_header(o.header.dtype, &o.header.global_shape, &target.extent, p)?;
                    return gather(o.header.dtype, std::slice::from_ref(&o), &target, header);
                }
            }
        }
        // S5: the raw stored chunk (upstream's fallback).
        let raw = if tp.size <= 1 { k.to_string() } else { exact };
        if let Ok(o) = cx.object(&raw) {
            return Ok(whole(&o));
        }
    }
    Err(last)
}

fn full_unscoped(cx: &mut Cx<'_>, req: &ReadRequest) -> TensorResult<ReadPlan> {
    let k = req.key.as_str();
    // F1: the writer set, when its manifest exists (no fallback if incomplete).
    if let Some(set) = writer_set(cx, k) {
        return from_set(cx, &set?, None);
    }
    // F2: the object at K.
    if let Ok(o) = cx.object(k) {
        let mut plan = whole(&o);
        plan.output.header = full_header(o.header.dtype, &o.header.local_shape)?;
        return Ok(plan);
    }
    // F3: the legacy TP set described by K_tp_0.
    let tp0 = cx.object(&keys::tp_key(k, 0));
    match tp0 {
        Ok(o) if o.header.axes.len() == 1 && o.header.axes[0].kind == AxisKind::Tp.code() => {
            let a = o.header.axes[0];
            let d = usize::try_from(a.split_dim)
                .map_err(|_| TensorError::corrupt(format!("{:?} has no split dim", o.key)))?;
            let m = a.shard_count as u32;
            check_members(u64::from(m))?;
            let set = SetSpec {
                split_dim: d,
                count: m,
                global: Some(o.header.global_shape.clone()),
                dtype: Some(o.header.dtype.code()),
                members: (0..m)
                    .map(|t| {
                        let q = Parallelism::from_axes(vec![Axis::tp(t, m, d)]);
                        (keys::shard_key(k, &q), q)
                    })
                    .collect(),
            };
            from_set(cx, &set, None)
        }
        _ => Err(TensorError::not_found(format!(
            "no tensor, writer set or TP set stored under {k:?}"
        ))),
    }
}

fn full(cx: &mut Cx<'_>, req: &ReadRequest, p: &Parallelism) -> TensorResult<ReadPlan> {
    let k = req.key.as_str();
    if p.has_ep_layout() {
        return full_layout(cx, req, p);
    }
    if p.tp().is_some() {
        let set = tp_set(cx, req, p)?;
        return from_set(cx, &set, None);
    }
    // Scope axes only: the object if it is a whole tensor.
    let key = keys::shard_key(k, p);
    let o = cx.object(&key)?;
    if !p.matches(&o.header) {
        return Err(TensorError::not_found(format!(
            "the object at {key:?} does not match the requested parallelism"
        )));
    }
    if o.header.global_shape != o.header.local_shape {
        return Err(TensorError::invalid(format!(
            "the object at {key:?} is a shard of a larger tensor; a full read needs a layout axis"
        )));
    }
    let mut plan = whole(&o);
    plan.output.header = full_header(o.header.dtype, &o.header.global_shape)?;
    Ok(plan)
}

/// Full read of a layout with an EP layout axis: every combination of
/// layout-axis ranks (TP count and split dim from the manifest when present).
fn full_layout(cx: &mut Cx<'_>, req: &ReadRequest, p: &Parallelism) -> TensorResult<ReadPlan> {
    let k = req.key.as_str();
    let mut q = p.clone();
    let mut global = None;
    let mut dtype = None;
    if let Some(tp) = p.tp().copied() {
        if let Some(mf) = cx.manifest(&keys::parallelism_manifest_key(k)) {
            if Some(mf.split_dim) != tp.split_dim {
                return Err(TensorError::invalid(format!(
                    "requested TP split_dim {} differs from the stored split_dim {}",
                    tp.split_dim.unwrap_or(0),
                    mf.split_dim
                )));
            }
            q = q.replace(Axis::tp(0, mf.shard_count, mf.split_dim));
            global = Some(mf.global_shape);
            dtype = Some(mf.dtype);
        }
    }
    let layout: Vec<Axis> = q.axes().iter().copied().filter(Axis::is_layout).collect();
    let total = layout
        .iter()
        .try_fold(1u64, |acc, a| acc.checked_mul(u64::from(a.size)))
        .unwrap_or(u64::MAX);
    check_members(total)?;
    let mut members = Vec::new();
    let mut ranks = vec![0u32; layout.len()];
    for _ in 0..total {
        let mut m = q.clone();
        for (a, &r) in layout.iter().zip(&ranks) {
            m = m.replace(a.at_rank(r));
        }
        members.push((keys::shard_key(k, &m), m));
        for i in (0..ranks.len()).rev() {
            ranks[i] += 1;
            if ranks[i] < layout[i].size {
                break;
            }
            ranks[i] = 0;
        }
    }
    let (objs, dt, g) = load_members(cx, &members, global.as_deref(), dtype)?;
    let target = Region::whole(&g);
    gather(dt, &objs, &target, full_header(dt, &g)?)
}

#[cfg(test)]
mod tests;
