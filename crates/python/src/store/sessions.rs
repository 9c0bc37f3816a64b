//! Put/get sessions: `batch_put_session_start`, `batch_put_session_end`,
//! `batch_put_session_revoke`, `batch_get_session_start` and
//! `batch_get_session_end` (upstream's names, argument order and return
//! shapes); the ranged transfers within a session are in `zero_copy`. The session tables and every rule live in the client crate
//! (`mooncake_client`, module `sessions`); this module only converts.

use super::class::MooncakeDistributedStore;
use super::class::Store;
use super::config::{options, ReplicateConfig};
use crate::args::{plain, UInt};
use crate::family::method_family;
use crate::report::Call;
use pyo3::prelude::*;

method_family! {
    fn method(&self, py: Python<'_>, keys: Vec<String>) -> Vec<i64> {
        let r = self.run(py, |c| step(c, &keys));
        Call::new(py, method).codes(&keys, r)
    }
    #[pymethods] for MooncakeDistributedStore {
        /// Start a put session: reserve objects without transfer; 0 or a code per key.
        #[pyo3(signature = (keys, sizes, config=None))]
        batch_put_session_start(sizes: Vec<UInt>, config: Option<ReplicateConfig>) {
            cfg: options(config),
            sizes: plain(&sizes),
            step: |c: &Store, keys: &[String]| c.batch_put_session_start(keys, &sizes, &cfg),
        }
        /// Complete a put session and make objects readable; 0 or a code per key.
        batch_put_session_end {
            step: |c: &Store, keys: &[String]| Ok(c.batch_put_session_end(keys)),
        }
        /// Revoke an incomplete put session; 0 or a code per key.
        batch_put_session_revoke {
            step: |c: &Store, keys: &[String]| Ok(c.batch_put_session_revoke(keys)),
        }
        /// Start a get session: query replicas once and cache them; 0 or a
        /// code per key.
        batch_get_session_start {
            step: |c: &Store, keys: &[String]| Ok(c.batch_get_session_start(keys)),
        }
    }
}

#[pymethods]
impl MooncakeDistributedStore {
    /// End a get session and drop cached replica metadata; 0 (or -600
    /// when not set up).
    fn batch_get_session_end(&self, py: Python<'_>, keys: Vec<String>) -> i64 {
        let r = self.run(py, |c| c.batch_get_session_end(&keys));
        Call::new(py, "batch_get_session_end").code(None, r)
    }
}
