//! Tensor IO executor: runs the plans of `mooncake-tensor` against the store,
//! with a number of master RPCs and data rounds per batch that does not grow
//! with the batch's length.
//!
//! * Writes: every object of a whole batch (shards and manifests of every
//!   item) goes in **one** PutStart, is gathered straight from the caller's
//!   memory (strided runs, no staging copy), and is committed with **one**
//!   PutEnd (plus one PutRevoke only when something failed). Results are as
//!   if each item's shards were written before its manifest: a manifest is
//!   committed only when its item's shards succeeded.
//! * Reads: at most two probe rounds for a whole batch (one GetReplicaList
//!   and one batched data round each, reading the first 304 bytes of every
//!   candidate), then the planned ranges are read straight into the result
//!   memory, one scatter request per owner segment, owners in parallel. A
//!   third master RPC refreshes leases only when they are about to run out.
//!
//! Both lower onto the store's batched data paths: reads onto
//! `Client::read_ranges` (`ranges`, the path `get_into_ranges` uses), writes
//! onto `Client::write_located` (`writes`).
//!
//! The Python front converts arguments into [`TensorWrite`] /
//! [`ReadRequest`] values and allocates result tensors; every rule lives in
//! `mooncake-tensor` or here.

use crate::client::Client;
use crate::config::{ReplicateConfig, WriteKind};
use crate::error::{Error, Result};
use crate::ops::ranges::RangeOp;
use crate::ops::reads::Lookup;
use crate::ops::writes::Pieces;
use mooncake_common::proto::{MasterRequest, MasterResponse, ObjectInfo, PutStartItem, ReplicaLoc};
use mooncake_common::ErrorCode;
use mooncake_tensor::{
    plan_write, resolve, Observations, Observed, ReadOutput, ReadPlan, ReadRequest, Step,
    TensorError, WritePlan, WriteRoute, WriteSource, HEADER_SIZE, PROBE_PREFIX,
};
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Fresh result allocations at least this large are advised to use
/// transparent huge pages before they are filled.
const HUGE_ADVICE_MIN: u64 = 4 << 20;
const HUGE_PAGE: usize = 2 << 20;

/// Ask the kernel to back the 2 MiB-aligned interior of a fresh result
/// allocation with transparent huge pages (`MADV_HUGEPAGE`): filling a
/// never-touched tensor then costs one page fault per 2 MiB instead of one
/// per 4 KiB, which dominates copies into new memory. Advice only: the
/// contents and ownership of the memory are unchanged, and failures (THP
/// disabled, not anonymous memory) are ignored.
fn advise_huge_pages(ptr: usize, len: u64) {
    if len < HUGE_ADVICE_MIN {
        return;
    }
    let start = ptr.next_multiple_of(HUGE_PAGE);
    let end = (ptr + len as usize) / HUGE_PAGE * HUGE_PAGE;
    if end > start {
        // SAFETY: madvise with MADV_HUGEPAGE only changes how the kernel backs
        // pages of this range, which lies inside the caller's allocation; it
        // never alters or frees their contents.
        unsafe {
            libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE);
        }
    }
}

impl From<TensorError> for Error {
    /// A tensor rule's failure keeps its code and reason.
    fn from(e: TensorError) -> Self {
        Error::new(e.code, e.reason)
    }
}

/// How a tensor write treats a key that exists and the replication config:
/// upstream's `put_*`, `upsert_*`, `pub_*` and `upsert_pub_*` families.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum WriteMode {
    /// A key that exists is left as it is (the item reports success).
    Put,
    /// A key that exists is replaced by a new version.
    Upsert,
    /// As `Put`, and every item's replication config is checked as a
    /// publication's (not only FULL ones).
    Pub,
    /// `Upsert` with `Pub`'s config check.
    UpsertPub,
}

impl WriteMode {
    /// Whether an existing key is replaced.
    pub fn upserts(self) -> bool {
        matches!(self, WriteMode::Upsert | WriteMode::UpsertPub)
    }

    /// Whether every item's config is checked as a publication's.
    pub fn publishes(self) -> bool {
        matches!(self, WriteMode::Pub | WriteMode::UpsertPub)
    }
}

/// One tensor write: the source bytes at `ptr` (a tensor's `data_ptr()`, or
/// the start of a `_from` buffer) laid out along `route`.
#[derive(Debug, Clone)]
pub struct TensorWrite {
    /// Base key `K`.
    pub key: String,
    /// Element type, shape, and where the payload starts relative to `ptr`.
    pub source: WriteSource,
    /// Address of byte 0 of the caller's buffer.
    pub ptr: usize,
    /// How the source is laid out into objects.
    pub route: WriteRoute,
}

/// Where a read result goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TensorDest {
    /// A fresh allocation of exactly the output's `nbytes` at this address.
    Payload(usize),
    /// A caller buffer of `size` bytes: the header goes at `ptr`, the
    /// payload at `ptr + 304` (`_into` reads).
    Into {
        /// Buffer start.
        ptr: usize,
        /// Buffer size.
        size: u64,
    },
}

/// The tensor object held in a caller buffer (`_from` writes): validates
/// that `ptr..ptr+size` holds exactly one valid object (`put_tensor_from`:
/// ptr 0, `size < 304` or an invalid header is -600).
///
/// # Safety
/// When `ptr` is non-zero, `ptr..ptr+min(size, 304)` must be readable.
pub unsafe fn object_source(ptr: usize, size: u64) -> Result<WriteSource> {
    if ptr == 0 {
        return Err(Error::invalid("buffer_ptr is null"));
    }
    let n = usize::try_from(size.min(HEADER_SIZE as u64)).unwrap_or(HEADER_SIZE);
    // SAFETY: the caller vouches for the first min(size, 304) bytes.
    let prefix = unsafe { std::slice::from_raw_parts(ptr as *const u8, n) };
    Ok(WriteSource::from_object(prefix, size).map(|(src, _)| src)?)
}

/// The pub check: a non-empty `preferred_segments` must name one
/// segment per replica (`pub_tensor*`, and the FULL route of the unified writes).
pub fn check_pub_config(cfg: &ReplicateConfig) -> Result<()> {
    let n = cfg.preferred_segments.len() as u64;
    if n != 0 && n != cfg.replica_num {
        return Err(Error::invalid(format!(
            "preferred_segments names {n} segments but replica_num is {}",
            cfg.replica_num
        )));
    }
    Ok(())
}

/// Argument rule of `batch_get_tensor_into` (an upstream quirk kept):
/// list lengths differ or a pointer is null -> every item fails with -600.
pub fn check_into_lists(keys: usize, ptrs: &[usize], sizes: usize) -> Result<()> {
    if keys != ptrs.len() || keys != sizes {
        return Err(Error::invalid(format!(
            "keys ({keys}), buffer_ptrs ({}) and sizes ({sizes}) differ in length",
            ptrs.len()
        )));
    }
    if ptrs.contains(&0) {
        return Err(Error::invalid("a buffer_ptr is null"));
    }
    Ok(())
}

/// `get_tensor_into_cuda` / `batch_get_tensor_into_cuda` (CUDA IPC reads
/// straight into GPU tensors of a dummy client): they need a CUDA device,
/// which this build does not drive, so every item fails with
/// INVALID_PARAMS, upstream's code for a destination it cannot read into
/// (and for lists of different lengths).
pub fn cuda_tensor_reads(keys: usize, tensors: usize) -> Vec<Result<u64>> {
    let e = if keys != tensors {
        Error::invalid(format!("{keys} keys but {tensors} tensors"))
    } else {
        Error::invalid(
            "CUDA IPC tensor reads need CUDA tensors and a CUDA device; this build has no CUDA support",
        )
    };
    vec![Err(e); keys]
}

/// One write object after deduplication by key.
struct WriteObj {
    key: String,
    pieces: Pieces,
    manifest: bool,
}

/// Outcome of one object's PutStart + replica writes.
#[derive(Clone, Copy)]
enum Written {
    Ok,
    Existing,
    Failed(ErrorCode, bool),
}

impl Written {
    fn ok(self) -> bool {
        matches!(self, Written::Ok | Written::Existing)
    }
}

impl Client {
    /// Write a batch of tensors (plain, TP and unified writes): plan every
    /// item, then one PutStart for all their objects, the gathers, and one
    /// PutEnd. Items that failed conversion or planning keep their error and
    /// write nothing.
    ///
    /// # Safety
    /// For every item, the runs its plan reads from `ptr` (the source's
    /// payload, or the whole object for a verbatim write) must be readable
    /// for the duration of the call.
    pub unsafe fn write_tensors(
        &self,
        items: Vec<Result<TensorWrite>>,
        cfg: &ReplicateConfig,
        mode: WriteMode,
    ) -> Result<Vec<Result<()>>> {
        let (upsert, pub_always) = (mode.upserts(), mode.publishes());
        let n = items.len();
        let item_keys: Vec<&str> = items
            .iter()
            .map(|i| i.as_ref().map_or("", |t| t.key.as_str()))
            .collect();
        let mut wcfg = cfg.write_config(WriteKind::Tensor, &item_keys)?;
        let pub_check = check_pub_config(cfg);
        let mut out: Vec<Result<()>> = vec![Ok(()); n];
        // Plans own the header/manifest bytes the pieces point into; keep them alive.
        let mut plans: Vec<Option<(WritePlan, usize)>> = Vec::with_capacity(n);
        for (i, it) in items.into_iter().enumerate() {
            let planned = it.and_then(|w| {
                let full = matches!(w.route, WriteRoute::Full | WriteRoute::Verbatim { .. });
                if pub_always || full {
                    pub_check.clone()?;
                }
                Ok((plan_write(&w.key, &w.source, &w.route)?, w.ptr))
            });
            match planned {
                Ok(x) => plans.push(Some(x)),
                Err(e) => {
                    out[i] = Err(e);
                    plans.push(None);
                }
            }
        }
        let mut objs: Vec<WriteObj> = Vec::new();
        let mut by_key: HashMap<String, usize> = HashMap::new();
        let mut item_objs: Vec<Vec<usize>> = vec![Vec::new(); n];
        for (i, p) in plans.iter().enumerate() {
            let Some((plan, ptr)) = p else { continue };
            for o in &plan.objects {
                if let Some(&j) = by_key.get(&o.key) {
                    // The same key twice in one batch: the first wins (put_batch rule).
                    item_objs[i].push(j);
                    continue;
                }
                let mut pieces: Pieces = Vec::with_capacity(1 + o.runs.len());
                if !o.inline.is_empty() {
                    pieces.push((o.inline.as_ptr() as usize, o.inline.len() as u64));
                }
                pieces.extend(o.runs.iter().map(|&(off, len)| (ptr + off as usize, len)));
                by_key.insert(o.key.clone(), objs.len());
                item_objs[i].push(objs.len());
                objs.push(WriteObj {
                    key: o.key.clone(),
                    pieces,
                    manifest: o.is_manifest,
                });
            }
        }
        if objs.is_empty() {
            return Ok(out);
        }
        if upsert {
            self.bump_mutations();
        }
        let keys: Vec<String> = objs.iter().map(|o| o.key.clone()).collect();
        let sizes: Vec<u64> = objs
            .iter()
            .map(|o| o.pieces.iter().map(|p| p.1).sum())
            .collect();
        self.describe_writer(&mut wcfg);
        if cfg.prefer_alloc_in_same_node {
            // A placement hint for tensor writes: this client's own segment first.
            wcfg.writer_segment = Some(self.desc.name.clone());
        }
        let started = match self.rpc(MasterRequest::PutStart {
            keys: keys.clone(),
            sizes,
            config: wcfg,
            upsert,
            exclude: Vec::new(),
        }) {
            Ok(MasterResponse::PutStart(v)) if v.len() == keys.len() => v,
            Ok(MasterResponse::Err(e)) | Err(e) => {
                return Ok(fail_planned(
                    out,
                    &item_objs,
                    Error::from(e).context("PutStart"),
                ));
            }
            Ok(_) => {
                let e = Error::internal("unexpected PutStart answer");
                return Ok(fail_planned(out, &item_objs, e));
            }
        };
        let mut status: Vec<Written> = Vec::with_capacity(objs.len());
        let mut jobs: Vec<(usize, Vec<ReplicaLoc>)> = Vec::new();
        let mut versions: Vec<u64> = vec![0; objs.len()];
        for (j, s) in started.into_iter().enumerate() {
            status.push(match s {
                PutStartItem::AlreadyExists => Written::Existing,
                PutStartItem::Err(e) => Written::Failed(e, false),
                PutStartItem::Write { replicas, version } => {
                    versions[j] = version;
                    jobs.push((j, replicas));
                    Written::Ok
                }
            });
        }
        if upsert {
            // An in-place rewrite of an unread key's own replica: its ledger
            // entry goes first.
            for (_, locs) in &jobs {
                crate::durability::ledger::vacate_own(locs);
            }
        }
        let located: Vec<(&Pieces, u64, &[ReplicaLoc])> = jobs
            .iter()
            .map(|(j, locs)| (&objs[*j].pieces, 0, locs.as_slice()))
            .collect();
        // SAFETY: the pieces point into the caller's buffers (vouched for by
        // the caller) and into `plans`, alive until we return.
        let written = unsafe { self.write_located(&located) };
        for ((j, _), r) in jobs.iter().zip(written) {
            if let Err((e, _)) = r {
                tracing::warn!(key = %objs[*j].key, error = %e, "tensor object write failed; revoking");
                status[*j] = Written::Failed(ErrorCode::TransferFail, true);
            }
        }
        // A manifest commits when some item using it has all its shards written.
        let shards_ok: Vec<bool> = item_objs
            .iter()
            .map(|objs_i| {
                objs_i
                    .iter()
                    .filter(|&&j| !objs[j].manifest)
                    .all(|&j| status[j].ok())
            })
            .collect();
        let mut manifest_wanted = vec![false; objs.len()];
        for (i, objs_i) in item_objs.iter().enumerate() {
            if plans[i].is_some() && shards_ok[i] {
                for &j in objs_i {
                    manifest_wanted[j] = true;
                }
            }
        }
        let (mut commit, mut commit_versions) = (Vec::new(), Vec::new());
        let (mut revoke, mut revoke_versions) = (Vec::new(), Vec::new());
        for (j, o) in objs.iter().enumerate() {
            match status[j] {
                Written::Ok if !o.manifest || manifest_wanted[j] => {
                    commit.push(o.key.clone());
                    commit_versions.push(versions[j]);
                }
                Written::Ok | Written::Failed(_, true) => {
                    revoke.push(o.key.clone());
                    revoke_versions.push(versions[j]);
                }
                _ => {}
            }
        }
        let mut final_status = status.clone();
        if !revoke.is_empty() {
            let _ = self.rpc(MasterRequest::PutRevoke {
                keys: revoke,
                versions: revoke_versions,
            });
        }
        if !commit.is_empty() {
            let end = match self.rpc(MasterRequest::PutEnd {
                keys: commit,
                versions: commit_versions,
            }) {
                Ok(MasterResponse::Ok) => Ok(()),
                Ok(MasterResponse::Err(e)) | Err(e) => Err(e),
                Ok(_) => Ok(()),
            };
            if let Err(e) = end {
                for s in final_status.iter_mut() {
                    if matches!(s, Written::Ok) {
                        *s = Written::Failed(e, false);
                    }
                }
            }
        }
        for (i, objs_i) in item_objs.iter().enumerate() {
            if plans[i].is_none() {
                continue;
            }
            // Shards first (upstream order), then the manifest.
            let first_bad = objs_i
                .iter()
                .filter(|&&j| !objs[j].manifest)
                .chain(objs_i.iter().filter(|&&j| objs[j].manifest))
                .find_map(|&j| match final_status[j] {
                    Written::Failed(e, _) => Some((j, e)),
                    _ => None,
                });
            if let Some((j, e)) = first_bad {
                out[i] = Err(Error::new(e, format!("writing {:?} failed", objs[j].key)));
            }
        }
        Ok(out)
    }
}

fn fail_planned(mut out: Vec<Result<()>>, item_objs: &[Vec<usize>], e: Error) -> Vec<Result<()>> {
    for (o, objs) in out.iter_mut().zip(item_objs) {
        if o.is_ok() && !objs.is_empty() {
            *o = Err(e.clone());
        }
    }
    out
}

/// One lookup RPC's lease.
struct LeaseRec {
    deadline: Instant,
    ttl: Duration,
    ticket: u64,
    reported: bool,
}

/// A probed object: its replicas and which lookup granted its lease.
struct Located {
    info: ObjectInfo,
    lease: usize,
}

/// Planned reads of a batch, between probing and copying: the output
/// description of every item (so the caller can allocate) and the replica
/// locations found while probing. Dropping it without [`TensorReads::execute`]
/// releases the read leases.
pub(crate) struct TensorReads<'c> {
    client: &'c Client,
    items: Vec<Result<Box<ReadPlan>>>,
    located: HashMap<String, Located>,
    leases: Vec<LeaseRec>,
}

impl Client {
    /// A batch of tensor reads: planned, then `alloc` gives a destination
    /// per planned output (`None`: that item fails), then read.
    ///
    /// # Safety
    /// Every destination `alloc` returns must be writable for its size (a
    /// payload's `nbytes`, an `_into` buffer's `size`) for the call.
    pub unsafe fn read_tensors<A>(
        &self,
        reqs: Vec<Result<ReadRequest>>,
        alloc: A,
    ) -> Vec<Result<ReadOutput>>
    where
        A: FnOnce(&[Result<ReadOutput>]) -> Vec<Option<TensorDest>>,
    {
        let reads = self.plan_tensor_reads(reqs);
        let outs: Vec<Result<ReadOutput>> =
            (0..reads.len()).map(|i| reads.output(i).cloned()).collect();
        let mut dests = alloc(&outs);
        dests.resize(outs.len(), None);
        // SAFETY: the caller vouches for the destinations.
        unsafe { reads.execute(&dests) }
    }

    /// Resolve a batch of reads: up to two probe rounds, each one
    /// GetReplicaList for the whole batch plus one data round reading the
    /// first 304 bytes of every candidate.
    pub(crate) fn plan_tensor_reads(&self, reqs: Vec<Result<ReadRequest>>) -> TensorReads<'_> {
        let mut reads = TensorReads {
            client: self,
            items: Vec::with_capacity(reqs.len()),
            located: HashMap::new(),
            leases: Vec::new(),
        };
        let mut obs = Observations::new();
        let mut pending: Vec<usize> = Vec::new();
        let reqs: Vec<Option<ReadRequest>> = reqs
            .into_iter()
            .enumerate()
            .map(|(i, r)| match r {
                Ok(r) => {
                    pending.push(i);
                    reads
                        .items
                        .push(Err(Error::new(ErrorCode::InternalError, "not planned")));
                    Some(r)
                }
                Err(e) => {
                    reads.items.push(Err(e));
                    None
                }
            })
            .collect();
        for round in 0..=2 {
            let mut need: Vec<String> = Vec::new();
            let mut still = Vec::new();
            for &i in &pending {
                let Some(req) = &reqs[i] else { continue };
                match resolve(req, &obs) {
                    Step::Probe(keys) => {
                        for k in keys {
                            if !need.contains(&k) {
                                need.push(k);
                            }
                        }
                        still.push(i);
                    }
                    Step::Read(plan) => reads.items[i] = Ok(plan),
                    Step::Fail(e) => reads.items[i] = Err(e.into()),
                }
            }
            pending = still;
            if need.is_empty() {
                break;
            }
            if round == 2 {
                for &i in &pending {
                    reads.items[i] = Err(Error::new(
                        ErrorCode::InternalError,
                        "the read planner asked for a third probe round",
                    ));
                }
                break;
            }
            self.probe(&need, &mut obs, &mut reads);
        }
        reads
    }

    /// One lookup + one prefix data round for `keys`.
    fn probe(&self, keys: &[String], obs: &mut Observations, reads: &mut TensorReads<'_>) {
        let (lk, lease) = reads.lookup(keys);
        let mut bufs: Vec<Vec<u8>> = Vec::with_capacity(keys.len());
        let mut infos: Vec<&ObjectInfo> = Vec::new();
        let mut ops: Vec<RangeOp> = Vec::new();
        let mut op_key: Vec<usize> = Vec::new();
        for (i, info) in lk.infos.iter().enumerate() {
            let want = match info {
                Ok(x) => x.size.min(PROBE_PREFIX as u64) as usize,
                Err(_) => 0,
            };
            bufs.push(vec![0u8; want]);
            if let Ok(x) = info {
                if want > 0 {
                    ops.push(RangeOp {
                        key: infos.len(),
                        src: 0,
                        dst: bufs[i].as_mut_ptr() as usize,
                        len: want as u64,
                        ..RangeOp::ONE_ROW
                    });
                    op_key.push(i);
                }
                infos.push(x);
            }
        }
        // SAFETY: every destination is a live Vec of exactly `len` bytes.
        let errs = unsafe { self.read_ranges(&infos, &ops) };
        let mut failed = vec![None; keys.len()];
        for (e, &i) in errs.iter().zip(&op_key) {
            if let Some(e) = e {
                failed[i] = Some(e.clone());
            }
        }
        for (i, (key, info)) in keys.iter().zip(lk.infos).enumerate() {
            let o = match (info, failed[i].take()) {
                (Err(e), _) => {
                    Observed::Missing(TensorError::store(e.code(), e.reason().to_string()))
                }
                (Ok(_), Some(e)) => Observed::Missing(TensorError::store(
                    e.code(),
                    format!("reading the header failed: {}", e.reason()),
                )),
                (Ok(info), None) => {
                    let local = info.replicas.iter().any(|r| {
                        *r.segment_name == *self.desc.name || *r.host_id == *self.desc.host_id
                    });
                    let o = Observed::Found {
                        size: info.size,
                        prefix: std::mem::take(&mut bufs[i]),
                        local,
                    };
                    reads.located.insert(key.clone(), Located { info, lease });
                    o
                }
            };
            obs.insert(key.clone(), o);
        }
    }
}

impl TensorReads<'_> {
    /// One tracked lookup of `keys` (one RPC), its lease recorded: the
    /// lookup and its lease's index in `leases`.
    fn lookup(&mut self, keys: &[String]) -> (Lookup, usize) {
        let t0 = Instant::now();
        let lk = self.client.lookup(keys, true);
        let lease = self.leases.len();
        self.leases.push(LeaseRec {
            deadline: lk.deadline,
            ttl: lk.deadline.saturating_duration_since(t0),
            ticket: lk.ticket,
            reported: false,
        });
        (lk, lease)
    }

    /// Number of items.
    pub(crate) fn len(&self) -> usize {
        self.items.len()
    }

    /// What item `i` will produce, or why it fails.
    pub(crate) fn output(&self, i: usize) -> Result<&ReadOutput> {
        match self.items.get(i) {
            Some(Ok(plan)) => Ok(&plan.output),
            Some(Err(e)) => Err(e.clone()),
            None => Err(Error::invalid("no such item")),
        }
    }

    /// Copy every planned item into its destination (`None`: skip the item,
    /// which then reports INVALID_PARAMS). An `Into` destination gets the
    /// output header at its start and must hold `304 + nbytes` bytes, else
    /// the item fails without touching it.
    ///
    /// # Safety
    /// Every destination must be writable for the bytes it is used for: a
    /// `Payload` for the item's `nbytes`, an `Into` for its `size`.
    pub(crate) unsafe fn execute(
        mut self,
        dests: &[Option<TensorDest>],
    ) -> Vec<Result<ReadOutput>> {
        let client = self.client;
        let n = self.items.len();
        let mut out: Vec<Result<ReadOutput>> = Vec::with_capacity(n);
        let mut live: Vec<(usize, usize)> = Vec::new(); // (item, payload address)
        let mut headers: Vec<(usize, usize)> = Vec::new(); // (item, `_into` buffer)
        for i in 0..n {
            let dest = dests.get(i).copied().flatten();
            match (&self.items[i], dest) {
                (Err(e), _) => out.push(Err(e.clone())),
                (Ok(_), None) => out.push(Err(Error::invalid("no destination"))),
                (Ok(plan), Some(TensorDest::Payload(p))) => {
                    advise_huge_pages(p, plan.output.nbytes);
                    out.push(Ok(plan.output.clone()));
                    live.push((i, p));
                }
                (Ok(plan), Some(TensorDest::Into { ptr, size })) => {
                    let need = HEADER_SIZE as u64 + plan.output.nbytes;
                    if ptr == 0 || size < need {
                        out.push(Err(Error::invalid(format!(
                            "buffer of {size} bytes is smaller than the {need} bytes the tensor object needs"
                        ))));
                        continue;
                    }
                    // The header goes in once the payload has been read, so
                    // a failed read never leaves a valid-looking object.
                    headers.push((i, ptr));
                    out.push(Ok(plan.output.clone()));
                    live.push((i, ptr + HEADER_SIZE));
                }
            }
        }
        self.refresh_leases(&live, &mut out);
        let mut key_ix: HashMap<&str, usize> = HashMap::new();
        let mut infos: Vec<&ObjectInfo> = Vec::new();
        let mut ops: Vec<RangeOp> = Vec::new();
        let mut op_item: Vec<usize> = Vec::new();
        let mut item_leases: Vec<Vec<usize>> = vec![Vec::new(); n];
        for &(i, base) in &live {
            if out[i].is_err() {
                continue;
            }
            let Ok(plan) = &self.items[i] else { continue };
            let mut src_ix = Vec::with_capacity(plan.sources.len());
            let mut missing = None;
            for s in &plan.sources {
                match self.located.get(&s.key) {
                    Some(l) => {
                        let k = *key_ix.entry(s.key.as_str()).or_insert_with(|| {
                            infos.push(&l.info);
                            infos.len() - 1
                        });
                        src_ix.push(k);
                        item_leases[i].push(l.lease);
                    }
                    None => missing = Some(s.key.clone()),
                }
            }
            if let Some(k) = missing {
                out[i] = Err(Error::new(
                    ErrorCode::InternalError,
                    format!("{k:?} was not located"),
                ));
                continue;
            }
            for r in &plan.ranges {
                ops.push(RangeOp {
                    key: src_ix[r.source],
                    src: r.src_offset,
                    dst: base + r.dst_offset as usize,
                    len: r.len,
                    count: r.count,
                    src_stride: r.src_stride,
                    dst_stride: r.dst_stride,
                });
                op_item.push(i);
            }
        }
        // SAFETY: destinations vouched for by our caller and checked above.
        let errs = unsafe { client.read_ranges(&infos, &ops) };
        for (e, &i) in errs.iter().zip(&op_item) {
            if let (Some(e), Ok(_)) = (e, &out[i]) {
                out[i] = Err(e.clone().context("reading tensor data failed"));
            }
        }
        let now = Instant::now();
        for (i, leases) in item_leases.iter().enumerate() {
            if out[i].is_ok() && leases.iter().any(|&l| now > self.leases[l].deadline) {
                out[i] = Err(Error::new(
                    ErrorCode::LeaseExpired,
                    "the read lease ran out before the copy finished",
                ));
            }
        }
        for &(i, ptr) in &headers {
            if let (Ok(o), Ok(_)) = (&out[i], &self.items[i]) {
                // SAFETY: the caller vouches for `size >= 304 + nbytes` bytes
                // at `ptr` (checked against the plan above).
                unsafe {
                    std::ptr::copy_nonoverlapping(o.header.as_ptr(), ptr as *mut u8, HEADER_SIZE);
                }
            }
        }
        out
    }

    /// Re-lookup (one RPC) the objects of items whose lease is more than
    /// half used, and fail items whose objects changed size meanwhile.
    fn refresh_leases(&mut self, live: &[(usize, usize)], out: &mut [Result<ReadOutput>]) {
        let now = Instant::now();
        let stale: Vec<bool> = self
            .leases
            .iter()
            .map(|l| l.deadline.saturating_duration_since(now) < l.ttl / 2)
            .collect();
        if !stale.iter().any(|&s| s) {
            return;
        }
        let mut keys: Vec<String> = Vec::new();
        for &(i, _) in live {
            let Ok(plan) = &self.items[i] else { continue };
            for s in &plan.sources {
                if self.located.get(&s.key).is_some_and(|l| stale[l.lease])
                    && !keys.contains(&s.key)
                {
                    keys.push(s.key.clone());
                }
            }
        }
        if keys.is_empty() {
            return;
        }
        let (lk, lease) = self.lookup(&keys);
        let mut changed: Vec<&str> = Vec::new();
        for (k, info) in keys.iter().zip(lk.infos) {
            match info {
                Ok(info)
                    if self
                        .located
                        .get(k)
                        .is_some_and(|l| l.info.size == info.size) =>
                {
                    self.located.insert(k.clone(), Located { info, lease });
                }
                _ => changed.push(k),
            }
        }
        for &(i, _) in live {
            let Ok(plan) = &self.items[i] else { continue };
            if plan
                .sources
                .iter()
                .any(|s| changed.contains(&s.key.as_str()))
            {
                out[i] = Err(Error::new(
                    ErrorCode::ObjectNotFound,
                    "a stored object changed or disappeared during the read",
                ));
            }
        }
    }
}

impl Drop for TensorReads<'_> {
    fn drop(&mut self) {
        for l in &mut self.leases {
            if !l.reported && l.ticket != 0 {
                self.client.read_finished(l.ticket);
                l.reported = true;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::WriteMode;

    #[test]
    fn write_modes_name_upstreams_four_families() {
        let flags = |m: WriteMode| (m.upserts(), m.publishes());
        assert_eq!(flags(WriteMode::Put), (false, false));
        assert_eq!(flags(WriteMode::Upsert), (true, false));
        assert_eq!(flags(WriteMode::Pub), (false, true));
        assert_eq!(flags(WriteMode::UpsertPub), (true, true));
    }
}
