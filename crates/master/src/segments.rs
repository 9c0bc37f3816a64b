//! The mounted segments: a slab of entries addressed by a compact [`SegId`]
//! (what every replica stores, instead of the segment's name and memory id),
//! with an index by name for the requests that name a segment.
//!
//! A slot is reused after its segment is dropped, under a new generation:
//! an id kept by a replica, a retired version or a deferred free of the old
//! segment then resolves to nothing, as the old name and memory id did.
//!
//! The table also keeps the segments on their way in and out:
//! - remounts in progress: a segment whose owner reports its ledger in
//!   several parts is not usable until the last part arrives;
//! - the memory ids of segments this master expired (their owner missed
//!   its heartbeats), for a day: if such a segment comes back, its ledger
//!   is discarded, since its objects were dropped meanwhile.

use crate::allocator::OffsetAllocator;
use crate::ledger_push::OwnerQueue;
use mooncake_common::proto::SegmentDesc;
use mooncake_common::ErrorCode;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long the memory id of an expired segment is remembered.
const EXPIRED_KEPT: Duration = Duration::from_secs(86_400);

/// A remount whose report is still arriving: the parts reported so far.
#[derive(Debug)]
pub(crate) struct PendingMount {
    /// The owning client.
    pub client_id: String,
    /// The segment.
    pub desc: SegmentDesc,
    /// Entries received so far.
    pub entries: Vec<mooncake_common::ledger::LedgerEntry>,
}

/// A mounted segment and its allocator.
#[derive(Debug)]
pub(crate) struct SegmentEntry {
    pub desc: SegmentDesc,
    /// The desc's names as shared strings, for the replica descriptors of
    /// replies (one allocation per segment, not per replica described).
    pub names: SegmentNames,
    pub client_id: String,
    pub alloc: OffsetAllocator,
    /// Ledger ops for the owner (commits and forgets of replicas here).
    pub ledger: Arc<OwnerQueue>,
    /// The owner has a disk tier: evicted replicas here move to it.
    pub disk_tier: bool,
    /// The segment came back after this master expired it: the disk copies
    /// its owner announces next were dropped with it, and are not adopted.
    pub stale_disk: bool,
}

impl SegmentEntry {
    /// The entry of `desc`, freshly mounted by `client_id`: the whole
    /// segment free, no ledger ops queued, no disk tier.
    pub(crate) fn new(desc: &SegmentDesc, client_id: &str) -> SegmentEntry {
        SegmentEntry {
            alloc: OffsetAllocator::new(desc.size),
            names: SegmentNames::of(desc),
            desc: desc.clone(),
            client_id: client_id.to_string(),
            ledger: Arc::new(OwnerQueue::default()),
            disk_tier: false,
            stale_disk: false,
        }
    }
}

/// A segment's names, shared by the descriptors of its replicas.
#[derive(Debug, Clone)]
pub(crate) struct SegmentNames {
    pub name: Arc<str>,
    pub uuid: Arc<str>,
    pub endpoint: Arc<str>,
    pub host_id: Arc<str>,
    pub socket_name: Arc<str>,
}

impl SegmentNames {
    fn of(desc: &SegmentDesc) -> SegmentNames {
        SegmentNames {
            name: Arc::from(desc.name.as_str()),
            uuid: Arc::from(desc.uuid.as_str()),
            endpoint: Arc::from(desc.endpoint.as_str()),
            host_id: Arc::from(desc.host_id.as_str()),
            socket_name: Arc::from(desc.socket_name.as_str()),
        }
    }
}

/// A mounted segment's slot and the generation of the mount it names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct SegId {
    idx: u32,
    gen: u32,
}

#[derive(Debug)]
struct Slot {
    gen: u32,
    entry: Option<SegmentEntry>,
}

/// Mounted segments by id and by name, with the remounts in progress and
/// the expired memory ids (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct Segments {
    slots: Vec<Slot>,
    by_name: HashMap<String, SegId>,
    free: Vec<u32>,
    /// Remounts in progress, by segment name.
    pending: HashMap<String, PendingMount>,
    /// Memory ids of segments this master expired, with when.
    expired: HashMap<String, Instant>,
}

impl Segments {
    /// The segment `id` names, if it is still mounted.
    pub(crate) fn by_id(&self, id: SegId) -> Option<&SegmentEntry> {
        let s = self.slots.get(id.idx as usize)?;
        (s.gen == id.gen).then_some(s.entry.as_ref()).flatten()
    }

    /// Mutable [`Segments::by_id`].
    pub(crate) fn by_id_mut(&mut self, id: SegId) -> Option<&mut SegmentEntry> {
        let s = self.slots.get_mut(id.idx as usize)?;
        if s.gen == id.gen {
            s.entry.as_mut()
        } else {
            None
        }
    }

    /// The id of the segment mounted as `name`.
    pub(crate) fn id_of(&self, name: &str) -> Option<SegId> {
        self.by_name.get(name).copied()
    }

    /// The name of segment `id` ("" once it is gone).
    pub(crate) fn name_of(&self, id: SegId) -> &str {
        self.by_id(id).map_or("", |s| s.desc.name.as_str())
    }

    /// The id of the segment mounted as `name`, which must belong to
    /// `client_id`: `SegmentNotFound` when none is, `IllegalClient` when
    /// another client owns it.
    pub(crate) fn owned_id(&self, client_id: &str, name: &str) -> Result<SegId, ErrorCode> {
        let id = self.id_of(name).ok_or(ErrorCode::SegmentNotFound)?;
        match self.by_id(id) {
            Some(s) if s.client_id == client_id => Ok(id),
            Some(_) => Err(ErrorCode::IllegalClient),
            None => Err(ErrorCode::SegmentNotFound),
        }
    }

    /// The segment mounted as `name`.
    pub(crate) fn get(&self, name: &str) -> Option<&SegmentEntry> {
        self.id_of(name).and_then(|id| self.by_id(id))
    }

    /// Mutable [`Segments::get`].
    pub(crate) fn get_mut(&mut self, name: &str) -> Option<&mut SegmentEntry> {
        let id = self.id_of(name)?;
        self.by_id_mut(id)
    }

    /// Mount `entry` under its name (replacing a segment of that name);
    /// its new id.
    pub(crate) fn insert(&mut self, entry: SegmentEntry) -> SegId {
        let name = entry.desc.name.clone();
        self.remove(&name);
        let idx = match self.free.pop() {
            Some(i) => i,
            None => {
                self.slots.push(Slot {
                    gen: 0,
                    entry: None,
                });
                u32::try_from(self.slots.len() - 1).unwrap_or(u32::MAX)
            }
        };
        let slot = &mut self.slots[idx as usize];
        slot.gen = slot.gen.wrapping_add(1);
        slot.entry = Some(entry);
        let id = SegId { idx, gen: slot.gen };
        self.by_name.insert(name, id);
        id
    }

    /// Unmount the segment `name`; its id and entry.
    pub(crate) fn remove(&mut self, name: &str) -> Option<(SegId, SegmentEntry)> {
        let id = self.by_name.remove(name)?;
        let slot = self.slots.get_mut(id.idx as usize)?;
        let entry = slot.entry.take()?;
        self.free.push(id.idx);
        Some((id, entry))
    }

    /// Unmount the segment `name` and drop a remount of that name in
    /// progress; the mounted segment's id and entry.
    pub(crate) fn unmount(&mut self, name: &str) -> Option<(SegId, SegmentEntry)> {
        self.pending.remove(name);
        self.remove(name)
    }

    /// The segment `name` expired at `now` (its owner missed its
    /// heartbeats): remember its memory id, and unmount it.
    pub(crate) fn expire(&mut self, name: &str, now: Instant) -> Option<(SegId, SegmentEntry)> {
        if let Some(seg) = self.get(name) {
            let uuid = seg.desc.uuid.clone();
            self.expired.insert(uuid, now);
        }
        self.unmount(name)
    }

    /// Forget the expired memory ids older than a day at `now`.
    pub(crate) fn forget_old_expired(&mut self, now: Instant) {
        self.expired
            .retain(|_, at| now.saturating_duration_since(*at) < EXPIRED_KEPT);
    }

    /// Whether the segment with memory id `uuid` expired here; the id is
    /// forgotten (it is mounted again).
    pub(crate) fn take_expired(&mut self, uuid: &str) -> bool {
        self.expired.remove(uuid).is_some()
    }

    /// Whether memory id `uuid` is remembered as expired (tests).
    #[cfg(test)]
    pub(crate) fn is_expired(&self, uuid: &str) -> bool {
        self.expired.contains_key(uuid)
    }

    /// Remember memory id `uuid` as expired at `at` (tests).
    #[cfg(test)]
    pub(crate) fn note_expired(&mut self, uuid: &str, at: Instant) {
        self.expired.insert(uuid.to_string(), at);
    }

    /// Drop the remounts in progress of `client_id` (it expired).
    pub(crate) fn drop_remounts_of(&mut self, client_id: &str) {
        self.pending.retain(|_, p| p.client_id != client_id);
    }

    /// The client remounting `name`, if a remount is in progress.
    pub(crate) fn remounting(&self, name: &str) -> Option<&str> {
        self.pending.get(name).map(|p| p.client_id.as_str())
    }

    /// Add one part of `client_id`'s ledger report for `desc`. A report
    /// from another client or for another memory id than the one in
    /// progress starts over.
    pub(crate) fn report_part(
        &mut self,
        client_id: &str,
        desc: &SegmentDesc,
        entries: Vec<mooncake_common::ledger::LedgerEntry>,
    ) {
        let fresh = || PendingMount {
            client_id: client_id.to_string(),
            desc: desc.clone(),
            entries: Vec::new(),
        };
        let pending = self.pending.entry(desc.name.clone()).or_insert_with(fresh);
        if pending.client_id != client_id || pending.desc.uuid != desc.uuid {
            *pending = fresh();
        }
        pending.entries.extend(entries);
    }

    /// The whole report of the remount of `name` (its last part arrived).
    pub(crate) fn take_report(&mut self, name: &str) -> Option<PendingMount> {
        self.pending.remove(name)
    }

    /// Whether any remount is in progress.
    pub(crate) fn remounts_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Every mounted segment.
    pub(crate) fn values(&self) -> impl Iterator<Item = &SegmentEntry> {
        self.slots.iter().filter_map(|s| s.entry.as_ref())
    }

    /// Names of the mounted segments.
    pub(crate) fn keys(&self) -> impl Iterator<Item = &String> {
        self.by_name.keys()
    }

    /// Number of mounted segments.
    pub(crate) fn len(&self) -> usize {
        self.by_name.len()
    }

    /// Whether no segment is mounted.
    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }
}

#[cfg(test)]
impl std::ops::Index<&str> for Segments {
    type Output = SegmentEntry;

    fn index(&self, name: &str) -> &SegmentEntry {
        match self.get(name) {
            Some(s) => s,
            None => panic!("no segment named {name:?}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::recovery::tests::{desc, entry};

    #[test]
    fn a_reused_slot_does_not_resolve_the_old_id() {
        let mut s = Segments::default();
        let a = s.insert(SegmentEntry::new(&desc("a", "ua"), "c1"));
        assert_eq!(s.name_of(a), "a");
        assert!(s.unmount("a").is_some());
        assert!(s.by_id(a).is_none() && s.name_of(a).is_empty());
        let b = s.insert(SegmentEntry::new(&desc("b", "ub"), "c1"));
        assert_ne!(a, b, "same slot, new generation");
        assert!(s.by_id(a).is_none());
        assert_eq!(s.owned_id("c1", "b"), Ok(b));
        assert_eq!(s.owned_id("c2", "b"), Err(ErrorCode::IllegalClient));
        assert_eq!(s.owned_id("c1", "a"), Err(ErrorCode::SegmentNotFound));
    }

    #[test]
    fn a_remount_report_collects_its_parts_and_starts_over_for_another_owner() {
        let mut s = Segments::default();
        assert!(!s.remounts_pending());
        s.report_part("c1", &desc("a", "u1"), vec![entry("k1", 1, 0, 64)]);
        s.report_part("c1", &desc("a", "u1"), vec![entry("k2", 2, 64, 64)]);
        assert!(s.remounts_pending());
        assert_eq!(s.remounting("a"), Some("c1"));
        assert_eq!(s.remounting("b"), None);
        // Another memory id of the same name starts over.
        s.report_part("c1", &desc("a", "u2"), vec![entry("k3", 3, 0, 64)]);
        // So does another client.
        s.report_part("c2", &desc("b", "u3"), vec![entry("k4", 4, 0, 64)]);
        s.report_part("c3", &desc("b", "u3"), vec![entry("k5", 5, 0, 64)]);
        let a = s.take_report("a").expect("a's report");
        assert_eq!((a.client_id.as_str(), a.desc.uuid.as_str()), ("c1", "u2"));
        assert_eq!(a.entries.len(), 1);
        assert_eq!(a.entries[0].key, "k3");
        assert_eq!(s.remounting("b"), Some("c3"));
        assert!(s.take_report("a").is_none(), "taken once");
        // An expired client's remounts go; unmounting a name drops its own.
        s.report_part("c4", &desc("c", "u4"), vec![]);
        s.drop_remounts_of("c3");
        assert_eq!(s.remounting("b"), None);
        assert!(s.unmount("c").is_none(), "c was not mounted yet");
        assert!(!s.remounts_pending());
    }

    #[test]
    fn an_expired_memory_id_is_remembered_for_a_day() {
        let mut s = Segments::default();
        let t0 = Instant::now();
        s.insert(SegmentEntry::new(&desc("a", "ua"), "c1"));
        s.insert(SegmentEntry::new(&desc("b", "ub"), "c1"));
        assert!(s.expire("a", t0).is_some());
        assert!(s.get("a").is_none(), "an expired segment is unmounted");
        assert!(s.expire("gone", t0).is_none());
        s.forget_old_expired(t0 + EXPIRED_KEPT - Duration::from_secs(1));
        assert!(s.is_expired("ua") && !s.is_expired("ub"));
        s.forget_old_expired(t0 + EXPIRED_KEPT);
        assert!(!s.is_expired("ua"), "forgotten after a day");
        // Coming back is answered once.
        s.expire("b", t0);
        assert!(s.take_expired("ub"));
        assert!(!s.take_expired("ub"));
    }
}
