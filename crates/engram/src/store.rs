//! The EngramStore engine for one layer: create-only populate with
//! rollback, cached-location lookup, batched remove.
//!
//! Lookup plan: the first lookup (or a populate) issues one batched replica
//! query for all H tables and caches, per head, the preferred replica, its
//! size and the lease deadline. Until half the lease has elapsed, lookups
//! issue no master RPC. Tables in this process's segment or in a same-host
//! segment are copied straight into the output; remote tables are fetched
//! with one scatter/gather request per owner (distinct rows only), owners in
//! parallel, received straight into the output. A read
//! failure or size mismatch drops the cache, refreshes once and retries.

use crate::config::{store_key, Layout, OutKind, TableDtype};
use crate::convert::{bf16_to_f32_slice, f16_to_f32_slice, f32_to_bf16_slice, f32_to_f16_slice};
use crate::error::{Error, Result};
use mooncake_client::{
    Client, Error as ClientError, ErrorCode, ObjectLocation, Op, Path, ReplicaLoc, ReplicateConfig,
};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::{Arc, OnceLock, Weak};
use std::time::Instant;

/// Outputs at least this large are filled by several threads.
const PAR_BYTES: usize = 1 << 20;
/// Most threads used to fill one output.
const MAX_THREADS: usize = 4;

/// A caller-owned output buffer: `[B, L, H, D]` elements of `kind`, C order.
#[derive(Debug, Clone, Copy)]
pub struct OutBuf {
    /// Start address.
    pub ptr: usize,
    /// Length in bytes.
    pub len: usize,
    /// Element type written.
    pub kind: OutKind,
}

/// One table handed to [`EngramCore::populate`], row-major `[N_h, D]`.
#[derive(Debug, Clone, Copy)]
pub enum Table<'a> {
    /// The table's bytes, already in the table dtype.
    Raw(&'a [u8]),
    /// Half-precision bits of a float16 or bfloat16 table.
    Bits(&'a [u16]),
    /// float32 values: a float32 table, or narrowed to a half-precision
    /// table dtype here.
    F32(&'a [f32]),
}

impl Table<'_> {
    /// Bytes this table takes in `dtype`.
    fn stored_bytes(&self, dtype: TableDtype) -> usize {
        match self {
            Table::Raw(b) => b.len(),
            Table::Bits(v) => v.len() * 2,
            Table::F32(v) => v.len() * dtype.itemsize(),
        }
    }
}

/// A client that is set up and not closed, or the failure `wrap` makes of
/// "no usable store" (INVALID_PARAMS).
fn usable(client: Option<&Arc<Client>>, wrap: fn(ClientError) -> Error) -> Result<&Arc<Client>> {
    client.filter(|c| !c.is_closed()).ok_or_else(|| {
        wrap(ClientError::invalid(
            "no usable store (none, not set up, or closed)",
        ))
    })
}

/// Cached table locations, valid for one client until `refresh_at`.
struct Cache {
    client: Weak<Client>,
    epoch: u64,
    locs: Vec<ObjectLocation>,
    refresh_at: Instant,
}

/// One layer's tables (layout, keys) and its location cache.
///
/// Every operation takes the client to use at call time (`None` for a
/// metadata-only layer or a store that is not set up), so a store set up
/// after the layer was built is used from then on (the client is resolved
/// at call time).
pub struct EngramCore {
    layer_id: i32,
    layout: Layout,
    keys: Vec<String>,
    cache: Mutex<Option<Arc<Cache>>>,
}

impl EngramCore {
    /// A layer over a validated layout.
    pub fn new(layer_id: i32, layout: Layout) -> Self {
        let keys = (0..layout.num_heads())
            .map(|h| store_key(layer_id, h))
            .collect();
        EngramCore {
            layer_id,
            layout,
            keys,
            cache: Mutex::new(None),
        }
    }

    /// The layer id.
    pub fn layer_id(&self) -> i32 {
        self.layer_id
    }

    /// The layout.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// Store keys, head order.
    pub fn keys(&self) -> &[String] {
        &self.keys
    }

    /// Drop the location cache.
    pub fn invalidate(&self) {
        *self.cache.lock() = None;
    }

    /// Upload one table per head (create-only, with rollback): the tables must match the layout; float32 tables bound
    /// for a half-precision layer are narrowed here. If any key exists, or
    /// the existence query fails, nothing is written. If any write fails,
    /// the keys this call created are force-removed (a key another writer
    /// created meanwhile is left alone). On success the location cache is
    /// refreshed.
    pub fn populate(
        &self,
        client: Option<&Arc<Client>>,
        tables: &[Table<'_>],
        cfg: &ReplicateConfig,
    ) -> Result<()> {
        self.invalidate();
        self.layout.check_table_count(tables.len())?;
        let dtype = self.layout.dtype;
        for (h, t) in tables.iter().enumerate() {
            let len = t.stored_bytes(dtype);
            if len as u64 != self.layout.table_bytes(h) {
                return Err(Error::populate(
                    ErrorCode::InvalidParams,
                    format!(
                        "table {h} has {len} bytes, the layout needs {}",
                        self.layout.table_bytes(h)
                    ),
                ));
            }
        }
        let client = usable(client, Error::Populate)?;
        for (k, r) in self.keys.iter().zip(client.batch_is_exist(&self.keys)) {
            match r {
                Ok(false) => {}
                Ok(true) => {
                    return Err(Error::populate(
                        ErrorCode::ObjectAlreadyExists,
                        format!(
                            "EngramStore populate requires empty destination key '{k}'. Remove the existing layer first."
                        ),
                    ))
                }
                Err(e) => {
                    return Err(Error::Populate(
                        e.context(format!("existence query for key '{k}'")),
                    ))
                }
            }
        }
        // Narrow float32 tables for half-precision layers (without the GIL:
        // the binding releases it around the whole call).
        let narrowed: Vec<Option<Vec<u16>>> = tables
            .iter()
            .map(|t| match (t, dtype) {
                (Table::F32(v), TableDtype::Float16 | TableDtype::BFloat16) => {
                    let mut bits = vec![0u16; v.len()];
                    if dtype == TableDtype::Float16 {
                        f32_to_f16_slice(v, &mut bits);
                    } else {
                        f32_to_bf16_slice(v, &mut bits);
                    }
                    Some(bits)
                }
                _ => None,
            })
            .collect();
        let (ptrs, sizes): (Vec<usize>, Vec<usize>) = tables
            .iter()
            .zip(&narrowed)
            .map(|(t, n)| match (n, t) {
                (Some(bits), _) => (bits.as_ptr() as usize, bits.len() * 2),
                (None, Table::Raw(b)) => (b.as_ptr() as usize, b.len()),
                (None, Table::Bits(v)) => (v.as_ptr() as usize, v.len() * 2),
                (None, Table::F32(v)) => (v.as_ptr() as usize, v.len() * 4),
            })
            .unzip();
        // SAFETY: every range is a borrowed slice (`tables`) or a vector of
        // `narrowed`, all alive until the call returns.
        let results = unsafe { client.batch_create_from(&self.keys, &ptrs, &sizes, cfg) }
            .map_err(Error::Populate)?;
        let mut first: Option<ClientError> = None;
        let mut created = Vec::new();
        for (k, r) in self.keys.iter().zip(results) {
            match r {
                Ok(()) => created.push(k.clone()),
                Err(e) => {
                    first.get_or_insert_with(|| e.context(format!("put of key '{k}'")));
                }
            }
        }
        if let Some(e) = first {
            let mut e = e;
            if !created.is_empty() {
                let undone = client
                    .batch_remove(&created, true)
                    .iter()
                    .filter(|r| r.is_ok())
                    .count();
                e = e.context(format!(
                    "rolled back {undone} of the {} keys this call created",
                    created.len()
                ));
            }
            return Err(Error::Populate(e));
        }
        // Refresh the location cache now (one batched query); a failure
        // here only means the next lookup queries again.
        let _ = self.plan(client, true);
        Ok(())
    }

    /// Remove all H tables with one batched remove; the number removed.
    /// OBJECT_NOT_FOUND is not a failure; every key is attempted, and the
    /// first other failure in head order is returned. No usable store is
    /// INVALID_PARAMS.
    pub fn remove(&self, client: Option<&Arc<Client>>, force: bool) -> Result<usize> {
        self.invalidate();
        let client = usable(client, Error::Remove)?;
        let mut removed = 0;
        let mut first: Option<ClientError> = None;
        for (k, r) in self.keys.iter().zip(client.batch_remove(&self.keys, force)) {
            match r {
                Ok(()) => removed += 1,
                Err(e) if e.code() == ErrorCode::ObjectNotFound => {}
                Err(e) => {
                    first.get_or_insert_with(|| e.context(format!("remove of key '{k}'")));
                }
            }
        }
        self.invalidate();
        match first {
            Some(e) => Err(Error::Remove(e)),
            None => Ok(removed),
        }
    }

    /// The cached plan, refreshed when missing, stale, for another client,
    /// or after this client mutated keys; `force` always refreshes.
    fn plan(&self, client: &Arc<Client>, force: bool) -> Result<Arc<Cache>> {
        let now = Instant::now();
        if !force {
            if let Some(c) = self.cache.lock().as_ref() {
                if std::ptr::eq(c.client.as_ptr(), Arc::as_ptr(client))
                    && c.epoch == client.mutation_epoch()
                    && now < c.refresh_at
                {
                    return Ok(Arc::clone(c));
                }
            }
        }
        let epoch = client.mutation_epoch();
        let lk = client.lookup_locations(&self.keys);
        let mut locs = Vec::with_capacity(self.keys.len());
        for (h, item) in lk.items.into_iter().enumerate() {
            match item {
                Ok(loc) if loc.size == self.layout.table_bytes(h) => locs.push(loc),
                Ok(loc) => {
                    self.invalidate();
                    return Err(Error::lookup(
                        ErrorCode::InvalidParams,
                        format!(
                            "table '{}' has {} bytes, the layout needs {}",
                            self.keys[h],
                            loc.size,
                            self.layout.table_bytes(h)
                        ),
                    ));
                }
                Err(e) => {
                    self.invalidate();
                    let e = e.context(format!("table '{}' unavailable", self.keys[h]));
                    return Err(Error::Lookup(e));
                }
            }
        }
        let cache = Arc::new(Cache {
            client: Arc::downgrade(client),
            epoch,
            locs,
            refresh_at: lk.deadline - lk.lease_ttl / 2,
        });
        *self.cache.lock() = Some(Arc::clone(&cache));
        Ok(cache)
    }

    /// Validate `ids` (`[B, L, H]`, flat) against the vocab sizes.
    fn check_ids(&self, ids: &[i64], b: usize, l: usize) -> Result<()> {
        let h_n = self.layout.num_heads();
        if b == 0 || l == 0 || ids.len() != b * l * h_n {
            return Err(Error::lookup(
                ErrorCode::InvalidParams,
                format!(
                    "row_ids are empty or mis-sized: B={b}, L={l}, {} ids",
                    ids.len()
                ),
            ));
        }
        for (i, chunk) in ids.chunks_exact(h_n).enumerate() {
            for (h, &id) in chunk.iter().enumerate() {
                let n_h = self.layout.vocab_sizes[h];
                if u64::try_from(id).map_or(true, |v| v >= n_h) {
                    return Err(Error::lookup(
                        ErrorCode::InvalidParams,
                        format!(
                            "row id out of range: (b, l, h, id, N_h) = ({}, {}, {h}, {id}, {n_h})",
                            i / l,
                            i % l
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    /// Gather `out[b,l,h,:] = table_h[ids[b,l,h], :]` into `out` (which
    /// holds `[B, L, H, D]` elements of `out.kind`, C order). On failure
    /// `out` is zero-filled.
    ///
    /// # Safety
    /// `out.ptr..+out.len` must be writable for the duration of the call.
    pub unsafe fn lookup_into(
        &self,
        client: Option<&Arc<Client>>,
        ids: &[i64],
        b: usize,
        l: usize,
        out: OutBuf,
    ) -> Result<()> {
        let r = self.check_ids(ids, b, l).and_then(|()| {
            // SAFETY: forwarded from the caller.
            unsafe { self.lookup_inner(client, ids, out) }
        });
        if r.is_err() && out.ptr != 0 {
            // SAFETY: the caller vouches for `out`.
            unsafe { std::ptr::write_bytes(out.ptr as *mut u8, 0, out.len) };
        }
        r
    }

    /// [`EngramCore::lookup_into`] once `ids` passed the checks.
    ///
    /// # Safety
    /// As [`EngramCore::lookup_into`].
    unsafe fn lookup_inner(
        &self,
        client: Option<&Arc<Client>>,
        ids: &[i64],
        buf: OutBuf,
    ) -> Result<()> {
        let OutBuf {
            ptr: out,
            len: out_len,
            kind,
        } = buf;
        let n = ids.len();
        let d = self.layout.dim;
        let raw_item = self.layout.dtype.itemsize();
        let convert = kind == OutKind::Float32 && self.layout.dtype != TableDtype::Float32;
        let out_item = if kind == OutKind::Float32 {
            4
        } else {
            raw_item
        };
        if out == 0 || out_len != n * d * out_item {
            return Err(Error::lookup(
                ErrorCode::InvalidParams,
                format!(
                    "the output has {out_len} bytes, the lookup needs {}",
                    n * d * out_item
                ),
            ));
        }
        let client = usable(client, Error::Lookup)?;
        // Half-precision rows bound for a float32 output are gathered into
        // the upper half of `out` and widened in place (no scratch buffer).
        let dst = if convert { out + n * d * 2 } else { out };
        let mut cache = self.plan(client, false)?;
        // SAFETY: `dst` spans the rows' bytes inside `out` (caller's).
        if let Err(e) = unsafe { self.gather(client, &cache, ids, dst) } {
            tracing::info!(error = %e, "EngramStore lookup: read failed; refreshing locations");
            self.invalidate();
            cache = self.plan(client, true)?;
            // SAFETY: as above.
            if let Err(e) = unsafe { self.gather(client, &cache, ids, dst) } {
                self.invalidate();
                return Err(Error::Lookup(e.context("read failed after a refresh")));
            }
        }
        if convert {
            // SAFETY: `out` holds `4 * n * d` bytes with the rows in its upper half.
            unsafe { widen_in_place(out, n * d, self.layout.dtype) };
        }
        Ok(())
    }

    /// Copy the rows into `dst` (`[B, L, H, D]` in the table dtype).
    ///
    /// # Safety
    /// `dst` must be writable for `ids.len() * row_bytes` bytes.
    unsafe fn gather(
        &self,
        client: &Arc<Client>,
        cache: &Cache,
        ids: &[i64],
        dst: usize,
    ) -> std::result::Result<(), ClientError> {
        let h_n = self.layout.num_heads();
        let rb = self.layout.row_bytes();
        // Heads grouped by source segment; memory-mapped vs TCP.
        let mut mem_groups: HashMap<&str, Vec<usize>> = HashMap::new();
        let mut tcp_groups: HashMap<&str, Vec<usize>> = HashMap::new();
        for (h, loc) in cache.locs.iter().enumerate() {
            let g = if loc.path == Path::Tcp {
                &mut tcp_groups
            } else {
                &mut mem_groups
            };
            g.entry(&*loc.replica.segment_uuid).or_default().push(h);
        }
        for heads in mem_groups.values() {
            let rep = &cache.locs[heads[0]].replica;
            let mut ops = Vec::with_capacity(heads.len() * ids.len() / h_n);
            for (i, chunk) in ids.chunks_exact(h_n).enumerate() {
                for &h in heads {
                    ops.push(Op {
                        seg_offset: cache.locs[h].replica.offset + chunk[h] as u64 * rb as u64,
                        local_ptr: dst + (i * h_n + h) * rb,
                        len: rb as u64,
                    });
                }
            }
            // SAFETY: every op writes one row slot of `dst`.
            unsafe { read_parallel(client, rep, &ops, ops.len() * rb)? };
        }
        if tcp_groups.is_empty() {
            return Ok(());
        }
        // Remote: one scatter/gather request per owner (the transfer engine
        // splits a large one over parallel streams), owners in parallel. Each
        // distinct row of a head is fetched once, straight into its first
        // place in `dst` (the owner gathers the rows into its socket writes;
        // a token's heads are adjacent in `dst`, so they form one receive
        // iovec); repeated rows are copied locally afterwards.
        let mut dups: Vec<(usize, usize)> = Vec::new();
        let per_owner: Vec<(&ReplicaLoc, Vec<Op>)> = tcp_groups
            .values()
            .map(|heads| {
                let rep = &cache.locs[heads[0]].replica;
                let tokens = ids.len() / h_n;
                let mut first: Vec<HashMap<i64, usize>> = heads
                    .iter()
                    .map(|_| HashMap::with_capacity(tokens))
                    .collect();
                let mut ops = Vec::with_capacity(heads.len() * tokens);
                for (i, chunk) in ids.chunks_exact(h_n).enumerate() {
                    for (j, &h) in heads.iter().enumerate() {
                        let at = dst + (i * h_n + h) * rb;
                        match first[j].entry(chunk[h]) {
                            std::collections::hash_map::Entry::Occupied(e) => {
                                dups.push((*e.get(), at));
                            }
                            std::collections::hash_map::Entry::Vacant(e) => {
                                e.insert(at);
                                ops.push(Op {
                                    seg_offset: cache.locs[h].replica.offset
                                        + chunk[h] as u64 * rb as u64,
                                    local_ptr: at,
                                    len: rb as u64,
                                });
                            }
                        }
                    }
                }
                (rep, ops)
            })
            .collect();
        let copy_dups = || {
            for &(from, to) in &dups {
                // SAFETY: both are row slots of `dst`; `from` was just filled.
                unsafe { std::ptr::copy_nonoverlapping(from as *const u8, to as *mut u8, rb) };
            }
        };
        if per_owner.len() == 1 {
            let (rep, ops) = &per_owner[0];
            // SAFETY: every op writes one row slot of `dst`.
            unsafe { client.read_ops(rep, ops)? };
            copy_dups();
            return Ok(());
        }
        on_threads(per_owner.iter(), |(rep, ops)| {
            // SAFETY: owners write disjoint parts of `dst`.
            unsafe { client.read_ops(rep, ops) }.map(|_| ())
        })?;
        copy_dups();
        Ok(())
    }
}

/// Widen `count` half-precision values stored at `out + 2*count` into
/// `count` float32 values at `out`, front to back, in blocks of `BLOCK`:
/// each block's inputs are copied out before its outputs are written, and
/// the outputs of values `..i+m` end at byte `4*(i+m)`, never past the
/// first input still unread (byte `2*count + 2*(i+m)`, as `i+m <= count`).
///
/// # Safety
/// `out..out+4*count` must be writable and hold the inputs in its upper half.
unsafe fn widen_in_place(out: usize, count: usize, dtype: TableDtype) {
    // One monomorphised loop per dtype, so the conversion inlines.
    if dtype == TableDtype::BFloat16 {
        // SAFETY: forwarded from the caller.
        unsafe { widen_with(out, count, bf16_to_f32_slice) }
    } else {
        // SAFETY: forwarded from the caller.
        unsafe { widen_with(out, count, f16_to_f32_slice) }
    }
}

/// [`widen_in_place`] with the conversion `widen`.
///
/// # Safety
/// As [`widen_in_place`].
unsafe fn widen_with(out: usize, count: usize, widen: impl Fn(&[u16], &mut [f32])) {
    const BLOCK: usize = 1024;
    let src = (out + 2 * count) as *const u16;
    let dst = out as *mut f32;
    let mut bits = [0u16; BLOCK];
    let mut vals = [0f32; BLOCK];
    let mut i = 0;
    while i < count {
        let m = BLOCK.min(count - i);
        // SAFETY: inputs `i..i+m` lie in the upper half and are not yet
        // overwritten (see above); `bits` holds `BLOCK >= m` values.
        unsafe { std::ptr::copy_nonoverlapping(src.add(i), bits.as_mut_ptr(), m) };
        widen(&bits[..m], &mut vals[..m]);
        // SAFETY: outputs `i..i+m` lie inside `out`; `vals` is a local copy.
        unsafe { std::ptr::copy_nonoverlapping(vals.as_ptr(), dst.add(i), m) };
        i += m;
    }
}

/// Run `ops` against one replica, split over up to `MAX_THREADS` threads
/// when `bytes` reaches `PAR_BYTES`.
///
/// # Safety
/// Every op's destination must be writable for the duration of the call.
unsafe fn read_parallel(
    client: &Client,
    rep: &ReplicaLoc,
    ops: &[Op],
    bytes: usize,
) -> std::result::Result<(), ClientError> {
    if bytes < PAR_BYTES {
        // SAFETY: forwarded from the caller.
        return unsafe { client.read_ops(rep, ops) }.map(|_| ());
    }
    // `available_parallelism` reads cgroup files: query it once.
    static CORES: OnceLock<usize> = OnceLock::new();
    let cores = *CORES.get_or_init(|| {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    });
    let threads = MAX_THREADS.min(cores);
    if threads < 2 || ops.len() < threads {
        // SAFETY: forwarded from the caller.
        return unsafe { client.read_ops(rep, ops) }.map(|_| ());
    }
    let per = ops.len().div_ceil(threads);
    on_threads(ops.chunks(per), |part| {
        // SAFETY: parts write disjoint output ranges.
        unsafe { client.read_ops(rep, part) }.map(|_| ())
    })
}

/// Run `work` on every item, each on a thread of its own; once all are
/// done, the first error in item order (a panicked thread counts as one).
fn on_threads<I: Send>(
    items: impl Iterator<Item = I>,
    work: impl Fn(I) -> std::result::Result<(), ClientError> + Sync,
) -> std::result::Result<(), ClientError> {
    let results: Vec<std::result::Result<(), ClientError>> = std::thread::scope(|sc| {
        let work = &work;
        let handles: Vec<_> = items.map(|it| sc.spawn(move || work(it))).collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(ClientError::internal("reader thread panicked")))
            })
            .collect()
    });
    results.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::{bf16, f16};

    /// A float32 value to half-precision bits.
    type Narrow = fn(f32) -> u16;
    /// Half-precision bits to a float32 value.
    type Widen = fn(u16) -> f32;

    #[test]
    fn widen_in_place_matches_out_of_place() {
        for count in [1usize, 7, 8, 9, 13, 64, 65, 1001, 1024, 1025, 5000] {
            let vals: Vec<f32> = (0..count).map(|i| i as f32 * 0.37 - 11.0).collect();
            let halves: [(TableDtype, Narrow, Widen); 2] = [
                (
                    TableDtype::BFloat16,
                    |v| bf16::from_f32(v).to_bits(),
                    |b| bf16::from_bits(b).to_f32(),
                ),
                (
                    TableDtype::Float16,
                    |v| f16::from_f32(v).to_bits(),
                    |b| f16::from_bits(b).to_f32(),
                ),
            ];
            for (dtype, narrow, widen) in halves {
                let bits: Vec<u16> = vals.iter().map(|&v| narrow(v)).collect();
                let mut buf = vec![0f32; count];
                // SAFETY: `buf` holds `4 * count` bytes; the bits go to its upper half.
                unsafe {
                    let upper = (buf.as_mut_ptr() as *mut u16).add(count);
                    std::ptr::copy_nonoverlapping(bits.as_ptr(), upper, count);
                    widen_in_place(buf.as_mut_ptr() as usize, count, dtype);
                }
                let want: Vec<f32> = bits.iter().map(|&b| widen(b)).collect();
                assert_eq!(buf, want, "{dtype} count {count}");
            }
        }
    }
}
