//! Copy and move tasks on objects (`create_copy_task`, `create_move_task`,
//! `query_task`).
//!
//! A task is checked when it is created (the object exists and is complete,
//! the segments named are mounted), then queued in the task table
//! ([`crate::tasks`]). Starting it allocates the object's size on each
//! target segment that has no replica of it yet and sends the target's
//! owner a [`LedgerOp::Fetch`]: the owner reads the object from any replica
//! into that space and reports ([`MasterState::fetched`]). A copy of the
//! version the task started with becomes a replica (recorded in the owner's
//! ledger with a `Commit`); otherwise the space is freed and the task fails.
//! Once every target holds a replica, a move drops its source replica (its
//! space returns when the owner acknowledges the forget, and not before the
//! reads in flight on it end). The task's assigned client is the owner of
//! the first target that copies.
//!
//! Dropping one replica of an object (a move's source, or
//! `batch_replica_clear` on one segment) lives here too.

use crate::durable::soft_pin_until_ms;
use crate::segments::SegId;
use crate::state::{FetchJob, Inner, MasterState, ObjStatus, PendingPin, Replica};
use crate::tasks::TaskSpec;
use mooncake_common::auth::unix_ms;
use mooncake_common::ledger::{FetchResult, LedgerEntry, LedgerOp};
use mooncake_common::proto::{TaskInfo, TaskKind};
use mooncake_common::ErrorCode;
use std::time::Instant;

impl MasterState {
    /// Create a task copying `key` to each of `targets` (segment names).
    /// INVALID_PARAMS for no target or a target not mounted;
    /// OBJECT_NOT_FOUND for an unknown key; REPLICA_IS_NOT_READY while its
    /// first write is in flight or when it has no memory replica;
    /// TASK_PENDING_LIMIT_EXCEEDED when the queue is full.
    pub fn create_copy_task(&self, key: &str, targets: &[String]) -> Result<u128, ErrorCode> {
        self.metrics.copy_task_requests.inc();
        if targets.is_empty() {
            return Err(ErrorCode::InvalidParams);
        }
        let mut g = self.inner.lock();
        g.check_task_object(key)?;
        for t in targets {
            if g.segments.get(t).is_none() {
                tracing::warn!(key, target = %t, "copy task: the target segment is not mounted");
                return Err(ErrorCode::InvalidParams);
            }
        }
        let spec = TaskSpec {
            kind: TaskKind::ReplicaCopy,
            key: key.into(),
            source: String::new(),
            targets: targets.to_vec(),
        };
        self.submit_task(&mut g, spec)
    }

    /// Create a task moving the replica of `key` on segment `source` to
    /// segment `target`. OBJECT_NOT_FOUND for an unknown key;
    /// INVALID_PARAMS when `source` is `target`, `target` is not mounted or
    /// `source` holds no replica of the object; otherwise as
    /// [`MasterState::create_copy_task`].
    pub fn create_move_task(
        &self,
        key: &str,
        source: &str,
        target: &str,
    ) -> Result<u128, ErrorCode> {
        self.metrics.move_task_requests.inc();
        let mut g = self.inner.lock();
        g.check_task_object(key)?;
        if source == target {
            return Err(ErrorCode::InvalidParams);
        }
        if g.segments.get(target).is_none() {
            tracing::warn!(key, target, "move task: the target segment is not mounted");
            return Err(ErrorCode::InvalidParams);
        }
        let holds = g.segments.id_of(source).is_some_and(|seg| {
            g.objects
                .get(key)
                .is_some_and(|o| o.replicas.iter().any(|r| r.seg == seg))
        });
        if !holds {
            tracing::warn!(
                key,
                source,
                "move task: the source segment holds no replica of the object"
            );
            return Err(ErrorCode::InvalidParams);
        }
        let spec = TaskSpec {
            kind: TaskKind::ReplicaMove,
            key: key.into(),
            source: source.to_string(),
            targets: vec![target.to_string()],
        };
        self.submit_task(&mut g, spec)
    }

    /// The state of task `id`; TASK_NOT_FOUND for an id never created or
    /// pruned from the finished history.
    pub fn query_task(&self, id: u128) -> Result<TaskInfo, ErrorCode> {
        self.metrics.query_task_requests.inc();
        self.inner
            .lock()
            .tasks
            .info(id)
            .ok_or(ErrorCode::TaskNotFound)
    }

    /// The owner of `segment_name` made these copies (see the module doc).
    /// Unknown entries are ignored.
    pub fn fetched(
        &self,
        client_id: &str,
        segment_name: &str,
        done: &[FetchResult],
    ) -> Result<(), ErrorCode> {
        let now = self.clock.now();
        let now_ms = unix_ms();
        let mut g = self.inner.lock();
        let seg = g.segments.owned_id(client_id, segment_name)?;
        let mut freed = false;
        for (key, version, offset, copied) in done {
            let Some(job) = g.fetches.remove(&(seg, *offset)) else {
                continue;
            };
            let why = if !*copied {
                Some("the target's owner could not read the object")
            } else if *job.key != **key || job.version != *version {
                Some("the target's owner reported another object")
            } else {
                g.install_copy(&job, seg, *offset, now)
            };
            if why.is_some() {
                if let Some(s) = g.segments.by_id_mut(seg) {
                    s.alloc.free(*offset, job.size);
                    freed = true;
                }
            }
            let msg = why.map_or_else(String::new, |w| {
                format!("copy to {segment_name} failed: {w}")
            });
            if let Some(spec) = g
                .tasks
                .copy_done(job.task, why.is_none(), &msg, now, now_ms)
            {
                if spec.kind == TaskKind::ReplicaMove {
                    g.drop_moved_source(&spec, now);
                }
            }
        }
        self.start_tasks(&mut g, now, now_ms);
        drop(g);
        if freed {
            self.note_space_freed();
        }
        Ok(())
    }

    /// Fail tasks past their timeouts or whose target segment went away,
    /// and start queued ones (the periodic sweep).
    pub(crate) fn sweep_tasks(&self) {
        let now = self.clock.now();
        let now_ms = unix_ms();
        let mut g = self.inner.lock();
        for task in std::mem::take(&mut g.lost_fetches) {
            g.tasks
                .copy_done(task, false, "the target segment was unmounted", now, now_ms);
        }
        g.tasks.expire(now, now_ms);
        self.start_tasks(&mut g, now, now_ms);
    }

    fn submit_task(&self, g: &mut Inner, spec: TaskSpec) -> Result<u128, ErrorCode> {
        let now = self.clock.now();
        let now_ms = unix_ms();
        let id = loop {
            let id: u128 = rand::random();
            if id != 0 {
                break id;
            }
        };
        g.tasks.submit(id, spec, now, now_ms)?;
        self.start_tasks(g, now, now_ms);
        Ok(id)
    }

    /// Start queued tasks while processing slots are free.
    fn start_tasks(&self, g: &mut Inner, now: Instant, now_ms: u64) {
        let mut retried = Vec::new();
        while let Some((id, spec)) = g.tasks.next_to_start() {
            match g.start_task(id, &spec) {
                Start::Copying(n, client) => g.tasks.started(id, n, &client, now, now_ms),
                Start::Done(msg) => {
                    g.tasks.finish(id, true, &msg, now, now_ms);
                    if spec.kind == TaskKind::ReplicaMove {
                        g.drop_moved_source(&spec, now);
                    }
                }
                Start::Failed(msg) => g.tasks.finish(id, false, &msg, now, now_ms),
                Start::NoRoom => retried.push(id),
            }
        }
        // Back to the queue after this pass, so that a task waiting for
        // room is tried once per sweep, not in a loop.
        for id in retried {
            g.tasks.no_room(id, now, now_ms);
        }
    }
}

/// What starting a task did.
enum Start {
    /// Copies sent to this many targets; the first one's owner.
    Copying(usize, String),
    /// Nothing to copy: finished with this message.
    Done(String),
    /// Cannot be done: failed with this message.
    Failed(String),
    /// A target has no room for the object now.
    NoRoom,
}

impl Inner {
    /// The object a task names must exist, be complete and have a memory
    /// replica.
    fn check_task_object(&self, key: &str) -> Result<(), ErrorCode> {
        let o = self.objects.get(key).ok_or(ErrorCode::ObjectNotFound)?;
        if o.status != ObjStatus::Complete || o.replicas.is_empty() {
            return Err(ErrorCode::ReplicaIsNotReady);
        }
        Ok(())
    }

    fn start_task(&mut self, id: u128, spec: &TaskSpec) -> Start {
        let Some(o) = self.objects.get(&spec.key) else {
            return Start::Failed("OBJECT_NOT_FOUND: the object is gone".into());
        };
        if o.status != ObjStatus::Complete || o.replicas.is_empty() {
            return Start::Failed("the object has no complete memory replica".into());
        }
        let (size, version) = (o.size, o.version);
        if spec.kind == TaskKind::ReplicaMove {
            let src = self.segments.id_of(&spec.source);
            if !src.is_some_and(|s| o.replicas.iter().any(|r| r.seg == s)) {
                return Start::Failed(format!(
                    "the source segment {} no longer holds a replica",
                    spec.source
                ));
            }
        }
        let mut needed: Vec<SegId> = Vec::new();
        for t in &spec.targets {
            let Some(seg) = self.segments.id_of(t) else {
                return Start::Failed(format!("the target segment {t} is not mounted"));
            };
            let has = o.replicas.iter().any(|r| r.seg == seg)
                || self
                    .fetches
                    .iter()
                    .any(|((s, _), j)| *s == seg && j.key == spec.key && j.version == version);
            if !has && !needed.contains(&seg) {
                needed.push(seg);
            }
        }
        if needed.is_empty() {
            return Start::Done("the object already has a replica on every target".into());
        }
        if let Err(e) = self.admit_write(&spec.key, size.saturating_mul(needed.len() as u64)) {
            return Start::Failed(format!("{e}: the copies would pass the tenant's quota"));
        }
        let mut got: Vec<(SegId, u64)> = Vec::with_capacity(needed.len());
        for seg in &needed {
            match self
                .segments
                .by_id_mut(*seg)
                .and_then(|s| s.alloc.alloc(size))
            {
                Some(offset) => got.push((*seg, offset)),
                None => {
                    for (s, off) in got {
                        if let Some(e) = self.segments.by_id_mut(s) {
                            e.alloc.free(off, size);
                        }
                    }
                    return Start::NoRoom;
                }
            }
        }
        let tag = self.tenant_tag(&spec.key);
        for (seg, offset) in &got {
            if let Some(e) = self.segments.by_id_mut(*seg) {
                e.alloc.tag(*offset, size, tag);
            }
        }
        let mut client = String::new();
        for (seg, offset) in &got {
            if let Some(e) = self.segments.by_id(*seg) {
                if client.is_empty() {
                    client = e.client_id.clone();
                }
                e.ledger.push(LedgerOp::Fetch {
                    offset: *offset,
                    version,
                    key: spec.key.to_string(),
                    size,
                });
            }
            self.fetches.insert(
                (*seg, *offset),
                FetchJob {
                    task: id,
                    key: spec.key.clone(),
                    version,
                    size,
                },
            );
        }
        Start::Copying(got.len(), client)
    }

    /// Make the copied space a replica of the object when the object is
    /// still the version copied and has none on that segment; otherwise
    /// say why not.
    fn install_copy(
        &mut self,
        job: &FetchJob,
        seg: SegId,
        offset: u64,
        now: Instant,
    ) -> Option<&'static str> {
        let Some(o) = self.objects.get_mut(&job.key) else {
            return Some("the object was removed during the copy");
        };
        if o.version != job.version || o.status != ObjStatus::Complete {
            return Some("the object was rewritten during the copy");
        }
        if o.replicas.iter().any(|r| r.seg == seg) {
            return Some("the segment already holds a replica");
        }
        o.replicas.push(Replica { seg, offset });
        let entry = LedgerEntry {
            key: job.key.to_string(),
            version: job.version,
            offset,
            size: job.size,
            hard_pin: o.hard_pin,
            soft_pin_until_ms: soft_pin_until_ms(PendingPin::Keep, o.soft_pin_deadline, now),
        };
        if let Some(s) = self.segments.by_id(seg) {
            s.ledger.push(LedgerOp::Commit(entry));
        }
        None
    }

    /// A move succeeded: the object drops its replica on the source segment
    /// (when it still has another).
    fn drop_moved_source(&mut self, spec: &TaskSpec, now: Instant) {
        let Some(src) = self.segments.id_of(&spec.source) else {
            return;
        };
        let keeps_another = self
            .objects
            .get(&spec.key)
            .is_some_and(|o| o.replicas.iter().any(|r| r.seg != src));
        if keeps_another {
            self.drop_replica_on(&spec.key, src, now);
        }
    }

    /// `batch_replica_clear` on one segment: the object `key` drops its
    /// memory replica and its disk copy on `seg` (the caller leaves it
    /// something elsewhere).
    pub(crate) fn clear_on_segment(&mut self, key: &str, seg: SegId, now: Instant) {
        self.drop_replica_on(key, seg, now);
        let Some(o) = self.objects.get(key) else {
            return;
        };
        if o.disk() != Some(seg) {
            return;
        }
        let version = o.version;
        let disk = self.objects.take_disk(key);
        self.forget_disk_copy(key, version, disk);
    }

    /// The object `key` drops its memory replica on segment `seg`, if it
    /// has one: its owner forgets it, and its space returns once the reads
    /// in flight on it end.
    fn drop_replica_on(&mut self, key: &str, seg: SegId, now: Instant) {
        let Some(o) = self.objects.get_mut(key) else {
            return;
        };
        let Some(pos) = o.replicas.iter().position(|r| r.seg == seg) else {
            return;
        };
        let r = o.replicas.remove(pos);
        let (version, size) = (o.version, o.size);
        let readers = o.readers().to_vec();
        let mut waits = Vec::new();
        let mut handed = Vec::new();
        self.retire(
            key,
            version,
            size,
            &[r],
            readers,
            &[],
            now,
            &mut waits,
            &mut handed,
        );
    }
}

#[cfg(test)]
mod tests {
    use crate::clock::ManualClock;
    use crate::config::MasterConfig;
    use crate::state::MasterState;
    use mooncake_common::ledger::LedgerOp;
    use mooncake_common::proto::{PutStartItem, SegmentDesc, TaskState, WriteConfig};
    use mooncake_common::ErrorCode;
    use std::sync::Arc;
    use std::time::Duration;

    fn desc(name: &str) -> SegmentDesc {
        SegmentDesc {
            name: name.into(),
            uuid: format!("u-{name}"),
            size: 1 << 20,
            base_addr: 0,
            host_id: "host".into(),
            pid: 1,
            endpoint: name.into(),
            socket_name: String::new(),
        }
    }

    /// A master with segments "a" (client ca) and "b" (client cb) and the
    /// object "k" of 4096 bytes on "a".
    fn setup(cfg: MasterConfig) -> (Arc<MasterState>, Arc<ManualClock>, u64) {
        let (st, clock) = MasterState::on_manual_clock(cfg);
        st.mount_segment("ca", desc("a")).unwrap();
        st.mount_segment("cb", desc("b")).unwrap();
        let version = write_k_on_a(&st);
        (st, clock, version)
    }

    /// Write and commit the object "k" of 4096 bytes on "a": its version.
    fn write_k_on_a(st: &MasterState) -> u64 {
        let wc = WriteConfig {
            preferred_segments: vec!["a".into()],
            ..WriteConfig::default()
        };
        let keys = vec!["k".to_string()];
        let version = match st.put_start(&keys, &[4096], &wc, false).remove(0) {
            PutStartItem::Write { version, .. } => version,
            other => panic!("{other:?}"),
        };
        st.commit_end(&keys, &[version], &["a".to_string()])
            .unwrap();
        version
    }

    /// The fetch ops queued for segment `seg`'s owner.
    fn fetches(st: &MasterState, seg: &str) -> Vec<(u64, u64)> {
        let g = st.inner.lock();
        g.segments[seg]
            .ledger
            .pending_ops()
            .into_iter()
            .filter_map(|op| match op {
                LedgerOp::Fetch {
                    offset, version, ..
                } => Some((offset, version)),
                _ => None,
            })
            .collect()
    }

    fn replica_segments(st: &MasterState) -> Vec<String> {
        let g = st.inner.lock();
        let o = &g.objects["k"];
        let mut v: Vec<String> = o
            .replicas
            .iter()
            .map(|r| g.segments.name_of(r.seg).to_string())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn a_reported_copy_becomes_a_replica_and_a_move_drops_its_source() {
        let (st, _, version) = setup(MasterConfig::default());
        let id = st.create_move_task("k", "a", "b").unwrap();
        let info = st.query_task(id).unwrap();
        assert_eq!(
            (info.state, info.assigned_client.as_str()),
            (TaskState::Processing, "cb")
        );
        let f = fetches(&st, "b");
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].1, version);
        st.fetched("cb", "b", &[("k".into(), version, f[0].0, true)])
            .unwrap();
        assert_eq!(st.query_task(id).unwrap().state, TaskState::Success);
        assert_eq!(replica_segments(&st), vec!["b".to_string()]);
        // A report from a client that does not own the segment is refused.
        assert_eq!(st.fetched("ca", "b", &[]), Err(ErrorCode::IllegalClient));
    }

    #[test]
    fn a_copy_of_a_rewritten_object_is_freed_and_fails_the_task() {
        let (st, _, version) = setup(MasterConfig::default());
        let id = st.create_copy_task("k", &["b".to_string()]).unwrap();
        let f = fetches(&st, "b");
        let used_before = st.inner.lock().segments["b"].alloc.used();
        assert!(used_before >= 4096);
        // The object is removed and written again meanwhile.
        assert_eq!(st.remove(&["k".to_string()], true), vec![0]);
        write_k_on_a(&st);
        st.fetched("cb", "b", &[("k".into(), version, f[0].0, true)])
            .unwrap();
        let info = st.query_task(id).unwrap();
        assert_eq!(info.state, TaskState::Failed);
        assert!(info.message.contains("rewritten"), "{}", info.message);
        assert_eq!(st.inner.lock().segments["b"].alloc.used(), 0);
        assert_eq!(replica_segments(&st), vec!["a".to_string()]);
    }

    #[test]
    fn a_target_unmounted_during_the_copy_fails_the_task() {
        let (st, _, _) = setup(MasterConfig::default());
        let id = st.create_copy_task("k", &["b".to_string()]).unwrap();
        st.unmount_segment("cb", "b").unwrap();
        st.sweep_tasks();
        let info = st.query_task(id).unwrap();
        assert_eq!(info.state, TaskState::Failed);
        assert!(info.message.contains("unmounted"), "{}", info.message);
        assert_eq!(replica_segments(&st), vec!["a".to_string()]);
    }

    #[test]
    fn a_copy_never_reported_times_out_but_keeps_its_space_until_reported() {
        let cfg = MasterConfig {
            processing_task_timeout_sec: 5,
            ..MasterConfig::default()
        };
        let (st, clock, version) = setup(cfg);
        let id = st.create_copy_task("k", &["b".to_string()]).unwrap();
        clock.advance(Duration::from_secs(6));
        st.sweep_tasks();
        assert_eq!(st.query_task(id).unwrap().state, TaskState::Failed);
        // The owner may still be copying: the space stays allocated.
        assert!(st.inner.lock().segments["b"].alloc.used() >= 4096);
        // Its late report still installs a good copy.
        let f = fetches(&st, "b");
        st.fetched("cb", "b", &[("k".into(), version, f[0].0, true)])
            .unwrap();
        assert_eq!(
            replica_segments(&st),
            vec!["a".to_string(), "b".to_string()]
        );
        assert_eq!(st.query_task(id).unwrap().state, TaskState::Failed);
    }

    #[test]
    fn a_failed_read_frees_the_space() {
        let (st, _, version) = setup(MasterConfig::default());
        let id = st.create_copy_task("k", &["b".to_string()]).unwrap();
        let f = fetches(&st, "b");
        st.fetched("cb", "b", &[("k".into(), version, f[0].0, false)])
            .unwrap();
        assert_eq!(st.query_task(id).unwrap().state, TaskState::Failed);
        assert_eq!(st.inner.lock().segments["b"].alloc.used(), 0);
    }
}
