//! The table of copy and move tasks: a plain state machine on explicit
//! times, with no knowledge of objects or segments (the master's
//! `replicate` module starts the copies and reports back here).
//!
//! A task is PENDING in a FIFO queue until the master starts it (at most
//! `--max_total_processing_tasks` are PROCESSING at once), PROCESSING while
//! segment owners copy, then FAILED or SUCCESS. A start that finds no room
//! on a target (NO_AVAILABLE_HANDLE) puts the task back at the end of the
//! queue, up to `--max_retry_attempts` times. A task PENDING longer than
//! `--pending_task_timeout_sec`, or PROCESSING longer than
//! `--processing_task_timeout_sec`, fails (0 disables either timeout). The
//! last `--max_total_finished_tasks` finished tasks stay queryable; older
//! ones are forgotten (TASK_NOT_FOUND). A full pending queue
//! (`--max_total_pending_tasks`) refuses new tasks with
//! TASK_PENDING_LIMIT_EXCEEDED.

use mooncake_common::proto::{TaskInfo, TaskKind, TaskState};
use mooncake_common::ErrorCode;
use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

/// Bounds on the table (the master's task flags).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TaskLimits {
    pub max_pending: usize,
    pub max_processing: usize,
    pub max_finished: usize,
    /// `None`: a task may stay PENDING forever.
    pub pending_timeout: Option<Duration>,
    /// `None`: a task may stay PROCESSING forever.
    pub processing_timeout: Option<Duration>,
    pub max_retries: u32,
}

impl Default for TaskLimits {
    fn default() -> Self {
        TaskLimits {
            max_pending: 10_000,
            max_processing: 10_000,
            max_finished: 10_000,
            pending_timeout: Some(Duration::from_secs(300)),
            processing_timeout: Some(Duration::from_secs(300)),
            max_retries: 10,
        }
    }
}

/// What a task asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TaskSpec {
    pub kind: TaskKind,
    pub key: Box<str>,
    /// Segment to move from (empty for a copy).
    pub source: String,
    /// Segments to copy or move to.
    pub targets: Vec<String>,
}

#[derive(Debug)]
struct Task {
    spec: TaskSpec,
    state: TaskState,
    updated: Instant,
    created_ms: u64,
    updated_ms: u64,
    assigned: String,
    message: String,
    /// Starts refused for want of room so far.
    retries: u32,
    /// Copies started and not yet reported.
    outstanding: usize,
    /// A reported copy failed (its message is in `message`).
    failed: bool,
}

/// The task table.
#[derive(Debug, Default)]
pub(crate) struct TaskTable {
    limits: TaskLimits,
    tasks: HashMap<u128, Task>,
    pending: VecDeque<u128>,
    processing: usize,
    finished: VecDeque<u128>,
}

impl TaskTable {
    /// An empty table with `limits`.
    pub(crate) fn new(limits: TaskLimits) -> Self {
        TaskTable {
            limits,
            ..TaskTable::default()
        }
    }

    /// Queue a task with id `id` (the caller draws it at random).
    pub(crate) fn submit(
        &mut self,
        id: u128,
        spec: TaskSpec,
        now: Instant,
        now_ms: u64,
    ) -> Result<(), ErrorCode> {
        if self.pending.len() >= self.limits.max_pending {
            return Err(ErrorCode::TaskPendingLimitExceeded);
        }
        if self.tasks.contains_key(&id) {
            return Err(ErrorCode::InternalError);
        }
        self.tasks.insert(
            id,
            Task {
                spec,
                state: TaskState::Pending,
                updated: now,
                created_ms: now_ms,
                updated_ms: now_ms,
                assigned: String::new(),
                message: String::new(),
                retries: 0,
                outstanding: 0,
                failed: false,
            },
        );
        self.pending.push_back(id);
        Ok(())
    }

    /// The next PENDING task to start, taken off the queue, while fewer
    /// than the limit are PROCESSING. The caller must answer with
    /// [`TaskTable::started`], [`TaskTable::no_room`] or
    /// [`TaskTable::finish`].
    pub(crate) fn next_to_start(&mut self) -> Option<(u128, TaskSpec)> {
        if self.processing >= self.limits.max_processing {
            return None;
        }
        while let Some(id) = self.pending.pop_front() {
            if let Some(t) = self.tasks.get(&id) {
                if t.state == TaskState::Pending {
                    return Some((id, t.spec.clone()));
                }
            }
        }
        None
    }

    /// Task `id` started `copies` copies on segments of `assigned` (a
    /// client id): PROCESSING until each is reported.
    pub(crate) fn started(
        &mut self,
        id: u128,
        copies: usize,
        assigned: &str,
        now: Instant,
        now_ms: u64,
    ) {
        let Some(t) = self.tasks.get_mut(&id) else {
            return;
        };
        if t.state != TaskState::Pending {
            return;
        }
        t.state = TaskState::Processing;
        t.outstanding = copies;
        t.assigned = assigned.to_string();
        t.updated = now;
        t.updated_ms = now_ms;
        self.processing += 1;
    }

    /// Task `id` found no room on a target: back to the end of the queue,
    /// or FAILED once it used up its retries. Returns whether it failed.
    pub(crate) fn no_room(&mut self, id: u128, now: Instant, now_ms: u64) -> bool {
        let Some(t) = self.tasks.get_mut(&id) else {
            return false;
        };
        t.retries += 1;
        if t.retries > self.limits.max_retries {
            let msg = format!(
                "NO_AVAILABLE_HANDLE: no room on the target segments after {} retries",
                self.limits.max_retries
            );
            self.finish(id, false, &msg, now, now_ms);
            return true;
        }
        self.pending.push_back(id);
        false
    }

    /// One copy of task `id` was reported: `ok`, or failed with `message`.
    /// Returns the task's spec when this report finished it successfully
    /// (the caller completes a move then), `None` otherwise.
    pub(crate) fn copy_done(
        &mut self,
        id: u128,
        ok: bool,
        message: &str,
        now: Instant,
        now_ms: u64,
    ) -> Option<TaskSpec> {
        let t = self.tasks.get_mut(&id)?;
        if t.state != TaskState::Processing {
            return None;
        }
        t.outstanding = t.outstanding.saturating_sub(1);
        if !ok && !t.failed {
            t.failed = true;
            t.message = message.to_string();
        }
        if t.outstanding > 0 {
            return None;
        }
        let (failed, spec) = (t.failed, t.spec.clone());
        let msg = if failed {
            t.message.clone()
        } else {
            message.to_string()
        };
        self.finish(id, !failed, &msg, now, now_ms);
        (!failed).then_some(spec)
    }

    /// Finish task `id` (PENDING or PROCESSING) as SUCCESS or FAILED.
    pub(crate) fn finish(&mut self, id: u128, ok: bool, message: &str, now: Instant, now_ms: u64) {
        let Some(t) = self.tasks.get_mut(&id) else {
            return;
        };
        if t.state.is_finished() {
            return;
        }
        if t.state == TaskState::Processing {
            self.processing = self.processing.saturating_sub(1);
        }
        t.state = if ok {
            TaskState::Success
        } else {
            TaskState::Failed
        };
        t.message = message.to_string();
        t.updated = now;
        t.updated_ms = now_ms;
        t.outstanding = 0;
        self.finished.push_back(id);
        while self.finished.len() > self.limits.max_finished {
            if let Some(old) = self.finished.pop_front() {
                self.tasks.remove(&old);
            }
        }
    }

    /// Fail the tasks that stayed PENDING or PROCESSING past their
    /// timeouts; returns how many.
    pub(crate) fn expire(&mut self, now: Instant, now_ms: u64) -> usize {
        let limits = self.limits;
        let late = |t: &Task| {
            let timeout = match t.state {
                TaskState::Pending => limits.pending_timeout,
                TaskState::Processing => limits.processing_timeout,
                _ => None,
            };
            timeout.is_some_and(|d| now.saturating_duration_since(t.updated) > d)
        };
        let ids: Vec<(u128, TaskState)> = self
            .tasks
            .iter()
            .filter(|(_, t)| late(t))
            .map(|(id, t)| (*id, t.state))
            .collect();
        for (id, state) in &ids {
            let msg = match state {
                TaskState::Pending => "timed out while PENDING (--pending_task_timeout_sec)",
                _ => "timed out while PROCESSING (--processing_task_timeout_sec)",
            };
            self.finish(*id, false, msg, now, now_ms);
        }
        ids.len()
    }

    /// What `QueryTask` answers for `id`.
    pub(crate) fn info(&self, id: u128) -> Option<TaskInfo> {
        let t = self.tasks.get(&id)?;
        Some(TaskInfo {
            id,
            kind: t.spec.kind,
            state: t.state,
            created_at_ms: t.created_ms,
            updated_at_ms: t.updated_ms,
            assigned_client: t.assigned.clone(),
            message: t.message.clone(),
        })
    }

    /// Whether any task is PENDING.
    #[cfg(test)]
    fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(key: &str) -> TaskSpec {
        TaskSpec {
            kind: TaskKind::ReplicaCopy,
            key: key.into(),
            source: String::new(),
            targets: vec!["b".into()],
        }
    }

    fn limits() -> TaskLimits {
        TaskLimits {
            max_pending: 2,
            max_processing: 1,
            max_finished: 2,
            pending_timeout: Some(Duration::from_secs(5)),
            processing_timeout: Some(Duration::from_secs(10)),
            max_retries: 1,
        }
    }

    #[test]
    fn a_task_goes_pending_processing_success() {
        let t0 = Instant::now();
        let mut t = TaskTable::new(limits());
        t.submit(1, spec("k"), t0, 100).unwrap();
        assert_eq!(t.info(1).unwrap().state, TaskState::Pending);
        let (id, s) = t.next_to_start().unwrap();
        assert_eq!((id, &*s.key), (1, "k"));
        t.started(1, 2, "client-b", t0, 101);
        let i = t.info(1).unwrap();
        assert_eq!(
            (i.state, i.assigned_client.as_str()),
            (TaskState::Processing, "client-b")
        );
        assert_eq!(
            t.copy_done(1, true, "", t0, 102),
            None,
            "one copy still out"
        );
        assert_eq!(t.info(1).unwrap().state, TaskState::Processing);
        assert!(t.copy_done(1, true, "copied", t0, 103).is_some());
        let i = t.info(1).unwrap();
        assert_eq!(
            (i.state, i.created_at_ms, i.updated_at_ms),
            (TaskState::Success, 100, 103)
        );
        assert_eq!(
            t.copy_done(1, true, "", t0, 104),
            None,
            "a late report changes nothing"
        );
    }

    #[test]
    fn one_failed_copy_fails_the_task_with_its_message() {
        let t0 = Instant::now();
        let mut t = TaskTable::new(limits());
        t.submit(1, spec("k"), t0, 0).unwrap();
        t.next_to_start().unwrap();
        t.started(1, 2, "c", t0, 0);
        assert_eq!(t.copy_done(1, false, "object changed", t0, 0), None);
        assert_eq!(t.copy_done(1, true, "", t0, 0), None);
        let i = t.info(1).unwrap();
        assert_eq!(
            (i.state, i.message.as_str()),
            (TaskState::Failed, "object changed")
        );
    }

    #[test]
    fn the_pending_queue_and_processing_slots_are_bounded() {
        let t0 = Instant::now();
        let mut t = TaskTable::new(limits());
        t.submit(1, spec("a"), t0, 0).unwrap();
        t.submit(2, spec("b"), t0, 0).unwrap();
        assert_eq!(
            t.submit(3, spec("c"), t0, 0),
            Err(ErrorCode::TaskPendingLimitExceeded)
        );
        assert_eq!(t.info(3), None);
        let (id, _) = t.next_to_start().unwrap();
        t.started(id, 1, "c", t0, 0);
        assert_eq!(t.next_to_start(), None, "one PROCESSING at most");
        assert!(t.has_pending());
        t.copy_done(id, true, "", t0, 0);
        assert_eq!(t.next_to_start().map(|(id, _)| id), Some(2));
    }

    #[test]
    fn no_room_requeues_then_fails_after_the_retries() {
        let t0 = Instant::now();
        let mut t = TaskTable::new(limits());
        t.submit(1, spec("a"), t0, 0).unwrap();
        t.next_to_start().unwrap();
        assert!(!t.no_room(1, t0, 0));
        assert_eq!(t.info(1).unwrap().state, TaskState::Pending);
        assert_eq!(t.next_to_start().map(|(id, _)| id), Some(1));
        assert!(t.no_room(1, t0, 0));
        let i = t.info(1).unwrap();
        assert_eq!(i.state, TaskState::Failed);
        assert!(i.message.contains("NO_AVAILABLE_HANDLE"), "{}", i.message);
        assert_eq!(t.next_to_start(), None);
    }

    #[test]
    fn timeouts_fail_pending_and_processing_tasks() {
        let t0 = Instant::now();
        let mut t = TaskTable::new(limits());
        t.submit(1, spec("a"), t0, 0).unwrap();
        t.submit(2, spec("b"), t0, 0).unwrap();
        t.next_to_start().unwrap();
        t.started(1, 1, "c", t0, 0);
        assert_eq!(t.expire(t0 + Duration::from_secs(5), 0), 0);
        assert_eq!(t.expire(t0 + Duration::from_secs(6), 0), 1);
        assert_eq!(t.info(2).unwrap().state, TaskState::Failed);
        assert_eq!(t.info(1).unwrap().state, TaskState::Processing);
        assert_eq!(t.expire(t0 + Duration::from_secs(11), 0), 1);
        let i = t.info(1).unwrap();
        assert_eq!(i.state, TaskState::Failed);
        assert!(i.message.contains("PROCESSING"), "{}", i.message);
        // A processing slot came back.
        t.submit(3, spec("c"), t0, 0).unwrap();
        assert_eq!(t.next_to_start().map(|(id, _)| id), Some(3));
    }

    #[test]
    fn zero_timeouts_never_expire() {
        let t0 = Instant::now();
        let mut t = TaskTable::new(TaskLimits {
            pending_timeout: None,
            processing_timeout: None,
            ..limits()
        });
        t.submit(1, spec("a"), t0, 0).unwrap();
        assert_eq!(t.expire(t0 + Duration::from_secs(86_400), 0), 0);
    }

    #[test]
    fn only_the_last_finished_tasks_stay_queryable() {
        let t0 = Instant::now();
        let mut t = TaskTable::new(TaskLimits {
            max_pending: 10,
            ..limits()
        });
        for id in 1..=3 {
            t.submit(id, spec("a"), t0, 0).unwrap();
            t.finish(id, true, "", t0, 0);
        }
        assert_eq!(t.info(1), None, "pruned");
        assert_eq!(t.info(2).unwrap().state, TaskState::Success);
        assert_eq!(t.info(3).unwrap().state, TaskState::Success);
    }
}
