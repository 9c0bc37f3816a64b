use super::*;
use std::sync::Mutex as StdMutex;

fn cfg(dir: &Path) -> TierConfig {
    let mut c = TierConfig::new(dir);
    c.scan_cache = std::time::Duration::ZERO;
    c
}

/// [`cfg`] with `limit` keys per bucket and at most `max` bytes on disk.
fn capped(dir: &Path, limit: usize, max: u64) -> TierConfig {
    let mut c = cfg(dir);
    c.bucket_keys_limit = limit;
    c.max_physical_bytes = max;
    c
}

fn value(i: u32, n: usize) -> Vec<u8> {
    (0..n).map(|j| (i as usize * 31 + j * 7) as u8).collect()
}

fn read_all(t: &DiskTier, key: &str, version: u64, n: usize) -> Result<Vec<u8>> {
    let mut v = vec![0u8; n];
    t.read(key, version, 0, &mut v)?;
    Ok(v)
}

/// The names of the bucket-store files in `dir` that parse, with their ids.
fn store_files(dir: &Path) -> Vec<(String, u64)> {
    std::fs::read_dir(dir)
        .expect("ls")
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let id = parse_name(&name)?.0;
            Some((name, id))
        })
        .collect()
}

/// Overwrite `bytes` at `offset` of the first bucket file in `dir`; returns
/// its path.
fn damage_bucket(dir: &Path, offset: u64, bytes: &[u8]) -> std::path::PathBuf {
    let bucket = std::fs::read_dir(dir)
        .expect("ls")
        .filter_map(|e| e.ok())
        .find(|e| e.file_name().to_string_lossy().ends_with(".bucket"))
        .expect("bucket")
        .path();
    let f = OpenOptions::new().write(true).open(&bucket).expect("open");
    f.write_all_at(bytes, offset).expect("damage");
    bucket
}

/// A tier on `dir` with `limit` keys per bucket, holding `k0..k{n}` with
/// `value(i, size)` at version `version(i)`.
fn filled(
    dir: &Path,
    limit: usize,
    n: u32,
    size: usize,
    version: impl Fn(u32) -> u64,
) -> (TierConfig, DiskTier) {
    let mut c = cfg(dir);
    c.bucket_keys_limit = limit;
    let t = DiskTier::open(c.clone()).expect("open");
    for i in 0..n {
        t.put(&format!("k{i}"), version(i), &value(i, size))
            .expect("put");
    }
    (c, t)
}

fn recorder(t: &DiskTier) -> Arc<StdMutex<Vec<(String, u64)>>> {
    let seen = Arc::new(StdMutex::new(Vec::new()));
    let s = Arc::clone(&seen);
    t.set_evict_handler(Box::new(move |keys| {
        s.lock().expect("lock").extend_from_slice(keys)
    }));
    seen
}

#[test]
fn values_read_back_whole_and_in_ranges_and_removal_forgets_them() {
    let d = tempfile::tempdir().expect("tmp");
    let t = DiskTier::open(cfg(d.path())).expect("open");
    t.put("a", 5, &value(1, 10_000)).expect("put");
    assert_eq!(
        read_all(&t, "a", 5, 10_000).expect("read"),
        value(1, 10_000)
    );
    let mut part = vec![0u8; 100];
    t.read("a", 5, 4000, &mut part).expect("range");
    assert_eq!(part, value(1, 10_000)[4000..4100]);
    assert!(matches!(
        read_all(&t, "a", 6, 10_000),
        Err(OffloadError::NotFound { .. })
    ));
    // A new version replaces the old one.
    t.put("a", 6, &value(2, 50)).expect("put v6");
    assert!(!t.contains("a", 5));
    assert_eq!(read_all(&t, "a", 6, 50).expect("v6"), value(2, 50));
    assert!(t.remove("a", 6));
    assert!(t.is_empty());
    t.flush();
    // Nothing live: no bucket file is left.
    let files = store_files(d.path());
    assert!(files.is_empty(), "{files:?}");
}

#[test]
fn sealed_buckets_survive_a_reopen_and_removals_stay_removed() {
    let d = tempfile::tempdir().expect("tmp");
    let c = {
        let (c, t) = filled(d.path(), 3, 7, 3000, |i| 100 + u64::from(i));
        assert!(t.remove("k1", 101));
        assert!(t.remove("k6", 106));
        c
    };
    let t = DiskTier::open(c).expect("reopen");
    let mut keys: Vec<String> = t.entries().into_iter().map(|e| e.key).collect();
    keys.sort();
    assert_eq!(keys, ["k0", "k2", "k3", "k4", "k5"]);
    for i in [0u32, 2, 3, 4, 5] {
        assert_eq!(
            read_all(&t, &format!("k{i}"), 100 + i as u64, 3000).expect("read"),
            value(i, 3000)
        );
    }
}

#[test]
fn a_second_owner_of_the_directory_is_refused_until_the_first_closes() {
    let d = tempfile::tempdir().expect("tmp");
    let t = DiskTier::open(cfg(d.path())).expect("open");
    t.put("a", 1, b"abc").expect("put");
    assert!(matches!(
        DiskTier::open(cfg(d.path())),
        Err(OffloadError::Locked(_))
    ));
    t.close();
    assert!(t.put("b", 1, b"abc").is_err());
    let t2 = DiskTier::open(cfg(d.path())).expect("reopen after close");
    assert!(t2.contains("a", 1));
}

#[test]
fn a_missing_directory_or_a_file_is_a_setup_error() {
    let d = tempfile::tempdir().expect("tmp");
    let e = DiskTier::open(cfg(&d.path().join("nope")))
        .err()
        .expect("missing");
    assert!(matches!(e, OffloadError::Setup { .. }), "{e}");
    let f = d.path().join("file");
    std::fs::write(&f, b"x").expect("file");
    let e = DiskTier::open(cfg(&f)).err().expect("file");
    assert!(e.to_string().contains("not a directory"), "{e}");
}

#[test]
fn a_bucket_without_meta_or_cut_short_is_dropped_on_open() {
    let d = tempfile::tempdir().expect("tmp");
    let (c, t) = filled(d.path(), 2, 6, 5000, |_| 1);
    drop(t);
    let mut ids: Vec<u64> = store_files(d.path())
        .into_iter()
        .map(|(_, id)| id)
        .collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 3);
    // The newest as if the owner died before its meta file; the middle cut short.
    std::fs::remove_file(d.path().join(file_name(ids[2], "meta"))).expect("rm meta");
    let f = OpenOptions::new()
        .write(true)
        .open(d.path().join(file_name(ids[1], "bucket")))
        .expect("open");
    f.set_len(7000).expect("truncate");
    let t = DiskTier::open(c).expect("reopen");
    let mut keys: Vec<String> = t.entries().into_iter().map(|e| e.key).collect();
    keys.sort();
    assert_eq!(keys, ["k0", "k1"]);
    assert!(!d.path().join(file_name(ids[2], "bucket")).exists());
    assert!(!d.path().join(file_name(ids[1], "bucket")).exists());
}

#[test]
fn a_corrupted_value_is_an_error_never_bytes_and_its_bucket_is_dropped() {
    let d = tempfile::tempdir().expect("tmp");
    let t = DiskTier::open(cfg(d.path())).expect("open");
    let seen = recorder(&t);
    t.put("a", 1, &value(1, 8000)).expect("put");
    t.put("b", 2, &value(2, 8000)).expect("put");
    t.flush();
    let bucket = damage_bucket(d.path(), 100, b"\xff\xfe");
    let e = read_all(&t, "a", 1, 8000).expect_err("corrupt");
    assert!(matches!(e, OffloadError::Corrupt { .. }), "{e}");
    assert!(matches!(
        read_all(&t, "b", 2, 8000),
        Err(OffloadError::NotFound { .. })
    ));
    let mut told = seen.lock().expect("lock").clone();
    told.sort();
    assert_eq!(told, [("a".to_string(), 1), ("b".to_string(), 2)]);
    assert!(!bucket.exists());
}

#[test]
fn usage_on_disk_stays_under_the_cap_evicting_oldest_buckets_first() {
    let d = tempfile::tempdir().expect("tmp");
    let mut c = capped(d.path(), 2, 200_000);
    c.watermark_eviction = false;
    let t = DiskTier::open(c).expect("open");
    let seen = recorder(&t);
    for i in 0..40u32 {
        t.put(&format!("k{i}"), i as u64, &value(i, 20_000))
            .expect("put");
        let used = disk_usage(d.path()).expect("du");
        assert!(used <= 200_000, "after k{i}: {used}");
    }
    let told = seen.lock().expect("lock").clone();
    assert!(!told.is_empty());
    // Oldest first: the evicted keys are a prefix of the written ones.
    let n = told.len();
    let mut idx: Vec<u64> = told.iter().map(|(_, v)| *v).collect();
    idx.sort();
    assert_eq!(idx, (0..n as u64).collect::<Vec<_>>());
    for (k, v) in &told {
        assert!(!t.contains(k, *v));
    }
    assert!(t.contains("k39", 39));
}

#[test]
fn a_tier_that_does_not_evict_refuses_writes_past_the_cap_and_keeps_every_copy() {
    let d = tempfile::tempdir().expect("tmp");
    let mut c = capped(d.path(), 2, 200_000);
    c.evict = false;
    let t = DiskTier::open(c).expect("open");
    let seen = recorder(&t);
    let mut stored = Vec::new();
    let mut refused = 0;
    for i in 0..40u32 {
        match t.put(&format!("k{i}"), i as u64, &value(i, 20_000)) {
            Ok(()) => stored.push(i),
            Err(e) => {
                assert!(e.is_no_space(), "{e}");
                refused += 1;
            }
        }
        let used = disk_usage(d.path()).expect("du");
        assert!(used <= 200_000, "after k{i}: {used}");
    }
    assert!(refused > 0, "nothing was refused");
    assert!(!stored.is_empty());
    assert!(seen.lock().expect("lock").is_empty(), "nothing was evicted");
    for i in stored {
        assert!(t.contains(&format!("k{i}"), i as u64), "k{i}");
    }
    // The periodic pass evicts nothing either.
    t.tick();
    assert!(seen.lock().expect("lock").is_empty());
}

#[test]
fn crossing_the_high_watermark_evicts_down_to_the_low_one() {
    let d = tempfile::tempdir().expect("tmp");
    let mut c = capped(d.path(), 1, 1_000_000);
    c.high_watermark = 0.9;
    c.low_watermark = 0.5;
    let t = DiskTier::open(c).expect("open");
    let mut max_after_drop = 0;
    let mut dropped = false;
    for i in 0..60u32 {
        let before = t.len();
        t.put(&format!("k{i}"), i as u64, &value(i, 40_000))
            .expect("put");
        let used = disk_usage(d.path()).expect("du");
        assert!(used <= 900_000 + 45_000, "{used}");
        if t.len() < before + 1 {
            dropped = true;
            max_after_drop = max_after_drop.max(used);
            assert!(used <= 500_000 + 45_000, "after an eviction: {used}");
        }
    }
    assert!(dropped);
    assert!(max_after_drop > 0);
}

#[test]
fn a_record_larger_than_the_cap_is_refused_and_nothing_is_evicted() {
    let d = tempfile::tempdir().expect("tmp");
    let mut c = cfg(d.path());
    c.max_physical_bytes = 100_000;
    c.watermark_eviction = false;
    let t = DiskTier::open(c).expect("open");
    t.put("small", 1, &value(1, 1000)).expect("put");
    let e = t.put("big", 2, &value(2, 200_000)).expect_err("too big");
    assert!(matches!(e, OffloadError::Full { .. }), "{e}");
    assert!(e.is_no_space());
    assert!(t.contains("small", 1));
    assert_eq!(
        read_all(&t, "small", 1, 1000).expect("read"),
        value(1, 1000)
    );
}

#[test]
fn a_large_value_reads_back_whole_and_checked() {
    let d = tempfile::tempdir().expect("tmp");
    let t = DiskTier::open(cfg(d.path())).expect("open");
    let big = value(9, (3 << 20) + 12_345);
    t.put("big", 1, &big).expect("put");
    assert_eq!(read_all(&t, "big", 1, big.len()).expect("read"), big);
    let mut part = vec![0u8; 1 << 20];
    t.read("big", 1, 700_000, &mut part).expect("range");
    assert_eq!(part, big[700_000..700_000 + (1 << 20)]);
    t.flush();
    damage_bucket(d.path(), 2 << 20, b"\x01");
    assert!(matches!(
        read_all(&t, "big", 1, big.len()),
        Err(OffloadError::Corrupt { .. })
    ));
}

#[test]
fn a_full_bucket_is_sealed_off_the_write_path_and_survives_a_reopen() {
    let d = tempfile::tempdir().expect("tmp");
    let (c, t) = filled(d.path(), 3, 4, 3000, |i| 10 + u64::from(i));
    // The first bucket took its last record: writes went on into a second
    // one, and the first waits for its seal.
    assert!(t.has_full());
    let metas = |dir: &Path| {
        std::fs::read_dir(dir)
            .expect("dir")
            .filter_map(|e| e.ok())
            .filter(|e| e.path().extension().is_some_and(|x| x == "meta"))
            .count()
    };
    assert_eq!(metas(d.path()), 0);
    assert_eq!(read_all(&t, "k0", 10, 3000).expect("read"), value(0, 3000));
    t.seal_full();
    assert!(!t.has_full());
    assert_eq!(metas(d.path()), 1);
    // A removal from a bucket waiting for its seal is not undone by it.
    t.put("k4", 14, &value(4, 3000)).expect("put");
    t.put("k5", 15, &value(5, 3000)).expect("put");
    assert!(t.has_full());
    assert!(t.remove("k3", 13));
    t.seal_full();
    drop(t);
    let t = DiskTier::open(c).expect("reopen");
    let mut keys: Vec<String> = t.entries().into_iter().map(|e| e.key).collect();
    keys.sort();
    assert_eq!(keys, ["k0", "k1", "k2", "k4", "k5"]);
}
