//! The object index, and the objects' metadata.
//!
//! [`ObjectTable`] holds the objects by key: entries in one dense vector
//! with a table of indices, so each key is stored once and no slot is left
//! empty (a removal swaps the last entry into the gap). It owns one
//! invariant across all objects: the disk-tier usage it reports
//! ([`ObjectTable::disk`]) is the sum of the sizes of the objects that
//! record a disk copy. An object's disk copy is therefore set and dropped
//! only through the table (insertion, [`ObjectTable::set_disk`],
//! [`ObjectTable::take_disk`], removal, and a segment's copies going at
//! once), and an object's size changes only while it has no disk copy.
//!
//! An [`Object`] at rest is a fixed layout with its replicas inline; what
//! only a write or read in flight needs lives in a side allocation that
//! exists while one is.

use crate::disk_usage::{DiskNote, DiskUsage};
use crate::segments::SegId;
use indexmap::IndexMap;
use smallvec::SmallVec;
use std::time::Instant;

/// Lifecycle of an object's replicas.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ObjStatus {
    Processing,
    Complete,
}

/// One replica: a range in a segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Replica {
    pub seg: SegId,
    pub offset: u64,
}

/// An object's replicas, inline for the usual one.
pub(crate) type Replicas = SmallVec<[Replica; 1]>;

/// Pin change to apply when a write commits.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) enum PendingPin {
    #[default]
    Keep,
    Set(u64),
    Clear,
}

/// An object's metadata. What only a write or read in flight needs lives
/// in [`Extra`], allocated while one is, so an object at rest is a fixed
/// layout with its replicas inline.
#[derive(Debug)]
pub(crate) struct Object {
    pub size: u64,
    /// Master-assigned version (see `mooncake_common::ledger`).
    pub version: u64,
    pub replicas: Replicas,
    pub lease_deadline: Instant,
    pub soft_pin_deadline: Option<Instant>,
    pub status: ObjStatus,
    pub hard_pin: bool,
    /// The segment whose owner holds this version in its disk tier. Set
    /// and cleared only through [`ObjectTable`], which counts the bytes.
    disk: Option<SegId>,
    /// Reads of this version while it had no memory replica (promotion
    /// admission), saturating.
    pub disk_hits: u8,
    /// A promotion of it back to memory is in flight.
    pub promoting: bool,
    /// The number of the group the key joined (see `groups`), 0 for none.
    pub group: u32,
    /// The client that created the key, as [`Inner::writer_id`] numbers
    /// it (0: not known, as for objects recovered from the owners'
    /// ledgers).
    pub writer: u32,
    extra: Option<Box<Extra>>,
}

/// The parts of an object's state that exist only while a write or a read
/// of it is in flight.
#[derive(Debug, Default)]
struct Extra {
    /// When the first write started (set while PROCESSING).
    put_start: Option<Instant>,
    /// Pin change the first write applies when it commits.
    pending_pin: PendingPin,
    /// Reads in flight: `(read ticket, expiry)`. An entry goes away when
    /// its client reports the ticket done; until then it counts while
    /// unexpired. It expires with the lease its lookup granted: a client
    /// discards any copy that finishes after that lease (LEASE_EXPIRED),
    /// so an expired entry can no longer protect a read that matters.
    readers: Vec<(u64, Instant)>,
    /// Upserts in flight over the committed version, each writing into its
    /// own fresh replicas while readers keep reading the committed ones.
    upserts: Vec<PendingWrite>,
    /// The write in flight (PROCESSING) rewrites a committed value in
    /// place: the key exists, and lookups wait for the write to end
    /// instead of failing.
    rewrite: bool,
    /// A lookup waited for an in-place rewrite and has not read yet: the
    /// next upsert writes a new version beside the value instead of
    /// rewriting it again, so a writer in a loop cannot keep a reader
    /// waiting.
    reader_waiting: bool,
}

impl Extra {
    fn is_idle(&self) -> bool {
        self.put_start.is_none()
            && self.readers.is_empty()
            && self.upserts.is_empty()
            && !self.rewrite
            && !self.reader_waiting
    }
}

impl Object {
    /// A first write in flight (PROCESSING) started at `now`.
    pub(crate) fn processing(
        size: u64,
        version: u64,
        replicas: Replicas,
        now: Instant,
        hard_pin: bool,
        pending_pin: PendingPin,
    ) -> Object {
        Object {
            status: ObjStatus::Processing,
            extra: Some(Box::new(Extra {
                put_start: Some(now),
                pending_pin,
                ..Extra::default()
            })),
            ..Object::complete(size, version, replicas, now, None, hard_pin)
        }
    }

    /// A committed object (adopted from an owner's report).
    pub(crate) fn complete(
        size: u64,
        version: u64,
        replicas: Replicas,
        lease_deadline: Instant,
        soft_pin_deadline: Option<Instant>,
        hard_pin: bool,
    ) -> Object {
        Object {
            size,
            version,
            replicas,
            lease_deadline,
            soft_pin_deadline,
            status: ObjStatus::Complete,
            hard_pin,
            disk: None,
            disk_hits: 0,
            promoting: false,
            group: 0,
            writer: 0,
            extra: None,
        }
    }

    /// The segment whose owner holds this version in its disk tier.
    pub(crate) fn disk(&self) -> Option<SegId> {
        self.disk
    }

    /// This object with its disk copy on `seg` (before it joins the table).
    pub(crate) fn on_disk(mut self, seg: SegId) -> Object {
        self.disk = Some(seg);
        self
    }

    fn extra_mut(&mut self) -> &mut Extra {
        self.extra.get_or_insert_with(Box::default)
    }

    /// Drop the in-flight part once nothing is in flight.
    fn tidy(&mut self) {
        if self.extra.as_ref().is_some_and(|e| e.is_idle()) {
            self.extra = None;
        }
    }

    /// When the first write started (PROCESSING objects).
    pub(crate) fn put_start(&self) -> Option<Instant> {
        self.extra.as_ref().and_then(|e| e.put_start)
    }

    /// The pin change the first write applies when it commits.
    pub(crate) fn pending_pin(&self) -> PendingPin {
        self.extra
            .as_ref()
            .map_or(PendingPin::Keep, |e| e.pending_pin)
    }

    /// The first write (or in-place rewrite) committed: the object is COMPLETE.
    pub(crate) fn mark_complete(&mut self) {
        self.status = ObjStatus::Complete;
        if let Some(e) = self.extra.as_mut() {
            e.put_start = None;
            e.pending_pin = PendingPin::Keep;
            e.rewrite = false;
        }
        self.tidy();
    }

    /// Start rewriting this committed object's replicas in place as
    /// `version`: it is PROCESSING until the write commits (then COMPLETE
    /// at `version`) or is revoked or discarded (then gone: its bytes are
    /// no longer a whole version).
    pub(crate) fn begin_rewrite(
        &mut self,
        version: u64,
        now: Instant,
        hard_pin: bool,
        pending_pin: PendingPin,
    ) {
        self.status = ObjStatus::Processing;
        self.version = version;
        self.hard_pin |= hard_pin;
        let e = self.extra_mut();
        e.put_start = Some(now);
        e.pending_pin = pending_pin;
        e.rewrite = true;
    }

    /// When the in-place rewrite in flight started (None: no rewrite).
    pub(crate) fn rewrite_start(&self) -> Option<Instant> {
        self.extra
            .as_ref()
            .filter(|e| e.rewrite)
            .and_then(|e| e.put_start)
    }

    /// Reads that may be in flight.
    pub(crate) fn readers(&self) -> &[(u64, Instant)] {
        self.extra.as_ref().map_or(&[], |e| e.readers.as_slice())
    }

    /// Count a read under `ticket` until `expiry` (expired ones are dropped).
    pub(crate) fn add_reader(&mut self, ticket: u64, expiry: Instant, now: Instant) {
        let e = self.extra_mut();
        e.readers.retain(|(_, exp)| *exp > now);
        e.readers.push((ticket, expiry));
        e.reader_waiting = false;
    }

    /// A lookup is waiting for the in-place rewrite in flight.
    pub(crate) fn note_waiting_reader(&mut self) {
        self.extra_mut().reader_waiting = true;
    }

    /// Whether a lookup waited for a rewrite and has not read since.
    pub(crate) fn reader_waiting(&self) -> bool {
        self.extra.as_ref().is_some_and(|e| e.reader_waiting)
    }

    /// The read of `ticket` ended.
    pub(crate) fn remove_reader(&mut self, ticket: u64) {
        if let Some(e) = self.extra.as_mut() {
            e.readers.retain(|(t, _)| *t != ticket);
        }
        self.tidy();
    }

    /// Hand over the reads in flight (the version they read is replaced).
    pub(crate) fn take_readers(&mut self) -> Vec<(u64, Instant)> {
        let r = self
            .extra
            .as_mut()
            .map(|e| std::mem::take(&mut e.readers))
            .unwrap_or_default();
        self.tidy();
        r
    }

    /// Whether a read of this object may be in flight at `now`.
    pub(crate) fn being_read(&self, now: Instant) -> bool {
        self.readers().iter().any(|(_, exp)| *exp > now)
    }

    /// Upserts in flight.
    pub(crate) fn upserts(&self) -> &[PendingWrite] {
        self.extra.as_ref().map_or(&[], |e| e.upserts.as_slice())
    }

    /// Start an upsert.
    pub(crate) fn push_upsert(&mut self, w: PendingWrite) {
        self.extra_mut().upserts.push(w);
    }

    /// Take the upsert of `version` out of the object.
    pub(crate) fn take_upsert(&mut self, version: u64) -> Option<PendingWrite> {
        let e = self.extra.as_mut()?;
        let i = e.upserts.iter().position(|p| p.version == version)?;
        let p = e.upserts.remove(i);
        self.tidy();
        Some(p)
    }

    /// Take the upserts for which `stale` holds.
    pub(crate) fn take_upserts_where(
        &mut self,
        stale: impl Fn(&PendingWrite) -> bool,
    ) -> Vec<PendingWrite> {
        let Some(e) = self.extra.as_mut() else {
            return Vec::new();
        };
        let (out, keep): (Vec<_>, Vec<_>) = std::mem::take(&mut e.upserts)
            .into_iter()
            .partition(|p| stale(p));
        e.upserts = keep;
        self.tidy();
        out
    }

    /// Drop the replicas in segment `seg` from the object's upserts.
    pub(crate) fn drop_upsert_replicas(&mut self, seg: SegId) {
        if let Some(e) = self.extra.as_mut() {
            for p in e.upserts.iter_mut() {
                p.replicas.retain(|r| r.seg != seg);
            }
        }
    }
}

/// An upsert in flight over a committed object: the new version's replicas
/// and what its commit applies.
#[derive(Debug)]
pub(crate) struct PendingWrite {
    pub version: u64,
    pub size: u64,
    pub replicas: Vec<Replica>,
    pub put_start: Instant,
    /// Hard pin of the new version (the write's, OR-ed with the object's).
    pub hard_pin: bool,
    pub pending_pin: PendingPin,
}

/// The objects by key, with the disk usage of their disk copies (see the
/// module docs).
#[derive(Debug, Default)]
pub(crate) struct ObjectTable {
    map: IndexMap<Box<str>, Object>,
    disk: DiskUsage,
}

impl ObjectTable {
    /// The object `key`.
    pub(crate) fn get(&self, key: &str) -> Option<&Object> {
        self.map.get(key)
    }

    /// Mutable [`ObjectTable::get`] (its disk copy stays the table's).
    pub(crate) fn get_mut(&mut self, key: &str) -> Option<&mut Object> {
        self.map.get_mut(key)
    }

    /// The entry at index `i` (see [`ObjectTable::get_index_of`]).
    pub(crate) fn get_index_mut(&mut self, i: usize) -> Option<(&str, &mut Object)> {
        self.map.get_index_mut(i).map(|(k, o)| (&**k, o))
    }

    /// Where `key` is in the index now (a removal may move the last entry).
    pub(crate) fn get_index_of(&self, key: &str) -> Option<usize> {
        self.map.get_index_of(key)
    }

    /// Whether `key` has an object.
    pub(crate) fn contains_key(&self, key: &str) -> bool {
        self.map.contains_key(key)
    }

    /// Number of objects.
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether there are no objects.
    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Entries the index has room for.
    pub(crate) fn capacity(&self) -> usize {
        self.map.capacity()
    }

    /// Give unused capacity back.
    pub(crate) fn shrink_to_fit(&mut self) {
        self.map.shrink_to_fit();
    }

    /// Every object, in index order.
    pub(crate) fn iter(&self) -> indexmap::map::Iter<'_, Box<str>, Object> {
        self.map.iter()
    }

    /// Every object, mutably (their disk copies stay the table's).
    pub(crate) fn iter_mut(&mut self) -> indexmap::map::IterMut<'_, Box<str>, Object> {
        self.map.iter_mut()
    }

    /// Every key, in index order.
    pub(crate) fn keys(&self) -> indexmap::map::Keys<'_, Box<str>, Object> {
        self.map.keys()
    }

    /// Every object, in index order.
    pub(crate) fn values(&self) -> indexmap::map::Values<'_, Box<str>, Object> {
        self.map.values()
    }

    /// Put `o` under `key` (its disk copy, if any, counts); the object it
    /// replaced, whose disk copy no longer counts.
    pub(crate) fn insert(&mut self, key: Box<str>, o: Object) -> Option<Object> {
        if o.disk.is_some() {
            self.disk.add(o.size);
        }
        let old = self.map.insert(key, o);
        if let Some(old) = &old {
            self.uncount(old);
        }
        old
    }

    /// Take the object `key` out (its disk copy no longer counts; the
    /// object still names it, for the caller to have it forgotten).
    pub(crate) fn remove(&mut self, key: &str) -> Option<Object> {
        self.remove_entry(key).map(|(_, o)| o)
    }

    /// [`ObjectTable::remove`] with the stored key.
    pub(crate) fn remove_entry(&mut self, key: &str) -> Option<(Box<str>, Object)> {
        let (k, o) = self.map.swap_remove_entry(key)?;
        self.uncount(&o);
        Some((k, o))
    }

    /// Take every object out, leaving the table empty with no disk usage
    /// (a caller that keeps some inserts them again).
    pub(crate) fn take_all(&mut self) -> IndexMap<Box<str>, Object> {
        self.disk.release(self.disk.bytes());
        std::mem::take(&mut self.map)
    }

    /// Replace the index with `map`, built by the caller from what
    /// [`ObjectTable::take_all`] returned (its disk copies count).
    pub(crate) fn restore(&mut self, map: IndexMap<Box<str>, Object>) {
        let bytes = map
            .values()
            .filter(|o| o.disk.is_some())
            .fold(0u64, |b, o| b.saturating_add(o.size));
        self.map = map;
        self.disk.add(bytes);
    }

    /// Record that `key`'s version has a disk copy on `seg` (its size now
    /// counts); false when there is no such object or it has one already.
    pub(crate) fn set_disk(&mut self, key: &str, seg: SegId) -> bool {
        match self.map.get_mut(key) {
            Some(o) if o.disk.is_none() => {
                o.disk = Some(seg);
                self.disk.add(o.size);
                true
            }
            _ => false,
        }
    }

    /// Drop `key`'s disk copy from its record (its size no longer counts);
    /// where it was.
    pub(crate) fn take_disk(&mut self, key: &str) -> Option<SegId> {
        let o = self.map.get_mut(key)?;
        let seg = o.disk.take()?;
        self.disk.release(o.size);
        Some(seg)
    }

    /// The disk copies on `seg` are gone (its tier was drained, or the
    /// segment went): every object drops its record of one there. Returns
    /// the keys of the objects that thereby have no copy left at all (no
    /// memory replica either).
    pub(crate) fn drop_disk_copies_on(&mut self, seg: SegId) -> Vec<Box<str>> {
        let mut freed = 0u64;
        let mut bare = Vec::new();
        for (k, o) in self.map.iter_mut() {
            if o.disk == Some(seg) {
                o.disk = None;
                freed = freed.saturating_add(o.size);
                if o.replicas.is_empty() {
                    bare.push(k.clone());
                }
            }
        }
        self.disk.release(freed);
        bare
    }

    /// The disk-tier usage of the objects' disk copies.
    pub(crate) fn disk(&self) -> &DiskUsage {
        &self.disk
    }

    /// An eviction pass offloaded `offloaded` objects and kept `kept` in
    /// memory for want of disk: whether to warn now (see
    /// [`DiskUsage::after_pass`]).
    pub(crate) fn note_eviction_pass(&mut self, kept: u64, offloaded: u64) -> DiskNote {
        self.disk.after_pass(kept, offloaded)
    }

    fn uncount(&mut self, o: &Object) {
        if o.disk.is_some() {
            self.disk.release(o.size);
        }
    }
}

#[cfg(test)]
impl std::ops::Index<&str> for ObjectTable {
    type Output = Object;

    fn index(&self, key: &str) -> &Object {
        match self.map.get(key) {
            Some(o) => o,
            None => panic!("no object under {key:?}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::segments::{SegmentEntry, Segments};

    fn segs() -> (SegId, SegId) {
        let mut s = Segments::default();
        let d = |n| crate::recovery::tests::desc(n, n);
        (
            s.insert(SegmentEntry::new(&d("a"), "c")),
            s.insert(SegmentEntry::new(&d("b"), "c")),
        )
    }

    fn obj(size: u64, replicas: &[SegId]) -> Object {
        let r = replicas
            .iter()
            .map(|&seg| Replica { seg, offset: 0 })
            .collect();
        Object::complete(size, 1, r, Instant::now(), None, false)
    }

    /// The usage the table reports equals the sum over its objects.
    fn check(t: &ObjectTable) {
        let sum: u64 = t
            .values()
            .filter(|o| o.disk().is_some())
            .map(|o| o.size)
            .sum();
        assert_eq!(t.disk().bytes(), sum);
    }

    #[test]
    fn disk_usage_follows_every_way_a_copy_comes_and_goes() {
        let (a, b) = segs();
        let mut t = ObjectTable::default();
        t.insert("m".into(), obj(10, &[a]));
        t.insert("d".into(), obj(20, &[]).on_disk(b));
        assert_eq!(t.disk().bytes(), 20);
        assert!(t.set_disk("m", a));
        assert!(!t.set_disk("m", b), "one disk copy per version");
        assert!(!t.set_disk("none", b));
        assert_eq!(t.disk().bytes(), 30);
        check(&t);
        // Replacing an object with a disk copy uncounts it.
        let old = t.insert("m".into(), obj(5, &[a]));
        assert_eq!(old.and_then(|o| o.disk()), Some(a));
        assert_eq!(t.disk().bytes(), 20);
        assert!(t.set_disk("m", a));
        assert_eq!(t.take_disk("m"), Some(a));
        assert_eq!(t.take_disk("m"), None);
        check(&t);
        // A removed object keeps naming its copy, which no longer counts.
        let (k, o) = t.remove_entry("d").expect("d");
        assert_eq!((&*k, o.disk()), ("d", Some(b)));
        assert_eq!(t.disk().bytes(), 0);
        check(&t);
    }

    #[test]
    fn a_gone_tier_reports_the_objects_left_with_nothing() {
        let (a, b) = segs();
        let mut t = ObjectTable::default();
        t.insert("bare".into(), obj(1, &[]).on_disk(a));
        t.insert("kept".into(), obj(2, &[b]).on_disk(a));
        t.insert("other".into(), obj(4, &[]).on_disk(b));
        t.insert("mem".into(), obj(8, &[a]));
        let bare = t.drop_disk_copies_on(a);
        assert_eq!(bare, vec![Box::<str>::from("bare")]);
        assert_eq!(t.disk().bytes(), 4);
        assert_eq!(t["kept"].disk(), None);
        assert_eq!(t["other"].disk(), Some(b));
        check(&t);
    }

    #[test]
    fn taking_all_and_restoring_some_counts_only_what_came_back() {
        let (a, _) = segs();
        let mut t = ObjectTable::default();
        for (i, k) in ["x", "y", "z"].iter().enumerate() {
            t.insert((*k).into(), obj(1 << i, &[]).on_disk(a));
        }
        assert_eq!(t.disk().bytes(), 7);
        let all = t.take_all();
        assert!(t.is_empty() && t.disk().bytes() == 0);
        let keep: IndexMap<Box<str>, Object> =
            all.into_iter().filter(|(k, _)| &**k != "y").collect();
        t.restore(keep);
        assert_eq!((t.len(), t.disk().bytes()), (2, 5));
        assert_eq!(t.get_index_of("z"), Some(1));
        check(&t);
    }
}
