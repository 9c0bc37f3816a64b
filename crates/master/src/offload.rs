//! Disk copies: objects that memory eviction moves to their owner's disk
//! tier instead of dropping them.
//!
//! An owner announces its disk tier (and what it already holds) with
//! `DiskTier` after mounting. When eviction selects an object with a
//! replica on such an owner's segment, and the master offloads
//! (`--enable_offload` or `--root_fs_dir`) and the disk copies fit
//! `--global_file_segment_size`, the owner gets a [`LedgerOp::Offload`]
//! for that replica: it copies the bytes to disk before acknowledging, and
//! the space is reused only after the ack. The object keeps its key and
//! version with no memory replica and [`Object::disk`] naming the owner's
//! segment; reads go to the owner. Removing or replacing the object sends
//! the owner a [`LedgerOp::DiskForget`]; copies the owner loses (its disk
//! tier evicted them, or a write failed) are reported with `DiskDropped`
//! and forgotten. A segment that goes away takes its disk copies with it.
//! An object whose copy would not fit `--global_file_segment_size` stays
//! in memory: eviction never drops a value it could have moved to disk
//! but for the room there.

use crate::segments::SegId;
use crate::state::{Inner, MasterState, ObjStatus, Object, Replicas};
use mooncake_common::ledger::LedgerOp;
use mooncake_common::proto::{DiskLoc, DiskObject};
use mooncake_common::ErrorCode;
use std::sync::Arc;

impl Inner {
    /// Where the disk copy of `key` at `version` on segment `seg` is read.
    pub(crate) fn disk_loc(&self, key: &str, version: u64, seg: SegId) -> Option<DiskLoc> {
        let s = self.segments.by_id(seg)?;
        Some(DiskLoc {
            key: key.to_string(),
            version,
            segment_name: s.desc.name.clone(),
            endpoint: s.desc.endpoint.clone(),
        })
    }

    /// `o` (the object `key`) is going away: its owner deletes the disk copy.
    pub(crate) fn forget_disk(&mut self, key: &str, o: &mut Object) {
        let disk = o.disk.take();
        self.forget_disk_copy(key, o.version, o.size, disk);
    }

    /// The disk copy of `key` at `version` on `disk` is no longer wanted.
    pub(crate) fn forget_disk_copy(
        &mut self,
        key: &str,
        version: u64,
        size: u64,
        disk: Option<SegId>,
    ) {
        let Some(seg) = disk else {
            return;
        };
        self.disk_bytes = self.disk_bytes.saturating_sub(size);
        if let Some(s) = self.segments.by_id(seg) {
            s.ledger.push(LedgerOp::DiskForget {
                key: key.to_string(),
                version,
            });
        }
    }

    /// Move `key` (selected by eviction) to the disk tier of the owner of
    /// one of its replicas: that replica's owner copies it to disk before
    /// acknowledging, the other replicas are forgotten, and every replica's
    /// space returns on its owner's ack. Nothing is done unless the answer
    /// is [`Offload::Moved`].
    pub(crate) fn offload_object(&mut self, key: &str, cap: u64) -> Offload {
        let Some(o) = self.objects.get(key) else {
            return Offload::NoTier;
        };
        if o.status != ObjStatus::Complete || o.disk.is_some() || o.replicas.is_empty() {
            return Offload::NoTier;
        }
        let Some(chosen) = o
            .replicas
            .iter()
            .find(|r| self.segments.by_id(r.seg).is_some_and(|s| s.disk_tier))
            .copied()
        else {
            return Offload::NoTier;
        };
        if !o.upserts().is_empty() {
            return Offload::Busy;
        }
        if self.disk_bytes.saturating_add(o.size) > cap {
            return Offload::Full;
        }
        let (version, size) = (o.version, o.size);
        let replicas: Replicas = o.replicas.clone();
        let mut waits = Vec::new();
        for r in &replicas {
            let Some(seg) = self.segments.by_id(r.seg) else {
                continue;
            };
            let op = if *r == chosen {
                LedgerOp::Offload {
                    offset: r.offset,
                    version,
                    key: key.to_string(),
                    size,
                }
            } else {
                LedgerOp::Forget {
                    offset: r.offset,
                    version,
                }
            };
            let q = Arc::clone(&seg.ledger);
            let seq = q.push_forget_then_free(op, r.offset, size);
            waits.push((q, seq));
        }
        if !waits.is_empty() {
            self.key_forgets
                .entry(key.into())
                .or_default()
                .extend(waits);
        }
        if let Some(o) = self.objects.get_mut(key) {
            o.replicas.clear();
            o.disk = Some(chosen.seg);
        }
        self.disk_bytes = self.disk_bytes.saturating_add(size);
        Offload::Moved
    }
}

/// What eviction did with an object it selected, in a master that offloads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Offload {
    /// On its way to its owner's disk tier.
    Moved,
    /// No replica's owner has a disk tier: eviction drops it, as without
    /// offload.
    NoTier,
    /// The disk copies would pass `--global_file_segment_size`: it stays in
    /// memory (an acknowledged value is never dropped for want of disk).
    Full,
    /// An upsert of it is in flight: it stays until a later pass.
    Busy,
}

impl MasterState {
    /// The owner of `segment_name` has a disk tier holding `objects`: adopt
    /// as disk copies the objects this master does not know (1 per object;
    /// 0 where it knows the key, whose copy the owner deletes). From now
    /// on evicted replicas on that segment move to the owner's disk.
    pub fn disk_tier(
        &self,
        client_id: &str,
        segment_name: &str,
        objects: Vec<DiskObject>,
        done: bool,
    ) -> Result<Vec<i32>, ErrorCode> {
        let now = self.clock.now();
        let mut g = self.inner.lock();
        let seg = match g.segments.get_mut(segment_name) {
            Some(s) if s.client_id == client_id => {
                if done && !s.disk_tier {
                    s.disk_tier = true;
                    if !self.cfg.offloads() {
                        tracing::warn!(segment = segment_name, "the owner has a disk tier, but this master runs without --enable_offload or --root_fs_dir: evicted objects are dropped");
                    }
                }
                g.segments.id_of(segment_name)
            }
            Some(_) => return Err(ErrorCode::IllegalClient),
            None => return Err(ErrorCode::SegmentNotFound),
        };
        let Some(seg) = seg else {
            return Err(ErrorCode::SegmentNotFound);
        };
        let codes = objects
            .into_iter()
            .map(|d| {
                if d.key.is_empty() || g.objects.contains_key(d.key.as_str()) {
                    return 0;
                }
                let mut o = Object::complete(d.size, d.version, Replicas::new(), now, None, false);
                o.disk = Some(seg);
                g.last_version = g.last_version.max(d.version);
                g.disk_bytes = g.disk_bytes.saturating_add(d.size);
                g.objects.insert(d.key.into_boxed_str(), o);
                1
            })
            .collect();
        Ok(codes)
    }

    /// The owner of `segment_name` lost these disk copies: forget them
    /// (an object left with no replica at all is gone).
    pub fn disk_dropped(
        &self,
        client_id: &str,
        segment_name: &str,
        objects: &[(String, u64)],
    ) -> Result<(), ErrorCode> {
        let mut g = self.inner.lock();
        let seg = match g.segments.get(segment_name) {
            Some(s) if s.client_id == client_id => g.segments.id_of(segment_name),
            Some(_) => return Err(ErrorCode::IllegalClient),
            None => return Err(ErrorCode::SegmentNotFound),
        };
        let mut lost = 0u64;
        for (key, version) in objects {
            let Some(o) = g.objects.get_mut(key.as_str()) else {
                continue;
            };
            if o.disk != seg || o.version != *version {
                continue;
            }
            o.disk = None;
            let (size, gone) = (o.size, o.replicas.is_empty());
            g.disk_bytes = g.disk_bytes.saturating_sub(size);
            if gone {
                g.objects.swap_remove(key.as_str());
                lost += 1;
            }
        }
        if lost > 0 {
            tracing::info!(
                segment = segment_name,
                objects = lost,
                "objects left the owner's disk tier"
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::Offload;
    use crate::config::MasterConfig;
    use crate::metrics::MasterMetrics;
    use crate::state::MasterState;
    use mooncake_common::ledger::LedgerOp;
    use mooncake_common::proto::{DiskObject, PutStartItem, SegmentDesc, WriteConfig};
    use mooncake_common::ErrorCode;
    use std::sync::Arc;

    fn desc(name: &str, size: u64) -> SegmentDesc {
        SegmentDesc {
            name: name.into(),
            uuid: format!("u-{name}"),
            size,
            base_addr: 0,
            host_id: "h".into(),
            pid: 1,
            endpoint: format!("{name}-data"),
            socket_name: String::new(),
        }
    }

    fn state(offload: bool, cap: u64) -> Arc<MasterState> {
        state_waiting(offload, cap, 5000)
    }

    /// [`state`] whose puts wait up to `wait_ms` for room.
    fn state_waiting(offload: bool, cap: u64, wait_ms: u64) -> Arc<MasterState> {
        let cfg = MasterConfig {
            enable_offload: offload,
            global_file_segment_size: cap,
            default_kv_lease_ttl_ms: 0,
            put_space_wait_ms: wait_ms,
            ..MasterConfig::default()
        };
        let st = MasterState::new(cfg, Arc::new(MasterMetrics::default()), None);
        st.mount_segment("c1", desc("a:1", 1 << 20)).expect("mount");
        st
    }

    const QUARTER: u64 = 1 << 18;

    /// An offloading master whose segment (1 MiB, its owner connected with
    /// a disk tier) is filled by four committed objects `f0`..`f3`.
    fn full_with_tier(cap: u64, wait_ms: u64) -> Arc<MasterState> {
        let st = state_waiting(true, cap, wait_ms);
        st.disk_tier("c1", "a:1", Vec::new(), true).expect("tier");
        st.ledger_queue("c1", "a:1")
            .expect("queue")
            .0
            .mark_connected();
        for i in 0..4 {
            put(&st, &format!("f{i}"), QUARTER);
        }
        st
    }

    /// The owner of "a:1" applies and acknowledges what is queued; the
    /// offloads among it.
    fn owner_acks(st: &Arc<MasterState>) -> usize {
        let q = st.ledger_queue("c1", "a:1").expect("queue").0;
        let ops = q.ack_all(&|r| st.release_forgotten("a:1", "u-a:1", r));
        ops.iter()
            .filter(|op| matches!(op, LedgerOp::Offload { .. }))
            .count()
    }

    fn start_put(st: &Arc<MasterState>, key: &str) -> std::thread::JoinHandle<PutStartItem> {
        let (st, key) = (Arc::clone(st), key.to_string());
        std::thread::spawn(move || {
            let items = st.put_start(&[key], &[QUARTER], &WriteConfig::default(), false);
            items.into_iter().next().expect("one item")
        })
    }

    /// Until `n` puts have started waiting for room.
    fn until_waiting(st: &MasterState, n: u64) {
        for _ in 0..100_000 {
            if st.metrics.put_space_waits.get() >= n {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        panic!("no put waited for room");
    }

    #[test]
    fn a_put_into_full_memory_waits_for_the_move_to_disk_and_then_gets_its_room() {
        let st = full_with_tier(u64::MAX, 600_000);
        let writer = start_put(&st, "new");
        until_waiting(&st, 1);
        // The waiting put evicted for itself: the oldest object is being
        // copied to disk, and its space comes back on the owner's ack.
        assert!(owner_acks(&st) >= 1);
        let item = writer.join().expect("writer");
        let PutStartItem::Write { version, .. } = item else {
            panic!("the put did not get its room: {item:?}");
        };
        st.commit_end(&["new".to_string()], &[version], &["a:1".to_string()])
            .expect("end");
        let keys: Vec<String> = ["f0", "f1", "f2", "f3", "new"]
            .iter()
            .map(|k| k.to_string())
            .collect();
        assert_eq!(st.exist(&keys), vec![1; 5]);
        let f0 = st
            .get_replica_list(&keys[..1], false)
            .remove(0)
            .expect("f0");
        assert!(
            f0.replicas.is_empty() && f0.disk.is_some(),
            "f0 moved to disk"
        );
    }

    #[test]
    fn two_puts_of_one_key_waiting_for_room_write_it_once() {
        let st = full_with_tier(u64::MAX, 600_000);
        let a = start_put(&st, "same");
        let b = start_put(&st, "same");
        until_waiting(&st, 2);
        assert!(owner_acks(&st) >= 1);
        let got = [a.join().expect("a"), b.join().expect("b")];
        let writes = got
            .iter()
            .filter(|i| matches!(i, PutStartItem::Write { .. }))
            .count();
        let existing = got
            .iter()
            .filter(|i| matches!(i, PutStartItem::AlreadyExists))
            .count();
        assert_eq!((writes, existing), (1, 1), "{got:?}");
    }

    #[test]
    fn room_freed_while_puts_wait_goes_to_them_in_arrival_order() {
        let st = full_with_tier(u64::MAX, 600_000);
        let a = start_put(&st, "a");
        until_waiting(&st, 1);
        let b = start_put(&st, "b");
        until_waiting(&st, 2);
        // Room for one: the first to wait gets it, the other waits on.
        assert!(owner_acks(&st) >= 1);
        let PutStartItem::Write { version: va, .. } = a.join().expect("a") else {
            panic!("the first waiting put did not get the room");
        };
        // The second evicts again for itself once it is first in line.
        until_waiting(&st, 3);
        assert!(owner_acks(&st) >= 1);
        let PutStartItem::Write { version: vb, .. } = b.join().expect("b") else {
            panic!("the second waiting put did not get the next room");
        };
        assert!(va < vb, "placed out of order: {va} >= {vb}");
    }

    #[test]
    fn a_put_waiting_for_room_from_an_owner_that_goes_away_fails_at_once() {
        let st = full_with_tier(u64::MAX, 600_000);
        let writer = start_put(&st, "new");
        until_waiting(&st, 1);
        // The room it waits for was to come back on this owner's ack.
        st.unmount_segment("c1", "a:1").expect("unmount");
        assert!(matches!(
            writer.join().expect("writer"),
            PutStartItem::Err(ErrorCode::NoAvailableHandle)
        ));
    }

    #[test]
    fn with_the_disk_full_too_a_put_fails_at_once_and_nothing_is_dropped() {
        // Room on disk for nothing: eviction keeps every object in memory.
        let st = full_with_tier(0, 600_000);
        let items = st.put_start(
            &["new".to_string()],
            &[QUARTER],
            &WriteConfig::default(),
            false,
        );
        assert!(matches!(
            items[..],
            [PutStartItem::Err(ErrorCode::NoAvailableHandle)]
        ));
        assert_eq!(owner_acks(&st), 0, "nothing was moved");
        let keys: Vec<String> = (0..4).map(|i| format!("f{i}")).collect();
        assert_eq!(st.exist(&keys), vec![1; 4]);
        for info in st.get_replica_list(&keys, false) {
            assert_eq!(info.expect("found").replicas.len(), 1);
        }
        assert_eq!(st.inner.lock().disk_bytes, 0);
        // A periodic pass keeps them too.
        st.eviction_pass();
        assert_eq!(st.exist(&keys), vec![1; 4]);
    }

    #[test]
    fn a_put_whose_room_does_not_come_back_in_time_fails_and_the_room_comes_later() {
        let st = full_with_tier(u64::MAX, 20);
        // The owner never acknowledges within the wait.
        let items = st.put_start(
            &["late".to_string()],
            &[QUARTER],
            &WriteConfig::default(),
            false,
        );
        assert!(matches!(
            items[..],
            [PutStartItem::Err(ErrorCode::NoAvailableHandle)]
        ));
        assert!(owner_acks(&st) >= 1);
        put(&st, "late", QUARTER);
        assert_eq!(st.exist(&["late".to_string()]), vec![1]);
    }

    #[test]
    fn without_offload_a_put_waits_for_evicted_objects_to_be_forgotten() {
        let st = state_waiting(false, u64::MAX, 600_000);
        st.ledger_queue("c1", "a:1")
            .expect("queue")
            .0
            .mark_connected();
        for i in 0..4 {
            put(&st, &format!("f{i}"), QUARTER);
        }
        let writer = start_put(&st, "new");
        until_waiting(&st, 1);
        let q = st.ledger_queue("c1", "a:1").expect("queue").0;
        let ops = q.ack_all(&|r| st.release_forgotten("a:1", "u-a:1", r));
        assert!(ops.iter().any(|op| matches!(op, LedgerOp::Forget { .. })));
        assert!(matches!(
            writer.join().expect("writer"),
            PutStartItem::Write { .. }
        ));
        assert_eq!(st.exist(&["f0".to_string()]), vec![0], "f0 was evicted");
    }

    fn put(st: &MasterState, key: &str, size: u64) {
        let items = st.put_start(&[key.to_string()], &[size], &WriteConfig::default(), false);
        let Some(PutStartItem::Write { version, .. }) = items.into_iter().next() else {
            panic!("no write");
        };
        // Ended as the owner of "a:1" (its ledger ops come back here).
        st.commit_end(&[key.to_string()], &[version], &["a:1".to_string()])
            .expect("end");
    }

    #[test]
    fn an_evicted_object_becomes_a_disk_copy_read_from_its_owner() {
        let st = state(true, u64::MAX);
        st.disk_tier("c1", "a:1", Vec::new(), true).expect("tier");
        put(&st, "k", 1000);
        let moved = st.inner.lock().offload_object("k", u64::MAX);
        assert_eq!(moved, Offload::Moved);
        let info = st
            .get_replica_list(&["k".to_string()], false)
            .remove(0)
            .expect("found");
        assert!(info.replicas.is_empty());
        let disk = info.disk.expect("disk copy");
        assert_eq!(
            (disk.key.as_str(), disk.segment_name.as_str()),
            ("k", "a:1")
        );
        assert_eq!(st.exist(&["k".to_string()]), vec![1]);
        // The owner was told to copy it to disk.
        let q = st.ledger_queue("c1", "a:1").expect("queue").0;
        assert!(q
            .pending_ops()
            .iter()
            .any(|op| matches!(op, LedgerOp::Offload { key, size: 1000, .. } if key == "k")));
        // Removing it tells the owner to delete the copy.
        assert_eq!(st.remove(&["k".to_string()], true), vec![0]);
        assert!(q
            .pending_ops()
            .iter()
            .any(|op| matches!(op, LedgerOp::DiskForget { key, .. } if key == "k")));
        assert_eq!(st.inner.lock().disk_bytes, 0);
    }

    #[test]
    fn no_disk_tier_or_a_full_file_segment_moves_nothing() {
        let st = state(true, 1500);
        put(&st, "k", 1000);
        let no_tier = st.inner.lock().offload_object("k", 1500);
        assert_eq!(no_tier, Offload::NoTier);
        st.disk_tier("c1", "a:1", Vec::new(), true).expect("tier");
        let moved = st.inner.lock().offload_object("k", 1500);
        assert_eq!(moved, Offload::Moved);
        put(&st, "k2", 1000);
        let full = st.inner.lock().offload_object("k2", 1500);
        assert_eq!(full, Offload::Full, "over the file segment");
    }

    #[test]
    fn a_reported_tier_is_adopted_and_a_dropped_copy_is_forgotten() {
        let st = state(true, u64::MAX);
        put(&st, "known", 10);
        let objs = vec![
            DiskObject {
                key: "old".into(),
                version: 42,
                size: 5,
            },
            DiskObject {
                key: "known".into(),
                version: 1,
                size: 10,
            },
        ];
        assert_eq!(
            st.disk_tier("c1", "a:1", objs, true).expect("tier"),
            vec![1, 0]
        );
        let info = st
            .get_replica_list(&["old".to_string()], false)
            .remove(0)
            .expect("found");
        assert_eq!(info.disk.expect("disk").version, 42);
        assert_eq!(
            st.disk_tier("c2", "a:1", Vec::new(), true),
            Err(ErrorCode::IllegalClient)
        );
        // A report of another version changes nothing.
        st.disk_dropped("c1", "a:1", &[("old".to_string(), 41)])
            .expect("drop");
        assert_eq!(st.exist(&["old".to_string()]), vec![1]);
        st.disk_dropped("c1", "a:1", &[("old".to_string(), 42)])
            .expect("drop");
        assert_eq!(st.exist(&["old".to_string()]), vec![0]);
    }

    #[test]
    fn a_gone_segment_takes_its_disk_copies_with_it() {
        let st = state(true, u64::MAX);
        let objs = vec![DiskObject {
            key: "d".into(),
            version: 3,
            size: 5,
        }];
        st.disk_tier("c1", "a:1", objs, true).expect("tier");
        st.unmount_segment("c1", "a:1").expect("unmount");
        assert_eq!(st.exist(&["d".to_string()]), vec![0]);
        assert_eq!(st.inner.lock().disk_bytes, 0);
    }
}
