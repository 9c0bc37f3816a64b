//! Copy and move tasks (`create_copy_task`, `create_move_task`,
//! `query_task`): the master queues them and has the target segments'
//! owners make the copies (see the master's `replicate` module); these
//! methods create and query them, and make the copies the master asks of
//! this client's segment (`durability::fetch` runs them).

use crate::client::Client;
use crate::durability::fetch::Job;
use crate::error::{Error, Result};
use mooncake_common::ledger::FetchResult;
use mooncake_common::proto::{MasterRequest, MasterResponse, ObjectInfo, TaskInfo};
use std::time::Instant;

impl Client {
    /// Create a task copying `key` to the segments `targets`: its id.
    pub fn create_copy_task(&self, key: &str, targets: &[String]) -> Result<u128> {
        self.task_rpc(MasterRequest::CreateCopyTask {
            key: key.to_string(),
            targets: targets.to_vec(),
        })
    }

    /// Create a task moving `key`'s replica on segment `source` to segment
    /// `target`: its id.
    pub fn create_move_task(&self, key: &str, source: &str, target: &str) -> Result<u128> {
        self.task_rpc(MasterRequest::CreateMoveTask {
            key: key.to_string(),
            source: source.to_string(),
            target: target.to_string(),
        })
    }

    /// The state of task `id`.
    pub fn query_task(&self, id: u128) -> Result<TaskInfo> {
        match self.rpc(MasterRequest::QueryTask { id })? {
            MasterResponse::Task(info) => Ok(info),
            MasterResponse::Err(e) => Err(e.into()),
            _ => Err(Error::internal("query task: unexpected master response")),
        }
    }

    fn task_rpc(&self, req: MasterRequest) -> Result<u128> {
        match self.rpc(req)? {
            MasterResponse::TaskId(id) => Ok(id),
            MasterResponse::Err(e) => Err(e.into()),
            _ => Err(Error::internal("create task: unexpected master response")),
        }
    }
}

impl Client {
    /// Make the copies `jobs` into this client's segment: one lookup for
    /// all, then one read; `copied` is false for an object that is gone,
    /// has another size, or could not be read within its lease.
    pub(crate) fn fetch_copies(&self, jobs: &[Job]) -> Vec<FetchResult> {
        let Some(seg) = self.segment.as_ref() else {
            return jobs
                .iter()
                .map(|j| (j.key.clone(), j.version, j.offset, false))
                .collect();
        };
        let keys: Vec<String> = jobs.iter().map(|j| j.key.clone()).collect();
        let lookup = self.lookup(&keys, true);
        let mut items: Vec<(&ObjectInfo, usize)> = Vec::new();
        let mut slot: Vec<Option<usize>> = Vec::with_capacity(jobs.len());
        for (j, info) in jobs.iter().zip(&lookup.infos) {
            match info {
                Ok(info) if info.size == j.size && seg.check_range(j.offset, j.size) => {
                    slot.push(Some(items.len()));
                    // The range lies inside the segment (checked).
                    items.push((info, seg.base() as usize + j.offset as usize));
                }
                _ => slot.push(None),
            }
        }
        // SAFETY: each destination is a range of this client's segment
        // (checked above) that the master allocated to this copy and hands
        // to nobody else until the result is reported.
        let read = unsafe { self.read_objects(&items) };
        let in_time = Instant::now() <= lookup.deadline;
        if lookup.ticket != 0 {
            self.read_finished(lookup.ticket);
        }
        jobs.iter()
            .zip(slot)
            .map(|(j, s)| {
                let ok = in_time && s.is_some_and(|i| read.get(i).is_some_and(|r| r.is_ok()));
                (j.key.clone(), j.version, j.offset, ok)
            })
            .collect()
    }

    /// Tell the master how the copies went.
    pub(crate) fn report_fetched(&self, done: Vec<FetchResult>) {
        let r = self.rpc(MasterRequest::Fetched {
            client_id: self.client_id.clone(),
            segment_name: self.desc.name.clone(),
            done,
        });
        if !matches!(r, Ok(MasterResponse::Ok)) {
            tracing::warn!(result = ?r, "cannot tell the master about copies made for its tasks");
        }
    }
}
