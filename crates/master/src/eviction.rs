//! Watermark eviction: evict unleased, unpinned objects oldest
//! lease first; soft-pinned objects only when that is not enough. When the
//! master offloads (see `offload`), an evicted object that has a disk copy
//! (written through when it was committed) loses only its memory replicas;
//! one without, whose replica lives on an owner with a disk tier, moves
//! there instead of being dropped. One that cannot be queued for disk
//! (the disk copies at `--global_file_segment_size`, the owner's queue at
//! `--offloading_queue_limit`, or, with `--offload_on_evict`, the pass's
//! cap of `offloading_queue_limit * offload_cap_ratio` reached) stays in
//! memory, or is dropped with `--offload_force_evict`.
//!
//! An object of a group (see `groups`) goes only with its whole group:
//! when no member is leased, every member that may be evicted goes with it.
//!
//! Evicted space returns when the owners acknowledge (a move to disk: once
//! the bytes are on disk), so writers can outrun it. A put that finds no
//! room therefore evicts at once and waits, without the lock, while space
//! is on its way back ([`MasterState::wait_for_space`]), at most
//! `--put_space_wait_ms`; it is woken by each free. When nothing is on its
//! way back (everything left is leased, pinned, being written, or kept for
//! want of disk) it fails at once with NO_AVAILABLE_HANDLE, with nothing
//! dropped.

use crate::disk_usage::DiskNote;
use crate::offload::Offload;
use crate::state::{flag_eviction, lease_expired, Inner, MasterState, ObjStatus};
use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::time::Instant;

impl MasterState {
    /// One eviction pass; called every 10 ms.
    pub(crate) fn eviction_pass(&self) {
        let hw = self.cfg.eviction_high_watermark_ratio;
        let er = self.cfg.eviction_ratio;
        let mut g = self.inner.lock();
        let (used, total) = g.usage();
        if total == 0 {
            self.need_eviction.store(false, Ordering::Relaxed);
            return;
        }
        // Space whose release waits only for a connected owner's ack (an
        // earlier pass's victims, possibly being copied to disk) counts as
        // free: evicting again for it would evict twice.
        let releasing = g.releasing_bytes();
        let used = used.saturating_sub(releasing);
        let ratio = used as f64 / total as f64;
        let flagged = self.need_eviction.load(Ordering::Relaxed) && er > 0.0;
        if ratio <= hw && (!flagged || releasing > 0) {
            return;
        }
        self.need_eviction.store(false, Ordering::Relaxed);
        self.metrics.attempted_evictions.inc();
        let now = self.clock.now();
        let mut plain = Vec::new();
        let mut pinned = Vec::new();
        for (k, o) in g.objects.iter() {
            if o.status != ObjStatus::Complete
                || o.hard_pin
                || o.replicas.is_empty()
                || !lease_expired(o, now)
            {
                continue;
            }
            let soft = o.soft_pin_deadline.is_some_and(|d| d > now);
            let entry = (o.lease_deadline, k.clone());
            if soft {
                pinned.push(entry);
            } else {
                plain.push(entry);
            }
        }
        let n = (plain.len() + pinned.len()) as f64;
        if n == 0.0 {
            return;
        }
        let target_frac = er.max(ratio - hw + er);
        let target = (target_frac * n).ceil() as usize;
        let lower = ((target as f64 / 2.0).max((ratio - hw) * n)).ceil() as usize;
        plain.sort();
        pinned.sort();
        let mut victims: Vec<Box<str>> = plain.into_iter().take(target).map(|(_, k)| k).collect();
        if victims.len() < lower && self.cfg.allow_evict_soft_pinned_objects {
            let more = target.saturating_sub(victims.len());
            victims.extend(pinned.into_iter().take(more).map(|(_, k)| k));
        }
        let victims = g.whole_groups(victims, now);
        let mut bytes = 0u64;
        let mut offloaded = 0u64;
        let mut evicted = 0u64;
        let mut kept = 0u64;
        let offload = self.cfg.offloads();
        let file_cap = self.cfg.global_file_segment_size;
        let queue_limit = self.cfg.offloading_queue_limit;
        let on_evict = self.cfg.offload_on_evict;
        let pass_cap = if on_evict {
            self.cfg.offload_cap()
        } else {
            u64::MAX
        };
        let force = on_evict && self.cfg.offload_force_evict;
        let mut forced = 0u64;
        let release = std::time::Duration::from_secs(self.cfg.put_start_release_timeout_sec);
        for k in &victims {
            let held = g
                .objects
                .get(k)
                .map_or(0, |o| o.size.saturating_mul(o.replicas.len() as u64));
            // The space returns when the owners acknowledge the forget
            // (or the move to disk).
            if offload {
                match g.evict_to_disk_copy(k) {
                    Offload::Moved => {
                        evicted += 1;
                        bytes = bytes.saturating_add(held);
                        continue;
                    }
                    Offload::Busy => {
                        kept += 1;
                        continue;
                    }
                    Offload::NoTier | Offload::Full => {}
                }
                let moved = if offloaded >= pass_cap {
                    Offload::Full
                } else {
                    g.offload_object(k, file_cap, queue_limit)
                };
                match moved {
                    Offload::Moved => {
                        offloaded += 1;
                        evicted += 1;
                        bytes = bytes.saturating_add(held);
                        continue;
                    }
                    Offload::Full if force => forced += 1,
                    Offload::Full | Offload::Busy => {
                        kept += 1;
                        continue;
                    }
                    Offload::NoTier => {}
                }
            }
            let _ = g.remove_object(k, now, release);
            evicted += 1;
            bytes = bytes.saturating_add(held);
        }
        if g.objects.note_eviction_pass(kept, offloaded) == DiskNote::Full {
            tracing::warn!(kept, disk_bytes = g.objects.disk().bytes(), cap = file_cap, "memory eviction keeps objects in memory that it cannot queue for disk (--global_file_segment_size, --offloading_queue_limit, or with --offload_on_evict the pass's share of it, --offload_cap_ratio); puts that need their space fail with NO_AVAILABLE_HANDLE");
        }
        if evicted > 0 {
            self.metrics.successful_evictions.inc();
            self.metrics.evicted_key_count.inc_by(evicted);
            self.metrics.evicted_size_bytes.inc_by(bytes);
            tracing::info!(evicted, offloaded, kept, forced, bytes, "eviction pass");
        }
    }

    /// A put found no room; `seen` is [`MasterState::space_gen`] as it read
    /// it then, with the lock held (`None`: it was behind another waiting
    /// put and did not look at the room), and `ticket` its place in the queue of
    /// puts waiting for room ([`MasterState::queue_for_space`]). Run an
    /// eviction pass for it at once (not at the next periodic one), then
    /// wait, without the lock, until it is first in the queue and space was
    /// freed since `seen` (true: look again), until it is first and nothing
    /// is on its way back any more, or until `deadline` (real time: the
    /// space comes back on other processes' acks).
    pub(crate) fn wait_for_space(&self, seen: Option<u64>, deadline: Instant, ticket: u64) -> bool {
        if Instant::now() >= deadline {
            return false;
        }
        flag_eviction(self);
        self.eviction_pass();
        // Counted once its pass queued what it evicted.
        self.metrics.put_space_waits.inc();
        let mut g = self.inner.lock();
        loop {
            let first = g.space_queue.is_first(ticket);
            let freed = seen.is_none_or(|s| self.space_gen.load(Ordering::Acquire) != s);
            if first && freed {
                return true;
            }
            if first && g.releasing_bytes() == 0 {
                return false;
            }
            if self.space_freed.wait_until(&mut g, deadline).timed_out() {
                let first = g.space_queue.is_first(ticket);
                return first && seen.is_none_or(|s| self.space_gen.load(Ordering::Acquire) != s);
            }
        }
    }

    /// A put starts waiting for room: its ticket, last in the queue.
    pub(crate) fn queue_for_space(&self) -> u64 {
        let mut g = self.inner.lock();
        g.space_queue.join()
    }

    /// The put of `ticket` is done waiting: the next one in the queue
    /// looks at the room.
    pub(crate) fn leave_space_queue(&self, ticket: u64) {
        let mut g = self.inner.lock();
        g.space_queue.leave(ticket);
        self.space_freed.notify_all();
    }

    /// Space was freed (call with `inner` held): wake the puts waiting for room.
    pub(crate) fn note_space_freed(&self) {
        self.space_gen.fetch_add(1, Ordering::AcqRel);
        self.space_freed.notify_all();
    }
}

impl Inner {
    /// Bytes whose release waits only for a connected owner's ack (or is
    /// being handed back to the allocator now).
    pub(crate) fn releasing_bytes(&self) -> u64 {
        self.segments
            .values()
            .map(|s| s.ledger.releasing_bytes())
            .sum()
    }
}

impl Inner {
    /// `victims` with each grouped one replaced by its group's members
    /// (none when a member is leased), each key once.
    fn whole_groups(&mut self, victims: Vec<Box<str>>, now: Instant) -> Vec<Box<str>> {
        let grouped = victims
            .iter()
            .any(|k| self.objects.get(k).is_some_and(|o| o.group != 0));
        if !grouped {
            return victims;
        }
        let mut seen: HashSet<Box<str>> = HashSet::with_capacity(victims.len());
        let mut done_groups = HashSet::new();
        let mut out = Vec::with_capacity(victims.len());
        for k in victims {
            let group = self.objects.get(&k).map_or(0, |o| o.group);
            if group == 0 {
                if seen.insert(k.clone()) {
                    out.push(k);
                }
                continue;
            }
            if !done_groups.insert(group) {
                continue;
            }
            for m in self.group_victims(group, now).unwrap_or_default() {
                if seen.insert(m.clone()) {
                    out.push(m);
                }
            }
        }
        out
    }
}
