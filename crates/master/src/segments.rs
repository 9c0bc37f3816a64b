//! The mounted segments: a slab of entries addressed by a compact [`SegId`]
//! (what every replica stores, instead of the segment's name and memory id),
//! with an index by name for the requests that name a segment.
//!
//! A slot is reused after its segment is dropped, under a new generation:
//! an id kept by a replica, a retired version or a deferred free of the old
//! segment then resolves to nothing, as the old name and memory id did.

use crate::allocator::OffsetAllocator;
use crate::ledger_push::OwnerQueue;
use mooncake_common::proto::SegmentDesc;
use mooncake_common::ErrorCode;
use std::collections::HashMap;
use std::sync::Arc;

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

/// Mounted segments by id and by name.
#[derive(Debug, Default)]
pub(crate) struct Segments {
    slots: Vec<Slot>,
    by_name: HashMap<String, SegId>,
    free: Vec<u32>,
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
