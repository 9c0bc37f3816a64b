//! Put/get sessions and ranged multi-buffer transfers:
//! `batch_put_session_start`, `batch_put_from_multi_buffer_ranges`,
//! `batch_put_session_end`, `batch_put_session_revoke`,
//! `batch_get_session_start`, `batch_get_into_multi_buffer_ranges` and
//! `batch_get_session_end` (upstream's names, argument order and return
//! shapes). The session tables and every rule live in the client crate
//! (`mooncake_client`, module `sessions`); this module only converts.

use super::class::MooncakeDistributedStore;
use super::config::{options, ReplicateConfig};
use crate::args::{plain, UInt};
use crate::report::Call;
use pyo3::prelude::*;

/// Per-key lists of caller addresses, sizes or offsets as `usize`
/// (lossless on 64-bit targets).
fn addrs2(v: &[Vec<UInt>]) -> Vec<Vec<usize>> {
    v.iter()
        .map(|l| l.iter().map(|u| u.usize()).collect())
        .collect()
}

#[pymethods]
impl MooncakeDistributedStore {
    /// Start a put session: reserve objects without transfer; 0 or a code per key.
    #[pyo3(signature = (keys, sizes, config=None))]
    fn batch_put_session_start(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        sizes: Vec<UInt>,
        config: Option<ReplicateConfig>,
    ) -> Vec<i64> {
        let cfg = options(config);
        let sizes = plain(&sizes);
        let r = self.run(py, |c| c.batch_put_session_start(&keys, &sizes, &cfg));
        Call::new(py, "batch_put_session_start").codes(&keys, r)
    }

    /// Ranged put from multiple buffers using a put session; bytes written
    /// or a code per key.
    fn batch_put_from_multi_buffer_ranges(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        all_buffer_ptrs: Vec<Vec<UInt>>,
        all_sizes: Vec<Vec<UInt>>,
        all_dst_offsets: Vec<Vec<UInt>>,
    ) -> Vec<i64> {
        let (ptrs, sizes, offs) = (
            addrs2(&all_buffer_ptrs),
            addrs2(&all_sizes),
            addrs2(&all_dst_offsets),
        );
        // SAFETY: the caller vouches for every source buffer (upstream contract).
        let r = self.run(py, |c| unsafe {
            c.batch_put_from_multi_buffer_ranges(&keys, &ptrs, &sizes, &offs)
        });
        Call::new(py, "batch_put_from_multi_buffer_ranges").codes(&keys, r)
    }

    /// Complete a put session and make objects readable; 0 or a code per key.
    fn batch_put_session_end(&self, py: Python<'_>, keys: Vec<String>) -> Vec<i64> {
        let r = self.run(py, |c| Ok(c.batch_put_session_end(&keys)));
        Call::new(py, "batch_put_session_end").codes(&keys, r)
    }

    /// Revoke an incomplete put session; 0 or a code per key.
    fn batch_put_session_revoke(&self, py: Python<'_>, keys: Vec<String>) -> Vec<i64> {
        let r = self.run(py, |c| Ok(c.batch_put_session_revoke(&keys)));
        Call::new(py, "batch_put_session_revoke").codes(&keys, r)
    }

    /// Start a get session: query replicas once and cache them; 0 or a
    /// code per key.
    fn batch_get_session_start(&self, py: Python<'_>, keys: Vec<String>) -> Vec<i64> {
        let r = self.run(py, |c| Ok(c.batch_get_session_start(&keys)));
        Call::new(py, "batch_get_session_start").codes(&keys, r)
    }

    /// Ranged get into multiple buffers using a get session; bytes read or
    /// a code per key.
    fn batch_get_into_multi_buffer_ranges(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        all_buffer_ptrs: Vec<Vec<UInt>>,
        all_sizes: Vec<Vec<UInt>>,
        all_src_offsets: Vec<Vec<UInt>>,
    ) -> Vec<i64> {
        let (ptrs, sizes, offs) = (
            addrs2(&all_buffer_ptrs),
            addrs2(&all_sizes),
            addrs2(&all_src_offsets),
        );
        // SAFETY: the caller vouches for every destination buffer being
        // writable (upstream contract).
        let r = self.run(py, |c| unsafe {
            c.batch_get_into_multi_buffer_ranges(&keys, &ptrs, &sizes, &offs)
        });
        Call::new(py, "batch_get_into_multi_buffer_ranges").codes(&keys, r)
    }

    /// End a get session and drop cached replica metadata; 0 (or -600
    /// when not set up).
    fn batch_get_session_end(&self, py: Python<'_>, keys: Vec<String>) -> i64 {
        let r = self.run(py, |c| c.batch_get_session_end(&keys));
        Call::new(py, "batch_get_session_end").code(None, r)
    }
}
