//! Test-only simulation of the executor over an in-memory key -> bytes map:
//! applies write plans and runs the probe/resolve/read loop, counting probe
//! rounds, so planner rules are tested end to end without a master.

use crate::error::TensorResult;
use crate::read_plan::{
    resolve, Observations, Observed, ReadOutput, ReadRequest, Step, PROBE_PREFIX,
};
use crate::write_plan::{plan_write, WriteRoute, WriteSource};
use crate::TensorError;
use std::collections::BTreeMap;

/// An in-memory store.
#[derive(Default, Debug, Clone)]
pub(crate) struct MemStore {
    pub(crate) objs: BTreeMap<String, Vec<u8>>,
}

/// The result of a simulated read: the output description, the payload,
/// and how many probe rounds it took.
#[derive(Debug)]
pub(crate) struct ReadBack {
    pub(crate) output: ReadOutput,
    pub(crate) payload: Vec<u8>,
    pub(crate) rounds: usize,
}

impl MemStore {
    /// Write `bytes` (the source buffer) along `route`; `upsert` replaces
    /// existing objects, otherwise the first write wins (write-once).
    pub(crate) fn write(
        &mut self,
        key: &str,
        src: &WriteSource,
        bytes: &[u8],
        route: &WriteRoute,
        upsert: bool,
    ) -> TensorResult<()> {
        let plan = plan_write(key, src, route)?;
        for o in plan.objects {
            let mut v = o.inline.clone();
            for (off, len) in &o.runs {
                v.extend_from_slice(&bytes[*off as usize..(*off + *len) as usize]);
            }
            assert_eq!(v.len() as u64, o.size());
            if upsert || !self.objs.contains_key(&o.key) {
                self.objs.insert(o.key, v);
            }
        }
        Ok(())
    }

    /// Stored keys, sorted.
    pub(crate) fn keys(&self) -> Vec<String> {
        self.objs.keys().cloned().collect()
    }

    /// What a probe of `key` observes: its size and prefix, or missing.
    pub(crate) fn observe(&self, key: &str) -> Observed {
        match self.objs.get(key) {
            Some(v) => Observed::Found {
                size: v.len() as u64,
                prefix: v[..v.len().min(PROBE_PREFIX)].to_vec(),
                local: true,
            },
            None => Observed::Missing(TensorError::not_found("missing")),
        }
    }

    /// Run the read loop for one request.
    pub(crate) fn read(&self, req: &ReadRequest) -> TensorResult<ReadBack> {
        let mut obs = Observations::new();
        let mut rounds = 0;
        loop {
            match resolve(req, &obs) {
                Step::Probe(keys) => {
                    rounds += 1;
                    assert!(
                        rounds <= 2,
                        "more than two probe rounds for {req:?}: {keys:?}"
                    );
                    for k in keys {
                        let o = self.observe(&k);
                        obs.insert(k, o);
                    }
                }
                Step::Fail(e) => return Err(e),
                Step::Read(plan) => {
                    let mut payload = vec![0xAAu8; plan.output.nbytes as usize];
                    let mut written = 0u64;
                    for r in &plan.ranges {
                        let s = &plan.sources[r.source];
                        let obj = &self.objs[&s.key];
                        assert_eq!(obj.len() as u64, s.size);
                        for (so, d, n) in r.rows() {
                            let (so, d, n) = (so as usize, d as usize, n as usize);
                            payload[d..d + n].copy_from_slice(&obj[so..so + n]);
                            written += n as u64;
                        }
                    }
                    assert_eq!(
                        written, plan.output.nbytes,
                        "ranges cover the payload exactly once"
                    );
                    return Ok(ReadBack {
                        output: plan.output,
                        payload,
                        rounds,
                    });
                }
            }
        }
    }
}
