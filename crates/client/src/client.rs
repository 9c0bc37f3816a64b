//! `Client`: one store client instance (what `MooncakeDistributedStore.setup` creates).

use crate::stats::ClientStats;
use mooncake_common::proto::WriteConfig;
use mooncake_common::ErrorCode;
use std::sync::Arc;

/// Arguments of `setup` after the Python layer has parsed them.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// `host` or `host:port`.
    pub local_hostname: String,
    /// `http://h:p/path`, `P2PHANDSHAKE`, or anything else (unsupported -> -1).
    pub metadata_server: String,
    pub global_segment_size: u64,
    pub local_buffer_size: u64,
    pub protocol: String,
    /// `host:port` of the master RPC service.
    pub master_server_addr: String,
}

/// A value read through the staging (local) buffer; owns its bytes and
/// holds its staging reservation until dropped.
pub struct StagedValue {
    pub data: Vec<u8>,
    pub(crate) _reservation: Option<crate::staging::Reservation>,
}

/// A set-up store client. Cheap to share (`Arc`); all methods take `&self` and are thread-safe.
pub struct Client {
    pub(crate) stats: ClientStats,
}

impl Client {
    /// Connect to the master, allocate and mount the segment, start the data
    /// server and heartbeat. Errors are the `setup` return codes of spec §2.3
    /// (-600 bad sizes/duplicate segment, -1 master unreachable/bad protocol/metadata).
    pub fn setup(_cfg: ClientConfig) -> Result<Arc<Client>, ErrorCode> {
        Err(ErrorCode::NotSupported)
    }

    /// Unmount, stop serving, unpublish metadata. Idempotent; returns 0.
    pub fn close(&self) -> i32 {
        0
    }

    /// `host:port` segment name.
    pub fn hostname(&self) -> String {
        String::new()
    }

    /// 0 healthy, 2 the last heartbeat failed (1 is for closed, decided by the caller).
    pub fn health(&self) -> i32 {
        0
    }

    /// Cumulative counters.
    pub fn stats(&self) -> Vec<(&'static str, u64)> {
        self.stats.snapshot()
    }

    /// Staged write of the concatenation of `parts` (put/put_parts/upsert/upsert_parts).
    /// Needs local-buffer space for the total size (else -600). Empty total -> -600.
    pub fn put_parts(
        &self,
        _key: &str,
        _parts: &[&[u8]],
        _cfg: &WriteConfig,
        _upsert: bool,
    ) -> i32 {
        ErrorCode::NotSupported.code()
    }

    /// Staged batch write (put_batch/upsert_batch): 0 or the first failing code.
    pub fn put_batch(
        &self,
        _keys: &[String],
        _values: &[&[u8]],
        _cfg: &WriteConfig,
        _upsert: bool,
    ) -> i32 {
        ErrorCode::NotSupported.code()
    }

    /// Direct write from caller memory (put_from/upsert_from). `size == 0` -> 0, nothing stored.
    ///
    /// # Safety
    /// `ptr..ptr+size` must be readable for the duration of the call.
    pub unsafe fn put_from(
        &self,
        _key: &str,
        _ptr: usize,
        _size: usize,
        _cfg: &WriteConfig,
        _upsert: bool,
    ) -> i32 {
        ErrorCode::NotSupported.code()
    }

    /// Direct batch write; one code per item (a size of 0 -> -600 for that item).
    ///
    /// # Safety
    /// Every `ptrs[i]..+sizes[i]` must be readable for the duration of the call.
    pub unsafe fn batch_put_from(
        &self,
        keys: &[String],
        _ptrs: &[usize],
        _sizes: &[usize],
        _cfg: &WriteConfig,
        _upsert: bool,
    ) -> Vec<i32> {
        vec![ErrorCode::NotSupported.code(); keys.len()]
    }

    /// Staged read (get/get_buffer): needs local-buffer space for the value.
    pub fn get(&self, _key: &str) -> Result<StagedValue, ErrorCode> {
        Err(ErrorCode::NotSupported)
    }

    /// Staged batch read.
    pub fn get_batch(&self, keys: &[String]) -> Vec<Result<StagedValue, ErrorCode>> {
        keys.iter().map(|_| Err(ErrorCode::NotSupported)).collect()
    }

    /// Read into caller memory; returns the object size or a negative code
    /// (-600 when `size` is smaller than the object, buffer untouched).
    ///
    /// # Safety
    /// `ptr..ptr+size` must be writable for the duration of the call.
    pub unsafe fn get_into(&self, _key: &str, _ptr: usize, _size: usize) -> i64 {
        ErrorCode::NotSupported.code() as i64
    }

    /// Batch read into caller memory; per item as `get_into`.
    ///
    /// # Safety
    /// Every `ptrs[i]..+sizes[i]` must be writable for the duration of the call.
    pub unsafe fn batch_get_into(
        &self,
        keys: &[String],
        _ptrs: &[usize],
        _sizes: &[usize],
    ) -> Vec<i64> {
        vec![ErrorCode::NotSupported.code() as i64; keys.len()]
    }

    /// Buffer-major ranged reads (spec §2.5 `get_into_ranges`). Destinations
    /// must lie in a registered region; results mirror `dst_offsets`.
    ///
    /// # Safety
    /// Registered regions must stay valid (the caller registered them).
    #[allow(clippy::type_complexity)]
    pub unsafe fn get_into_ranges(
        &self,
        buffer_ptrs: &[usize],
        keys: &[Vec<String>],
        dst_offsets: &[Vec<Vec<u64>>],
        _src_offsets: &[Vec<Vec<u64>>],
        _sizes: &[Vec<Vec<u64>>],
    ) -> Vec<Vec<Vec<i64>>> {
        let _ = (buffer_ptrs, keys);
        dst_offsets
            .iter()
            .map(|g| {
                g.iter()
                    .map(|f| vec![ErrorCode::NotSupported.code() as i64; f.len()])
                    .collect()
            })
            .collect()
    }

    /// Object size (grants a lease) or a negative code.
    pub fn get_size(&self, _key: &str) -> i64 {
        ErrorCode::NotSupported.code() as i64
    }

    /// 1/0 per key, negative on error (grants a lease on 1).
    pub fn is_exist(&self, keys: &[String]) -> Vec<i32> {
        vec![ErrorCode::NotSupported.code(); keys.len()]
    }

    /// Remove per key (0, -704, -706, -703).
    pub fn remove(&self, keys: &[String], _force: bool) -> Vec<i32> {
        vec![ErrorCode::NotSupported.code(); keys.len()]
    }

    /// Count removed, or -600 for an invalid pattern.
    pub fn remove_by_regex(&self, _pattern: &str, _force: bool) -> i64 {
        ErrorCode::NotSupported.code() as i64
    }

    /// Count removed.
    pub fn remove_all(&self, _force: bool) -> i64 {
        ErrorCode::NotSupported.code() as i64
    }

    /// Register `[ptr, ptr+size)`; -600 on overlap or size 0.
    pub fn register_buffer(&self, _ptr: usize, _size: usize) -> i32 {
        ErrorCode::NotSupported.code()
    }

    /// Unregister the region starting at `ptr`; -600 if none starts there.
    pub fn unregister_buffer(&self, _ptr: usize) -> i32 {
        ErrorCode::NotSupported.code()
    }
}
