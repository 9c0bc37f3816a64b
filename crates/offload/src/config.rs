//! The tier's settings: upstream's `MOONCAKE_OFFLOAD_*` environment
//! variables, with upstream's defaults.

use std::path::PathBuf;
use std::time::Duration;

/// `MOONCAKE_OFFLOAD_FILE_STORAGE_PATH`'s default.
pub const DEFAULT_STORAGE_PATH: &str = "/data/file_storage";

/// How an owner's disk tier is bounded and grouped.
#[derive(Debug, Clone, PartialEq)]
pub struct TierConfig {
    /// The directory (must exist and be writable).
    pub path: PathBuf,
    /// Most bytes of records per bucket (`MOONCAKE_OFFLOAD_BUCKET_SIZE_LIMIT_BYTES`, 256 MiB).
    pub bucket_size_limit: u64,
    /// Most records per bucket (`MOONCAKE_OFFLOAD_BUCKET_KEYS_LIMIT`, 500).
    pub bucket_keys_limit: usize,
    /// Cap on bytes used (`MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES`, 2 TiB).
    pub total_size_limit: u64,
    /// Cap on bytes used; 0 means 90% of the file system's size
    /// (`MOONCAKE_OFFLOAD_BUCKET_MAX_TOTAL_SIZE`, 0).
    pub bucket_max_total_size: u64,
    /// Hard cap on bytes allocated on disk, 0 = none
    /// (`MOONCAKE_OFFLOAD_BUCKET_MAX_PHYSICAL_BYTES`, 0).
    pub max_physical_bytes: u64,
    /// How long a usage scan is reused; zero rescans on every write
    /// (`MOONCAKE_OFFLOAD_BUCKET_DISK_SCAN_CACHE_MS`, 500).
    pub scan_cache: Duration,
    /// Take out the oldest buckets to make room for a write (and, with
    /// `watermark_eviction`, to stay under the watermarks); false: a write
    /// that does not fit under the cap fails with `Full` and nothing is
    /// taken out (the master's `--enable_disk_eviction`, for tiers under its
    /// `--root_fs_dir`).
    pub evict: bool,
    /// Evict down to the low watermark once usage crosses the high one
    /// (`MOONCAKE_OFFLOAD_ENABLE_DISK_WATERMARK_EVICTION`, true).
    pub watermark_eviction: bool,
    /// `MOONCAKE_OFFLOAD_DISK_EVICTION_HIGH_WATERMARK_RATIO` (0.90).
    pub high_watermark: f64,
    /// `MOONCAKE_OFFLOAD_DISK_EVICTION_LOW_WATERMARK_RATIO` (0.80).
    pub low_watermark: f64,
    /// How often the owner seals its open bucket and checks the watermarks
    /// (`MOONCAKE_OFFLOAD_HEARTBEAT_INTERVAL_SECONDS`, 10 s).
    pub heartbeat_interval: Duration,
}

impl TierConfig {
    /// Upstream's defaults for a directory.
    pub fn new(path: impl Into<PathBuf>) -> TierConfig {
        TierConfig {
            path: path.into(),
            bucket_size_limit: 256 << 20,
            bucket_keys_limit: 500,
            total_size_limit: 2 << 40,
            bucket_max_total_size: 0,
            max_physical_bytes: 0,
            scan_cache: Duration::from_millis(500),
            evict: true,
            watermark_eviction: true,
            high_watermark: 0.90,
            low_watermark: 0.80,
            heartbeat_interval: Duration::from_secs(10),
        }
    }

    /// The settings from the `MOONCAKE_OFFLOAD_*` environment; `path`
    /// (when not empty) overrides `MOONCAKE_OFFLOAD_FILE_STORAGE_PATH`.
    /// A value that does not parse, or watermarks out of order, is an error
    /// naming the variable.
    pub fn from_env(path: &str) -> Result<TierConfig, String> {
        Self::from_lookup(path, |k| std::env::var(k).ok())
    }

    /// [`TierConfig::from_env`] over any variable lookup.
    pub fn from_lookup(
        path: &str,
        get: impl Fn(&str) -> Option<String>,
    ) -> Result<TierConfig, String> {
        let dir = if path.is_empty() {
            get("MOONCAKE_OFFLOAD_FILE_STORAGE_PATH")
                .filter(|p| !p.trim().is_empty())
                .unwrap_or_else(|| DEFAULT_STORAGE_PATH.to_string())
        } else {
            path.to_string()
        };
        let mut c = TierConfig::new(dir);
        let num = |name: &str, default: u64| -> Result<u64, String> {
            match get(name) {
                None => Ok(default),
                Some(v) if v.trim().is_empty() => Ok(default),
                Some(v) => v
                    .trim()
                    .parse::<u64>()
                    .map_err(|_| format!("{name}={v:?} is not a byte count")),
            }
        };
        let ratio = |names: &[&str], default: f64| -> Result<f64, String> {
            for name in names {
                if let Some(v) = get(name).filter(|v| !v.trim().is_empty()) {
                    return match v.trim().parse::<f64>() {
                        Ok(r) if (0.0..=1.0).contains(&r) => Ok(r),
                        _ => Err(format!("{name}={v:?} is not a ratio in [0, 1]")),
                    };
                }
            }
            Ok(default)
        };
        c.bucket_size_limit = num(
            "MOONCAKE_OFFLOAD_BUCKET_SIZE_LIMIT_BYTES",
            c.bucket_size_limit,
        )?
        .max(1);
        c.bucket_keys_limit = num(
            "MOONCAKE_OFFLOAD_BUCKET_KEYS_LIMIT",
            c.bucket_keys_limit as u64,
        )?
        .max(1) as usize;
        c.total_size_limit = num(
            "MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES",
            c.total_size_limit,
        )?;
        c.bucket_max_total_size = num("MOONCAKE_OFFLOAD_BUCKET_MAX_TOTAL_SIZE", 0)?;
        c.max_physical_bytes = num("MOONCAKE_OFFLOAD_BUCKET_MAX_PHYSICAL_BYTES", 0)?;
        if let Some(v) = get("MOONCAKE_OFFLOAD_BUCKET_DISK_SCAN_CACHE_MS") {
            let ms: i64 = v.trim().parse().map_err(|_| {
                format!("MOONCAKE_OFFLOAD_BUCKET_DISK_SCAN_CACHE_MS={v:?} is not a number")
            })?;
            c.scan_cache = Duration::from_millis(ms.max(0) as u64);
        }
        if let Some(v) = get("MOONCAKE_OFFLOAD_ENABLE_DISK_WATERMARK_EVICTION") {
            c.watermark_eviction = match v.trim().to_ascii_lowercase().as_str() {
                "1" | "true" | "yes" | "on" => true,
                "0" | "false" | "no" | "off" => false,
                _ => {
                    return Err(format!(
                        "MOONCAKE_OFFLOAD_ENABLE_DISK_WATERMARK_EVICTION={v:?} is not a boolean"
                    ))
                }
            };
        }
        c.high_watermark = ratio(
            &[
                "MOONCAKE_OFFLOAD_DISK_EVICTION_HIGH_WATERMARK_RATIO",
                "MOONCAKE_DISK_EVICTION_HIGH_WATERMARK_RATIO",
            ],
            c.high_watermark,
        )?;
        c.low_watermark = ratio(
            &[
                "MOONCAKE_OFFLOAD_DISK_EVICTION_LOW_WATERMARK_RATIO",
                "MOONCAKE_DISK_EVICTION_LOW_WATERMARK_RATIO",
            ],
            c.low_watermark,
        )?;
        if c.watermark_eviction && c.high_watermark <= c.low_watermark {
            return Err(format!(
                "the disk high watermark ({}) must be above the low watermark ({})",
                c.high_watermark, c.low_watermark
            ));
        }
        let hb = num("MOONCAKE_OFFLOAD_HEARTBEAT_INTERVAL_SECONDS", 10)?;
        c.heartbeat_interval = Duration::from_secs(hb.max(1));
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn with(vars: &[(&str, &str)], path: &str) -> Result<TierConfig, String> {
        let m: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        TierConfig::from_lookup(path, |k| m.get(k).cloned())
    }

    #[test]
    fn defaults_are_upstreams() {
        let c = with(&[], "").expect("defaults");
        assert_eq!(c.path, PathBuf::from(DEFAULT_STORAGE_PATH));
        assert_eq!(c.bucket_size_limit, 256 << 20);
        assert_eq!(c.bucket_keys_limit, 500);
        assert_eq!(c.total_size_limit, 2_199_023_255_552);
        assert_eq!((c.high_watermark, c.low_watermark), (0.9, 0.8));
        assert_eq!(c.heartbeat_interval, Duration::from_secs(10));
        assert!(c.watermark_eviction);
    }

    #[test]
    fn the_argument_overrides_the_path_variable() {
        let v = [("MOONCAKE_OFFLOAD_FILE_STORAGE_PATH", "/env")];
        assert_eq!(with(&v, "").expect("env").path, PathBuf::from("/env"));
        assert_eq!(with(&v, "/arg").expect("arg").path, PathBuf::from("/arg"));
    }

    #[test]
    fn bad_values_name_their_variable() {
        for (k, v) in [
            ("MOONCAKE_OFFLOAD_BUCKET_KEYS_LIMIT", "many"),
            ("MOONCAKE_OFFLOAD_DISK_EVICTION_HIGH_WATERMARK_RATIO", "1.5"),
            ("MOONCAKE_OFFLOAD_ENABLE_DISK_WATERMARK_EVICTION", "maybe"),
        ] {
            let e = with(&[(k, v)], "/x").expect_err(k);
            assert!(e.contains(k), "{e}");
        }
        let e = with(
            &[
                ("MOONCAKE_DISK_EVICTION_HIGH_WATERMARK_RATIO", "0.5"),
                ("MOONCAKE_DISK_EVICTION_LOW_WATERMARK_RATIO", "0.6"),
            ],
            "/x",
        )
        .expect_err("order");
        assert!(e.contains("watermark"), "{e}");
    }
}
