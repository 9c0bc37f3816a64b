//! Copy and move tasks: `create_copy_task`, `create_move_task` and
//! `query_task`, with upstream's `QueryTaskResponse`. A task id crosses as
//! upstream's UUID does: a tuple of two ints, the high 64 bits first.

use super::class::MooncakeDistributedStore;
use super::config::{TaskStatus, TaskType};
use crate::report::Call;
use mooncake_client::{Result, TaskInfo, TaskKind, TaskState};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;

/// A 128-bit id as upstream's UUID pair `(high, low)`.
fn pair(id: u128) -> (u64, u64) {
    ((id >> 64) as u64, id as u64)
}

/// The id a `(high, low)` pair (any sequence of two ints) names;
/// `TypeError` for anything else.
fn from_pair(v: &Bound<'_, PyAny>) -> PyResult<u128> {
    let parts: Vec<u64> = v.extract().map_err(|e| {
        PyTypeError::new_err(format!(
            "task_id must be the (int, int) pair create_copy_task or create_move_task returned: {e}"
        ))
    })?;
    match parts[..] {
        [hi, lo] => Ok((u128::from(hi) << 64) | u128::from(lo)),
        _ => Err(PyTypeError::new_err(format!(
            "task_id must be a pair of ints, not {} ints",
            parts.len()
        ))),
    }
}

/// What `query_task` returns for a task.
#[pyclass(module = "mooncake.store", frozen, get_all)]
pub(crate) struct QueryTaskResponse {
    /// The task id, `(high, low)`.
    id: (u64, u64),
    /// `TaskType.REPLICA_COPY` or `TaskType.REPLICA_MOVE`.
    #[pyo3(name = "type")]
    kind: TaskType,
    /// Where the task stands.
    status: TaskStatus,
    /// Creation time, Unix ms.
    created_at_ms_epoch: u64,
    /// Last state change, Unix ms.
    last_updated_at_ms_epoch: u64,
    /// The client copying for it, `(high, low)` (`(0, 0)` before one is).
    assigned_client: (u64, u64),
    /// Why it failed, or what it did.
    message: String,
}

impl From<TaskInfo> for QueryTaskResponse {
    fn from(t: TaskInfo) -> Self {
        let assigned = uuid::Uuid::parse_str(&t.assigned_client).map_or(0, |u| u.as_u128());
        QueryTaskResponse {
            id: pair(t.id),
            kind: match t.kind {
                TaskKind::ReplicaCopy => TaskType::ReplicaCopy,
                TaskKind::ReplicaMove => TaskType::ReplicaMove,
            },
            status: match t.state {
                TaskState::Pending => TaskStatus::Pending,
                TaskState::Processing => TaskStatus::Processing,
                TaskState::Failed => TaskStatus::Failed,
                TaskState::Success => TaskStatus::Success,
            },
            created_at_ms_epoch: t.created_at_ms,
            last_updated_at_ms_epoch: t.updated_at_ms,
            assigned_client: pair(assigned),
            message: t.message,
        }
    }
}

#[pymethods]
impl QueryTaskResponse {
    fn __repr__(&self) -> String {
        format!(
            "QueryTaskResponse(id={:?}, type={}, status={}, created_at={}, last_updated_at={}, assigned_client={:?}, message=\"{}\")",
            self.id,
            self.kind as i64,
            self.status as i64,
            self.created_at_ms_epoch,
            self.last_updated_at_ms_epoch,
            self.assigned_client,
            self.message
        )
    }
}

#[pymethods]
impl MooncakeDistributedStore {
    /// Create a task copying `key` to each of the segments `targets`:
    /// `(task_id, 0)`, or `((0, 0), code)`: INVALID_PARAMS (-600) for no
    /// target or one not mounted, OBJECT_NOT_FOUND (-704),
    /// TASK_PENDING_LIMIT_EXCEEDED (-1401).
    fn create_copy_task(
        &self,
        py: Python<'_>,
        key: String,
        targets: Vec<String>,
    ) -> ((u64, u64), i64) {
        let r = self.run(py, |s| s.create_copy_task(&key, &targets));
        task_reply(Call::new(py, "create_copy_task"), &key, r)
    }

    /// Create a task moving `key`'s replica on segment `source` to segment
    /// `target`: `(task_id, 0)`, or `((0, 0), code)`: INVALID_PARAMS (-600)
    /// when `source` is `target`, holds no replica, or `target` is not
    /// mounted; OBJECT_NOT_FOUND (-704).
    fn create_move_task(
        &self,
        py: Python<'_>,
        key: String,
        source: String,
        target: String,
    ) -> ((u64, u64), i64) {
        let r = self.run(py, |s| s.create_move_task(&key, &source, &target));
        task_reply(Call::new(py, "create_move_task"), &key, r)
    }

    /// The state of a task: `(QueryTaskResponse, 0)`, or `(None, code)`:
    /// TASK_NOT_FOUND (-1400) for an id never created or no longer kept.
    fn query_task(
        &self,
        py: Python<'_>,
        task_id: &Bound<'_, PyAny>,
    ) -> PyResult<(Option<QueryTaskResponse>, i64)> {
        let call = Call::new(py, "query_task");
        let id = from_pair(task_id)?;
        Ok(match self.run(py, |s| s.query_task(id)) {
            Ok(info) => (Some(info.into()), 0),
            Err(e) => (None, call.code::<()>(None, Err(e))),
        })
    }
}

fn task_reply(call: Call<'_>, key: &str, r: Result<u128>) -> ((u64, u64), i64) {
    match r {
        Ok(id) => (pair(id), 0),
        Err(e) => ((0, 0), call.code::<()>(Some(key), Err(e))),
    }
}

/// Add `QueryTaskResponse` and the task enums, whose members upstream also
/// exports at module level.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<QueryTaskResponse>()?;
    m.add_class::<TaskType>()?;
    m.add_class::<TaskStatus>()?;
    Ok(())
}
