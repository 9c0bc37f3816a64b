//! The removal methods: `remove`, `batch_remove`,
//! `remove_by_regex`, `remove_all`, `batch_replica_clear`.

use super::class::MooncakeDistributedStore;
use crate::args::Flag;
use crate::report::Call;
use pyo3::prelude::*;

/// `force` as given (None, like upstream's bool conversion, means False).
fn force_flag(force: Option<Flag>) -> bool {
    force.is_some_and(|f| f.0)
}

#[pymethods]
impl MooncakeDistributedStore {
    /// 0, -704 missing, -706 leased (without `force`), -703 not all replicas complete.
    #[pyo3(signature = (key, force=None))]
    fn remove(&self, py: Python<'_>, key: String, force: Option<Flag>) -> i64 {
        let r = self.run(py, |c| c.remove(&key, force_flag(force)));
        Call::new(py, "remove").code(Some(&key), r)
    }

    /// `remove` per key; `[]` for `[]`.
    #[pyo3(signature = (keys, force=None))]
    fn batch_remove(&self, py: Python<'_>, keys: Vec<String>, force: Option<Flag>) -> Vec<i64> {
        let r = self.run(py, |c| Ok(c.batch_remove(&keys, force_flag(force))));
        Call::new(py, "batch_remove").codes(&keys, r)
    }

    /// Remove keys matching `regex_pattern` (search semantics); the count, or -600.
    #[pyo3(signature = (regex_pattern, force=None))]
    fn remove_by_regex(&self, py: Python<'_>, regex_pattern: String, force: Option<Flag>) -> i64 {
        let r = self.run(py, |c| c.remove_by_regex(&regex_pattern, force_flag(force)));
        Call::new(py, "remove_by_regex").code(None, r)
    }

    /// Remove every removable object; the count.
    #[pyo3(signature = (force=None))]
    fn remove_all(&self, py: Python<'_>, force: Option<Flag>) -> i64 {
        let r = self.run(py, |c| c.remove_all(force_flag(force)));
        Call::new(py, "remove_all").code(None, r)
    }

    /// Clear the replicas of those of `keys` this client wrote whose lease
    /// has run out: every replica (the object is removed) with the default
    /// `segment_name=""`, else those on that segment. Returns the keys
    /// cleared; unknown, leased, still-written or other clients' keys are
    /// skipped. A call that fails (not set up, master unreachable) returns
    /// `[]` and is logged.
    #[pyo3(signature = (keys, segment_name=String::new()))]
    fn batch_replica_clear(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        segment_name: String,
    ) -> Vec<String> {
        let r = self.run(py, |s| s.batch_replica_clear(&keys, &segment_name));
        Call::new(py, "batch_replica_clear")
            .ok(None, r)
            .unwrap_or_default()
    }
}
