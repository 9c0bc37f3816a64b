//! Removal: `remove`, `batch_remove`, `remove_by_regex`, `remove_all`.

use super::args::Flag;
use super::batch::Plan;
use super::class::{MooncakeDistributedStore, NOT_SET_UP};
use super::log;
use mooncake_common::ErrorCode;
use pyo3::prelude::*;

const INVALID: i32 = ErrorCode::InvalidParams as i32;

/// `force` as given (None, like upstream's bool conversion, means False).
fn force_flag(force: Option<Flag>) -> bool {
    force.is_some_and(|f| f.0)
}

#[pymethods]
impl MooncakeDistributedStore {
    /// 0, -704 missing, -706 leased (without `force`), -703 not all replicas complete.
    #[pyo3(signature = (key, force=None))]
    fn remove(&self, py: Python<'_>, key: String, force: Option<Flag>) -> i32 {
        let Some(client) = self.client_or_log(py, "remove", Some(&key)) else {
            return NOT_SET_UP;
        };
        if key.is_empty() {
            log::fail(py, "remove", Some(&key), INVALID as i64, "empty key");
            return INVALID;
        }
        let codes =
            py.allow_threads(|| client.remove(std::slice::from_ref(&key), force_flag(force)));
        let rc = codes
            .first()
            .copied()
            .unwrap_or(ErrorCode::InternalError.code());
        if rc < 0 {
            log::fail(py, "remove", Some(&key), rc as i64, "");
        }
        rc
    }

    /// `remove` per key; `[]` for `[]`.
    #[pyo3(signature = (keys, force=None))]
    fn batch_remove(&self, py: Python<'_>, keys: Vec<String>, force: Option<Flag>) -> Vec<i32> {
        if keys.is_empty() {
            return Vec::new();
        }
        let Some(client) = self.client_or_log_all(py, "batch_remove", keys.len()) else {
            return vec![NOT_SET_UP; keys.len()];
        };
        let plan = Plan::reject_empty_keys(&keys);
        let sent = plan.pick(&keys);
        let answers = if sent.is_empty() {
            Vec::new()
        } else {
            py.allow_threads(|| client.remove(&sent, force_flag(force)))
        };
        let merged = plan.merge(answers, |c| c as i32);
        log::fail_codes(py, "batch_remove", &keys, &merged);
        merged
    }

    /// Remove keys matching `regex_pattern` (search semantics); the count, or -600.
    #[pyo3(signature = (regex_pattern, force=None))]
    fn remove_by_regex(&self, py: Python<'_>, regex_pattern: String, force: Option<Flag>) -> i64 {
        let Some(client) = self.client_or_log(py, "remove_by_regex", None) else {
            return NOT_SET_UP as i64;
        };
        let n = py.allow_threads(|| client.remove_by_regex(&regex_pattern, force_flag(force)));
        if n < 0 {
            let detail = format!("pattern {}", log::show_key(&regex_pattern));
            log::fail(py, "remove_by_regex", None, n, &detail);
        }
        n
    }

    /// Remove every removable object; the count.
    #[pyo3(signature = (force=None))]
    fn remove_all(&self, py: Python<'_>, force: Option<Flag>) -> i64 {
        let Some(client) = self.client_or_log(py, "remove_all", None) else {
            return NOT_SET_UP as i64;
        };
        let n = py.allow_threads(|| client.remove_all(force_flag(force)));
        if n < 0 {
            log::fail(py, "remove_all", None, n, "");
        }
        n
    }
}
