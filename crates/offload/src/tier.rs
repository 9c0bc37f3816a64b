//! [`DiskTier`]: one owner's bucket files, their index, the cap and the
//! eviction of whole buckets.

use crate::config::TierConfig;
use crate::error::{OffloadError, Result};
use crate::layout::{
    decode_head, decode_meta, encode_head, encode_meta, file_name, parse_name, Meta, MetaEntry,
    RECORD_HEADER,
};
use crate::usage::{disk_usage, fs_size};
use nix::fcntl::{Flock, FlockArg};
use parking_lot::{Mutex, RwLock};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// Told which `(key, version)` pairs left the tier (evicted buckets,
/// corrupt buckets), before their files are deleted.
pub type EvictHandler = Box<dyn Fn(&[(String, u64)]) + Send + Sync>;

/// An object the tier holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskEntry {
    /// Its key.
    pub key: String,
    /// The master's version of it.
    pub version: u64,
    /// Value size in bytes.
    pub size: u64,
}

struct Bucket {
    file: Arc<File>,
    /// End of the written records.
    len: u64,
    /// Keys whose live record is in this bucket.
    keys: HashSet<String>,
    /// The meta file is written (no more appends).
    sealed: bool,
}

struct Loc {
    bucket: u64,
    entry: MetaEntry,
}

#[derive(Default)]
struct Inner {
    index: HashMap<String, Loc>,
    buckets: BTreeMap<u64, Bucket>,
    open: Option<u64>,
    last_id: u64,
    /// Last scan of the directory's usage, and when.
    scanned: Option<(Instant, u64)>,
    /// Bytes written since that scan (rounded up to 4 KiB per record).
    since_scan: u64,
    /// Buckets that took their last record and wait to be sealed
    /// ([`DiskTier::seal_full`]), oldest first.
    full: Vec<u64>,
}

/// Buckets taken out of the index, whose files are deleted once the
/// handler has been told.
struct Evicted {
    ids: Vec<u64>,
    keys: Vec<(String, u64)>,
}

/// Counters of a tier.
#[derive(Debug, Default)]
pub struct TierStats {
    /// Records written.
    pub writes: AtomicU64,
    /// Value bytes written.
    pub bytes_written: AtomicU64,
    /// Values read.
    pub reads: AtomicU64,
    /// Value bytes read.
    pub bytes_read: AtomicU64,
    /// Buckets evicted to stay under the cap or the watermark.
    pub evicted_buckets: AtomicU64,
    /// Buckets dropped because a check failed.
    pub corrupt_buckets: AtomicU64,
    /// Writes refused (cap, full disk, I/O error).
    pub failed_writes: AtomicU64,
}

/// One owner's disk tier (see the crate documentation for the layout).
/// Thread-safe; writes are serialised, reads run in parallel with them.
pub struct DiskTier {
    cfg: TierConfig,
    cap: u64,
    lock: Mutex<Option<Flock<File>>>,
    closed: AtomicBool,
    write: Mutex<()>,
    inner: Mutex<Inner>,
    /// Held while buckets are being sealed: a flush waits for a seal in
    /// progress elsewhere.
    sealing: Mutex<()>,
    handler: RwLock<Option<EvictHandler>>,
    /// A full disk was logged (once, until a write succeeds again).
    full_logged: AtomicBool,
    /// Counters.
    pub stats: TierStats,
}

fn round4k(n: u64) -> u64 {
    n.div_ceil(4096).saturating_mul(4096)
}

fn allocated(f: &File) -> u64 {
    f.metadata()
        .map(|m| m.blocks().saturating_mul(512))
        .unwrap_or(0)
}

impl DiskTier {
    /// Open (and recover) the tier in `cfg.path`, which must exist and be
    /// writable; refused while another owner holds the directory.
    pub fn open(cfg: TierConfig) -> Result<DiskTier> {
        let dir = cfg.path.clone();
        let md = std::fs::metadata(&dir).map_err(|e| OffloadError::Setup {
            path: dir.clone(),
            reason: "cannot be used".into(),
            source: Some(e),
        })?;
        if !md.is_dir() {
            return Err(OffloadError::setup(&dir, "is not a directory"));
        }
        let lock_file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(dir.join(".lock"))
            .map_err(|e| OffloadError::Setup {
                path: dir.clone(),
                reason: "is not writable".into(),
                source: Some(e),
            })?;
        let lock = Flock::lock(lock_file, FlockArg::LockExclusiveNonblock)
            .map_err(|_| OffloadError::Locked(dir.clone()))?;
        let probe = dir.join(format!(".probe-{}", std::process::id()));
        std::fs::write(&probe, b"x")
            .and_then(|_| std::fs::remove_file(&probe))
            .map_err(|e| OffloadError::Setup {
                path: dir.clone(),
                reason: "is not writable".into(),
                source: Some(e),
            })?;
        let mut cap = cfg.total_size_limit;
        let fs_cap = if cfg.bucket_max_total_size > 0 {
            cfg.bucket_max_total_size
        } else {
            fs_size(&dir).map_or(u64::MAX, |s| (s as f64 * 0.9) as u64)
        };
        cap = cap.min(fs_cap);
        if cfg.max_physical_bytes > 0 {
            cap = cap.min(cfg.max_physical_bytes);
        }
        let tier = DiskTier {
            cfg,
            cap,
            lock: Mutex::new(Some(lock)),
            closed: AtomicBool::new(false),
            write: Mutex::new(()),
            inner: Mutex::new(Inner::default()),
            sealing: Mutex::new(()),
            handler: RwLock::new(None),
            full_logged: AtomicBool::new(false),
            stats: TierStats::default(),
        };
        tier.recover()?;
        Ok(tier)
    }

    /// The settings.
    pub fn config(&self) -> &TierConfig {
        &self.cfg
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.cfg.path
    }

    /// The byte cap in force (the smallest configured one).
    pub fn cap(&self) -> u64 {
        self.cap
    }

    /// Set what is told about objects leaving the tier.
    pub fn set_evict_handler(&self, h: EvictHandler) {
        *self.handler.write() = Some(h);
    }

    /// Objects held.
    pub fn len(&self) -> usize {
        self.inner.lock().index.len()
    }

    /// Whether the tier holds no object.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every object held.
    pub fn entries(&self) -> Vec<DiskEntry> {
        self.inner
            .lock()
            .index
            .values()
            .map(|l| DiskEntry {
                key: l.entry.key.clone(),
                version: l.entry.version,
                size: l.entry.value_len,
            })
            .collect()
    }

    /// The object `key`, if held (any version).
    pub fn entries_of(&self, key: &str) -> Option<DiskEntry> {
        self.inner.lock().index.get(key).map(|l| DiskEntry {
            key: l.entry.key.clone(),
            version: l.entry.version,
            size: l.entry.value_len,
        })
    }

    /// Seal the open bucket and give the directory up (another owner may
    /// open it from now on); later writes fail, reads still work.
    pub fn close(&self) {
        self.flush();
        self.closed.store(true, Ordering::Release);
        drop(self.lock.lock().take());
    }

    /// Whether `key` is held at `version`.
    pub fn contains(&self, key: &str, version: u64) -> bool {
        self.inner
            .lock()
            .index
            .get(key)
            .is_some_and(|l| l.entry.version == version)
    }

    /// Bytes in use on disk (a fresh scan).
    pub fn usage(&self) -> u64 {
        let mut g = self.inner.lock();
        g.scanned = None;
        self.used(&mut g)
    }

    fn path_of(&self, id: u64, ext: &str) -> PathBuf {
        self.cfg.path.join(file_name(id, ext))
    }

    /// Rebuild the index from the directory, dropping what fails a check.
    fn recover(&self) -> Result<()> {
        let dir = &self.cfg.path;
        let mut found: BTreeMap<u64, (bool, bool)> = BTreeMap::new();
        let rd = std::fs::read_dir(dir).map_err(|e| OffloadError::io(dir, e))?;
        for e in rd {
            let e = e.map_err(|e| OffloadError::io(dir, e))?;
            let name = e.file_name().to_string_lossy().into_owned();
            if name.ends_with(".tmp") {
                let _ = std::fs::remove_file(e.path());
                continue;
            }
            if let Some((id, ext)) = parse_name(&name) {
                let f = found.entry(id).or_default();
                match ext {
                    "bucket" => f.0 = true,
                    "meta" => f.1 = true,
                    _ => {}
                }
            }
        }
        let mut g = self.inner.lock();
        let (mut dropped, mut kept) = (0usize, 0usize);
        for (id, (has_data, has_meta)) in found {
            g.last_id = g.last_id.max(id);
            if !(has_data && has_meta) {
                if has_data {
                    tracing::warn!(bucket = id, dir = %dir.display(), "dropped a half-written bucket (no meta file)");
                }
                self.delete_files(id);
                dropped += 1;
                continue;
            }
            match self.recover_bucket(id) {
                Ok(Some((bucket, entries))) => {
                    for e in entries {
                        // A later bucket's record of a key supersedes an earlier one.
                        if let Some(old) = g.index.remove(&e.key) {
                            if let Some(b) = g.buckets.get_mut(&old.bucket) {
                                b.keys.remove(&e.key);
                            }
                        }
                        g.index.insert(
                            e.key.clone(),
                            Loc {
                                bucket: id,
                                entry: e,
                            },
                        );
                        kept += 1;
                    }
                    g.buckets.insert(id, bucket);
                }
                Ok(None) => {
                    self.delete_files(id);
                }
                Err(why) => {
                    tracing::warn!(bucket = id, dir = %dir.display(), why = %why, "dropped a damaged bucket");
                    self.stats.corrupt_buckets.fetch_add(1, Ordering::Relaxed);
                    self.delete_files(id);
                    dropped += 1;
                }
            }
        }
        // Buckets whose keys all moved to later buckets.
        let empty: Vec<u64> = g
            .buckets
            .iter()
            .filter(|(_, b)| b.keys.is_empty())
            .map(|(id, _)| *id)
            .collect();
        for id in empty {
            g.buckets.remove(&id);
            self.delete_files(id);
        }
        if kept > 0 || dropped > 0 {
            tracing::info!(dir = %dir.display(), objects = kept, dropped_buckets = dropped, "disk tier recovered");
        }
        Ok(())
    }

    /// Check one bucket: its meta file, and each listed record's header.
    /// `Ok(None)`: nothing live is left in it.
    fn recover_bucket(
        &self,
        id: u64,
    ) -> std::result::Result<Option<(Bucket, Vec<MetaEntry>)>, String> {
        let meta_bytes = std::fs::read(self.path_of(id, "meta")).map_err(|e| e.to_string())?;
        let meta = decode_meta(&meta_bytes)?;
        if meta.bucket != id {
            return Err("meta file names another bucket".into());
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(self.path_of(id, "bucket"))
            .map_err(|e| e.to_string())?;
        let len = file.metadata().map_err(|e| e.to_string())?.len();
        let mut entries = Vec::with_capacity(meta.entries.len());
        for e in meta.entries {
            if e.offset.saturating_add(e.record_len()) > len {
                return Err(format!(
                    "record of {:?} extends past the bucket's end",
                    e.key
                ));
            }
            let mut head = vec![0u8; RECORD_HEADER + e.key.len()];
            file.read_exact_at(&mut head, e.offset)
                .map_err(|err| err.to_string())?;
            let h = decode_head(&head, &e.key)?;
            if h.version != e.version || h.value_len != e.value_len || h.value_crc != e.value_crc {
                return Err(format!(
                    "record of {:?} disagrees with the meta file",
                    e.key
                ));
            }
            entries.push(e);
        }
        if entries.is_empty() {
            return Ok(None);
        }
        let keys = entries.iter().map(|e| e.key.clone()).collect();
        Ok(Some((
            Bucket {
                file: Arc::new(file),
                len,
                keys,
                sealed: true,
            },
            entries,
        )))
    }

    fn delete_files(&self, id: u64) {
        // The meta file first: a crash in between leaves a bucket without
        // meta, which the next open drops.
        let _ = std::fs::remove_file(self.path_of(id, "meta"));
        let _ = std::fs::remove_file(self.path_of(id, "bucket"));
    }

    /// Bytes in use: a directory scan, reused for `scan_cache` plus what
    /// was written since. A failed scan counts as full (fails closed).
    fn used(&self, g: &mut Inner) -> u64 {
        let fresh = match g.scanned {
            Some((at, _)) => !self.cfg.scan_cache.is_zero() && at.elapsed() < self.cfg.scan_cache,
            None => false,
        };
        if !fresh {
            match disk_usage(&self.cfg.path) {
                Ok(u) => {
                    g.scanned = Some((Instant::now(), u));
                    g.since_scan = 0;
                }
                Err(e) => {
                    tracing::warn!(dir = %self.cfg.path.display(), error = %e, "cannot measure the disk tier; treating it as full");
                    g.scanned = None;
                    return u64::MAX;
                }
            }
        }
        g.scanned
            .map_or(u64::MAX, |(_, u)| u.saturating_add(g.since_scan))
    }

    /// Take buckets out (oldest first) until `need` more bytes fit under
    /// the cap and, with watermark eviction, under the low watermark once
    /// the high one would be crossed. Fails with `Full` when even every
    /// bucket is not enough, or when `need` does not fit under the cap and
    /// the tier does not evict (nothing is taken out then).
    fn make_room(&self, g: &mut Inner, need: u64) -> Result<Evicted> {
        let mut out = Evicted {
            ids: Vec::new(),
            keys: Vec::new(),
        };
        let used = self.used(g);
        let cap = self.cap;
        if !self.cfg.evict {
            if used.saturating_add(need) > cap {
                return Err(OffloadError::Full { need, cap, used });
            }
            return Ok(out);
        }
        let mut limit = cap;
        if self.cfg.watermark_eviction
            && used.saturating_add(need) as f64 > self.cfg.high_watermark * cap as f64
        {
            limit = (self.cfg.low_watermark * cap as f64) as u64;
        }
        if used.saturating_add(need) <= limit {
            return Ok(out);
        }
        if used == u64::MAX {
            return Err(OffloadError::Full { need, cap, used });
        }
        // Plan first, so a write that cannot fit takes nothing out.
        let mut freed = 0u64;
        let mut plan = Vec::new();
        for (id, b) in g.buckets.iter() {
            if used.saturating_sub(freed).saturating_add(need) <= limit {
                break;
            }
            let meta = std::fs::metadata(self.path_of(*id, "meta"))
                .map(|m| m.blocks() * 512)
                .unwrap_or(0);
            freed = freed.saturating_add(allocated(&b.file) + meta);
            plan.push(*id);
        }
        let after = used.saturating_sub(freed);
        if after.saturating_add(need) > cap {
            return Err(OffloadError::Full { need, cap, used });
        }
        for id in plan {
            if g.open == Some(id) {
                g.open = None;
            }
            if let Some(gone) = take_bucket(g, id) {
                out.keys.extend(gone);
                out.ids.push(id);
            }
        }
        Ok(out)
    }

    /// Tell the handler, then delete the files of taken-out buckets.
    fn finish_eviction(&self, ev: Evicted, reason: &str) {
        if ev.ids.is_empty() {
            return;
        }
        if !ev.keys.is_empty() {
            if let Some(h) = self.handler.read().as_ref() {
                h(&ev.keys);
            }
        }
        for id in &ev.ids {
            self.delete_files(*id);
        }
        self.inner.lock().scanned = None;
        tracing::info!(
            buckets = ev.ids.len(),
            objects = ev.keys.len(),
            reason,
            "disk tier evicted buckets"
        );
        if reason != "corrupt" {
            self.stats
                .evicted_buckets
                .fetch_add(ev.ids.len() as u64, Ordering::Relaxed);
        }
    }

    fn new_bucket(&self, g: &mut Inner) -> Result<u64> {
        let now_us = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_micros() as u64)
            .unwrap_or(0);
        let id = g.last_id.saturating_add(1).max(now_us);
        g.last_id = id;
        let path = self.path_of(id, "bucket");
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o644)
            .open(&path)
            .map_err(|e| OffloadError::io(&path, e))?;
        g.buckets.insert(
            id,
            Bucket {
                file: Arc::new(file),
                len: 0,
                keys: HashSet::new(),
                sealed: false,
            },
        );
        g.open = Some(id);
        Ok(id)
    }

    /// Persist `value` as `key` at `version` (replacing any other version
    /// of the key). On failure nothing of the record stays readable.
    pub fn put(&self, key: &str, version: u64, value: &[u8]) -> Result<()> {
        let r = self.put_inner(key, version, value);
        match &r {
            Ok(()) => {
                self.full_logged.store(false, Ordering::Relaxed);
                self.stats.writes.fetch_add(1, Ordering::Relaxed);
                self.stats
                    .bytes_written
                    .fetch_add(value.len() as u64, Ordering::Relaxed);
            }
            Err(e) => {
                self.stats.failed_writes.fetch_add(1, Ordering::Relaxed);
                if e.is_no_space() {
                    if !self.full_logged.swap(true, Ordering::Relaxed) {
                        tracing::warn!(dir = %self.cfg.path.display(), error = %e, "disk tier full: evicted objects are dropped (as without offload) until space frees up");
                    }
                } else {
                    tracing::warn!(dir = %self.cfg.path.display(), key, error = %e, "disk tier write failed");
                }
            }
        }
        r
    }

    fn put_inner(&self, key: &str, version: u64, value: &[u8]) -> Result<()> {
        let _w = self.write.lock();
        if self.closed.load(Ordering::Acquire) {
            return Err(OffloadError::setup(&self.cfg.path, "the tier is closed"));
        }
        let head = encode_head(key, version, value);
        let rec = head.len() as u64 + value.len() as u64;
        let (ev, id, file, at) = {
            let mut g = self.inner.lock();
            let ev = self.make_room(&mut g, round4k(rec))?;
            self.drop_key(&mut g, key);
            let id = match g.open {
                Some(id) if g.buckets.contains_key(&id) => id,
                _ => self.new_bucket(&mut g)?,
            };
            let b = g
                .buckets
                .get(&id)
                .ok_or_else(|| OffloadError::setup(&self.cfg.path, "open bucket vanished"))?;
            (ev, id, Arc::clone(&b.file), b.len)
        };
        self.finish_eviction(ev, "cap");
        let path = self.path_of(id, "bucket");
        let wrote = file
            .write_all_at(&head, at)
            .and_then(|_| file.write_all_at(value, at + head.len() as u64));
        if let Err(e) = wrote {
            let _ = file.set_len(at);
            // Start the next record in a fresh bucket.
            let mut g = self.inner.lock();
            g.scanned = None;
            if g.open == Some(id) {
                drop(g);
                self.seal(id);
            }
            return Err(OffloadError::io(path, e));
        }
        let full = {
            let mut g = self.inner.lock();
            g.since_scan = g.since_scan.saturating_add(round4k(rec));
            let Some(b) = g.buckets.get_mut(&id) else {
                return Err(OffloadError::setup(&self.cfg.path, "open bucket vanished"));
            };
            b.len = at + rec;
            b.keys.insert(key.to_string());
            let full =
                b.len >= self.cfg.bucket_size_limit || b.keys.len() >= self.cfg.bucket_keys_limit;
            g.index.insert(
                key.to_string(),
                Loc {
                    bucket: id,
                    entry: MetaEntry {
                        key: key.to_string(),
                        version,
                        offset: at,
                        value_len: value.len() as u64,
                        value_crc: crc32c::crc32c(value),
                    },
                },
            );
            full
        };
        if full {
            // Sealed later, off the write path (its data sync may take as
            // long as the device needs for the whole bucket).
            let mut g = self.inner.lock();
            if g.open == Some(id) {
                g.open = None;
            }
            g.full.push(id);
        }
        Ok(())
    }

    /// Whether buckets wait to be sealed ([`DiskTier::seal_full`]).
    pub fn has_full(&self) -> bool {
        !self.inner.lock().full.is_empty()
    }

    /// Seal the buckets that took their last record. Writes and reads go
    /// on meanwhile (each bucket's data is synced without the tier's
    /// locks); an owner calls it from a thread of its own when
    /// [`DiskTier::has_full`] says so, and a flush does it too.
    pub fn seal_full(&self) {
        let _s = self.sealing.lock();
        let ids = std::mem::take(&mut self.inner.lock().full);
        for id in ids {
            self.seal_unlocked(id);
        }
    }

    /// Forget `key`'s record (any version) in the index; its bucket's meta
    /// is rewritten (or the bucket deleted) when sealed.
    fn drop_key(&self, g: &mut Inner, key: &str) {
        let Some(l) = g.index.remove(key) else {
            return;
        };
        self.unlist(g, l.bucket, key);
    }

    fn unlist(&self, g: &mut Inner, id: u64, key: &str) {
        let Some(b) = g.buckets.get_mut(&id) else {
            return;
        };
        b.keys.remove(key);
        if !b.sealed {
            return;
        }
        if b.keys.is_empty() {
            g.buckets.remove(&id);
            self.delete_files(id);
            g.scanned = None;
        } else if let Err(e) = self.write_meta(g, id) {
            tracing::warn!(bucket = id, error = %e, "cannot rewrite a bucket's meta file; dropping the bucket");
            let gone = take_bucket(g, id).unwrap_or_default();
            if let Some(h) = self.handler.read().as_ref() {
                h(&gone);
            }
            self.delete_files(id);
        }
    }

    /// Write bucket `id`'s meta file (its live records) atomically.
    fn write_meta(&self, g: &Inner, id: u64) -> std::io::Result<()> {
        let Some(b) = g.buckets.get(&id) else {
            return Ok(());
        };
        let mut entries: Vec<MetaEntry> = b
            .keys
            .iter()
            .filter_map(|k| {
                g.index
                    .get(k)
                    .filter(|l| l.bucket == id)
                    .map(|l| l.entry.clone())
            })
            .collect();
        entries.sort_by_key(|e| e.offset);
        let bytes = encode_meta(&Meta {
            bucket: id,
            entries,
        });
        let tmp = self.cfg.path.join(format!("{}.tmp", file_name(id, "meta")));
        let mut f = File::create(&tmp)?;
        let r = f.write_all(&bytes).and_then(|_| f.sync_data());
        if let Err(e) = r {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
        std::fs::rename(&tmp, self.path_of(id, "meta"))?;
        if let Ok(d) = File::open(&self.cfg.path) {
            let _ = d.sync_all();
        }
        Ok(())
    }

    /// Seal bucket `id`: its data to disk, then its meta file. A bucket
    /// whose meta cannot be written is dropped (its keys told to the handler).
    fn seal(&self, id: u64) {
        let _s = self.sealing.lock();
        self.seal_unlocked(id);
    }

    /// [`DiskTier::seal`] with `sealing` held by the caller. The data is
    /// synced without the tier's lock (reads and removals go on); the meta
    /// file is written under it, from the records live at that moment.
    fn seal_unlocked(&self, id: u64) {
        let file = {
            let mut g = self.inner.lock();
            if g.open == Some(id) {
                g.open = None;
            }
            let Some(b) = g.buckets.get(&id) else {
                return;
            };
            if b.sealed {
                return;
            }
            Arc::clone(&b.file)
        };
        let synced = file.sync_data();
        let mut g = self.inner.lock();
        // Taken out (evicted, corrupt) or sealed meanwhile: nothing to do.
        let Some(b) = g.buckets.get(&id) else {
            return;
        };
        if b.sealed {
            return;
        }
        if b.keys.is_empty() {
            g.buckets.remove(&id);
            self.delete_files(id);
            g.scanned = None;
            return;
        }
        let r = synced.and_then(|_| self.write_meta(&g, id));
        match r {
            Ok(()) => {
                if let Some(b) = g.buckets.get_mut(&id) {
                    b.sealed = true;
                }
            }
            Err(e) => {
                let gone = take_bucket(&mut g, id).unwrap_or_default();
                g.scanned = None;
                drop(g);
                tracing::warn!(bucket = id, error = %e, objects = gone.len(), "cannot seal a bucket; dropping it");
                if let Some(h) = self.handler.read().as_ref() {
                    h(&gone);
                }
                self.delete_files(id);
            }
        }
    }

    /// Seal the open bucket and those waiting to be sealed (their records
    /// survive a restart once this returns).
    pub fn flush(&self) {
        {
            let _w = self.write.lock();
            if self.closed.load(Ordering::Acquire) {
                return;
            }
            // No write appends to it any more: sealed with the full ones.
            let mut g = self.inner.lock();
            if let Some(id) = g.open.take() {
                g.full.push(id);
            }
        }
        self.seal_full();
    }

    /// Periodic work: seal the open bucket, and evict down to the low
    /// watermark when usage is above the high one.
    pub fn tick(&self) {
        self.flush();
        let _w = self.write.lock();
        let ev = {
            let mut g = self.inner.lock();
            g.scanned = None;
            self.make_room(&mut g, 0)
        };
        match ev {
            Ok(ev) => self.finish_eviction(ev, "watermark"),
            Err(e) => tracing::debug!(error = %e, "disk tier over its cap"),
        }
    }

    /// Remove `key` at `version` (a later version stays). Returns whether
    /// it was held.
    pub fn remove(&self, key: &str, version: u64) -> bool {
        let mut g = self.inner.lock();
        match g.index.get(key) {
            Some(l) if l.entry.version == version => {}
            _ => return false,
        }
        self.drop_key(&mut g, key);
        true
    }

    /// Read `dst.len()` bytes of `key`'s value at `version` from byte
    /// `src` on. The value's checksum is verified first; a failed check
    /// drops the bucket (the handler is told) and is an error.
    pub fn read(&self, key: &str, version: u64, src: u64, dst: &mut [u8]) -> Result<()> {
        let not_found = || OffloadError::NotFound {
            key: key.to_string(),
            version,
        };
        let (id, file, entry) = {
            let g = self.inner.lock();
            let l = g.index.get(key).ok_or_else(not_found)?;
            if l.entry.version != version {
                return Err(not_found());
            }
            let b = g.buckets.get(&l.bucket).ok_or_else(not_found)?;
            (l.bucket, Arc::clone(&b.file), l.entry.clone())
        };
        if src.saturating_add(dst.len() as u64) > entry.value_len {
            return Err(OffloadError::setup(
                &self.cfg.path,
                format!(
                    "range {src}+{} is outside {key:?} ({} bytes)",
                    dst.len(),
                    entry.value_len
                ),
            ));
        }
        let path = self.path_of(id, "bucket");
        let corrupt = |why: String| -> OffloadError {
            self.drop_corrupt(id);
            OffloadError::Corrupt {
                bucket: id,
                key: key.to_string(),
                why,
            }
        };
        let mut head = vec![0u8; RECORD_HEADER + key.len()];
        if let Err(e) = file.read_exact_at(&mut head, entry.offset) {
            if e.kind() == std::io::ErrorKind::UnexpectedEof {
                return Err(corrupt("record cut short".into()));
            }
            return Err(OffloadError::io(path, e));
        }
        let h = decode_head(&head, key).map_err(&corrupt)?;
        if h.version != version || h.value_len != entry.value_len || h.value_crc != entry.value_crc
        {
            return Err(corrupt("record disagrees with the index".into()));
        }
        let whole = src == 0 && dst.len() as u64 == entry.value_len;
        let read_value = |value: &mut [u8]| -> Result<()> {
            if let Err(e) = file.read_exact_at(value, entry.value_offset()) {
                if e.kind() == std::io::ErrorKind::UnexpectedEof {
                    return Err(corrupt("value cut short".into()));
                }
                return Err(OffloadError::io(&path, e));
            }
            if crc32c::crc32c(value) != entry.value_crc {
                return Err(corrupt("value checksum mismatch".into()));
            }
            Ok(())
        };
        if whole {
            read_value(dst)?;
        } else {
            let mut buf = vec![0u8; entry.value_len as usize];
            read_value(&mut buf)?;
            let s = src as usize;
            let n = dst.len();
            dst.copy_from_slice(&buf[s..s + n]);
        }
        read_ahead(&file, entry.value_offset() + entry.value_len);
        self.stats.reads.fetch_add(1, Ordering::Relaxed);
        self.stats
            .bytes_read
            .fetch_add(dst.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    fn drop_corrupt(&self, id: u64) {
        tracing::warn!(bucket = id, dir = %self.cfg.path.display(), "disk tier bucket failed a checksum; dropping it");
        self.stats.corrupt_buckets.fetch_add(1, Ordering::Relaxed);
        let ev = {
            let mut g = self.inner.lock();
            if g.open == Some(id) {
                g.open = None;
            }
            let mut ev = Evicted {
                ids: Vec::new(),
                keys: Vec::new(),
            };
            if let Some(b) = g.buckets.remove(&id) {
                for k in b.keys {
                    if let Some(l) = g.index.remove(&k) {
                        ev.keys.push((k, l.entry.version));
                    }
                }
                ev.ids.push(id);
            }
            ev
        };
        self.finish_eviction(ev, "corrupt");
    }
}

impl Drop for DiskTier {
    fn drop(&mut self) {
        self.flush();
    }
}

/// Take bucket `id` out of `g` together with its keys' index records: the
/// `(key, version)` of every record that was in it (`None`: no such bucket).
fn take_bucket(g: &mut Inner, id: u64) -> Option<Vec<(String, u64)>> {
    let b = g.buckets.remove(&id)?;
    Some(
        b.keys
            .into_iter()
            .filter_map(|k| {
                let v = g.index.remove(&k)?.entry.version;
                Some((k, v))
            })
            .collect(),
    )
}

/// Bytes of a bucket past a record just read that the kernel is asked to
/// fetch in the background: records evicted together sit one after the
/// other in a bucket and are usually read back together, and a request
/// for the next ones in flight while this one is copied keeps more than
/// one read at the device at a time.
const READ_AHEAD: i64 = 32 << 20;

/// Ask the kernel to start reading `READ_AHEAD` bytes of `file` from `at`
/// (advice only: a failure changes nothing).
fn read_ahead(file: &std::fs::File, at: u64) {
    let Ok(at) = i64::try_from(at) else {
        return;
    };
    let _ = nix::fcntl::posix_fadvise(
        std::os::fd::AsRawFd::as_raw_fd(file),
        at,
        READ_AHEAD,
        nix::fcntl::PosixFadviseAdvice::POSIX_FADV_WILLNEED,
    );
}

#[cfg(test)]
mod tests;
