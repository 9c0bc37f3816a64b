//! Rebuilding metadata from the segment owners (no object lost
//! when a master dies). A client whose master does not know it (the master
//! restarted, or a new HA leader took over) remounts its segment with a
//! report of its ledger: the committed replicas its memory holds. The
//! segment becomes usable only once the whole report arrived, and then:
//!
//! - an entry for a key the master does not have becomes a COMPLETE object
//!   (lease expired, pins as recorded) with that replica;
//! - an entry with the version the master has adds a replica to it;
//! - an entry older than the master's version is stale: the owner drops it;
//! - an entry newer than the master's version replaces the master's object
//!   (whose replicas are forgotten at their owners);
//! - an entry that does not fit the segment, overlaps another entry, or is
//!   malformed is stale.
//!
//! A segment this master expired (its owner was silent past the client TTL,
//! and its objects were dropped) comes back empty: its owner's ledger is
//! discarded, so expired objects do not reappear.

use crate::durable::Waits;
use crate::segments::SegmentEntry;
use crate::state::{Inner, MasterState, ObjStatus, Object, Replica};
use crate::takeover::Hold;
use mooncake_common::auth::unix_ms;
use mooncake_common::ledger::{alloc_len, LedgerEntry};
use mooncake_common::proto::SegmentDesc;
use mooncake_common::ErrorCode;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// What adopting one report did.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Adoption {
    /// New objects.
    pub objects: u64,
    /// Replicas added (to new or existing objects).
    pub replicas: u64,
    /// `(offset, version)` of the entries the owner must drop.
    pub stale: Vec<(u64, u64)>,
}

/// Outcome of one `RemountSegment` request.
#[derive(Debug, PartialEq, Eq)]
pub enum Remount {
    /// More chunks are expected.
    Partial,
    /// Done: the owner drops `stale`, or everything when `discard_all`.
    Done {
        /// Stale `(offset, version)` entries.
        stale: Vec<(u64, u64)>,
        /// The segment had been expired: drop the whole ledger.
        discard_all: bool,
    },
}

impl Inner {
    /// Adopt the reported `entries` of the freshly mounted segment `name`.
    /// Returns what changed and the forgets sent for displaced objects.
    pub(crate) fn adopt(
        &mut self,
        name: &str,
        mut entries: Vec<LedgerEntry>,
        now: Instant,
        release: Duration,
    ) -> (Adoption, Waits) {
        let mut out = Adoption::default();
        let mut waits = Vec::new();
        let now_ms = unix_ms();
        // Highest version first, so that duplicate keys keep their newest entry.
        entries.sort_by_key(|e| std::cmp::Reverse(e.version));
        for e in entries {
            let Some((id, seg)) = self
                .segments
                .id_of(name)
                .and_then(|id| self.segments.by_id(id).map(|s| (id, s)))
            else {
                out.stale.push((e.offset, e.version));
                continue;
            };
            let fits = !e.key.is_empty()
                && e.size > 0
                && e.offset
                    .checked_add(alloc_len(e.size))
                    .is_some_and(|end| end <= seg.alloc.capacity());
            if !fits {
                out.stale.push((e.offset, e.version));
                continue;
            }
            let existing = self
                .objects
                .get(e.key.as_str())
                .map(|o| (o.version, o.status, o.size));
            match existing {
                Some((v, _, _)) if v > e.version => {
                    out.stale.push((e.offset, e.version));
                    continue;
                }
                Some((v, status, size)) if v == e.version => {
                    let already = self
                        .objects
                        .get(e.key.as_str())
                        .is_some_and(|o| o.replicas.iter().any(|r| r.seg == id));
                    if status != ObjStatus::Complete || size != e.size || already {
                        out.stale.push((e.offset, e.version));
                        continue;
                    }
                    if !self.reserve(name, e.offset, e.size, &e.key) {
                        out.stale.push((e.offset, e.version));
                        continue;
                    }
                    if let Some(o) = self.objects.get_mut(e.key.as_str()) {
                        o.replicas.push(Replica {
                            seg: id,
                            offset: e.offset,
                        });
                    }
                    self.last_version = self.last_version.max(e.version);
                    out.replicas += 1;
                    continue;
                }
                Some(_) => {
                    // The report is newer than what we have: ours goes.
                    waits.extend(self.remove_object(&e.key, now, release));
                }
                None => {}
            }
            if !self.reserve(name, e.offset, e.size, &e.key) {
                out.stale.push((e.offset, e.version));
                continue;
            }
            let soft_pin_deadline = e
                .soft_pin_until_ms
                .filter(|&ms| ms > now_ms)
                .map(|ms| now + Duration::from_millis(ms - now_ms));
            self.last_version = self.last_version.max(e.version);
            let replicas = smallvec::smallvec![Replica {
                seg: id,
                offset: e.offset,
            }];
            self.objects.insert(
                e.key.into_boxed_str(),
                Object::complete(
                    e.size,
                    e.version,
                    replicas,
                    now,
                    soft_pin_deadline,
                    e.hard_pin,
                ),
            );
            out.objects += 1;
            out.replicas += 1;
        }
        (out, waits)
    }

    /// Mark a reported replica's range allocated, charged to the key's
    /// tenant.
    fn reserve(&mut self, name: &str, offset: u64, size: u64, key: &str) -> bool {
        let tag = self.tenant_tag(key);
        self.segments.get_mut(name).is_some_and(|s| {
            let ok = s.alloc.reserve(offset, size);
            if ok {
                s.alloc.tag(offset, size, tag);
            }
            ok
        })
    }
}

impl MasterState {
    /// Handle one chunk of a remount with a ledger report (see the module doc).
    pub fn remount_segment(
        &self,
        client_id: &str,
        desc: SegmentDesc,
        entries: Vec<LedgerEntry>,
        done: bool,
    ) -> Result<Remount, ErrorCode> {
        self.metrics.mount_segment_requests.inc();
        if desc.size == 0 {
            return Err(ErrorCode::InvalidParams);
        }
        let now = self.clock.now();
        let mut g = self.inner.lock();
        match g.segments.get(&desc.name) {
            Some(s) if s.client_id != client_id => return Err(ErrorCode::SegmentAlreadyExists),
            // A retry of a remount that already finished.
            Some(s) if s.desc.uuid == desc.uuid => {
                return Ok(if done {
                    Remount::Done {
                        stale: Vec::new(),
                        discard_all: false,
                    }
                } else {
                    Remount::Partial
                })
            }
            Some(_) => {
                let name = desc.name.clone();
                g.drop_segment(&name);
            }
            None => {}
        }
        if let Some(other) = g.segments.remounting(&desc.name) {
            if other != client_id && g.clients.contains(other) {
                return Err(ErrorCode::SegmentAlreadyExists);
            }
        }
        g.clients.register(client_id, now);
        g.segments.report_part(client_id, &desc, entries);
        if !done {
            return Ok(Remount::Partial);
        }
        let Some(pending) = g.segments.take_report(&desc.name) else {
            return Err(ErrorCode::InternalError);
        };
        // Requests held by a takeover re-check once this lock is released,
        // when the report is adopted.
        self.remounted.notify_all();
        let name = desc.name.clone();
        g.segments.insert(SegmentEntry::new(&desc, client_id));
        g.clients.add_segment(client_id, &name);
        if g.segments.take_expired(&desc.uuid) {
            tracing::warn!(segment = %name, entries = pending.entries.len(), "an expired segment came back; its objects stay dropped");
            // Its disk copies too (see `offload`).
            if let Some(s) = g.segments.get_mut(&name) {
                s.stale_disk = true;
            }
            return Ok(Remount::Done {
                stale: Vec::new(),
                discard_all: true,
            });
        }
        let reported = pending.entries.len();
        let release = Duration::from_secs(self.cfg.put_start_release_timeout_sec);
        let (adoption, waits) = g.adopt(&name, pending.entries, now, release);
        drop(g);
        self.metrics.recovered_segments.inc();
        self.metrics.recovered_objects.inc_by(adoption.objects);
        self.metrics.recovered_replicas.inc_by(adoption.replicas);
        self.metrics
            .recovery_stale_entries
            .inc_by(adoption.stale.len() as u64);
        tracing::warn!(
            segment = %name,
            reported,
            objects = adoption.objects,
            replicas = adoption.replicas,
            stale = adoption.stale.len(),
            "segment remounted with its ledger"
        );
        // Forgets of displaced older objects go out without a wait: their
        // keys already point at the newer replicas.
        drop(waits);
        Ok(Remount::Done {
            stale: adoption.stale,
            discard_all: false,
        })
    }
}

/// The hold of a term that took over (the rule is in `takeover`): requests
/// about unknown keys wait for the previous owners' remounts.
impl MasterState {
    /// Hold requests about unknown keys as a term that took over does
    /// (see the module documentation), from now: until `owners` (the
    /// segments the previous leader published; None: unknown, then for
    /// `quiet`) have remounted. A zero `quiet` turns the hold off.
    pub(crate) fn hold_after_takeover(&self, quiet: Duration, owners: Option<Vec<String>>) {
        if quiet.is_zero() {
            return;
        }
        let cap = Duration::from_secs(self.cfg.client_ttl_sec.max(1) as u64);
        let hold = Hold::new(self.clock.now(), quiet, cap, owners);
        *self.takeover.lock() = Some(hold);
        self.takeover_settled.store(false, Ordering::Release);
    }

    /// Whether the takeover hold (if any) is over; logs once when it ends.
    pub(crate) fn takeover_over(&self) -> bool {
        if self.takeover_settled.load(Ordering::Acquire) {
            return true;
        }
        let hold = self.takeover.lock().clone();
        let g = self.inner.lock();
        self.hold_over_locked(hold.as_ref(), &g)
    }

    fn hold_over_locked(&self, hold: Option<&Hold>, g: &Inner) -> bool {
        let now = self.clock.now();
        let over = hold.is_none_or(|h| {
            !h.holds(now, g.segments.remounts_pending(), |n| {
                g.segments.get(n).is_some()
            })
        });
        if over && !self.takeover_settled.swap(true, Ordering::AcqRel) {
            if let Some(h) = hold {
                tracing::warn!(
                    after_ms = h.age(now).as_millis() as u64,
                    segments = g.segments.len(),
                    objects = g.objects.len(),
                    "takeover hold over: requests about unknown keys are answered"
                );
            }
        }
        over
    }

    /// Wait, while the takeover hold lasts, until every one of `keys` is
    /// known (`None`: a request about every key, which waits out the hold).
    pub(crate) fn await_known(&self, keys: Option<&[String]>) {
        if self.takeover_settled.load(Ordering::Acquire) {
            return;
        }
        let hold = self.takeover.lock().clone();
        let mut g = self.inner.lock();
        loop {
            if self.hold_over_locked(hold.as_ref(), &g) || self.is_stopped() {
                return;
            }
            if keys.is_some_and(|ks| ks.iter().all(|k| g.objects.contains_key(k.as_str()))) {
                return;
            }
            self.remounted.wait_for(&mut g, crate::takeover::RECHECK);
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::config::MasterConfig;
    use crate::metrics::MasterMetrics;
    use std::sync::Arc;
    use std::time::{SystemTime, UNIX_EPOCH};

    fn state() -> Arc<MasterState> {
        MasterState::new(
            MasterConfig::default(),
            Arc::new(MasterMetrics::default()),
            None,
        )
    }

    pub(crate) fn desc(name: &str, uuid: &str) -> SegmentDesc {
        SegmentDesc {
            name: name.into(),
            uuid: uuid.into(),
            size: 1 << 20,
            base_addr: 0,
            host_id: "h".into(),
            pid: 1,
            endpoint: name.into(),
            socket_name: String::new(),
        }
    }

    pub(crate) fn entry(key: &str, version: u64, offset: u64, size: u64) -> LedgerEntry {
        LedgerEntry::unpinned(key, version, offset, size)
    }

    fn done(stale: Vec<(u64, u64)>) -> Remount {
        Remount::Done {
            stale,
            discard_all: false,
        }
    }

    #[test]
    fn reports_rebuild_objects_and_allocators() {
        let st = state();
        assert_eq!(
            st.remount_segment(
                "c1",
                desc("a:1", "ua"),
                vec![entry("k1", 10, 0, 100)],
                false
            ),
            Ok(Remount::Partial)
        );
        // Not usable until the report is complete.
        assert!(st.inner.lock().segments.is_empty());
        let r = st.remount_segment(
            "c1",
            desc("a:1", "ua"),
            vec![
                entry("k2", 11, 128, 64),
                entry("bad", 12, (1 << 20) - 64, 128), // past the end
                entry("newer", 13, 0, 64),             // overlaps k1: the newer wins
                entry("", 14, 512, 64),                // no key
            ],
            true,
        );
        assert_eq!(r, Ok(done(vec![(512, 14), ((1 << 20) - 64, 12), (0, 10)])));
        let g = st.inner.lock();
        assert_eq!(g.objects.len(), 2);
        assert_eq!(g.objects["k2"].status, ObjStatus::Complete);
        assert_eq!(g.objects["newer"].version, 13);
        assert!(!g.objects.contains_key("k1"));
        assert_eq!(g.segments["a:1"].alloc.used(), 64 + 64);
        assert!(g.last_version >= 13);
        drop(g);
        assert_eq!(st.metrics.recovered_objects.get(), 2);
        assert_eq!(st.metrics.recovery_stale_entries.get(), 3);
        // New versions stay above everything adopted.
        assert!(st.inner.lock().next_version() > 13);
    }

    #[test]
    fn versions_decide_between_segments() {
        let st = state();
        let now_us = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_micros() as u64;
        let v1 = now_us - 1000;
        let v2 = now_us - 500;
        // a holds k at v1 plus a replica of r; b holds k at v2 and r too.
        st.remount_segment(
            "ca",
            desc("a:1", "ua"),
            vec![entry("k", v1, 0, 64), entry("r", v1, 64, 64)],
            true,
        )
        .unwrap();
        let r = st.remount_segment(
            "cb",
            desc("b:1", "ub"),
            vec![entry("k", v2, 0, 64), entry("r", v1, 128, 64)],
            true,
        );
        assert_eq!(r, Ok(done(vec![])));
        {
            let g = st.inner.lock();
            assert_eq!(g.objects["k"].version, v2);
            assert_eq!(g.objects["k"].replicas.len(), 1);
            assert_eq!(g.segments.name_of(g.objects["k"].replicas[0].seg), "b:1");
            assert_eq!(g.objects["r"].replicas.len(), 2);
            // a's stale k is being forgotten: its space comes back on the ack.
            assert_eq!(g.segments["a:1"].ledger.pending_free_bytes(), 64);
        }
        // A third segment with an older k is told to drop it.
        let r = st.remount_segment("cc", desc("c:1", "uc"), vec![entry("k", v1, 0, 64)], true);
        assert_eq!(r, Ok(done(vec![(0, v1)])));
    }

    #[test]
    fn a_put_before_any_remount_does_not_evict_recovered_objects() {
        use mooncake_common::proto::{PutStartItem, WriteConfig};
        let st = state();
        // A put reaching a restarted master (or a new leader) before any
        // segment came back fails for want of a segment, not of space...
        let items = st.put_start(
            &["early".to_string()],
            &[64],
            &WriteConfig::default(),
            false,
        );
        assert!(matches!(
            items[0],
            PutStartItem::Err(ErrorCode::NoAvailableHandle)
        ));
        assert!(!st.need_eviction.load(std::sync::atomic::Ordering::Relaxed));
        // ...so the objects the first remount brings back are not evicted.
        let entries: Vec<_> = (0..8)
            .map(|i| entry(&format!("k{i}"), 10 + i, i * 128, 64))
            .collect();
        st.remount_segment("c1", desc("a:1", "ua"), entries, true)
            .unwrap();
        st.eviction_pass();
        assert_eq!(st.inner.lock().objects.len(), 8);
        assert_eq!(st.metrics.evicted_key_count.get(), 0);
    }

    #[test]
    fn an_expired_segment_that_comes_back_has_none_of_its_disk_copies_adopted() {
        use mooncake_common::proto::DiskObject;
        let st = state();
        let copy = |key: &str, version: u64| DiskObject {
            key: key.into(),
            version,
            size: 64,
        };
        // The segment expired (its objects, disk copies included, were
        // dropped); it comes back, and its owner announces its disk tier.
        st.inner.lock().segments.note_expired("ue", Instant::now());
        let r = st.remount_segment("c1", desc("e:1", "ue"), vec![], true);
        assert_eq!(
            r,
            Ok(Remount::Done {
                stale: vec![],
                discard_all: true
            })
        );
        let part = st.disk_tier("c1", "e:1", vec![copy("x", 7)], false);
        assert_eq!(part, Ok(vec![0]));
        let last = st.disk_tier("c1", "e:1", vec![copy("y", 8)], true);
        assert_eq!(last, Ok(vec![0]), "the owner deletes them");
        assert!(!st.inner.lock().objects.contains_key("x"));
        assert!(!st.inner.lock().objects.contains_key("y"));
        // Copies it announces later (to this master after a restart of the
        // owner, say) are its own again.
        let again = st.disk_tier("c1", "e:1", vec![copy("z", 9)], true);
        assert_eq!(again, Ok(vec![1]));
        assert!(st.inner.lock().objects.contains_key("z"));
    }

    #[test]
    fn retries_conflicts_and_expired_segments() {
        let st = state();
        st.remount_segment("c1", desc("a:1", "ua"), vec![entry("k", 5, 0, 64)], true)
            .unwrap();
        // A retry of the finished remount changes nothing.
        assert_eq!(
            st.remount_segment("c1", desc("a:1", "ua"), vec![entry("k", 5, 0, 64)], true),
            Ok(done(vec![]))
        );
        assert_eq!(st.inner.lock().objects["k"].replicas.len(), 1);
        // Another live client cannot take the name.
        assert_eq!(
            st.remount_segment("c2", desc("a:1", "ux"), vec![], true),
            Err(ErrorCode::SegmentAlreadyExists)
        );
        // An expired segment comes back empty.
        st.inner.lock().segments.note_expired("ue", Instant::now());
        assert_eq!(
            st.remount_segment("c3", desc("e:1", "ue"), vec![entry("x", 9, 0, 64)], true),
            Ok(Remount::Done {
                stale: vec![],
                discard_all: true
            })
        );
        assert!(!st.inner.lock().objects.contains_key("x"));
        assert_eq!(
            st.remount_segment(
                "c4",
                SegmentDesc {
                    size: 0,
                    ..desc("z:1", "uz")
                },
                vec![],
                true
            ),
            Err(ErrorCode::InvalidParams)
        );
    }
}

#[cfg(test)]
mod takeover_tests {
    use super::tests::{desc, entry};
    use crate::config::MasterConfig;
    use crate::state::MasterState;
    use std::sync::mpsc::Receiver;
    use std::sync::Arc;
    use std::time::Duration;

    const S: Duration = Duration::from_secs(1);
    const HELD: Duration = Duration::from_millis(100);
    const GOES_ON: Duration = Duration::from_secs(5);

    /// A request about `keys` (None: every key) on its own thread; the
    /// receiver hears when it goes on.
    fn request(st: &Arc<MasterState>, keys: Option<&[&str]>) -> Receiver<()> {
        let st = Arc::clone(st);
        let keys: Option<Vec<String>> = keys.map(|ks| ks.iter().map(|k| k.to_string()).collect());
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            st.await_known(keys.as_deref());
            let _ = tx.send(());
        });
        rx
    }

    fn remount(st: &MasterState, key: &str, done: bool) {
        st.remount_segment("c1", desc("seg", "u1"), vec![entry(key, 1, 0, 4096)], done)
            .expect("remount");
    }

    #[test]
    fn an_unknown_key_waits_until_its_owner_remounts() {
        let (st, clock) = MasterState::on_manual_clock(MasterConfig::default());
        st.hold_after_takeover(S, None);
        let held = request(&st, Some(&["k"]));
        // Held: the clock does not move, the key is unknown.
        assert!(held.recv_timeout(HELD).is_err());
        // Its owner remounts with it: the request goes on at once.
        remount(&st, "k", true);
        assert!(held.recv_timeout(GOES_ON).is_ok());
        // A known key is never held; an unknown one still is.
        assert!(request(&st, Some(&["k"])).recv_timeout(GOES_ON).is_ok());
        let other = request(&st, Some(&["k", "other"]));
        assert!(other.recv_timeout(HELD).is_err());
        // Past the quiet window it goes on.
        clock.advance(S);
        assert!(other.recv_timeout(GOES_ON).is_ok());
    }

    #[test]
    fn the_hold_ends_with_the_quiet_window_and_a_request_about_every_key_waits_for_it() {
        let (st, clock) = MasterState::on_manual_clock(MasterConfig::default());
        st.hold_after_takeover(S, None);
        let all = request(&st, None);
        assert!(all.recv_timeout(HELD).is_err());
        clock.advance(S);
        assert!(all.recv_timeout(GOES_ON).is_ok());
        // Over: nothing waits any more.
        assert!(request(&st, Some(&["never"])).recv_timeout(GOES_ON).is_ok());
    }

    #[test]
    fn a_remount_in_progress_extends_the_hold_until_it_ends_or_the_client_ttl() {
        let (st, clock) = MasterState::on_manual_clock(MasterConfig::default());
        st.hold_after_takeover(S, None);
        // The first chunk of a ledger arrived; the rest has not.
        remount(&st, "k", false);
        clock.advance(2 * S);
        let held = request(&st, Some(&["x"]));
        assert!(held.recv_timeout(HELD).is_err());
        clock.advance(Duration::from_secs(st.config().client_ttl_sec as u64));
        assert!(held.recv_timeout(GOES_ON).is_ok());
    }

    #[test]
    fn past_the_quiet_window_a_listed_owner_is_still_waited_for() {
        let (st, clock) = MasterState::on_manual_clock(MasterConfig::default());
        st.hold_after_takeover(S, Some(vec!["seg".into()]));
        clock.advance(2 * S);
        assert!(!st.takeover_over());
        let held = request(&st, Some(&["absent"]));
        assert!(held.recv_timeout(HELD).is_err());
        remount(&st, "k", true);
        // The owner is back: the absent key is answered (as absent).
        assert!(held.recv_timeout(GOES_ON).is_ok());
        assert!(st.takeover_over());
    }

    #[test]
    fn a_state_that_did_not_take_over_never_holds() {
        let (st, _) = MasterState::on_manual_clock(MasterConfig::default());
        assert!(request(&st, None).recv_timeout(GOES_ON).is_ok());
        st.hold_after_takeover(Duration::ZERO, None);
        assert!(request(&st, Some(&["k"])).recv_timeout(GOES_ON).is_ok());
    }
}
