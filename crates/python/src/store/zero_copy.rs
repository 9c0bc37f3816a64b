//! The zero-copy methods: `register_buffer`,
//! `unregister_buffer`, `put_from`, `upsert_from`, `get_into`,
//! `batch_put_from`, `batch_upsert_from`, `batch_get_into`,
//! `batch_put_from_multi_buffers`, `batch_get_into_multi_buffers` and
//! `get_into_ranges`.
//!
//! Pointers are caller-provided addresses, trusted as upstream does; every
//! rule about them (lengths, sizes, registered regions, result shapes) is
//! the client's.

use super::class::MooncakeDistributedStore;
use super::config::{options, ReplicateConfig};
use crate::args::{plain, Flag, UInt};
use crate::report::{Call, IntoCode};
use mooncake_client::ranges_failed;
use pyo3::prelude::*;

/// Caller addresses or sizes as `usize` (lossless on 64-bit targets).
fn addrs(v: &[UInt]) -> Vec<usize> {
    v.iter().map(|u| u.usize()).collect()
}

/// Per-key lists of caller addresses or sizes as `usize`.
fn addrs2(v: &[Vec<UInt>]) -> Vec<Vec<usize>> {
    v.iter().map(|l| addrs(l)).collect()
}

impl MooncakeDistributedStore {
    fn write_from(
        &self,
        call: Call<'_>,
        (key, ptr, size): (String, UInt, UInt),
        config: Option<ReplicateConfig>,
        upsert: bool,
    ) -> i64 {
        let cfg = options(config);
        // SAFETY: the caller vouches for `ptr..ptr+size` (upstream contract).
        let r = self.run(call.py(), |c| unsafe {
            c.put_from(&key, ptr.usize(), size.usize(), &cfg, upsert)
        });
        call.code(Some(&key), r)
    }

    fn write_from_batch(
        &self,
        call: Call<'_>,
        (keys, ptrs, sizes): (Vec<String>, Vec<UInt>, Vec<UInt>),
        config: Option<ReplicateConfig>,
        upsert: bool,
    ) -> Vec<i64> {
        let cfg = options(config);
        let (ptrs, sizes) = (addrs(&ptrs), addrs(&sizes));
        // SAFETY: the caller vouches for every `ptr..ptr+size` (upstream contract).
        let r = self.run(call.py(), |c| unsafe {
            c.batch_put_from(&keys, &ptrs, &sizes, &cfg, upsert)
        });
        call.codes(&keys, r)
    }
}

#[pymethods]
impl MooncakeDistributedStore {
    /// Register `[buffer_ptr, buffer_ptr+size)` for `get_into_ranges`; -600 on overlap.
    fn register_buffer(&self, py: Python<'_>, buffer_ptr: UInt, size: UInt) -> i64 {
        let r = self.run(py, |c| c.register_buffer(buffer_ptr.usize(), size.usize()));
        Call::new(py, "register_buffer").code(None, r)
    }

    /// Unregister the region starting at `buffer_ptr`; -600 if none starts there.
    fn unregister_buffer(&self, py: Python<'_>, buffer_ptr: UInt) -> i64 {
        let r = self.run(py, |c| c.unregister_buffer(buffer_ptr.usize()));
        Call::new(py, "unregister_buffer").code(None, r)
    }

    /// Store `size` bytes at `buffer_ptr` under `key` (no staging); `size == 0` -> 0.
    #[pyo3(signature = (key, buffer_ptr, size, config=None))]
    fn put_from(
        &self,
        py: Python<'_>,
        key: String,
        buffer_ptr: UInt,
        size: UInt,
        config: Option<ReplicateConfig>,
    ) -> i64 {
        let call = Call::new(py, "put_from");
        self.write_from(call, (key, buffer_ptr, size), config, false)
    }

    /// Insert or replace `key` from `size` bytes at `buffer_ptr`.
    #[pyo3(signature = (key, buffer_ptr, size, config=None))]
    fn upsert_from(
        &self,
        py: Python<'_>,
        key: String,
        buffer_ptr: UInt,
        size: UInt,
        config: Option<ReplicateConfig>,
    ) -> i64 {
        let call = Call::new(py, "upsert_from");
        self.write_from(call, (key, buffer_ptr, size), config, true)
    }

    /// Read `key` into `buffer_ptr`; the object size, or a negative code.
    fn get_into(&self, py: Python<'_>, key: String, buffer_ptr: UInt, size: UInt) -> i64 {
        // SAFETY: the caller vouches for `ptr..ptr+size` being writable.
        let r = self.run(py, |c| unsafe {
            c.get_into(&key, buffer_ptr.usize(), size.usize())
        });
        Call::new(py, "get_into").code(Some(&key), r)
    }

    /// `put_from` per item; any length mismatch -> all -600.
    #[pyo3(signature = (keys, buffer_ptrs, sizes, config=None))]
    fn batch_put_from(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        buffer_ptrs: Vec<UInt>,
        sizes: Vec<UInt>,
        config: Option<ReplicateConfig>,
    ) -> Vec<i64> {
        let call = Call::new(py, "batch_put_from");
        self.write_from_batch(call, (keys, buffer_ptrs, sizes), config, false)
    }

    /// `upsert_from` per item; any length mismatch -> all -600.
    #[pyo3(signature = (keys, buffer_ptrs, sizes, config=None))]
    fn batch_upsert_from(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        buffer_ptrs: Vec<UInt>,
        sizes: Vec<UInt>,
        config: Option<ReplicateConfig>,
    ) -> Vec<i64> {
        let call = Call::new(py, "batch_upsert_from");
        self.write_from_batch(call, (keys, buffer_ptrs, sizes), config, true)
    }

    /// `get_into` per item; any length mismatch -> all -600.
    fn batch_get_into(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        buffer_ptrs: Vec<UInt>,
        sizes: Vec<UInt>,
    ) -> Vec<i64> {
        let (ptrs, sizes) = (addrs(&buffer_ptrs), addrs(&sizes));
        // SAFETY: the caller vouches for every `ptr..ptr+size` being writable.
        let r = self.run(py, |c| unsafe { c.batch_get_into(&keys, &ptrs, &sizes) });
        Call::new(py, "batch_get_into").codes(&keys, r)
    }

    /// Store each key's buffers, concatenated, as its value; 0 or a code per key.
    #[pyo3(signature = (keys, all_buffer_ptrs, all_sizes, config=None))]
    fn batch_put_from_multi_buffers(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        all_buffer_ptrs: Vec<Vec<UInt>>,
        all_sizes: Vec<Vec<UInt>>,
        config: Option<ReplicateConfig>,
    ) -> Vec<i64> {
        let cfg = options(config);
        let (ptrs, sizes) = (addrs2(&all_buffer_ptrs), addrs2(&all_sizes));
        // SAFETY: the caller vouches for every buffer (upstream contract).
        let r = self.run(py, |c| unsafe {
            c.batch_put_from_multi_buffers(&keys, &ptrs, &sizes, &cfg)
        });
        Call::new(py, "batch_put_from_multi_buffers").codes(&keys, r)
    }

    /// Read each key's value into its buffers, in order; the size or a code per key.
    #[pyo3(signature = (keys, all_buffer_ptrs, all_sizes, prefer_alloc_in_same_node=Flag(false)))]
    fn batch_get_into_multi_buffers(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        all_buffer_ptrs: Vec<Vec<UInt>>,
        all_sizes: Vec<Vec<UInt>>,
        prefer_alloc_in_same_node: Flag,
    ) -> Vec<i64> {
        let (ptrs, sizes) = (addrs2(&all_buffer_ptrs), addrs2(&all_sizes));
        let same_node = prefer_alloc_in_same_node.0;
        // SAFETY: the caller vouches for every buffer being writable.
        let r = self.run(py, |c| unsafe {
            c.batch_get_into_multi_buffers(&keys, &ptrs, &sizes, same_node)
        });
        Call::new(py, "batch_get_into_multi_buffers").codes(&keys, r)
    }

    /// Buffer-major ranged reads; the result mirrors `all_dst_offsets`.
    fn get_into_ranges(
        &self,
        py: Python<'_>,
        buffer_ptrs: Vec<UInt>,
        all_keys: Vec<Vec<String>>,
        all_dst_offsets: Vec<Vec<Vec<UInt>>>,
        all_src_offsets: Vec<Vec<Vec<UInt>>>,
        all_sizes: Vec<Vec<Vec<UInt>>>,
    ) -> Vec<Vec<Vec<i64>>> {
        let plain3 = |v: &[Vec<Vec<UInt>>]| -> Vec<Vec<Vec<u64>>> {
            v.iter()
                .map(|g| g.iter().map(|f| plain(f)).collect())
                .collect()
        };
        let (dst, src, sizes) = (
            plain3(&all_dst_offsets),
            plain3(&all_src_offsets),
            plain3(&all_sizes),
        );
        let ptrs = addrs(&buffer_ptrs);
        let r = self.run(py, |c| {
            // SAFETY: registered regions are the caller's; the client checks
            // every destination against them.
            Ok(unsafe { c.get_into_ranges(&ptrs, &all_keys, &dst, &src, &sizes) })
        });
        let ranges = r.unwrap_or_else(|e| ranges_failed(&dst, ptrs.len(), &e));
        // One log line for every failed fragment of the call.
        let mut failures = Vec::new();
        let mut total = 0;
        for (i, groups) in ranges.iter().enumerate() {
            for (j, frags) in groups.iter().enumerate() {
                let key = all_keys
                    .get(i)
                    .and_then(|k| k.get(j))
                    .map_or("", String::as_str);
                total += frags.len();
                failures.extend(
                    frags
                        .iter()
                        .filter_map(|r| r.as_ref().err().map(|e| (key, e))),
                );
            }
        }
        Call::new(py, "get_into_ranges").fail_items(&failures, total);
        ranges
            .into_iter()
            .map(|groups| {
                groups
                    .into_iter()
                    .map(|frags| {
                        frags
                            .into_iter()
                            .map(|r| {
                                r.map_or_else(|e| i64::from(e.code().code()), IntoCode::into_code)
                            })
                            .collect()
                    })
                    .collect()
            })
            .collect()
    }
}
