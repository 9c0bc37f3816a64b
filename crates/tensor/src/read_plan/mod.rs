//! Read planning: turns a request and
//! what is known about stored objects into byte ranges
//! `(key, src_offset, dst_offset, len)` that assemble the result directly in
//! its final memory.
//!
//! Planning is a pure function of the request and the *observations* (size,
//! first 304 bytes and locality of each probed key). [`resolve`] either asks
//! for more keys to be probed, or answers with a [`ReadPlan`] or a failure.
//! Every request needs at most two probe rounds: the candidates and
//! manifests (round 1), then, when re-sharding or rebuilding, the members of
//! the sets the round-1 objects describe (round 2). The executor batches
//! each round of a whole batch into one master lookup and one data round, so
//! a batch read costs a constant number of master RPCs whatever its size.
//!
//! The model: every stored object is a box of the global tensor, given by
//! its layout axes (those with a split dim). Scope axes (DP, PP, EP without
//! a split dim) only say which stored set an object belongs to. A shard or
//! full read is a target box; it is assembled from the pieces of the stored
//! boxes of one complete set that intersect it, each piece copied straight
//! into the result. Of the sets that cover the target, the read prefers the
//! one whose scope matches the request's scope axes (DP replica, PP stage),
//! then the one with the fewest pieces, then the one with the most local
//! pieces. An EP axis without split dim names one expert's tensor: only
//! sets of that expert serve it. A read returns
//! exactly the requested box or fails with a reason; only the legacy TP
//! wrappers fall back to a raw stored chunk.

use crate::axis::{Axis, AxisKind, Parallelism, RawAxis};
use crate::dtype::DType;
use crate::error::{TensorError, TensorResult};
use crate::geometry::{copy_rows, narrow, CopyRows, Region};
use crate::header::StoredAxis;
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
        /// Whether a replica lives in this client's own segment.
        local: bool,
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

/// `count` byte ranges of `len` bytes out of source `source`: the `i`-th
/// from `src_offset + i * src_stride` of the object to
/// `dst_offset + i * dst_stride` of the result payload (the rows of one
/// dimension of a box; a single range has `count` 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PlanRange {
    /// Index into [`ReadPlan::sources`].
    pub source: usize,
    /// Offset of the first row in the stored object.
    pub src_offset: u64,
    /// Offset of the first row in the result payload.
    pub dst_offset: u64,
    /// Bytes per row.
    pub len: u64,
    /// Rows (at least 1).
    pub count: u64,
    /// Bytes between rows in the stored object.
    pub src_stride: u64,
    /// Bytes between rows in the result payload.
    pub dst_stride: u64,
}

impl PlanRange {
    /// One contiguous range.
    pub fn single(source: usize, src_offset: u64, dst_offset: u64, len: u64) -> PlanRange {
        PlanRange {
            source,
            src_offset,
            dst_offset,
            len,
            count: 1,
            src_stride: 0,
            dst_stride: 0,
        }
    }

    /// Bytes copied.
    pub fn bytes(&self) -> u64 {
        self.len * self.count
    }

    /// The rows as `(src_offset, dst_offset, len)`.
    pub fn rows(&self) -> impl Iterator<Item = (u64, u64, u64)> + '_ {
        (0..self.count).map(move |i| {
            (
                self.src_offset + i * self.src_stride,
                self.dst_offset + i * self.dst_stride,
                self.len,
            )
        })
    }
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

impl<'a> Obj<'a> {
    /// The object at `key` of `size` bytes, whose header is in `prefix`.
    fn decode(key: &str, size: u64, prefix: &'a [u8]) -> TensorResult<Obj<'a>> {
        Ok(Obj {
            key: key.to_string(),
            size,
            prefix,
            header: TensorHeader::decode(prefix, size)?,
        })
    }
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
            Some(Observed::Found { size, prefix, .. }) => {
                Obj::decode(key, *size, prefix).map_err(|e| e.context(format!("{key:?}")))
            }
        }
    }
}

/// Round-1 keys of a request: every candidate and manifest a read may
/// consult without first reading another object.
fn round1(req: &ReadRequest) -> Vec<String> {
    let k = req.key.as_str();
    match (req.mode, req.parallelism.as_ref()) {
        (ReadMode::AsStored, None) => vec![k.to_string()],
        (ReadMode::AsStored, Some(p)) => vec![keys::shard_key(k, p)],
        (ReadMode::Shard, None) => Vec::new(),
        (_, p) => {
            let mut v = Vec::new();
            if let Some(p) = p {
                v.extend(exact_keys(k, p));
            }
            v.extend([
                k.to_string(),
                keys::parallelism_manifest_key(k),
                keys::writer_manifest_key(k),
                keys::tp_key(k, 0),
            ]);
            v
        }
    }
}

/// The keys whose object, when its header matches the request, is the
/// requested shard as stored: P's canonical key, and for a single TP axis
/// the writer shard of the same rank, count and split dim.
fn exact_keys(k: &str, p: &Parallelism) -> Vec<String> {
    let mut v = vec![keys::shard_key(k, p)];
    if p.is_single_tp() {
        v.push(writer_key(k, &p.axes()[0]));
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
        (_, p) => remap(&mut cx, req, p),
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
            vec![PlanRange::single(0, h.data_offset, 0, h.data_bytes)]
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
    let mut runs: Vec<CopyRows> = Vec::new();
    for o in sources {
        let b = shard_box(&o.header).map_err(|e| e.context(format!("{:?}", o.key)))?;
        runs.clear();
        let n = copy_rows(itemsize, &b, target, &mut runs);
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
            count: r.count,
            src_stride: r.src_stride,
            dst_stride: r.dst_stride,
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

fn check_members(n: u64) -> TensorResult<()> {
    if n > MAX_SET_MEMBERS {
        return Err(TensorError::corrupt(format!(
            "a set of {n} shards is more than the {MAX_SET_MEMBERS} supported"
        )));
    }
    Ok(())
}

/// Most DP replicas of one stored layout a read enumerates (their members
/// are all probed in one round when the preferred one needs probing);
/// beyond it, only the replica the manifest or seed names and the requested one.
const MAX_REPLICAS: u32 = 8;

/// How the members of a stored set are named.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Naming {
    /// Canonical shard keys (`K_tp_r` for a single TP axis).
    Canonical,
    /// Writer-partition keys `K__writer_{r}of{n}_sd{d}`.
    Writer,
}

/// One member of a stored set.
struct Member {
    key: String,
    /// The axes its header must carry (`None`: the object at `K`, any header).
    axes: Option<Parallelism>,
    /// Its box in the global tensor, when known before probing it.
    bx: Option<Region>,
}

/// One stored set that may serve a read: all members together hold the
/// whole global tensor once.
struct StoredSet {
    /// What it is and where it was found, for messages.
    origin: String,
    members: Vec<Member>,
    /// Its scope axes (those without a split dim).
    scope: Vec<Axis>,
    /// The split dim of its TP axis, if it has one.
    tp_split: Option<usize>,
    /// Why the set cannot be enumerated, if it cannot.
    invalid: Option<TensorError>,
}

/// The dtype and global shape one round-1 object states for the tensor.
struct Hint {
    what: String,
    dtype: i32,
    global: Vec<u64>,
}

/// A probed, decodable tensor object at `key` (round-1 keys only; never
/// declares).
fn peek<'a>(cx: &Cx<'a>, key: &str) -> Option<Obj<'a>> {
    match cx.obs.get(key) {
        Some(Observed::Found { size, prefix, .. }) => Obj::decode(key, *size, prefix).ok(),
        _ => None,
    }
}

/// A probed, valid manifest at `key`.
fn peek_manifest(cx: &Cx<'_>, key: &str) -> Option<Manifest> {
    match cx.obs.get(key) {
        Some(Observed::Found { prefix, .. }) => Manifest::decode(prefix).ok(),
        _ => None,
    }
}

/// The axis list a stored shard header names, if it is a valid request
/// whose split dims lie inside the tensor.
fn template_of(h: &TensorHeader) -> Option<Parallelism> {
    if h.layout != Layout::Shard {
        return None;
    }
    let raw = h
        .axes
        .iter()
        .map(|a: &StoredAxis| Axis::from_stored(a).map(|x| RawAxis::from(&x)))
        .collect::<Option<Vec<_>>>()?;
    let p = Parallelism::new(&raw).ok()?;
    p.check_split_dims(h.ndim()).ok()?;
    Some(p)
}

/// A set's axes for messages: scope axes with their rank, layout axes with
/// their count and dim.
fn describe(p: &Parallelism) -> String {
    let parts: Vec<String> = p
        .axes()
        .iter()
        .map(|a| {
            let name = a.kind.name();
            match (a.split_dim, a.kind) {
                (Some(d), _) => format!("{name}={} on dim {d}", a.size),
                (None, AxisKind::Pp) => format!(
                    "{name} rank {} of {} stage {}",
                    a.rank,
                    a.size,
                    a.stage_id.unwrap_or(0)
                ),
                (None, AxisKind::Ep) => format!(
                    "{name} rank {} of {} expert {}",
                    a.rank,
                    a.size,
                    a.expert_id.unwrap_or(0)
                ),
                (None, _) => format!("{name} rank {} of {}", a.rank, a.size),
            }
        })
        .collect();
    format!("[{}]", parts.join(", "))
}

/// Every member of the set `t` describes: one per combination of its
/// layout-axis ranks, its scope axes as given.
fn enumerate(
    k: &str,
    t: &Parallelism,
    naming: Naming,
    global: &[u64],
) -> TensorResult<Vec<Member>> {
    let layout: Vec<Axis> = t.axes().iter().copied().filter(Axis::is_layout).collect();
    let total = layout
        .iter()
        .try_fold(1u64, |acc, a| acc.checked_mul(u64::from(a.size)))
        .unwrap_or(u64::MAX);
    check_members(total)?;
    let mut out = Vec::new();
    let mut ranks = vec![0u32; layout.len()];
    for _ in 0..total {
        let mut m = t.clone();
        for (a, &r) in layout.iter().zip(&ranks) {
            m = m.replace(a.at_rank(r));
        }
        let bx = narrow(global, &m)?;
        let key = match naming {
            Naming::Canonical => keys::shard_key(k, &m),
            Naming::Writer => writer_key(k, &m.axes()[0]),
        };
        out.push(Member {
            key,
            axes: Some(m),
            bx: Some(bx),
        });
        for i in (0..ranks.len()).rev() {
            ranks[i] += 1;
            if ranks[i] < layout[i].size {
                break;
            }
            ranks[i] = 0;
        }
    }
    Ok(out)
}

/// Add the sets the layout `t` describes: one per DP replica when it has a
/// DP axis (replicas hold the same tensor), else one.
fn add_layout(
    sets: &mut Vec<StoredSet>,
    k: &str,
    t: &Parallelism,
    naming: Naming,
    global: &[u64],
    want: Option<&Parallelism>,
    origin: &str,
) {
    let dp = t.axes().iter().find(|a| a.kind == AxisKind::Dp).copied();
    let replicas: Vec<Parallelism> = match dp {
        Some(dp) if dp.size <= MAX_REPLICAS => {
            (0..dp.size).map(|r| t.replace(dp.at_rank(r))).collect()
        }
        Some(dp) => {
            let mut v = vec![t.clone()];
            let asked = want.and_then(|p| p.axes().iter().find(|a| a.kind == AxisKind::Dp));
            if let Some(a) = asked.filter(|a| a.size == dp.size && a.rank != dp.rank) {
                v.push(t.replace(dp.at_rank(a.rank)));
            }
            v
        }
        None => vec![t.clone()],
    };
    for r in replicas {
        let what = format!("the set {} ({origin})", describe(&r));
        let (members, invalid) = match enumerate(k, &r, naming, global) {
            Ok(m) => (m, None),
            Err(e) => (Vec::new(), Some(e)),
        };
        let same = |s: &StoredSet| {
            s.members.len() == members.len()
                && s.members.iter().zip(&members).all(|(a, b)| a.key == b.key)
        };
        if invalid.is_none() && sets.iter().any(same) {
            continue;
        }
        sets.push(StoredSet {
            origin: what,
            members,
            scope: r
                .axes()
                .iter()
                .copied()
                .filter(|a| !a.is_layout())
                .collect(),
            tp_split: r.tp().and_then(|a| a.split_dim),
            invalid,
        });
    }
}

/// The stored sets of `K` that round 1 reveals, in discovery order, and what
/// each round-1 object states about the tensor's dtype and global shape.
fn discover(
    cx: &Cx<'_>,
    req: &ReadRequest,
    p: Option<&Parallelism>,
) -> (Vec<StoredSet>, Vec<Hint>) {
    let k = req.key.as_str();
    let mut sets = Vec::new();
    let mut hints = Vec::new();
    let hint = |hints: &mut Vec<Hint>, what: &str, dtype: i32, global: &[u64]| {
        hints.push(Hint {
            what: what.to_string(),
            dtype,
            global: global.to_vec(),
        })
    };
    if let Some(o) = peek(cx, k) {
        hint(&mut hints, k, o.header.dtype.code(), &o.header.global_shape);
        sets.push(StoredSet {
            origin: format!("the object at {k:?}"),
            members: vec![Member {
                key: k.to_string(),
                axes: None,
                bx: shard_box(&o.header).ok(),
            }],
            scope: Vec::new(),
            tp_split: None,
            invalid: None,
        });
    }
    let pm = keys::parallelism_manifest_key(k);
    if let Some(mf) = peek_manifest(cx, &pm) {
        hint(&mut hints, &pm, mf.dtype, &mf.global_shape);
        let g = &mf.global_shape;
        match &mf.layout {
            Some(t) => add_layout(&mut sets, k, t, Naming::Canonical, g, p, &pm),
            None => {
                // The 96-byte form names a TP set: alone (`K_tp_r`), or
                // within the scope of a multi-axis request.
                let tp = Axis::tp(0, mf.shard_count, mf.split_dim);
                let single = Parallelism::from_axes(vec![tp]);
                add_layout(&mut sets, k, &single, Naming::Canonical, g, p, &pm);
                if let Some(p) = p.filter(|p| p.tp().is_some() && !p.is_single_tp()) {
                    add_layout(
                        &mut sets,
                        k,
                        &p.replace(tp),
                        Naming::Canonical,
                        g,
                        p.into(),
                        &pm,
                    );
                }
            }
        }
    }
    let wm = keys::writer_manifest_key(k);
    if let Some(mf) = peek_manifest(cx, &wm) {
        hint(&mut hints, &wm, mf.dtype, &mf.global_shape);
        let t = Parallelism::from_axes(vec![Axis::tp(0, mf.shard_count, mf.split_dim)]);
        add_layout(&mut sets, k, &t, Naming::Writer, &mf.global_shape, p, &wm);
    }
    let mut seeds = vec![keys::tp_key(k, 0)];
    if let Some(p) = p {
        seeds.push(keys::shard_key(k, p));
    }
    for key in seeds {
        let Some(o) = peek(cx, &key) else { continue };
        let Some(t) = template_of(&o.header) else {
            continue;
        };
        if key == keys::tp_key(k, 0) && !t.is_single_tp() {
            continue;
        }
        hint(
            &mut hints,
            &key,
            o.header.dtype.code(),
            &o.header.global_shape,
        );
        let origin = format!("named by {key:?}");
        add_layout(
            &mut sets,
            k,
            &t,
            Naming::Canonical,
            &o.header.global_shape,
            p,
            &origin,
        );
    }
    (sets, hints)
}

/// Why a set may not serve a request with scope axes `want`: an EP axis
/// without split dim names one expert's tensor, so a set of another expert
/// holds another tensor. (DP replicas and pipeline stages hold the same
/// tensor; they only rank the sets.)
fn excluded(want: &[Axis], have: &[Axis]) -> Option<String> {
    for w in want.iter().filter(|w| w.kind == AxisKind::Ep) {
        for h in have.iter().filter(|h| h.kind == AxisKind::Ep) {
            if w.expert_id != h.expert_id {
                return Some(format!(
                    "it holds expert {}, not {}",
                    h.expert_id.unwrap_or(0),
                    w.expert_id.unwrap_or(0)
                ));
            }
        }
    }
    None
}

/// How many of the requested scope axes a set holds at another rank or
/// stage.
fn scope_mismatch(want: &[Axis], have: &[Axis]) -> usize {
    want.iter()
        .filter(|w| {
            have.iter().any(|h| {
                h.kind == w.kind && (h.rank, h.size, h.stage_id) != (w.rank, w.size, w.stage_id)
            })
        })
        .count()
}

/// A set ranked for a target: its members whose box meets the target.
struct Ranked<'s> {
    set: &'s StoredSet,
    mismatch: usize,
    needed: Vec<&'s Member>,
}

/// What the observations say about a ranked set.
enum Eval<'a> {
    /// Some needed member has not been probed.
    Unobserved,
    /// It cannot serve the target, because of this.
    Incomplete(String),
    /// Every needed member is present and consistent.
    Complete { objs: Vec<Obj<'a>>, local: usize },
}

fn evaluate<'a>(
    obs: &'a Observations,
    r: &Ranked<'_>,
    dtype: DType,
    global: &[u64],
    target: &Region,
) -> Eval<'a> {
    let mut objs = Vec::with_capacity(r.needed.len());
    let mut missing = Vec::new();
    let mut local = 0;
    let mut covered = 0u64;
    for m in &r.needed {
        let (size, prefix, is_local) = match obs.get(&m.key) {
            None => return Eval::Unobserved,
            Some(Observed::Missing(e)) if e.code == ErrorCode::ObjectNotFound => {
                missing.push(format!("{:?}", m.key));
                continue;
            }
            Some(Observed::Missing(e)) => {
                missing.push(format!("{:?} ({})", m.key, e.reason));
                continue;
            }
            Some(Observed::Found {
                size,
                prefix,
                local,
            }) => (*size, prefix, *local),
        };
        let header = match TensorHeader::decode(prefix, size) {
            Ok(h) => h,
            Err(e) => return Eval::Incomplete(format!("{:?}: {}", m.key, e.reason)),
        };
        if let Some(ax) = &m.axes {
            if !ax.matches(&header) {
                return Eval::Incomplete(format!(
                    "{:?} does not carry the axes {}",
                    m.key,
                    describe(ax)
                ));
            }
        }
        if header.dtype != dtype {
            return Eval::Incomplete(format!(
                "{:?} has dtype {} but the tensor is {}",
                m.key,
                header.dtype.torch_name(),
                dtype.torch_name()
            ));
        }
        if header.global_shape != global {
            return Eval::Incomplete(format!(
                "{:?} has global shape {:?}, not {:?}",
                m.key, header.global_shape, global
            ));
        }
        let hb = match shard_box(&header) {
            Ok(b) => b,
            Err(e) => return Eval::Incomplete(format!("{:?}: {}", m.key, e.reason)),
        };
        if m.bx.as_ref().is_some_and(|b| *b != hb) {
            return Eval::Incomplete(format!("{:?} does not hold the box its axes name", m.key));
        }
        covered += hb.intersect(target).map_or(0, |x| x.volume());
        local += usize::from(is_local);
        objs.push(Obj {
            key: m.key.clone(),
            size,
            prefix,
            header,
        });
    }
    if !missing.is_empty() {
        let n = missing.len();
        let mut list = missing.into_iter().take(4).collect::<Vec<_>>().join(", ");
        if n > 4 {
            list.push_str(&format!(" and {} more", n - 4));
        }
        return Eval::Incomplete(format!("missing {list}"));
    }
    if covered != target.volume() {
        return Eval::Incomplete("its shards do not cover the target".into());
    }
    Eval::Complete { objs, local }
}

/// Shard and full reads: the exact stored shard when it exists, else the
/// target box assembled from the best complete stored set.
fn remap(cx: &mut Cx<'_>, req: &ReadRequest, p: Option<&Parallelism>) -> TensorResult<ReadPlan> {
    let k = req.key.as_str();
    let adv = req.advisory_split_dim;
    if let (ReadMode::Shard, Some(p)) = (req.mode, p) {
        for key in exact_keys(k, p) {
            if let Some(o) = peek(cx, &key) {
                if p.matches_with(&o.header, adv) {
                    return Ok(whole(&o));
                }
            }
        }
    }
    let (sets, hints) = discover(cx, req, p);
    match plan_sets(cx, req, p, &sets, &hints) {
        Err(e) if !cx.pending() && adv => {
            // The legacy TP wrappers' last resort: the raw stored chunk.
            match p.filter(|p| p.is_single_tp()) {
                Some(p) => match peek(cx, &keys::shard_key(k, p)) {
                    Some(o) => Ok(whole(&o)),
                    None => Err(e),
                },
                None => Err(e),
            }
        }
        other => other,
    }
}

fn plan_sets(
    cx: &mut Cx<'_>,
    req: &ReadRequest,
    p: Option<&Parallelism>,
    sets: &[StoredSet],
    hints: &[Hint],
) -> TensorResult<ReadPlan> {
    let k = req.key.as_str();
    let Some(first) = hints.first() else {
        return Err(TensorError::not_found(format!(
            "nothing is stored under {k:?}: no tensor at {k:?}, no {:?}, no {:?}, no {:?}{}",
            keys::parallelism_manifest_key(k),
            keys::writer_manifest_key(k),
            keys::tp_key(k, 0),
            p.map(|p| format!(", no {:?}", keys::shard_key(k, p)))
                .unwrap_or_default()
        )));
    };
    for h in &hints[1..] {
        if h.global != first.global {
            return Err(TensorError::corrupt(format!(
                "the stored sets of {k:?} disagree on the global shape: {:?} per {:?}, {:?} per {:?}",
                first.global, first.what, h.global, h.what
            )));
        }
        if h.dtype != first.dtype {
            return Err(TensorError::corrupt(format!(
                "the stored sets of {k:?} disagree on the dtype: code {} per {:?}, {} per {:?}",
                first.dtype, first.what, h.dtype, h.what
            )));
        }
    }
    let dtype = DType::from_code(first.dtype).ok_or_else(|| {
        TensorError::corrupt(format!(
            "{:?} names an unknown dtype code {}",
            first.what, first.dtype
        ))
    })?;
    let global = first.global.clone();
    let (target, header, what) = match (req.mode, p) {
        (ReadMode::Shard, Some(p)) => {
            let mut q = p.clone();
            if req.advisory_split_dim {
                // Legacy TP wrappers: the stored TP split dim wins.
                if let (Some(tp), Some(d)) = (p.tp().copied(), sets.iter().find_map(|s| s.tp_split))
                {
                    q = q.replace(Axis {
                        split_dim: Some(d),
                        ..tp
                    });
                }
            }
            let bx = q
                .check_split_dims(global.len())
                .and_then(|()| narrow(&global, &q))
                .map_err(|e| {
                    e.context(format!(
                        "the shard {} of {k:?} (global shape {global:?})",
                        describe(&q)
                    ))
                })?;
            let header = shard_header(dtype, &global, &bx.extent, &q)?;
            (bx, header, format!("shard {}", describe(&q)))
        }
        _ => (
            Region::whole(&global),
            full_header(dtype, &global)?,
            "full tensor".to_string(),
        ),
    };
    let want: Vec<Axis> = p
        .map(|p| {
            p.axes()
                .iter()
                .copied()
                .filter(|a| !a.is_layout())
                .collect()
        })
        .unwrap_or_default();
    let mut reasons: Vec<String> = Vec::new();
    let mut ranked: Vec<Ranked<'_>> = Vec::new();
    for s in sets {
        if let Some(e) = &s.invalid {
            reasons.push(format!("{}: {}", s.origin, e.reason));
            continue;
        }
        if let Some(why) = excluded(&want, &s.scope) {
            reasons.push(format!("{}: {why}", s.origin));
            continue;
        }
        let needed = s
            .members
            .iter()
            .filter(|m| m.bx.as_ref().is_none_or(|b| b.intersect(&target).is_some()))
            .collect();
        ranked.push(Ranked {
            set: s,
            mismatch: scope_mismatch(&want, &s.scope),
            needed,
        });
    }
    ranked.sort_by_key(|r| (r.mismatch, r.needed.len()));
    let mut i = 0;
    while i < ranked.len() {
        let rank = (ranked[i].mismatch, ranked[i].needed.len());
        let end = ranked[i..]
            .iter()
            .position(|r| (r.mismatch, r.needed.len()) != rank)
            .map_or(ranked.len(), |n| i + n);
        let mut unobserved = false;
        let mut best: Option<(usize, Vec<Obj<'_>>)> = None;
        for r in &ranked[i..end] {
            match evaluate(cx.obs, r, dtype, &global, &target) {
                Eval::Unobserved => unobserved = true,
                Eval::Incomplete(why) => reasons.push(format!("{}: {why}", r.set.origin)),
                Eval::Complete { objs, local } => {
                    if best.as_ref().is_none_or(|b| local > b.0) {
                        best = Some((local, objs));
                    }
                }
            }
        }
        if unobserved {
            // Probe this rank's sets and every fallback in one round.
            for r in &ranked[i..] {
                for m in &r.needed {
                    cx.declare(&m.key);
                }
            }
            return Err(TensorError::not_found("set members are not probed yet"));
        }
        if let Some((_, objs)) = best {
            return gather(dtype, &objs, &target, header);
        }
        i = end;
    }
    Err(TensorError::not_found(format!(
        "no complete stored set of {k:?} covers the {what}: {}",
        if reasons.is_empty() {
            "no stored set found".to_string()
        } else {
            reasons.join("; ")
        }
    )))
}

#[cfg(test)]
mod tests;
