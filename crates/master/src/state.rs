//! The master's in-memory metadata: clients, mounted segments (each with its
//! own allocator) and objects. All mutation goes through [`MasterState`],
//! which serialises access with one lock; RPC handlers and background tasks
//! (eviction, client TTL, discard sweep) call into it.
//!
//! What the lock guards, `Inner`, is a set of tables, each a plain struct
//! with private fields that keeps its own invariant and has unit tests on
//! explicit times: the clients and their heartbeats (`clients`), the
//! objects and their disk usage (`object_table`), the segments with their
//! remounts in progress and expired ids (`segments`), retired versions
//! (`retired`), read tickets (`read_tickets`), deferred frees
//! (`deferred_frees`), the forgets later writes wait for (`forgets`) and
//! the puts waiting for room (`space_queue`). The steps that span tables
//! (put start, commit, removal, a segment going) are methods of `Inner`
//! and [`MasterState`].

use crate::admin::{AdminView, GaugeSnapshot, ReplicaView};
use crate::clock::{Clock, SystemClock};
use crate::config::MasterConfig;
use crate::metadata_kv::MetadataKv;
use crate::metrics::MasterMetrics;
use crate::segments::{SegId, SegmentEntry, Segments};
use mooncake_common::ledger::LedgerOp;
use mooncake_common::proto::{ReplicaLoc, SegmentDesc, SoftPin, MAX_SEGMENT_SIZE};
use mooncake_common::ErrorCode;
use parking_lot::{Condvar, Mutex};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub(crate) use crate::object_table::{
    ObjStatus, Object, ObjectTable, PendingPin, PendingWrite, Replica, Replicas,
};

/// Objects one sweep for stale in-flight writes looks at (about a
/// millisecond of work under the lock).
pub(crate) const SWEEP_CHUNK: usize = 65_536;

/// Everything under the master lock.
#[derive(Debug, Default)]
pub(crate) struct Inner {
    /// Registered clients, their heartbeats and segments.
    pub clients: crate::clients::Clients,
    pub segments: Segments,
    /// Objects by key, with the disk usage of their disk copies.
    pub objects: ObjectTable,
    /// Space of discarded writes, freed after the discard delay.
    pub deferred: crate::deferred_frees::DeferredFrees,
    /// Open read tickets: the keys each marked and when it expires.
    pub tickets: crate::read_tickets::ReadTickets,
    /// Highest object version assigned or adopted.
    pub last_version: u64,
    /// Forgets not yet known to be acknowledged, which later writes wait for.
    pub forgets: crate::forgets::Forgets,
    /// Replaced versions still being read, per key, oldest first.
    pub retired: crate::retired::RetiredVersions,
    /// Where the next sweep for stale in-flight writes resumes in `objects`
    /// (each sweep looks at [`SWEEP_CHUNK`] entries, so its cost and the
    /// time it holds the lock do not grow with the number of objects).
    pub sweep_cursor: usize,
    /// Puts waiting for room: freed room goes to the first, and no other
    /// put takes room while any waits.
    pub space_queue: crate::space_queue::SpaceQueue,
    /// Promotions in flight, by the space allocated for them.
    pub promotions: HashMap<(SegId, u64), Promotion>,
    /// Copy and move tasks.
    pub tasks: crate::tasks::TaskTable,
    /// Copies of those tasks in flight, by the space allocated for them.
    pub fetches: HashMap<(SegId, u64), FetchJob>,
    /// Tasks whose copy in flight lost its target segment (failed at the
    /// next sweep).
    pub lost_fetches: Vec<u128>,
    /// Numbers of the client ids that created objects (see
    /// `Object::writer`), from 1.
    pub writer_ids: HashMap<Box<str>, u32>,
    /// Object groups.
    pub groups: crate::groups::Groups,
    /// Tenant quota policies and allocation tags.
    pub tenants: crate::tenants::Tenants,
    /// How long after its start a discarded write's space stays allocated
    /// while its writer may still copy (`put_start_release_timeout_sec`).
    pub discard_release: Duration,
    /// Keys whose objects this master removed (recent ones): their disk
    /// copies are not adopted again.
    pub gone: crate::gone_keys::GoneKeys,
}

/// A promotion in flight: the owner of the disk copy reads it back into
/// space allocated on its segment.
#[derive(Debug)]
pub(crate) struct Promotion {
    pub key: Box<str>,
    pub version: u64,
    pub size: u64,
}

/// A copy of a copy or move task in flight: the space allocated for it
/// (its key in `Inner::fetches`) is the object `key` at `version`.
#[derive(Debug)]
pub(crate) struct FetchJob {
    pub task: u128,
    pub key: Box<str>,
    pub version: u64,
    pub size: u64,
}

/// The master's shared state.
pub struct MasterState {
    pub(crate) cfg: MasterConfig,
    pub(crate) metrics: Arc<MasterMetrics>,
    pub(crate) metadata: Option<Arc<MetadataKv>>,
    pub(crate) inner: Mutex<Inner>,
    pub(crate) need_eviction: AtomicBool,
    /// Source of read-ticket ids (0 is never used).
    pub(crate) next_ticket: std::sync::atomic::AtomicU64,
    /// Set when this state's term ended: background loops exit.
    pub(crate) stopped: AtomicBool,
    /// Signalled (with `inner` held) whenever a retired version is freed.
    pub(crate) version_freed: Condvar,
    /// Signalled whenever an in-place rewrite may have ended.
    pub(crate) rewrite_done: Condvar,
    /// Signalled (with `inner` held) whenever segment space is freed: puts
    /// waiting for room retry (see `eviction`).
    pub(crate) space_freed: Condvar,
    /// Bumped (with `inner` held) with every `space_freed` signal, so a
    /// waiter tells a free that came before it slept from none.
    pub(crate) space_gen: std::sync::atomic::AtomicU64,
    /// Time for leases, pins, TTLs and delays.
    pub(crate) clock: Arc<dyn Clock>,
    /// The hold of a term that took over (see `takeover`), if any.
    pub(crate) takeover: Mutex<Option<crate::takeover::Hold>>,
    /// Set once no request needs to look at `takeover` again.
    pub(crate) takeover_settled: AtomicBool,
    /// Signalled (with `inner` held) whenever a remount completes.
    pub(crate) remounted: Condvar,
}

impl MasterState {
    /// Create the state; call [`MasterState::start_background`] inside a tokio runtime.
    pub fn new(
        cfg: MasterConfig,
        metrics: Arc<MasterMetrics>,
        metadata: Option<Arc<MetadataKv>>,
    ) -> Arc<Self> {
        Self::with_clock(cfg, metrics, metadata, Arc::new(SystemClock))
    }

    /// A state with fresh metrics and no metadata store whose time is a
    /// [`crate::clock::ManualClock`]: it moves only when its caller
    /// advances it.
    #[cfg(test)]
    pub(crate) fn on_manual_clock(
        cfg: MasterConfig,
    ) -> (Arc<Self>, Arc<crate::clock::ManualClock>) {
        let clock = Arc::new(crate::clock::ManualClock::default());
        let st = Self::with_clock(
            cfg,
            Arc::new(MasterMetrics::default()),
            None,
            Arc::clone(&clock) as _,
        );
        (st, clock)
    }

    /// [`MasterState::new`] reading time from `clock`.
    pub fn with_clock(
        cfg: MasterConfig,
        metrics: Arc<MasterMetrics>,
        metadata: Option<Arc<MetadataKv>>,
        clock: Arc<dyn Clock>,
    ) -> Arc<Self> {
        let tasks = crate::tasks::TaskTable::new(cfg.task_limits());
        let tenants = if cfg.enable_multi_tenants {
            crate::tenants::Tenants::load(cfg.tenant_quota_file.clone().into()).unwrap_or_else(|e| {
                // Checked at start: the file changed since. No tenant is
                // admitted until the admin API sets a policy.
                tracing::error!(error = %e, "tenant quota policy unreadable: every write is refused (TENANT_NOT_REGISTERED) until a policy is set");
                crate::tenants::Tenants::closed(cfg.tenant_quota_file.clone().into())
            })
        } else {
            crate::tenants::Tenants::default()
        };
        let discard_release = Duration::from_secs(cfg.put_start_release_timeout_sec);
        Arc::new(MasterState {
            cfg,
            metrics,
            metadata,
            inner: Mutex::new(Inner {
                tasks,
                tenants,
                discard_release,
                ..Inner::default()
            }),
            need_eviction: AtomicBool::new(false),
            next_ticket: std::sync::atomic::AtomicU64::new(1),
            stopped: AtomicBool::new(false),
            version_freed: Condvar::new(),
            rewrite_done: Condvar::new(),
            space_freed: Condvar::new(),
            space_gen: std::sync::atomic::AtomicU64::new(0),
            clock,
            takeover: Mutex::new(None),
            takeover_settled: AtomicBool::new(true),
            remounted: Condvar::new(),
        })
    }

    /// The effective configuration.
    pub fn config(&self) -> &MasterConfig {
        &self.cfg
    }

    /// Spawn the periodic tasks: eviction (10 ms), client TTL and discard
    /// sweep. They end when [`MasterState::stop`] is called.
    pub fn start_background(self: &Arc<Self>) {
        let me = Arc::clone(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(10));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            while !me.is_stopped() {
                tick.tick().await;
                me.eviction_pass();
            }
        });
        let me = Arc::clone(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(200));
            while !me.is_stopped() {
                tick.tick().await;
                me.expire_clients();
                me.sweep_discarded();
                me.sweep_tasks();
            }
        });
    }

    /// End this state's life (its HA term ended): background tasks stop and
    /// every ledger stream and waiter is released.
    pub fn stop(&self) {
        self.stopped.store(true, Ordering::Release);
        let g = self.inner.lock();
        for seg in g.segments.values() {
            seg.ledger.close();
        }
        // Room on its way back from those owners no longer comes.
        self.space_freed.notify_all();
    }

    /// Whether [`MasterState::stop`] was called.
    pub fn is_stopped(&self) -> bool {
        self.stopped.load(Ordering::Acquire)
    }

    /// Heartbeat. Returns true when the client is unknown and must remount.
    pub fn ping(&self, client_id: &str) -> bool {
        self.metrics.ping_requests.inc();
        let mut g = self.inner.lock();
        let now = self.clock.now();
        !g.clients.ping(client_id, now)
    }

    /// Mount (or remount) a segment for a client. A size no client can
    /// map ([`MAX_SEGMENT_SIZE`]), or one that would overflow the total
    /// capacity, is refused with INVALID_PARAMS.
    pub fn mount_segment(&self, client_id: &str, desc: SegmentDesc) -> Result<(), ErrorCode> {
        self.metrics.mount_segment_requests.inc();
        if desc.size > MAX_SEGMENT_SIZE {
            tracing::warn!(segment = %desc.name, size = desc.size, "refused a segment larger than any client can map");
            return Err(ErrorCode::InvalidParams);
        }
        let mut g = self.inner.lock();
        // A remount with new memory replaces the old segment of that name.
        let replaced = match g.segments.get(&desc.name) {
            Some(existing) if existing.client_id != client_id => {
                return Err(ErrorCode::SegmentAlreadyExists)
            }
            Some(existing) if existing.desc.uuid == desc.uuid => return Ok(()),
            Some(existing) => Some(existing.alloc.capacity()),
            None => None,
        };
        let fits = g
            .total_capacity()
            .and_then(|t| t.checked_sub(replaced.unwrap_or(0)))
            .and_then(|t| t.checked_add(desc.size))
            .is_some();
        if !fits {
            tracing::warn!(segment = %desc.name, size = desc.size, "refused a segment that overflows the capacity sum");
            return Err(ErrorCode::InvalidParams);
        }
        if replaced.is_some() {
            let name = desc.name.clone();
            g.drop_segment(&name);
        }
        if desc.size > 0 {
            g.segments.insert(SegmentEntry::new(&desc, client_id));
        }
        g.clients.register(client_id, self.clock.now());
        if desc.size > 0 {
            g.clients.add_segment(client_id, &desc.name);
        }
        // New capacity: puts waiting for room look again.
        self.note_space_freed();
        Ok(())
    }

    /// Unmount one segment of a client; its replicas are dropped.
    pub fn unmount_segment(&self, client_id: &str, name: &str) -> Result<(), ErrorCode> {
        self.metrics.unmount_segment_requests.inc();
        let mut g = self.inner.lock();
        g.segments.owned_id(client_id, name)?;
        g.drop_segment(name);
        g.clients.remove_segment(client_id, name);
        // Room on its way back from that segment no longer comes.
        self.space_freed.notify_all();
        Ok(())
    }

    /// A client leaves: drop all of its segments and forget it.
    pub fn disconnect(&self, client_id: &str) {
        let mut g = self.inner.lock();
        if let Some(c) = g.clients.remove(client_id) {
            for s in c.segments {
                g.drop_segment(&s);
            }
            self.space_freed.notify_all();
        }
    }

    /// Expire clients that missed their TTL, with their segments; a time
    /// the master itself did not run is not counted (see `clients`).
    pub(crate) fn expire_clients(&self) {
        let ttl = Duration::from_secs(self.cfg.client_ttl_sec.max(0) as u64);
        let now = self.clock.now();
        let mut expired_segments = Vec::new();
        {
            let mut g = self.inner.lock();
            let check = g.clients.check_ttl(now, ttl);
            if let Some(gap) = check.stalled {
                tracing::warn!(
                    ?gap,
                    clients = g.clients.len(),
                    "the master did not run for a while: that time is not counted against client TTLs"
                );
            }
            for (id, c) in check.expired {
                tracing::warn!(client = %id, segments = ?c.segments, "client expired after missing heartbeats");
                for s in c.segments {
                    g.expire_segment(&s, now);
                    expired_segments.push(s);
                }
                g.segments.drop_remounts_of(&id);
            }
            if !expired_segments.is_empty() {
                self.space_freed.notify_all();
            }
            g.segments.forget_old_expired(now);
        }
        if self.cfg.enable_metadata_cleanup_on_timeout {
            if let Some(kv) = &self.metadata {
                for s in expired_segments {
                    kv.cleanup_segment(&s);
                }
            }
        }
    }

    /// Release deferred frees whose time has come and discard stale
    /// PROCESSING puts and upserts (in the next [`SWEEP_CHUNK`] objects).
    pub(crate) fn sweep_discarded(&self) {
        let now = self.clock.now();
        let discard = Duration::from_secs(self.cfg.put_start_discard_timeout_sec);
        let release = Duration::from_secs(self.cfg.put_start_release_timeout_sec);
        let mut g = self.inner.lock();
        let stale_start =
            |t: Option<Instant>| t.is_some_and(|t| now.saturating_duration_since(t) > discard);
        // The next chunk of objects, from where the last sweep stopped: a
        // write that went stale is found within (objects / SWEEP_CHUNK)
        // sweeps of its deadline. An entry that moved (a removal swaps the
        // last entry into its place) is found on the next round.
        let len = g.objects.len();
        let start = if g.sweep_cursor < len {
            g.sweep_cursor
        } else {
            0
        };
        let end = (start + SWEEP_CHUNK).min(len);
        g.sweep_cursor = if end >= len { 0 } else { end };
        let mut stale = Vec::new();
        let mut stale_upserts = Vec::new();
        for i in start..end {
            let Some((k, o)) = g.objects.get_index_mut(i) else {
                break;
            };
            if o.status == ObjStatus::Processing && stale_start(o.put_start()) {
                stale.push(Box::<str>::from(k));
            }
            // Upserts whose writer went silent: their space returns later.
            if o.upserts().iter().any(|p| stale_start(Some(p.put_start))) {
                stale_upserts.extend(o.take_upserts_where(|p| stale_start(Some(p.put_start))));
            }
        }
        let discarded = !stale.is_empty();
        for k in stale {
            g.discard_processing(&k, release);
        }
        if discarded {
            // A discarded in-place rewrite no longer holds its key's lookups.
            self.rewrite_done.notify_all();
        }
        for p in stale_upserts {
            g.defer_free(&p.replicas, p.size, p.version, p.put_start + release);
        }
        self.sweep_retired(&mut g, now);
        g.sweep_groups();
        g.tickets.expire(now);
        let due = g.deferred.take_due(now);
        let freed = !due.is_empty();
        for d in due {
            if let Some(seg) = g.segments.by_id_mut(d.seg) {
                seg.alloc.free(d.offset, d.size);
            }
        }
        if freed {
            self.note_space_freed();
        }
    }

    /// Used and total bytes over all segments.
    pub fn usage(&self) -> (u64, u64) {
        self.inner.lock().usage()
    }
}

impl Inner {
    /// A read leased objects of the groups `numbers` (repeats allowed)
    /// until `until`: lease every live member of those groups as long.
    pub(crate) fn lease_groups(&mut self, mut numbers: Vec<u32>, until: Instant) {
        numbers.sort_unstable();
        numbers.dedup();
        for n in numbers {
            let Inner {
                groups, objects, ..
            } = self;
            let members = groups.live_members(n, |k| objects.get(k).is_some_and(|o| o.group == n));
            for k in members {
                if let Some(o) = objects.get_mut(&k) {
                    if until > o.lease_deadline {
                        o.lease_deadline = until;
                    }
                }
            }
        }
    }

    /// The members of group `n` eviction may take with it at `now`, or
    /// `None` when a member is leased (the group stays whole).
    pub(crate) fn group_victims(&mut self, n: u32, now: Instant) -> Option<Vec<Box<str>>> {
        let Inner {
            groups, objects, ..
        } = self;
        let members = groups.live_members(n, |k| objects.get(k).is_some_and(|o| o.group == n));
        let mut out = Vec::with_capacity(members.len());
        for k in members {
            let Some(o) = objects.get(&k) else {
                continue;
            };
            if !lease_expired(o, now) {
                return None;
            }
            let soft = o.soft_pin_deadline.is_some_and(|d| d > now);
            if o.status == ObjStatus::Complete && !o.hard_pin && !soft && !o.replicas.is_empty() {
                out.push(k);
            }
        }
        Some(out)
    }

    /// Prune a chunk of groups (the periodic sweep).
    pub(crate) fn sweep_groups(&mut self) {
        let Inner {
            groups, objects, ..
        } = self;
        groups.sweep(SWEEP_CHUNK / 16, |n, k| {
            objects.get(k).is_some_and(|o| o.group == n)
        });
    }

    /// The number of client `id` in `Object::writer` (0 for an empty id).
    pub(crate) fn writer_id(&mut self, id: &str) -> u32 {
        if id.is_empty() {
            return 0;
        }
        if let Some(n) = self.writer_ids.get(id) {
            return *n;
        }
        let n = u32::try_from(self.writer_ids.len() + 1).unwrap_or(u32::MAX);
        self.writer_ids.insert(id.into(), n);
        n
    }

    /// Used and total bytes over all segments (mounts keep the sum in
    /// range; saturating all the same).
    pub(crate) fn usage(&self) -> (u64, u64) {
        self.segments.values().fold((0, 0), |(u, t), s| {
            (
                u.saturating_add(s.alloc.used()),
                t.saturating_add(s.alloc.capacity()),
            )
        })
    }

    /// Sum of mounted capacities, `None` if it does not fit a `u64`.
    pub(crate) fn total_capacity(&self) -> Option<u64> {
        self.segments
            .values()
            .try_fold(0u64, |t, s| t.checked_add(s.alloc.capacity()))
    }

    /// Whether the owner of segment `name` has missed a heartbeat at `now`
    /// (an unknown owner counts as suspect).
    pub(crate) fn is_suspect(&self, name: &str, now: Instant) -> bool {
        match self
            .segments
            .get(name)
            .and_then(|s| self.clients.get(&s.client_id))
        {
            Some(c) => c.is_suspect(now),
            None => true,
        }
    }

    /// Remove a segment: drop its replicas, erase objects left without one.
    pub(crate) fn drop_segment(&mut self, name: &str) {
        let gone = self.segments.unmount(name);
        self.dropped_segment(gone);
    }

    /// [`Inner::drop_segment`] for a segment that expired at `now` (its
    /// memory id is remembered: see `segments`).
    pub(crate) fn expire_segment(&mut self, name: &str, now: Instant) {
        let gone = self.segments.expire(name, now);
        self.dropped_segment(gone);
    }

    /// Drop the replicas of an unmounted segment, erase objects left
    /// without one.
    fn dropped_segment(&mut self, gone: Option<(SegId, SegmentEntry)>) {
        let Some((id, seg)) = gone else {
            return;
        };
        seg.ledger.close();
        self.deferred.drop_segment(id);
        self.promotions.retain(|(s, _), _| *s != id);
        // Copies in flight to it fail their tasks at the next sweep.
        let lost = self.fetches.iter().filter(|((s, _), _)| *s == id);
        let lost: Vec<u128> = lost.map(|(_, j)| j.task).collect();
        self.fetches.retain(|(s, _), _| *s != id);
        self.lost_fetches.extend(lost);
        self.retired.drop_segment(id);
        // Objects left with nothing: those that lost their last memory
        // replica here and have no disk copy, and those whose disk copy was
        // here and have no memory replica.
        let mut empty = Vec::new();
        for (k, o) in self.objects.iter_mut() {
            o.drop_upsert_replicas(id);
            let before = o.replicas.len();
            o.replicas.retain(|r| r.seg != id);
            if before > 0 && o.replicas.is_empty() && o.disk().is_none() {
                empty.push(k.clone());
            }
        }
        empty.extend(self.objects.drop_disk_copies_on(id));
        for k in empty {
            self.erase_bare(&k);
        }
    }

    /// A new object version: above every version assigned or adopted so
    /// far, and at least the wall clock in microseconds (so versions keep
    /// growing across master restarts and failovers).
    pub(crate) fn next_version(&mut self) -> u64 {
        let now_us = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_micros() as u64)
            .unwrap_or(0);
        let v = self.last_version.saturating_add(1).max(now_us);
        self.last_version = v;
        v
    }

    /// Free replicas of `size` bytes now.
    pub(crate) fn free_replicas(&mut self, replicas: &[Replica], size: u64) {
        for r in replicas {
            if let Some(seg) = self.segments.by_id_mut(r.seg) {
                seg.alloc.free(r.offset, size);
            }
        }
    }

    /// Free replicas of `size` bytes, written by the write of `version`, at
    /// `at` (its writer may still be copying into them until then), or
    /// once that writer ends or revokes the write
    /// ([`Inner::release_discarded`]).
    pub(crate) fn defer_free(
        &mut self,
        replicas: &[Replica],
        size: u64,
        version: u64,
        at: Instant,
    ) {
        for r in replicas {
            self.deferred.defer(r.seg, r.offset, size, version, at);
        }
    }

    /// The writer of `version` ended or revoked it, and its write had been
    /// discarded (its object removed or evicted, or the write gone stale)
    /// while it copied: it copies no more, so the space kept for it
    /// returns now instead of after the discard delay. Each owner is told
    /// to forget the version (it may have recorded its commit) and the
    /// space returns on that ack. Returns whether the write had such space.
    pub(crate) fn release_discarded(&mut self, version: u64) -> bool {
        if version == 0 {
            return false;
        }
        let mine = self.deferred.take_version(version);
        for d in &mine {
            if let Some(seg) = self.segments.by_id(d.seg) {
                let op = LedgerOp::Forget {
                    offset: d.offset,
                    version,
                };
                seg.ledger.push_forget_then_free(op, d.offset, d.size);
            }
        }
        !mine.is_empty()
    }

    /// Discard a stale PROCESSING object; its space is released later.
    pub(crate) fn discard_processing(&mut self, key: &str, release: Duration) {
        if let Some(mut o) = self.objects.remove(key) {
            self.discard_upserts(&mut o, release);
            if let Some(start) = o.put_start() {
                self.defer_free(&o.replicas, o.size, o.version, start + release);
            }
        }
    }

    /// After many removals: give the object index's unused capacity back
    /// (it never shrinks by itself). Returns whether it shrank.
    pub(crate) fn shrink_after_removals(&mut self) -> bool {
        let (len, cap) = (self.objects.len(), self.objects.capacity());
        if cap > 4096 && len * 4 < cap {
            self.objects.shrink_to_fit();
            self.tickets.shrink_to_fit();
            self.retired.shrink_to_fit();
            true
        } else {
            false
        }
    }

    /// Describe a replica for a client.
    pub(crate) fn replica_loc(&self, r: &Replica, size: u64) -> Option<ReplicaLoc> {
        let seg = self.segments.by_id(r.seg)?;
        Some(ReplicaLoc {
            segment_name: Arc::clone(&seg.names.name),
            segment_uuid: Arc::clone(&seg.names.uuid),
            endpoint: Arc::clone(&seg.names.endpoint),
            host_id: Arc::clone(&seg.names.host_id),
            socket_name: Arc::clone(&seg.names.socket_name),
            segment_size: seg.desc.size,
            base_addr: seg.desc.base_addr,
            offset: r.offset,
            size,
            ticket: None,
        })
    }
}

/// Map a soft-pin request to the change applied at commit.
pub(crate) fn pending_pin(action: SoftPin, ttl: Option<u64>, default_ttl: u64) -> PendingPin {
    match action {
        SoftPin::Preserve => PendingPin::Keep,
        SoftPin::Disable => PendingPin::Clear,
        SoftPin::Enable => match ttl.unwrap_or(default_ttl) {
            0 => PendingPin::Clear,
            t => PendingPin::Set(t),
        },
    }
}

impl AdminView for MasterState {
    fn tenant_quotas(
        &self,
        only: Option<&str>,
    ) -> Result<Vec<crate::tenants::TenantQuota>, crate::tenants::QuotaAdminError> {
        MasterState::tenant_quotas(self, only)
    }

    fn upsert_tenant_quota(
        &self,
        tenant: &str,
        bytes: u64,
    ) -> Result<crate::tenants::TenantQuota, crate::tenants::QuotaAdminError> {
        MasterState::upsert_tenant_quota(self, tenant, bytes)
    }

    fn delete_tenant_quota(
        &self,
        tenant: &str,
    ) -> Result<crate::tenants::TenantQuota, crate::tenants::QuotaAdminError> {
        MasterState::delete_tenant_quota(self, tenant)
    }

    fn query_key(&self, key: &str) -> Result<Vec<ReplicaView>, ErrorCode> {
        let infos = self.get_replica_list(&[key.to_string()], false);
        match infos.into_iter().next() {
            Some(Ok(info)) => Ok(info
                .replicas
                .into_iter()
                .map(|r| ReplicaView {
                    size: r.size,
                    buffer_address: r.base_addr.wrapping_add(r.offset),
                    transport_endpoint: r.endpoint.to_string(),
                })
                .collect()),
            Some(Err(e)) => Err(e),
            None => Err(ErrorCode::InternalError),
        }
    }

    fn all_keys(&self) -> Vec<String> {
        let mut v: Vec<String> = self
            .inner
            .lock()
            .objects
            .keys()
            .map(|k| k.to_string())
            .collect();
        v.sort();
        v
    }

    fn all_segments(&self) -> Vec<String> {
        let mut v: Vec<String> = self.inner.lock().segments.keys().cloned().collect();
        v.sort();
        v
    }

    fn gauges(&self) -> GaugeSnapshot {
        let g = self.inner.lock();
        let (used, total) = g.usage();
        let now = self.clock.now();
        GaugeSnapshot {
            allocated_bytes: used,
            total_capacity_bytes: total,
            key_count: g.objects.len() as u64,
            soft_pin_key_count: g
                .objects
                .values()
                .filter(|o| o.soft_pin_deadline.is_some_and(|d| d > now))
                .count() as u64,
            active_clients: g.clients.len() as u64,
            retired_versions: g.retired.totals().0,
            retired_bytes: g.retired.totals().1,
            tenants: if g.tenants.enabled {
                g.tenant_quotas(None)
            } else {
                Vec::new()
            },
            ..Default::default()
        }
    }
}

/// Whether the pattern uses syntax that ECMAScript does not have (inline flags etc.).
pub(crate) fn is_non_ecmascript(pattern: &str) -> bool {
    let b = pattern.as_bytes();
    let mut i = 0;
    while i + 1 < b.len() {
        if b[i] == b'\\' {
            i += 2;
            continue;
        }
        if b[i] == b'(' && b[i + 1] == b'?' {
            match b.get(i + 2) {
                Some(b':') => {}
                _ => return true,
            }
        }
        i += 1;
    }
    false
}

/// Convenience used by the eviction code: is the lease over?
pub(crate) fn lease_expired(o: &Object, now: Instant) -> bool {
    o.lease_deadline <= now
}

/// Record that eviction is needed (a put could not allocate).
pub(crate) fn flag_eviction(state: &MasterState) {
    state.need_eviction.store(true, Ordering::Relaxed);
}
