//! The zero-copy methods: `register_buffer`,
//! `unregister_buffer`, `put_from`, `upsert_from`, `get_into`,
//! `batch_put_from`, `batch_upsert_from`, `batch_get_into`,
//! `batch_put_from_multi_buffers`, `batch_get_into_multi_buffers`, the
//! ranged `batch_put_from_multi_buffer_ranges` and
//! `batch_get_into_multi_buffer_ranges` (within a session) and
//! `get_into_ranges`.
//!
//! Pointers are caller-provided addresses, trusted as upstream does; every
//! rule about them (lengths, sizes, registered regions, result shapes) is
//! the client's. CUDA device buffers of `put_from`, `get_into` and their
//! batch forms are staged through host memory (`device_staging`).

use super::class::MooncakeDistributedStore;
use super::class::Store;
use super::config::{options, ReplicateConfig};
use crate::args::{addrs, addrs2, plain, Flag, UInt};
use crate::family::method_family;
use crate::report::{Call, IntoCode};
use mooncake_client::device_staging::{
    get_one_staged, get_staged, host_only, nested_staged, put_staged,
};
use mooncake_client::{ranges_failed, Dst, Dsts, MemLists, Src, Srcs};
use pyo3::prelude::*;

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
            put_staged(&[ptr.usize()], &[size.usize()], |p| {
                c.put_from(&key, Src::new(p[0], size.usize()), &cfg, upsert)
            })
        });
        call.code(Some(&key), r)
    }
}

method_family! {
    #[pyo3(signature = (key, buffer_ptr, size, config=None))]
    fn method(
        &self,
        py: Python<'_>,
        key: String,
        buffer_ptr: UInt,
        size: UInt,
        config: Option<ReplicateConfig>,
    ) -> i64 {
        self.write_from(Call::new(py, method), (key, buffer_ptr, size), config, upsert)
    }
    #[pymethods] for MooncakeDistributedStore {
        /// Store `size` bytes at `buffer_ptr` under `key` (no staging); `size == 0` -> 0.
        put_from { upsert: false }
        /// Insert or replace `key` from `size` bytes at `buffer_ptr`.
        upsert_from { upsert: true }
    }
}

method_family! {
    #[pyo3(signature = (keys, buffer_ptrs, sizes, config=None))]
    fn method(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        buffer_ptrs: Vec<UInt>,
        sizes: Vec<UInt>,
        config: Option<ReplicateConfig>,
    ) -> Vec<i64> {
        let cfg = options(config);
        let (ptrs, sizes) = (addrs(&buffer_ptrs), addrs(&sizes));
        // SAFETY: the caller vouches for every `ptr..ptr+size` (upstream contract).
        let r = self.run(py, |c| unsafe {
            put_staged(&ptrs, &sizes, |p| {
                c.batch_put_from(&keys, Srcs { ptrs: p, sizes: &sizes }, &cfg, upsert)
            })
        });
        Call::new(py, method).codes(&keys, r)
    }
    #[pymethods] for MooncakeDistributedStore {
        /// `put_from` per item; any length mismatch -> all -600.
        batch_put_from { upsert: false }
        /// `upsert_from` per item; any length mismatch -> all -600.
        batch_upsert_from { upsert: true }
    }
}

method_family! {
    fn method(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        all_buffer_ptrs: Vec<Vec<UInt>>,
        all_sizes: Vec<Vec<UInt>>,
    ) -> Vec<i64> {
        let (ptrs, sizes) = (addrs2(&all_buffer_ptrs), addrs2(&all_sizes));
        let read = method.contains("get");
        // SAFETY: the caller vouches for every buffer: readable for a put,
        // writable for a get (upstream contract).
        let r = self.run(py, |c| unsafe {
            nested_staged(&ptrs, &sizes, read, |p| {
                transfer(c, &keys, MemLists { ptrs: p, sizes: &sizes }, extra)
            })
        });
        Call::new(py, method).codes(&keys, r)
    }
    #[pymethods] for MooncakeDistributedStore {
        /// Store each key's buffers, concatenated, as its value; 0 or a code per key.
        #[pyo3(signature = (keys, all_buffer_ptrs, all_sizes, config=None))]
        batch_put_from_multi_buffers(config: Option<ReplicateConfig>) {
            extra: &options(config),
            transfer: Store::batch_put_from_multi_buffers,
        }
        /// Read each key's value into its buffers, in order; the size or a code per key.
        #[pyo3(signature = (keys, all_buffer_ptrs, all_sizes, prefer_alloc_in_same_node=Flag(false)))]
        batch_get_into_multi_buffers(prefer_alloc_in_same_node: Flag) {
            extra: prefer_alloc_in_same_node.0,
            transfer: Store::batch_get_into_multi_buffers,
        }
        /// Ranged put from multiple buffers using a put session; bytes written
        /// or a code per key.
        batch_put_from_multi_buffer_ranges(all_dst_offsets: Vec<Vec<UInt>>) {
            extra: &addrs2(&all_dst_offsets),
            transfer: Store::batch_put_from_multi_buffer_ranges,
        }
        /// Ranged get into multiple buffers using a get session; bytes read or
        /// a code per key.
        batch_get_into_multi_buffer_ranges(all_src_offsets: Vec<Vec<UInt>>) {
            extra: &addrs2(&all_src_offsets),
            transfer: Store::batch_get_into_multi_buffer_ranges,
        }
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

    /// Read `key` into `buffer_ptr`; the object size, or a negative code.
    fn get_into(&self, py: Python<'_>, key: String, buffer_ptr: UInt, size: UInt) -> i64 {
        // SAFETY: the caller vouches for `ptr..ptr+size` being writable.
        let r = self.run(py, |c| unsafe {
            get_one_staged(buffer_ptr.usize(), size.usize(), |p| {
                c.get_into(&key, Dst::new(p, size.usize()))
            })
        });
        Call::new(py, "get_into").code(Some(&key), r)
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
        let r = self.run(py, |c| unsafe {
            get_staged(&ptrs, &sizes, |p| {
                c.batch_get_into(
                    &keys,
                    Dsts {
                        ptrs: p,
                        sizes: &sizes,
                    },
                )
            })
        });
        Call::new(py, "batch_get_into").codes(&keys, r)
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
            host_only(&ptrs, "get_into_ranges")?;
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
