//! [`Store`]: what a `MooncakeDistributedStore` is set up as. `setup` makes
//! an in-process client (it owns a segment and talks to the master);
//! `setup_dummy` makes a dummy client, whose every call the
//! `mooncake_client` daemon on this host serves. Both answer the same
//! methods with the same results, so the Python binding does not care
//! which one it holds.

use crate::dummy::DummyClient;
use mooncake_client::{
    Client, ObjectIo, Ranges, ReplicateConfig, Result, StagedValue, TensorDest, TensorWrite,
    WriteMode,
};
use mooncake_tensor::{ReadOutput, ReadRequest};
use std::sync::Arc;

/// A set-up store: in-process or dummy. Cheap to clone.
#[derive(Clone)]
pub enum Store {
    /// `setup`: this process's own client.
    Local(Arc<Client>),
    /// `setup_dummy`: a dummy client of the daemon on this host.
    Dummy(Arc<DummyClient>),
}

/// `$e` with `$c` bound to whichever client `$s` holds (both have the method).
macro_rules! both {
    ($s:expr, $c:ident => $e:expr) => {
        match $s {
            Store::Local($c) => $e,
            Store::Dummy($c) => $e,
        }
    };
}

impl Store {
    /// The in-process client, when this is one.
    pub fn client(&self) -> Option<&Arc<Client>> {
        match self {
            Store::Local(c) => Some(c),
            Store::Dummy(_) => None,
        }
    }

    /// The dummy client, when this is one.
    pub fn dummy(&self) -> Option<&Arc<DummyClient>> {
        match self {
            Store::Local(_) => None,
            Store::Dummy(d) => Some(d),
        }
    }

    /// Unmount and disconnect (in-process), or detach (dummy). Idempotent.
    pub fn close(&self) {
        both!(self, c => c.close())
    }

    /// Whether `close` was called.
    pub fn is_closed(&self) -> bool {
        both!(self, c => c.is_closed())
    }

    /// `get_hostname()`.
    pub fn hostname(&self) -> String {
        both!(self, c => c.hostname())
    }

    /// `health_check()`.
    pub fn health(&self) -> i32 {
        both!(self, c => c.health())
    }

    /// `get_client_stats()`.
    pub fn stats(&self) -> Vec<(String, u64)> {
        match self {
            Store::Local(c) => c
                .stats()
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect(),
            Store::Dummy(d) => d.stats(),
        }
    }

    /// `unmount_segment` / `unmount_and_free_segment`.
    pub fn unmount_segments(&self, method: &str, ids: &[String]) -> Result<()> {
        match self {
            Store::Local(c) => c.unmount_segments(ids),
            Store::Dummy(d) => Err(d.in_process_only(method)),
        }
    }

    /// `unmount_local_disk_segment`.
    pub fn drain_local_disk_segment(&self) -> Result<()> {
        match self {
            Store::Local(c) => c.drain_local_disk_segment(),
            Store::Dummy(d) => Err(d.in_process_only("unmount_local_disk_segment")),
        }
    }

    /// `get_offload_rpc_read_count`: 0 (no SSD tier; a dummy has none either).
    pub fn offload_rpc_read_count(&self) -> u64 {
        match self {
            Store::Local(c) => c.offload_rpc_read_count(),
            Store::Dummy(_) => 0,
        }
    }

    /// `register_buffer`.
    pub fn register_buffer(&self, ptr: usize, size: usize) -> Result<()> {
        both!(self, c => c.register_buffer(ptr, size))
    }

    /// `unregister_buffer`.
    pub fn unregister_buffer(&self, ptr: usize) -> Result<()> {
        both!(self, c => c.unregister_buffer(ptr))
    }

    /// `put`/`upsert`.
    pub fn put(&self, key: &str, value: &[u8], cfg: &ReplicateConfig, upsert: bool) -> Result<()> {
        both!(self, c => c.put(key, value, cfg, upsert))
    }

    /// `put_parts`/`upsert_parts`.
    pub fn put_parts(
        &self,
        key: &str,
        parts: &[&[u8]],
        cfg: &ReplicateConfig,
        upsert: bool,
    ) -> Result<u64> {
        both!(self, c => c.put_parts(key, parts, cfg, upsert))
    }

    /// `put_batch`/`upsert_batch`.
    pub fn put_batch(
        &self,
        keys: &[String],
        values: &[&[u8]],
        cfg: &ReplicateConfig,
        upsert: bool,
    ) -> Result<()> {
        both!(self, c => c.put_batch(keys, values, cfg, upsert))
    }

    /// `put_from`/`upsert_from`.
    ///
    /// # Safety
    /// `ptr..ptr+size` must be readable for the duration of the call.
    pub unsafe fn put_from(
        &self,
        key: &str,
        ptr: usize,
        size: usize,
        cfg: &ReplicateConfig,
        upsert: bool,
    ) -> Result<()> {
        // SAFETY: the caller's contract is the client's.
        both!(self, c => unsafe { c.put_from(key, ptr, size, cfg, upsert) })
    }

    /// `put_from_with_metadata`.
    ///
    /// # Safety
    /// Both ranges must be readable for the duration of the call.
    pub unsafe fn put_from_with_metadata(
        &self,
        key: &str,
        ptr: usize,
        metadata_ptr: usize,
        size: usize,
        metadata_size: usize,
        cfg: &ReplicateConfig,
    ) -> Result<()> {
        // SAFETY: the caller's contract is the client's.
        both!(self, c => unsafe {
            c.put_from_with_metadata(key, ptr, metadata_ptr, size, metadata_size, cfg)
        })
    }

    /// `batch_put_from`/`batch_upsert_from`.
    ///
    /// # Safety
    /// Every `ptrs[i]..+sizes[i]` must be readable for the duration of the call.
    pub unsafe fn batch_put_from(
        &self,
        keys: &[String],
        ptrs: &[usize],
        sizes: &[usize],
        cfg: &ReplicateConfig,
        upsert: bool,
    ) -> Result<Vec<Result<()>>> {
        // SAFETY: the caller's contract is the client's.
        both!(self, c => unsafe { c.batch_put_from(keys, ptrs, sizes, cfg, upsert) })
    }

    /// `get`/`get_buffer`.
    pub fn get(&self, key: &str) -> Result<StagedValue> {
        both!(self, c => c.get(key))
    }

    /// `get_batch`/`batch_get_buffer`.
    pub fn get_batch(&self, keys: &[String]) -> Vec<Result<StagedValue>> {
        both!(self, c => c.get_batch(keys))
    }

    /// Whole values into memory `alloc` gives once the sizes are known.
    pub fn get_batch_with<A>(&self, keys: &[String], alloc: A) -> Vec<Result<u64>>
    where
        A: FnOnce(&[Result<u64>]) -> Vec<Option<usize>>,
    {
        both!(self, c => c.get_batch_with(keys, alloc))
    }

    /// `get_into`.
    ///
    /// # Safety
    /// `ptr..ptr+size` must be writable for the duration of the call.
    pub unsafe fn get_into(&self, key: &str, ptr: usize, size: usize) -> Result<u64> {
        // SAFETY: the caller's contract is the client's.
        both!(self, c => unsafe { c.get_into(key, ptr, size) })
    }

    /// `batch_get_into`.
    ///
    /// # Safety
    /// Every `ptrs[i]..+sizes[i]` must be writable for the duration of the call.
    pub unsafe fn batch_get_into(
        &self,
        keys: &[String],
        ptrs: &[usize],
        sizes: &[usize],
    ) -> Result<Vec<Result<u64>>> {
        // SAFETY: the caller's contract is the client's.
        both!(self, c => unsafe { c.batch_get_into(keys, ptrs, sizes) })
    }

    /// `get_size`.
    pub fn get_size(&self, key: &str) -> Result<u64> {
        both!(self, c => c.get_size(key))
    }

    /// `is_exist`.
    pub fn is_exist(&self, key: &str) -> Result<bool> {
        both!(self, c => c.is_exist(key))
    }

    /// `batch_is_exist`.
    pub fn batch_is_exist(&self, keys: &[String]) -> Vec<Result<bool>> {
        both!(self, c => c.batch_is_exist(keys))
    }

    /// `remove`.
    pub fn remove(&self, key: &str, force: bool) -> Result<()> {
        both!(self, c => c.remove(key, force))
    }

    /// `batch_remove`.
    pub fn batch_remove(&self, keys: &[String], force: bool) -> Vec<Result<()>> {
        both!(self, c => c.batch_remove(keys, force))
    }

    /// `remove_by_regex`.
    pub fn remove_by_regex(&self, pattern: &str, force: bool) -> Result<u64> {
        both!(self, c => c.remove_by_regex(pattern, force))
    }

    /// `remove_all`.
    pub fn remove_all(&self, force: bool) -> Result<u64> {
        both!(self, c => c.remove_all(force))
    }

    /// `batch_put_from_multi_buffers`.
    ///
    /// # Safety
    /// Every buffer must be readable for the duration of the call.
    pub unsafe fn batch_put_from_multi_buffers(
        &self,
        keys: &[String],
        all_ptrs: &[Vec<usize>],
        all_sizes: &[Vec<usize>],
        cfg: &ReplicateConfig,
    ) -> Result<Vec<Result<()>>> {
        // SAFETY: the caller's contract is the client's.
        both!(self, c => unsafe { c.batch_put_from_multi_buffers(keys, all_ptrs, all_sizes, cfg) })
    }

    /// `batch_get_into_multi_buffers`.
    ///
    /// # Safety
    /// Every buffer must be writable for the duration of the call.
    pub unsafe fn batch_get_into_multi_buffers(
        &self,
        keys: &[String],
        all_ptrs: &[Vec<usize>],
        all_sizes: &[Vec<usize>],
        prefer_same_node: bool,
    ) -> Result<Vec<Result<u64>>> {
        // SAFETY: the caller's contract is the client's.
        both!(self, c => unsafe {
            c.batch_get_into_multi_buffers(keys, all_ptrs, all_sizes, prefer_same_node)
        })
    }

    /// `get_into_ranges`.
    ///
    /// # Safety
    /// Registered regions must stay valid and writable for the call.
    pub unsafe fn get_into_ranges(
        &self,
        buffer_ptrs: &[usize],
        keys: &[Vec<String>],
        dst_offsets: &[Vec<Vec<u64>>],
        src_offsets: &[Vec<Vec<u64>>],
        sizes: &[Vec<Vec<u64>>],
    ) -> Ranges {
        // SAFETY: the caller's contract is the client's.
        both!(self, c => unsafe {
            c.get_into_ranges(buffer_ptrs, keys, dst_offsets, src_offsets, sizes)
        })
    }

    /// `batch_put_session_start`.
    pub fn batch_put_session_start(
        &self,
        keys: &[String],
        sizes: &[u64],
        cfg: &ReplicateConfig,
    ) -> Result<Vec<Result<()>>> {
        both!(self, c => c.batch_put_session_start(keys, sizes, cfg))
    }

    /// `batch_put_from_multi_buffer_ranges`.
    ///
    /// # Safety
    /// Every buffer must be readable for the duration of the call.
    pub unsafe fn batch_put_from_multi_buffer_ranges(
        &self,
        keys: &[String],
        all_ptrs: &[Vec<usize>],
        all_sizes: &[Vec<usize>],
        all_offsets: &[Vec<usize>],
    ) -> Result<Vec<Result<u64>>> {
        // SAFETY: the caller's contract is the client's.
        both!(self, c => unsafe {
            c.batch_put_from_multi_buffer_ranges(keys, all_ptrs, all_sizes, all_offsets)
        })
    }

    /// `batch_put_session_end`.
    pub fn batch_put_session_end(&self, keys: &[String]) -> Vec<Result<()>> {
        both!(self, c => c.batch_put_session_end(keys))
    }

    /// `batch_put_session_revoke`.
    pub fn batch_put_session_revoke(&self, keys: &[String]) -> Vec<Result<()>> {
        both!(self, c => c.batch_put_session_revoke(keys))
    }

    /// `batch_get_session_start`.
    pub fn batch_get_session_start(&self, keys: &[String]) -> Vec<Result<()>> {
        both!(self, c => c.batch_get_session_start(keys))
    }

    /// `batch_get_into_multi_buffer_ranges`.
    ///
    /// # Safety
    /// Every buffer must be writable for the duration of the call.
    pub unsafe fn batch_get_into_multi_buffer_ranges(
        &self,
        keys: &[String],
        all_ptrs: &[Vec<usize>],
        all_sizes: &[Vec<usize>],
        all_offsets: &[Vec<usize>],
    ) -> Result<Vec<Result<u64>>> {
        // SAFETY: the caller's contract is the client's.
        both!(self, c => unsafe {
            c.batch_get_into_multi_buffer_ranges(keys, all_ptrs, all_sizes, all_offsets)
        })
    }

    /// `batch_get_session_end`.
    pub fn batch_get_session_end(&self, keys: &[String]) -> Result<()> {
        both!(self, c => c.batch_get_session_end(keys))
    }

    /// A batch of tensor writes.
    ///
    /// # Safety
    /// For every item, the bytes its plan reads from `ptr` must be readable
    /// for the duration of the call.
    pub unsafe fn write_tensors(
        &self,
        items: Vec<Result<TensorWrite>>,
        cfg: &ReplicateConfig,
        mode: WriteMode,
    ) -> Result<Vec<Result<()>>> {
        // SAFETY: the caller's contract is the client's.
        both!(self, c => unsafe { c.write_tensors(items, cfg, mode) })
    }

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
        match self {
            Store::Local(c) => {
                let reads = c.plan_tensor_reads(reqs);
                let outs: Vec<Result<ReadOutput>> =
                    (0..reads.len()).map(|i| reads.output(i).cloned()).collect();
                let mut dests = alloc(&outs);
                dests.resize(outs.len(), None);
                // SAFETY: the caller vouches for the destinations.
                unsafe { reads.execute(&dests) }
            }
            // SAFETY: the caller vouches for the destinations.
            Store::Dummy(d) => unsafe { d.read_tensors(reqs, alloc) },
        }
    }
}

impl ObjectIo for Store {
    fn object_size(&self, key: &str) -> Result<u64> {
        self.get_size(key)
    }

    unsafe fn read_object_into(&self, key: &str, ptr: usize, size: usize) -> Result<u64> {
        // SAFETY: the caller's contract is `get_into`'s.
        unsafe { self.get_into(key, ptr, size) }
    }

    unsafe fn write_objects_from(
        &self,
        keys: &[String],
        all_ptrs: &[Vec<usize>],
        all_sizes: &[Vec<usize>],
        cfg: &ReplicateConfig,
    ) -> Result<Vec<Result<()>>> {
        // SAFETY: the caller's contract is the clients'.
        both!(self, c => unsafe { c.batch_put_from_multi_buffers(keys, all_ptrs, all_sizes, cfg) })
    }
}
