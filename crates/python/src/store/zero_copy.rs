//! Zero-copy API: `register_buffer`, `unregister_buffer`, `put_from`,
//! `upsert_from`, `get_into`, `batch_put_from`, `batch_upsert_from`,
//! `batch_get_into` and `get_into_ranges`.
//!
//! Pointers are caller-provided addresses, trusted as upstream does; the
//! binding only checks shapes, keys and configs before the client call.

use super::args::{plain, UInt};
use super::batch::Plan;
use super::bytes_api::write_config;
use super::class::{MooncakeDistributedStore, NOT_SET_UP};
use super::config::ReplicateConfig;
use super::log;
use mooncake_common::ErrorCode;
use pyo3::prelude::*;

const INVALID: i32 = ErrorCode::InvalidParams as i32;

/// `code` in every fragment slot of `dst` (shape of `all_dst_offsets`),
/// with `n_buffers` outer entries.
fn fill_like(dst: &[Vec<Vec<UInt>>], n_buffers: usize, code: i64) -> Vec<Vec<Vec<i64>>> {
    (0..n_buffers)
        .map(|i| {
            dst.get(i)
                .map(|groups| groups.iter().map(|f| vec![code; f.len()]).collect())
                .unwrap_or_default()
        })
        .collect()
}

impl MooncakeDistributedStore {
    fn write_from(
        &self,
        py: Python<'_>,
        method: &str,
        (key, ptr, size): (String, UInt, UInt),
        config: Option<PyRef<'_, ReplicateConfig>>,
        upsert: bool,
    ) -> i32 {
        let Some(client) = self.client_or_log(py, method, Some(&key)) else {
            return NOT_SET_UP;
        };
        if key.is_empty() {
            log::fail(py, method, Some(&key), INVALID as i64, "empty key");
            return INVALID;
        }
        let cfg = match write_config(config.as_ref(), None) {
            Ok(cfg) => cfg,
            Err((code, why)) => {
                log::fail(py, method, Some(&key), code.code() as i64, why);
                return code.code();
            }
        };
        drop(config);
        // SAFETY: the caller vouches for `ptr..ptr+size` (upstream contract).
        let rc = py.allow_threads(|| unsafe {
            client.put_from(&key, ptr.usize(), size.usize(), &cfg, upsert)
        });
        if rc < 0 {
            log::fail(py, method, Some(&key), rc as i64, "");
        }
        rc
    }

    fn write_from_batch(
        &self,
        py: Python<'_>,
        method: &str,
        (keys, ptrs, sizes): (Vec<String>, Vec<UInt>, Vec<UInt>),
        config: Option<PyRef<'_, ReplicateConfig>>,
        upsert: bool,
    ) -> Vec<i32> {
        let n = keys.len();
        if n == 0 && ptrs.is_empty() && sizes.is_empty() {
            return Vec::new();
        }
        let Some(client) = self.client_or_log_all(py, method, n) else {
            return vec![NOT_SET_UP; n];
        };
        if ptrs.len() != n || sizes.len() != n {
            log::fail_all(
                py,
                method,
                n,
                INVALID as i64,
                "keys, buffer_ptrs and sizes differ in length",
            );
            return vec![INVALID; n];
        }
        let cfg = match write_config(config.as_ref(), Some(n)) {
            Ok(cfg) => cfg,
            Err((code, why)) => {
                log::fail_all(py, method, n, code.code() as i64, why);
                return vec![code.code(); n];
            }
        };
        drop(config);
        let plan = Plan::new(
            keys.iter()
                .zip(&sizes)
                .map(|(k, s)| (k.is_empty() || s.0 == 0).then_some(INVALID as i64))
                .collect(),
        );
        let (k, p, s) = (
            plan.pick(&keys),
            plain(&plan.pick(&ptrs)),
            plain(&plan.pick(&sizes)),
        );
        let p: Vec<usize> = p.into_iter().map(|v| v as usize).collect();
        let s: Vec<usize> = s.into_iter().map(|v| v as usize).collect();
        let answers = if k.is_empty() {
            Vec::new()
        } else {
            // SAFETY: the caller vouches for every `ptr..ptr+size` (upstream contract).
            py.allow_threads(|| unsafe { client.batch_put_from(&k, &p, &s, &cfg, upsert) })
        };
        let merged = plan.merge(answers, |c| c as i32);
        log::fail_codes(py, method, &keys, &merged);
        merged
    }
}

#[pymethods]
impl MooncakeDistributedStore {
    /// Register `[buffer_ptr, buffer_ptr+size)` for `get_into_ranges`; -600 on overlap.
    fn register_buffer(&self, py: Python<'_>, buffer_ptr: UInt, size: UInt) -> i32 {
        let Some(client) = self.client_or_log(py, "register_buffer", None) else {
            return NOT_SET_UP;
        };
        let rc = py.allow_threads(|| client.register_buffer(buffer_ptr.usize(), size.usize()));
        if rc < 0 {
            let detail = format!("buffer {:#x} size {}", buffer_ptr.0, size.0);
            log::fail(py, "register_buffer", None, rc as i64, &detail);
        }
        rc
    }

    /// Unregister the region starting at `buffer_ptr`; -600 if none starts there.
    fn unregister_buffer(&self, py: Python<'_>, buffer_ptr: UInt) -> i32 {
        let Some(client) = self.client_or_log(py, "unregister_buffer", None) else {
            return NOT_SET_UP;
        };
        let rc = py.allow_threads(|| client.unregister_buffer(buffer_ptr.usize()));
        if rc < 0 {
            let detail = format!("buffer {:#x}", buffer_ptr.0);
            log::fail(py, "unregister_buffer", None, rc as i64, &detail);
        }
        rc
    }

    /// Store `size` bytes at `buffer_ptr` under `key` (no staging); `size == 0` -> 0.
    #[pyo3(signature = (key, buffer_ptr, size, config=None))]
    fn put_from(
        &self,
        py: Python<'_>,
        key: String,
        buffer_ptr: UInt,
        size: UInt,
        config: Option<PyRef<'_, ReplicateConfig>>,
    ) -> i32 {
        self.write_from(py, "put_from", (key, buffer_ptr, size), config, false)
    }

    /// Insert or replace `key` from `size` bytes at `buffer_ptr`.
    #[pyo3(signature = (key, buffer_ptr, size, config=None))]
    fn upsert_from(
        &self,
        py: Python<'_>,
        key: String,
        buffer_ptr: UInt,
        size: UInt,
        config: Option<PyRef<'_, ReplicateConfig>>,
    ) -> i32 {
        self.write_from(py, "upsert_from", (key, buffer_ptr, size), config, true)
    }

    /// Read `key` into `buffer_ptr`; the object size, or a negative code.
    fn get_into(&self, py: Python<'_>, key: String, buffer_ptr: UInt, size: UInt) -> i64 {
        let Some(client) = self.client_or_log(py, "get_into", Some(&key)) else {
            return NOT_SET_UP as i64;
        };
        if key.is_empty() {
            log::fail(py, "get_into", Some(&key), INVALID as i64, "empty key");
            return INVALID as i64;
        }
        // SAFETY: the caller vouches for `ptr..ptr+size` being writable.
        let rc =
            py.allow_threads(|| unsafe { client.get_into(&key, buffer_ptr.usize(), size.usize()) });
        if rc < 0 {
            log::fail(py, "get_into", Some(&key), rc, "");
        }
        rc
    }

    /// `put_from` per item; any length mismatch -> all -600.
    #[pyo3(signature = (keys, buffer_ptrs, sizes, config=None))]
    fn batch_put_from(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        buffer_ptrs: Vec<UInt>,
        sizes: Vec<UInt>,
        config: Option<PyRef<'_, ReplicateConfig>>,
    ) -> Vec<i32> {
        self.write_from_batch(
            py,
            "batch_put_from",
            (keys, buffer_ptrs, sizes),
            config,
            false,
        )
    }

    /// `upsert_from` per item; any length mismatch -> all -600.
    #[pyo3(signature = (keys, buffer_ptrs, sizes, config=None))]
    fn batch_upsert_from(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        buffer_ptrs: Vec<UInt>,
        sizes: Vec<UInt>,
        config: Option<PyRef<'_, ReplicateConfig>>,
    ) -> Vec<i32> {
        self.write_from_batch(
            py,
            "batch_upsert_from",
            (keys, buffer_ptrs, sizes),
            config,
            true,
        )
    }

    /// `get_into` per item; any length mismatch -> all -600.
    fn batch_get_into(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        buffer_ptrs: Vec<UInt>,
        sizes: Vec<UInt>,
    ) -> Vec<i64> {
        let n = keys.len();
        if n == 0 && buffer_ptrs.is_empty() && sizes.is_empty() {
            return Vec::new();
        }
        let Some(client) = self.client_or_log_all(py, "batch_get_into", n) else {
            return vec![NOT_SET_UP as i64; n];
        };
        if buffer_ptrs.len() != n || sizes.len() != n {
            let why = "keys, buffer_ptrs and sizes differ in length";
            log::fail_all(py, "batch_get_into", n, INVALID as i64, why);
            return vec![INVALID as i64; n];
        }
        let plan = Plan::reject_empty_keys(&keys);
        let k = plan.pick(&keys);
        let p: Vec<usize> = plan.pick(&buffer_ptrs).iter().map(|u| u.usize()).collect();
        let s: Vec<usize> = plan.pick(&sizes).iter().map(|u| u.usize()).collect();
        let answers = if k.is_empty() {
            Vec::new()
        } else {
            // SAFETY: the caller vouches for every `ptr..ptr+size` being writable.
            py.allow_threads(|| unsafe { client.batch_get_into(&k, &p, &s) })
        };
        let merged = plan.merge(answers, |c| c);
        log::fail_codes(py, "batch_get_into", &keys, &merged);
        merged
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
        const METHOD: &str = "get_into_ranges";
        let n = buffer_ptrs.len();
        let invalid = INVALID as i64;
        let Some(client) = self.client_or_log_all(py, METHOD, n) else {
            return fill_like(&all_dst_offsets, n, NOT_SET_UP as i64);
        };
        if all_keys.len() != n
            || all_dst_offsets.len() != n
            || all_src_offsets.len() != n
            || all_sizes.len() != n
        {
            let why = "buffer_ptrs, all_keys and the offset/size lists differ in length";
            log::fail_all(py, METHOD, n, invalid, why);
            return fill_like(&all_dst_offsets, n, invalid);
        }
        // Sanitised copy for the client: rejected buffers/groups are emptied
        // and their result slots overwritten afterwards.
        let mut keys = all_keys.clone();
        let mut dst: Vec<Vec<Vec<u64>>> = Vec::with_capacity(n);
        let mut src: Vec<Vec<Vec<u64>>> = Vec::with_capacity(n);
        let mut sizes: Vec<Vec<Vec<u64>>> = Vec::with_capacity(n);
        // (buffer, Some(group), or None for the whole buffer)
        let mut rejected: Vec<(usize, Option<usize>)> = Vec::new();
        for i in 0..n {
            let groups = all_dst_offsets[i].len();
            if all_keys[i].len() != groups
                || all_src_offsets[i].len() != groups
                || all_sizes[i].len() != groups
            {
                rejected.push((i, None));
                keys[i].clear();
                dst.push(Vec::new());
                src.push(Vec::new());
                sizes.push(Vec::new());
                continue;
            }
            let (mut d_i, mut s_i, mut z_i) = (Vec::new(), Vec::new(), Vec::new());
            for j in 0..groups {
                let (d, s, z) = (
                    &all_dst_offsets[i][j],
                    &all_src_offsets[i][j],
                    &all_sizes[i][j],
                );
                if d.len() != s.len() || d.len() != z.len() || all_keys[i][j].is_empty() {
                    rejected.push((i, Some(j)));
                    d_i.push(Vec::new());
                    s_i.push(Vec::new());
                    z_i.push(Vec::new());
                } else {
                    d_i.push(plain(d));
                    s_i.push(plain(s));
                    z_i.push(plain(z));
                }
            }
            dst.push(d_i);
            src.push(s_i);
            sizes.push(z_i);
        }
        let ptrs: Vec<usize> = buffer_ptrs.iter().map(|u| u.usize()).collect();
        // SAFETY: registered regions are the caller's; the client checks
        // every destination against them.
        let answers = py
            .allow_threads(|| unsafe { client.get_into_ranges(&ptrs, &keys, &dst, &src, &sizes) });
        // Shape the result like the caller's `all_dst_offsets`.
        let internal = ErrorCode::InternalError.code() as i64;
        let mut result: Vec<Vec<Vec<i64>>> = all_dst_offsets
            .iter()
            .enumerate()
            .map(|(i, groups)| {
                groups
                    .iter()
                    .enumerate()
                    .map(|(j, frags)| {
                        let got = answers.get(i).and_then(|g| g.get(j));
                        (0..frags.len())
                            .map(|k| got.and_then(|f| f.get(k)).copied().unwrap_or(internal))
                            .collect()
                    })
                    .collect()
            })
            .collect();
        for &(i, group) in &rejected {
            match group {
                Some(j) => result[i][j].iter_mut().for_each(|c| *c = invalid),
                None => result[i].iter_mut().flatten().for_each(|c| *c = invalid),
            }
        }
        let mut failures: Vec<(&str, i64)> = Vec::new();
        let mut total = 0;
        for (i, groups) in result.iter().enumerate() {
            for (j, frags) in groups.iter().enumerate() {
                let key = all_keys[i].get(j).map_or("", String::as_str);
                total += frags.len();
                failures.extend(frags.iter().filter(|c| **c < 0).map(|c| (key, *c)));
            }
        }
        log::fail_batch(py, METHOD, &failures, total);
        result
    }
}
