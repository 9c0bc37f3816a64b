//! Watermark eviction: evict unleased, unpinned objects oldest
//! lease first; soft-pinned objects only when that is not enough. When the
//! master offloads, an evicted object whose replica lives on an owner with
//! a disk tier moves there instead of being dropped (see `offload`).

use crate::state::{lease_expired, MasterState, ObjStatus};
use std::sync::atomic::Ordering;

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
        let releasing: u64 = g
            .segments
            .values()
            .map(|s| s.ledger.releasing_bytes())
            .sum();
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
        let mut bytes = 0u64;
        let mut offloaded = 0u64;
        let offload = self.cfg.offloads();
        let file_cap = self.cfg.global_file_segment_size;
        let release = std::time::Duration::from_secs(self.cfg.put_start_release_timeout_sec);
        for k in &victims {
            if let Some(o) = g.objects.get(&**k) {
                bytes = bytes.saturating_add(o.size.saturating_mul(o.replicas.len() as u64));
            }
            // The space returns when the owners acknowledge the forget
            // (or the move to disk).
            if offload && g.offload_object(k, file_cap) {
                offloaded += 1;
                continue;
            }
            let _ = g.remove_object(k, now, release);
        }
        if !victims.is_empty() {
            self.metrics.successful_evictions.inc();
            self.metrics.evicted_key_count.inc_by(victims.len() as u64);
            self.metrics.evicted_size_bytes.inc_by(bytes);
            tracing::info!(evicted = victims.len(), offloaded, bytes, "eviction pass");
        }
    }
}
