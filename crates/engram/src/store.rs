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

use crate::config::{store_key, Layout, TableDtype};
use crate::convert::{bf16_to_f32, f16_to_f32};
use mooncake_client::{Client, ErrorCode, ObjectLocation, Op, Path, WriteConfig};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, OnceLock, Weak};
use std::time::Instant;

/// Outputs at least this large are filled by several threads.
const PAR_BYTES: usize = 1 << 20;
/// Most threads used to fill one output.
const MAX_THREADS: usize = 4;

/// The one lookup failure the API reports (`EngramStore lookup failed`);
/// the reason is logged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LookupError;

impl fmt::Display for LookupError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("EngramStore lookup failed")
    }
}

impl std::error::Error for LookupError {}

/// Element type of a lookup output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutKind {
    /// The table dtype itself (raw bits for bfloat16).
    Raw,
    /// float32 (converted from half-precision tables).
    Float32,
}

/// A caller-owned output buffer: `[B, L, H, D]` elements of `kind`, C order.
#[derive(Debug, Clone, Copy)]
pub struct OutBuf {
    /// Start address.
    pub ptr: usize,
    /// Length in bytes.
    pub len: usize,
    pub kind: OutKind,
}

/// Cached table locations, valid for one client until `refresh_at`.
struct Cache {
    client: Weak<Client>,
    epoch: u64,
    locs: Vec<ObjectLocation>,
    refresh_at: Instant,
}

/// One layer's tables (layout, keys) and its location cache.
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

    /// Upload one table per head (`tables[h]` = pointer and byte length of
    /// a row-major table in the table dtype). Create-only: fails without
    /// writing if any key exists; on a partial failure removes the keys this
    /// call created. Returns `false` on failure (reason logged).
    ///
    /// # Safety
    /// Every `tables[h]` range must be readable for the duration of the call.
    pub unsafe fn populate(
        &self,
        client: &Arc<Client>,
        tables: &[(usize, usize)],
        cfg: &WriteConfig,
    ) -> bool {
        self.invalidate();
        let h_n = self.layout.num_heads();
        if tables.len() != h_n {
            return false;
        }
        for (h, &(_, len)) in tables.iter().enumerate() {
            if len as u64 != self.layout.table_bytes(h) {
                tracing::warn!(
                    head = h,
                    len,
                    "EngramStore populate: table has the wrong size"
                );
                return false;
            }
        }
        let exist = client.is_exist(&self.keys);
        for (k, &c) in self.keys.iter().zip(&exist) {
            if c == 1 {
                tracing::warn!(
                    "EngramStore populate requires empty destination key '{k}'. Remove the existing layer first."
                );
                return false;
            }
            if c != 0 {
                tracing::warn!(key = %k, rc = c, "EngramStore populate: existence query failed");
                return false;
            }
        }
        let ptrs: Vec<usize> = tables.iter().map(|t| t.0).collect();
        let sizes: Vec<usize> = tables.iter().map(|t| t.1).collect();
        let codes = client.batch_create_from(&self.keys, &ptrs, &sizes, cfg);
        if codes.iter().any(|&c| c != 0) {
            let created: Vec<String> = self
                .keys
                .iter()
                .zip(&codes)
                .filter(|(_, &c)| c == 0)
                .map(|(k, _)| k.clone())
                .collect();
            for (k, &c) in self.keys.iter().zip(&codes) {
                if c != 0 {
                    tracing::warn!(key = %k, rc = c, "EngramStore populate: put failed");
                }
            }
            if !created.is_empty() {
                let rc = client.remove(&created, true);
                tracing::warn!(keys = ?created, rc = ?rc, "EngramStore populate: rolled back");
            }
            return false;
        }
        // Refresh the location cache now (one batched query).
        let _ = self.plan(client, true);
        true
    }

    /// Remove all H tables with one batched remove. `Ok(removed)` or the
    /// first error code in head order (-704 is not an error).
    pub fn remove(&self, client: &Arc<Client>, force: bool) -> Result<usize, i32> {
        self.invalidate();
        let codes = client.remove(&self.keys, force);
        let mut removed = 0;
        let mut first_err = None;
        for (k, &c) in self.keys.iter().zip(&codes) {
            match c {
                0 => removed += 1,
                -704 => {}
                e => {
                    tracing::warn!(key = %k, rc = e, "EngramStore remove_from_store failed for key");
                    first_err.get_or_insert(e);
                }
            }
        }
        self.invalidate();
        match first_err {
            Some(e) => Err(e),
            None => Ok(removed),
        }
    }

    /// The cached plan, refreshed when missing, stale, for another client,
    /// or after this client mutated keys; `force` always refreshes.
    fn plan(&self, client: &Arc<Client>, force: bool) -> Result<Arc<Cache>, LookupError> {
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
                    tracing::warn!(
                        key = %self.keys[h],
                        size = loc.size,
                        expected = self.layout.table_bytes(h),
                        "EngramStore lookup: table size does not match the layout"
                    );
                    self.invalidate();
                    return Err(LookupError);
                }
                Err(e) => {
                    tracing::warn!(key = %self.keys[h], error = %e, "EngramStore lookup: table unavailable");
                    self.invalidate();
                    return Err(LookupError);
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
    fn check_ids(&self, ids: &[i64], b: usize, l: usize) -> Result<(), LookupError> {
        let h_n = self.layout.num_heads();
        if b == 0 || l == 0 || ids.len() != b * l * h_n {
            tracing::warn!(
                b,
                l,
                n = ids.len(),
                "EngramStore lookup: empty or mis-sized row_ids"
            );
            return Err(LookupError);
        }
        for (i, chunk) in ids.chunks_exact(h_n).enumerate() {
            for (h, &id) in chunk.iter().enumerate() {
                let n_h = self.layout.vocab_sizes[h];
                if id < 0 || id as u64 >= n_h {
                    tracing::warn!(
                        b = i / l,
                        l = i % l,
                        h,
                        id,
                        n_h,
                        "EngramStore lookup: row id out of range"
                    );
                    return Err(LookupError);
                }
            }
        }
        Ok(())
    }

    /// Gather `out[b,l,h,:] = table_h[ids[b,l,h], :]` into `out` (which
    /// holds `[B, L, H, D]` elements of `out.kind`, C order). On failure `out` is
    /// zero-filled.
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
    ) -> Result<(), LookupError> {
        let r = self.lookup_inner(client, ids, b, l, out);
        if r.is_err() && out.ptr != 0 {
            std::ptr::write_bytes(out.ptr as *mut u8, 0, out.len);
        }
        r
    }

    unsafe fn lookup_inner(
        &self,
        client: Option<&Arc<Client>>,
        ids: &[i64],
        b: usize,
        l: usize,
        buf: OutBuf,
    ) -> Result<(), LookupError> {
        let OutBuf {
            ptr: out,
            len: out_len,
            kind,
        } = buf;
        self.check_ids(ids, b, l)?;
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
            tracing::warn!(out_len, "EngramStore lookup: output has the wrong size");
            return Err(LookupError);
        }
        let Some(client) = client.filter(|c| !c.is_closed()) else {
            tracing::warn!("EngramStore lookup: no usable store");
            return Err(LookupError);
        };
        // Half-precision rows bound for a float32 output are gathered into
        // the upper half of `out` and widened in place (no scratch buffer).
        let dst = if convert { out + n * d * 2 } else { out };
        let mut cache = self.plan(client, false)?;
        if let Err(e) = self.gather(client, &cache, ids, dst) {
            tracing::info!(error = %e, "EngramStore lookup: read failed; refreshing locations");
            self.invalidate();
            cache = self.plan(client, true)?;
            if let Err(e) = self.gather(client, &cache, ids, dst) {
                tracing::warn!(error = %e, "EngramStore lookup: read failed after refresh");
                self.invalidate();
                return Err(LookupError);
            }
        }
        if convert {
            widen_in_place(out, n * d, self.layout.dtype);
        }
        Ok(())
    }

    /// Copy the rows into `dst` (`[B, L, H, D]` in the table dtype).
    unsafe fn gather(
        &self,
        client: &Arc<Client>,
        cache: &Cache,
        ids: &[i64],
        dst: usize,
    ) -> Result<(), ErrorCode> {
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
            g.entry(loc.replica.segment_uuid.as_str())
                .or_default()
                .push(h);
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
            read_parallel(client, rep, &ops, ops.len() * rb)?;
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
        let per_owner: Vec<(&mooncake_client::ReplicaLoc, Vec<Op>)> = tcp_groups
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
            client.read_ops(rep, ops)?;
            copy_dups();
            return Ok(());
        }
        let results: Vec<Result<(), ErrorCode>> = std::thread::scope(|sc| {
            let handles: Vec<_> = per_owner
                .iter()
                .map(|(rep, ops)| {
                    // SAFETY: owners write disjoint parts of `dst`.
                    sc.spawn(move || unsafe { client.read_ops(rep, ops) }.map(|_| ()))
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or(Err(ErrorCode::InternalError)))
                .collect()
        });
        results.into_iter().collect::<Result<(), ErrorCode>>()?;
        copy_dups();
        Ok(())
    }
}

/// Widen `count` half-precision values stored at `out + 2*count` into
/// `count` float32 values at `out`, front to back, in blocks of `BLOCK`.
/// Block `k` of outputs ends at byte `4*BLOCK*(k+1)`, never past the start
/// of the inputs still unread (`2*count + 2*BLOCK*(k+1)`), and each block
/// is read before it is written.
///
/// # Safety
/// `out..out+4*count` must be writable and hold the inputs in its upper half.
unsafe fn widen_in_place(out: usize, count: usize, dtype: TableDtype) {
    const BLOCK: usize = 64;
    let src = (out + 2 * count) as *const u16;
    let dst = out as *mut f32;
    let mut i = 0;
    while i < count {
        let m = BLOCK.min(count - i);
        let mut buf = [0u16; BLOCK];
        std::ptr::copy_nonoverlapping(src.add(i), buf.as_mut_ptr(), m);
        let mut vals = [0f32; BLOCK];
        // One arm per dtype so the conversion inlines and vectorises.
        match dtype {
            TableDtype::BFloat16 => {
                for (v, &b) in vals.iter_mut().zip(&buf) {
                    *v = bf16_to_f32(b);
                }
            }
            _ => {
                for (v, &b) in vals.iter_mut().zip(&buf) {
                    *v = f16_to_f32(b);
                }
            }
        }
        std::ptr::copy_nonoverlapping(vals.as_ptr(), dst.add(i), m);
        i += m;
    }
}

/// Run `ops` against one replica, split over up to `MAX_THREADS` threads
/// when `bytes` reaches `PAR_BYTES`.
unsafe fn read_parallel(
    client: &Client,
    rep: &mooncake_client::ReplicaLoc,
    ops: &[Op],
    bytes: usize,
) -> Result<(), ErrorCode> {
    if bytes < PAR_BYTES {
        return client.read_ops(rep, ops).map(|_| ());
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
        return client.read_ops(rep, ops).map(|_| ());
    }
    let per = ops.len().div_ceil(threads);
    let results: Vec<Result<Path, ErrorCode>> = std::thread::scope(|sc| {
        let handles: Vec<_> = ops
            .chunks(per)
            .map(|part| {
                // SAFETY: parts write disjoint output ranges.
                sc.spawn(move || unsafe { client.read_ops(rep, part) })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or(Err(ErrorCode::InternalError)))
            .collect()
    });
    for r in results {
        r?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::convert::f32_to_bf16;

    #[test]
    fn widen_in_place_matches_out_of_place() {
        for count in [1usize, 7, 8, 9, 13, 64, 1001] {
            let vals: Vec<f32> = (0..count).map(|i| i as f32 * 0.37 - 11.0).collect();
            // bfloat16
            let mut buf = vec![0f32; count];
            let bits: Vec<u16> = vals.iter().map(|&v| f32_to_bf16(v)).collect();
            unsafe {
                let upper = (buf.as_mut_ptr() as *mut u16).add(count);
                std::ptr::copy_nonoverlapping(bits.as_ptr(), upper, count);
                widen_in_place(buf.as_mut_ptr() as usize, count, TableDtype::BFloat16);
            }
            let want: Vec<f32> = bits.iter().map(|&b| bf16_to_f32(b)).collect();
            assert_eq!(buf, want, "bf16 count {count}");
            // float16 (bits of small integers: exact)
            let h: Vec<u16> = (0..count).map(|i| 0x3C00 + (i as u16 % 512)).collect();
            let mut buf = vec![0f32; count];
            unsafe {
                let upper = (buf.as_mut_ptr() as *mut u16).add(count);
                std::ptr::copy_nonoverlapping(h.as_ptr(), upper, count);
                widen_in_place(buf.as_mut_ptr() as usize, count, TableDtype::Float16);
            }
            let want: Vec<f32> = h.iter().map(|&b| f16_to_f32(b)).collect();
            assert_eq!(buf, want, "f16 count {count}");
        }
    }
}
