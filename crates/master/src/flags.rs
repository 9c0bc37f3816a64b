//! gflags-compatible command line for `mooncake_master`: every upstream flag
//! is recognised and type-checked; the implemented ones configure the master,
//! feature switches this build lacks fail fast, and the rest warn when set.
//!
//! Owns the master's flag table ([`FLAGS`]) and the translation of the
//! parsed values into the effective [`MasterConfig`]. The parser itself
//! (syntax, `--flagfile`, `--config_path`, the gflags built-ins and glog's
//! logging flags) is the one every binary of this stack shares,
//! [`mooncake_common::gflags`].

use std::net::Ipv4Addr;

use crate::config::{AllocationStrategy, MasterConfig};
use mooncake_common::gflags::{f, failed_validation, Flags, Parsed, Program, IGN};
pub use mooncake_common::gflags::{parse_duration_ms, FlagDef, FlagRole, FlagType};
use mooncake_common::AuthKey;

/// Result of parsing the master command line.
#[derive(Debug)]
pub enum FlagOutcome {
    /// Start the master with this effective configuration.
    Run(Box<MasterConfig>),
    /// Exit immediately. Messages starting with `ERROR` belong on stderr;
    /// anything else (help, version) belongs on stdout.
    Exit {
        /// Process exit status.
        code: i32,
        /// Text to print (without trailing newline).
        message: String,
    },
}

use FlagRole::{Core, Feature, Ignored, Replaced};
use FlagType::{Bool, Double, Duration, Int32, Int64, Str, Uint32, Uint64};

const NO_LOG: &str = "this build keeps no operation log and takes no snapshots: metadata \
survives a master restart or failover because the clients re-report the replicas their segments \
hold when they remount (README, 'HA and durability')";

/// The master's own flags (the common ones, [`mooncake_common::gflags::COMMON_FLAGS`], come after).
#[rustfmt::skip]
pub static FLAGS: &[FlagDef] = &[
    // ---- implemented upstream flags (Tier 1) ----
    f("rpc_address", Str, "0.0.0.0", Core, "RPC bind address"),
    f("rpc_port", Int32, "0", Core, "RPC port; 0 means use --port"),
    f("port", Int32, "50051", Core, "deprecated: use --rpc_port"),
    f("rpc_thread_num", Int32, "0", Core, "worker threads; 0 = automatic (2-4)"),
    f("max_threads", Int32, "16", Core, "deprecated: use --rpc_thread_num"),
    f("rpc_interface", Str, "", Core, "network interface whose IPv4 address overrides --rpc_address"),
    f("rpc_conn_timeout_seconds", Int32, "0", Core, "idle RPC connection timeout in seconds (0 = --idle_connection_timeout_sec)"),
    f("rpc_enable_tcp_no_delay", Bool, "true", Core, "set TCP_NODELAY on RPC connections"),
    f("enable_http_metadata_server", Bool, "false", Core, "run the embedded HTTP metadata server"),
    f("http_metadata_server_host", Str, "0.0.0.0", Core, "HTTP metadata server bind host"),
    f("http_metadata_server_port", Int32, "8080", Core, "HTTP metadata server port"),
    f("metrics_host", Str, "0.0.0.0", Core, "admin/metrics HTTP server bind host"),
    f("metrics_port", Int32, "9003", Core, "admin/metrics HTTP server port"),
    f("enable_metric_reporting", Bool, "true", Core, "log a one-line summary every 10 s"),
    f("default_kv_lease_ttl", Duration, "10000", Core, "read lease duration (ms, or with ms/s/m/h suffix)"),
    f("default_kv_soft_pin_ttl", Duration, "1800000", Core, "default soft-pin duration"),
    f("max_kv_soft_pin_ttl", Duration, "86400000", Core, "maximum soft-pin duration"),
    f("allow_evict_soft_pinned_objects", Bool, "true", Core, "allow evicting soft-pinned objects as a last resort"),
    f("eviction_high_watermark_ratio", Double, "0.9", Core, "usage ratio that triggers eviction"),
    f("eviction_ratio", Double, "0.05", Core, "fraction of capacity to free per eviction round"),
    f("client_ttl", Int64, "10", Core, "seconds without a ping before a client expires"),
    f("put_start_discard_timeout_sec", Uint64, "30", Core, "seconds before an unfinished put may be discarded"),
    f("put_start_release_timeout_sec", Uint64, "600", Core, "seconds before an unfinished put's space is released"),
    f("memory_allocator", Str, "offset", Core, "segment allocator: offset (cachelib accepted, uses offset)"),
    f("allocation_strategy", Str, "random", Core, "random | free_ratio_first | local_first"),
    f("enable_metadata_cleanup_on_timeout", Bool, "false", Core, "delete mooncake/ram/<segment> when a client expires"),
    // ---- ours: authentication and connection limits ----
    f("auth_token_file", Str, "", Core, "file holding the cluster token; clients must prove it (MC_AUTH_TOKEN / MC_AUTH_TOKEN_FILE)"),
    f("max_connections", Uint32, "4096", Core, "most open connections per listener (RPC, metadata, admin)"),
    f("max_connections_per_peer", Uint32, "1024", Core, "most open connections per peer address and listener"),
    f("idle_connection_timeout_sec", Uint32, "60", Core, "close connections silent this long (0 = never); --rpc_conn_timeout_seconds overrides it for RPC"),
    // ---- ours: versioned upserts ----
    f("max_pending_versions_per_key", Uint32, "4", Core, "replaced versions of one key kept for their readers before an upsert of the key waits for one to be freed"),
    f("pending_version_wait_ms", Uint64, "5000", Core, "how long such an upsert waits before it returns OBJECT_REPLICA_BUSY (-714)"),
    // ---- feature switches: true fails fast unless this build implements the feature ----
    f("enable_ha", Bool, "false", Core, "HA: masters elect one leader through etcd; clients use etcd://<connstring>"),
    f("enable_oplog", Bool, "false", Replaced(NO_LOG), "operation log"),
    f("enable_snapshot", Bool, "false", Replaced(NO_LOG), "metadata snapshots"),
    f("enable_snapshot_restore", Bool, "false", Replaced(NO_LOG), "restore from snapshot"),
    f("enable_offload", Bool, "false", Core, "move evicted objects to their owners' disk tiers (owners set up with enable_ssd_offload / --enable_offload)"),
    f("enable_cxl", Bool, "false", Feature("CXL memory"), "CXL memory"),
    f("enable_multi_tenants", Bool, "false", Feature("multi-tenancy"), "multi-tenancy"),
    f("enable_kv_events", Bool, "false", Feature("KV event publishing"), "KV events"),
    f("offload_on_evict", Bool, "false", Core, "accepted either way: this build moves objects to disk when memory eviction selects them"),
    f("promotion_on_hit", Bool, "false", Feature("promotion from the offload tier"), "promote on hit"),
    f("root_fs_dir", Str, "", Core, "owners keep their disk tiers under <root_fs_dir>/<cluster_id>/ and evicted objects move there (turns offload on)"),
    f("global_file_segment_size", Int64, "9223372036854775807", Core, "most bytes of disk copies over all owners; beyond it evicted objects are dropped"),
    // ---- recognised but unimplemented: a non-default value logs a WARNING ----
    f("batch_oplog_retry_timeout_sec", Uint32, "180", Ignored, IGN),
    f("cluster_id", Str, "mooncake_cluster", Core, "HA cluster name (etcd key prefix); clients set MC_STORE_CLUSTER_ID to match"),
    f("cxl_path", Str, "/dev/dax0.0", Ignored, IGN),
    f("cxl_size", Uint64, "8589934592", Ignored, IGN),
    f("dynamic_replication_admission_qps_threshold", Double, "0.8", Ignored, IGN),
    f("dynamic_replication_heat_window_seconds", Uint32, "10", Ignored, IGN),
    f("dynamic_replication_max_memory_replicas", Uint64, "2", Ignored, IGN),
    f("dynamic_replication_mode", Str, "off", Ignored, IGN),
    f("enable_disk_eviction", Bool, "true", Ignored, IGN),
    f("etcd_endpoints", Str, "", Core, "legacy alias of --ha_backend_connstring, used when that is empty"),
    f("ha_backend_connstring", Str, "", Core, "HA backend endpoints: etcd h1:2379;h2:2379"),
    f("ha_backend_type", Str, "etcd", Core, "HA backend: etcd (redis and k8s are not supported by this build)"),
    f("kv_events_additional_salt", Str, "", Ignored, IGN),
    f("kv_events_backend_id", Str, "", Ignored, IGN),
    f("kv_events_bind_endpoint", Str, "", Ignored, IGN),
    f("kv_events_block_size", Uint32, "0", Ignored, IGN),
    f("kv_events_dp_rank", Uint32, "0", Ignored, IGN),
    f("kv_events_emit_legacy_compat", Bool, "true", Ignored, IGN),
    f("kv_events_emit_object_key", Bool, "true", Ignored, IGN),
    f("kv_events_lora_name", Str, "", Ignored, IGN),
    f("kv_events_model_name", Str, "", Ignored, IGN),
    f("kv_events_queue_capacity", Uint32, "65536", Ignored, IGN),
    f("kv_events_tenant_id", Str, "default", Ignored, IGN),
    f("max_retry_attempts", Uint32, "10", Ignored, IGN),
    f("max_total_finished_tasks", Uint32, "10000", Ignored, IGN),
    f("max_total_pending_tasks", Uint32, "10000", Ignored, IGN),
    f("max_total_processing_tasks", Uint32, "10000", Ignored, IGN),
    f("nof_eviction_high_watermark_ratio", Double, "0.9", Ignored, IGN),
    f("nof_eviction_ratio", Double, "0.05", Ignored, IGN),
    f("nof_heartbeat_failures_threshold", Uint32, "3", Ignored, IGN),
    f("nof_heartbeat_interval_sec", Int64, "10", Ignored, IGN),
    f("nof_heartbeat_probe_timeout_ms", Uint32, "1000", Ignored, IGN),
    f("offload_cap_ratio", Double, "0.5", Ignored, IGN),
    f("offload_force_evict", Bool, "false", Ignored, IGN),
    f("offloading_queue_limit", Uint64, "50000", Ignored, IGN),
    f("oplog_batch_max_entries", Uint32, "1024", Ignored, IGN),
    f("oplog_poll_interval_ms", Int32, "1000", Ignored, IGN),
    f("pending_task_timeout_sec", Uint64, "300", Ignored, IGN),
    f("pod_name", Str, "", Ignored, IGN),
    f("pod_namespace", Str, "", Ignored, IGN),
    f("processing_task_timeout_sec", Uint64, "300", Ignored, IGN),
    f("promotion_admission_threshold", Uint32, "2", Ignored, IGN),
    f("promotion_max_per_heartbeat", Uint32, "1", Ignored, IGN),
    f("promotion_queue_limit", Uint32, "50000", Ignored, IGN),
    f("quota_bytes", Uint64, "0", Ignored, IGN),
    f("snapshot_backup_dir", Str, "", Ignored, IGN),
    f("snapshot_catalog_backend_connstring", Str, "", Ignored, IGN),
    f("snapshot_catalog_backend_type", Str, "", Ignored, IGN),
    f("snapshot_catalog_store_connstring", Str, "", Ignored, IGN),
    f("snapshot_catalog_store_type", Str, "", Ignored, IGN),
    f("snapshot_child_timeout_seconds", Uint64, "300", Ignored, IGN),
    f("snapshot_interval_seconds", Uint64, "600", Ignored, IGN),
    f("snapshot_object_store_type", Str, "", Ignored, IGN),
    f("snapshot_payload_backend_type", Str, "", Ignored, IGN),
    f("snapshot_payload_store_type", Str, "", Ignored, IGN),
    f("snapshot_retention_count", Uint32, "2", Ignored, IGN),
    f("tenant_quota_connector_type", Str, "file", Ignored, IGN),
    f("tenant_quota_connector_uri", Str, "", Ignored, IGN),
    f("mmap_arena_pool_size", Uint64, "8589934592", Ignored, IGN),
    f("use_mmap_arena_allocator", Bool, "false", Ignored, IGN),
];

/// The `mooncake_master` command line.
pub static MASTER: Program = Program {
    name: "mooncake_master",
    title: "Mooncake store master (Rust)",
    flags: FLAGS,
};

/// Look a flag up by exact name (the master's and the common flags).
pub fn find_flag(name: &str) -> Option<&'static FlagDef> {
    MASTER.find(name)
}

/// Text printed by `--help` (optionally only flags whose name contains `filter`).
pub fn help_text(filter: &str) -> String {
    MASTER.help_text(filter)
}

/// Text printed by `--version`.
pub fn version_text() -> String {
    MASTER.version_text()
}

/// Parse the master command line; warnings are logged through `tracing`.
pub fn parse_master_args(args: &[String]) -> FlagOutcome {
    let (outcome, warnings) = parse_master_args_with_warnings(args);
    for w in &warnings {
        tracing::warn!("{w}");
    }
    outcome
}

/// Parse the master command line, returning the warnings (deprecated flags,
/// ignored unimplemented flags, …) instead of logging them, so the caller can
/// log them once its logger is configured.
pub fn parse_master_args_with_warnings(args: &[String]) -> (FlagOutcome, Vec<String>) {
    let (parsed, mut warnings) = MASTER.parse(args);
    let flags = match parsed {
        Parsed::Run(flags) => flags,
        Parsed::Exit { code, message } => return (FlagOutcome::Exit { code, message }, warnings),
    };
    match build_config(&flags, &mut warnings) {
        Ok(cfg) => (FlagOutcome::Run(Box::new(cfg)), warnings),
        Err(message) => (FlagOutcome::Exit { code: 1, message }, warnings),
    }
}

/// Translate the merged flags into the effective configuration.
fn build_config(fl: &Flags, warnings: &mut Vec<String>) -> Result<MasterConfig, String> {
    let mut cfg = MasterConfig {
        rpc_address: fl.string("rpc_address"),
        ..MasterConfig::default()
    };

    let iface = fl.string("rpc_interface");
    if !iface.is_empty() {
        match interface_ipv4(&iface) {
            Some(ip) => cfg.rpc_address = ip.to_string(),
            None => {
                return Err(format!(
                    "{}: interface has no IPv4 address",
                    failed_validation("rpc_interface", &iface)
                ))
            }
        }
    }

    let rpc_port = fl.int_range("rpc_port", 0, 65535)?;
    let port = fl.int_range("port", 0, 65535)?;
    if fl.is_set("port") {
        warnings.push("flag --port is deprecated; use --rpc_port".into());
    }
    cfg.rpc_port = if rpc_port != 0 { rpc_port } else { port } as u16;

    let threads = fl.int_range("rpc_thread_num", 0, 4096)?;
    let max_threads = fl.int_range("max_threads", 0, 4096)?;
    if fl.is_set("max_threads") {
        warnings.push("flag --max_threads is deprecated; use --rpc_thread_num".into());
    }
    cfg.rpc_thread_num = if fl.is_set("max_threads") && !fl.is_set("rpc_thread_num") {
        max_threads
    } else {
        threads
    } as u32;

    cfg.rpc_conn_timeout_seconds =
        fl.int_range("rpc_conn_timeout_seconds", 0, i32::MAX as i64)? as u32;
    cfg.rpc_enable_tcp_no_delay = fl.bool("rpc_enable_tcp_no_delay");
    cfg.enable_http_metadata_server = fl.bool("enable_http_metadata_server");
    cfg.http_metadata_server_host = fl.string("http_metadata_server_host");
    cfg.http_metadata_server_port = fl.int_range("http_metadata_server_port", 0, 65535)? as u16;
    cfg.metrics_host = fl.string("metrics_host");
    cfg.metrics_port = fl.int_range("metrics_port", 0, 65535)? as u16;
    cfg.enable_metric_reporting = fl.bool("enable_metric_reporting");
    cfg.default_kv_lease_ttl_ms = fl.uint("default_kv_lease_ttl");
    cfg.default_kv_soft_pin_ttl_ms = fl.uint("default_kv_soft_pin_ttl");
    cfg.max_kv_soft_pin_ttl_ms = fl.uint("max_kv_soft_pin_ttl");
    cfg.allow_evict_soft_pinned_objects = fl.bool("allow_evict_soft_pinned_objects");
    for name in ["eviction_high_watermark_ratio", "eviction_ratio"] {
        if !(0.0..=1.0).contains(&fl.double(name)) {
            return Err(failed_validation(name, &fl.raw(name)));
        }
    }
    cfg.eviction_high_watermark_ratio = fl.double("eviction_high_watermark_ratio");
    cfg.eviction_ratio = fl.double("eviction_ratio");
    cfg.client_ttl_sec = fl.int_range("client_ttl", 1, i64::MAX)?;
    cfg.put_start_discard_timeout_sec = fl.uint("put_start_discard_timeout_sec");
    cfg.put_start_release_timeout_sec = fl.uint("put_start_release_timeout_sec");
    cfg.max_pending_versions_per_key =
        fl.int_range("max_pending_versions_per_key", 1, u32::MAX as i64)? as u32;
    cfg.pending_version_wait_ms = fl.uint("pending_version_wait_ms");

    match fl.string("memory_allocator").as_str() {
        "offset" => {}
        "cachelib" => warnings.push(
            "--memory_allocator=cachelib is not available in this build; using offset".into(),
        ),
        _ => {
            return Err(failed_validation(
                "memory_allocator",
                &fl.raw("memory_allocator"),
            ))
        }
    }
    cfg.allocation_strategy = match fl.string("allocation_strategy").as_str() {
        "random" => AllocationStrategy::Random,
        "free_ratio_first" => AllocationStrategy::FreeRatioFirst,
        "local_first" => AllocationStrategy::LocalFirst,
        _ => {
            return Err(failed_validation(
                "allocation_strategy",
                &fl.raw("allocation_strategy"),
            ))
        }
    };
    cfg.enable_metadata_cleanup_on_timeout = fl.bool("enable_metadata_cleanup_on_timeout");
    cfg.auth_token_file = fl.string("auth_token_file");
    if !cfg.auth_token_file.is_empty() {
        let key = AuthKey::from_file(std::path::Path::new(&cfg.auth_token_file)).map_err(|e| {
            format!(
                "{}: {e}",
                failed_validation("auth_token_file", &fl.raw("auth_token_file"))
            )
        })?;
        cfg.auth = Some(key);
    }
    cfg.max_connections = u32::try_from(fl.uint("max_connections").max(1)).unwrap_or(u32::MAX);
    cfg.max_connections_per_peer =
        u32::try_from(fl.uint("max_connections_per_peer").max(1)).unwrap_or(u32::MAX);
    cfg.idle_connection_timeout_sec =
        u32::try_from(fl.uint("idle_connection_timeout_sec")).unwrap_or(u32::MAX);
    ha_config(fl, &mut cfg, warnings)?;
    cfg.enable_offload = fl.bool("enable_offload");
    cfg.root_fs_dir = fl.string("root_fs_dir");
    if !cfg.root_fs_dir.is_empty() && !cfg.root_fs_dir.starts_with('/') {
        return Err(format!(
            "{}: the root directory must be an absolute path",
            failed_validation("root_fs_dir", &fl.raw("root_fs_dir"))
        ));
    }
    cfg.global_file_segment_size = fl.int_range("global_file_segment_size", 0, i64::MAX)? as u64;
    cfg.log_level = fl.log_level(warnings);
    Ok(cfg)
}

/// The HA flags (upstream's names and forms): `--enable_ha`,
/// `--ha_backend_type` (etcd only), `--ha_backend_connstring` (or the legacy
/// `--etcd_endpoints` when it is empty), `--cluster_id`.
fn ha_config(fl: &Flags, cfg: &mut MasterConfig, warnings: &mut Vec<String>) -> Result<(), String> {
    cfg.enable_ha = fl.bool("enable_ha");
    cfg.cluster_id = fl.string("cluster_id");
    let conn = match fl.string("ha_backend_connstring") {
        c if c.trim().is_empty() => fl.string("etcd_endpoints"),
        c => c,
    };
    if !cfg.enable_ha {
        for name in [
            "ha_backend_connstring",
            "etcd_endpoints",
            "ha_backend_type",
            "cluster_id",
        ] {
            let default = find_flag(name).map(|d| d.default).unwrap_or_default();
            if fl.is_set(name) && fl.raw(name) != default {
                warnings.push(format!("flag --{name} has no effect without --enable_ha"));
            }
        }
        return Ok(());
    }
    let ty = fl.string("ha_backend_type");
    if ty != "etcd" {
        return Err(format!(
            "ERROR: --ha_backend_type={ty}: this build supports only the etcd HA backend"
        ));
    }
    if conn.trim().is_empty() {
        return Err(
            "ERROR: --enable_ha needs --ha_backend_connstring=h1:2379;h2:2379 (or the legacy --etcd_endpoints)"
                .into(),
        );
    }
    cfg.ha_endpoints = mooncake_common::ha::parse_etcd_endpoints(&conn).map_err(|e| {
        let name = if fl.string("ha_backend_connstring").trim().is_empty() {
            "etcd_endpoints"
        } else {
            "ha_backend_connstring"
        };
        format!("{}: {e}", failed_validation(name, &conn))
    })?;
    if cfg.cluster_id.is_empty() || cfg.cluster_id.contains('/') {
        return Err(format!(
            "{}: a cluster id is a non-empty name without '/'",
            failed_validation("cluster_id", &cfg.cluster_id)
        ));
    }
    let unspecified = cfg
        .rpc_address
        .trim_matches(['[', ']'])
        .parse::<std::net::IpAddr>()
        .is_ok_and(|ip| ip.is_unspecified());
    if unspecified || cfg.rpc_address.is_empty() {
        return Err(format!(
            "ERROR: --enable_ha needs a reachable --rpc_address (or --rpc_interface), not '{}': \
             the leader publishes rpc_address:rpc_port for the clients",
            cfg.rpc_address
        ));
    }
    Ok(())
}

/// IPv4 address of a network interface.
pub fn interface_ipv4(name: &str) -> Option<Ipv4Addr> {
    nix::ifaddrs::getifaddrs()
        .ok()?
        .filter(|ifa| ifa.interface_name == name)
        .find_map(|ifa| {
            ifa.address
                .as_ref()
                .and_then(|a| a.as_sockaddr_in())
                .map(|sin| sin.ip())
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use mooncake_common::gflags::parse_value;
    use std::collections::HashSet;

    fn args(list: &[&str]) -> Vec<String> {
        std::iter::once("mooncake_master")
            .chain(list.iter().copied())
            .map(String::from)
            .collect()
    }

    fn run(list: &[&str]) -> MasterConfig {
        match parse_master_args(&args(list)) {
            FlagOutcome::Run(c) => *c,
            FlagOutcome::Exit { code, message } => panic!("exit {code}: {message}"),
        }
    }

    fn run_w(list: &[&str]) -> (MasterConfig, Vec<String>) {
        match parse_master_args_with_warnings(&args(list)) {
            (FlagOutcome::Run(c), w) => (*c, w),
            (FlagOutcome::Exit { code, message }, _) => panic!("exit {code}: {message}"),
        }
    }

    fn exit(list: &[&str]) -> (i32, String) {
        match parse_master_args(&args(list)) {
            FlagOutcome::Exit { code, message } => (code, message),
            FlagOutcome::Run(c) => panic!("unexpectedly ran: {c:?}"),
        }
    }

    fn tmp(name: &str, content: &str) -> String {
        let path = std::env::temp_dir().join(format!(
            "mc-flags-{}-{}-{name}",
            std::process::id(),
            rand::random::<u32>()
        ));
        std::fs::write(&path, content).expect("write temp file");
        path.to_string_lossy().into_owned()
    }

    #[test]
    fn table_is_consistent() {
        let mut seen = HashSet::new();
        for d in MASTER.all() {
            assert!(seen.insert(d.name), "duplicate flag {}", d.name);
            assert!(
                parse_value(d, d.default).is_ok(),
                "bad default for {}",
                d.name
            );
            if let Replaced(_) = d.role {
                assert_eq!(d.ty, FlagType::Bool);
            }
        }
        for name in ["enable_oplog", "enable_snapshot", "enable_snapshot_restore"] {
            assert!(matches!(find_flag(name).map(|d| d.role), Some(Replaced(_))));
        }
        for name in [
            "enable_cxl",
            "enable_multi_tenants",
            "enable_kv_events",
            "promotion_on_hit",
        ] {
            assert!(matches!(find_flag(name).map(|d| d.role), Some(Feature(_))));
        }
    }

    #[test]
    fn defaults() {
        let c = run(&[]);
        let d = MasterConfig::default();
        assert_eq!(c.rpc_address, "0.0.0.0");
        assert_eq!(c.rpc_port, 50051);
        assert_eq!(c.rpc_thread_num, 0);
        assert!(c.rpc_enable_tcp_no_delay);
        assert!(!c.enable_http_metadata_server);
        assert_eq!(c.http_metadata_server_port, 8080);
        assert_eq!(c.metrics_port, 9003);
        assert_eq!(c.default_kv_lease_ttl_ms, d.default_kv_lease_ttl_ms);
        assert_eq!(c.default_kv_soft_pin_ttl_ms, 1_800_000);
        assert_eq!(c.max_kv_soft_pin_ttl_ms, 86_400_000);
        assert_eq!(c.eviction_high_watermark_ratio, 0.9);
        assert_eq!(c.eviction_ratio, 0.05);
        assert_eq!(c.client_ttl_sec, 10);
        assert_eq!(c.put_start_discard_timeout_sec, 30);
        assert_eq!(c.put_start_release_timeout_sec, 600);
        assert_eq!(c.allocation_strategy, AllocationStrategy::Random);
        assert_eq!(c.log_level, "warn");
    }

    #[test]
    fn syntax_forms() {
        let c = run(&[
            "--rpc_port=1234",
            "-metrics_port=9100",
            "--http_metadata_server_port",
            "8081",
            "-rpc_address",
            "127.0.0.1",
            "--enable_http_metadata_server",
            "--noenable_metric_reporting",
            "positional",
            "-rpc_enable_tcp_no_delay=F",
        ]);
        assert_eq!(c.rpc_port, 1234);
        assert_eq!(c.metrics_port, 9100);
        assert_eq!(c.http_metadata_server_port, 8081);
        assert_eq!(c.rpc_address, "127.0.0.1");
        assert!(c.enable_http_metadata_server);
        assert!(!c.enable_metric_reporting);
        assert!(!c.rpc_enable_tcp_no_delay);
    }

    #[test]
    fn bool_spellings() {
        for (s, v) in [
            ("true", true),
            ("TRUE", true),
            ("t", true),
            ("yes", true),
            ("Y", true),
            ("1", true),
            ("false", false),
            ("f", false),
            ("No", false),
            ("n", false),
            ("0", false),
        ] {
            let c = run(&[&format!("--enable_http_metadata_server={s}")]);
            assert_eq!(c.enable_http_metadata_server, v, "{s}");
        }
        let (code, msg) = exit(&["--enable_http_metadata_server=maybe"]);
        assert_eq!(code, 1);
        assert_eq!(
            msg,
            "ERROR: illegal value 'maybe' specified for bool flag 'enable_http_metadata_server'"
        );
        // A bool never consumes the next argument.
        let c = run(&["--enable_http_metadata_server", "false"]);
        assert!(c.enable_http_metadata_server);
    }

    #[test]
    fn double_dash_ends_flags() {
        let c = run(&["--rpc_port=7", "--", "--bogus=1", "--rpc_port=8"]);
        assert_eq!(c.rpc_port, 7);
    }

    #[test]
    fn last_assignment_wins() {
        assert_eq!(run(&["--rpc_port=7", "--rpc_port=9"]).rpc_port, 9);
    }

    #[test]
    fn unknown_flag() {
        let (code, msg) = exit(&["--bogus=1"]);
        assert_eq!(code, 1);
        assert_eq!(msg, "ERROR: unknown command line flag 'bogus'");
        let (code, msg) = exit(&["-nobogus"]);
        assert_eq!(code, 1);
        assert!(msg.contains("unknown command line flag 'nobogus'"));
    }

    #[test]
    fn undefok_suppresses_unknown() {
        let c = run(&[
            "--bogus=1",
            "--nofoo",
            "--undefok=bogus,foo",
            "--rpc_port=5",
        ]);
        assert_eq!(c.rpc_port, 5);
    }

    #[test]
    fn bad_numbers() {
        assert_eq!(
            exit(&["--rpc_port=abc"]),
            (
                1,
                "ERROR: illegal value 'abc' specified for int32 flag 'rpc_port'".into()
            )
        );
        assert_eq!(
            exit(&["--client_ttl=1.5"]).1,
            "ERROR: illegal value '1.5' specified for int64 flag 'client_ttl'"
        );
        assert_eq!(
            exit(&["--put_start_release_timeout_sec=-1"]).1,
            "ERROR: illegal value '-1' specified for uint64 flag 'put_start_release_timeout_sec'"
        );
        assert_eq!(
            exit(&["--eviction_ratio=x"]).1,
            "ERROR: illegal value 'x' specified for double flag 'eviction_ratio'"
        );
        assert_eq!(
            exit(&["--kv_events_block_size=4294967296"]).1,
            "ERROR: illegal value '4294967296' specified for uint32 flag 'kv_events_block_size'"
        );
        assert_eq!(
            exit(&["--rpc_port=99999999999"]).1,
            "ERROR: illegal value '99999999999' specified for int32 flag 'rpc_port'"
        );
        assert_eq!(exit(&["--rpc_port="]).0, 1);
        // Hex is accepted, like strtol.
        assert_eq!(run(&["--rpc_port=0x10"]).rpc_port, 16);
    }

    #[test]
    fn range_validation() {
        assert_eq!(
            exit(&["--rpc_port=70000"]).1,
            "ERROR: failed validation of new value '70000' for flag 'rpc_port'"
        );
        assert_eq!(exit(&["--metrics_port=-1"]).0, 1);
        assert_eq!(exit(&["--eviction_ratio=1.5"]).0, 1);
        assert_eq!(exit(&["--client_ttl=0"]).0, 1);
    }

    #[test]
    fn missing_argument_and_no_prefix_on_non_bool() {
        let (code, msg) = exit(&["--rpc_port"]);
        assert_eq!(code, 1);
        assert!(msg.contains("flag 'rpc_port' is missing its argument"));
        let (code, msg) = exit(&["--norpc_port"]);
        assert_eq!(code, 1);
        assert!(msg.contains("int32 command line flag 'rpc_port'"));
    }

    #[test]
    fn durations() {
        let cases = [
            ("2s", 2000),
            ("2000", 2000),
            ("500ms", 500),
            ("3m", 180_000),
            ("1h", 3_600_000),
            ("0", 0),
        ];
        for (raw, ms) in cases {
            assert_eq!(
                run(&[&format!("--default_kv_lease_ttl={raw}")]).default_kv_lease_ttl_ms,
                ms,
                "{raw}"
            );
        }
        assert_eq!(
            run(&["--max_kv_soft_pin_ttl", "2h"]).max_kv_soft_pin_ttl_ms,
            7_200_000
        );
        assert_eq!(
            run(&["--default_kv_soft_pin_ttl=10s"]).default_kv_soft_pin_ttl_ms,
            10_000
        );
        for bad in ["abc", "-5", "5d", "s", "1.5s", "", "99999999999999999999h"] {
            assert_eq!(
                exit(&[&format!("--default_kv_lease_ttl={bad}")]),
                (
                    1,
                    format!("ERROR: failed validation of new value '{bad}' for flag 'default_kv_lease_ttl'")
                ),
                "{bad}"
            );
        }
    }

    #[test]
    fn help_and_version() {
        let (code, msg) = exit(&["--help"]);
        assert_eq!(code, 1);
        for d in FLAGS {
            assert!(
                msg.contains(&format!("-{} (", d.name)),
                "help lacks {}",
                d.name
            );
        }
        let (code, msg) = exit(&["--version"]);
        assert_eq!(code, 0);
        assert_eq!(
            msg,
            format!("mooncake_master version {}", env!("CARGO_PKG_VERSION"))
        );
        let (code, msg) = exit(&["--helpmatch=lease"]);
        assert_eq!(code, 1);
        assert!(msg.contains("default_kv_lease_ttl"));
        assert!(!msg.contains("rpc_port"));
        // Errors win over help.
        assert!(exit(&["--help", "--bogus"]).1.starts_with("ERROR"));
    }

    #[test]
    fn feature_switches_fail_fast() {
        let (code, msg) = exit(&["--enable_oplog=true"]);
        assert_eq!(code, 1);
        assert!(
            msg.contains("flag --enable_oplog: this build keeps no operation log"),
            "{msg}"
        );
        assert!(msg.contains("re-report"), "{msg}");
        for name in ["enable_snapshot", "enable_snapshot_restore"] {
            let (code, msg) = exit(&[&format!("--{name}")]);
            assert_eq!(code, 1);
            assert!(msg.contains(&format!("flag --{name}: ")), "{msg}");
        }
        for name in ["enable_cxl", "promotion_on_hit", "enable_kv_events"] {
            let (code, msg) = exit(&[&format!("--{name}")]);
            assert_eq!(code, 1);
            assert!(msg.contains(&format!("flag --{name} requires")), "{msg}");
        }
        // Explicitly false is fine.
        run(&[
            "--enable_ha=false",
            "--noenable_snapshot",
            "--noenable_oplog",
        ]);
    }

    #[test]
    fn offload_flags() {
        let c = run(&[]);
        assert!(!c.offloads());
        assert_eq!(c.global_file_segment_size, i64::MAX as u64);
        let c = run(&["--enable_offload=true", "--offload_on_evict=true"]);
        assert!(c.offloads());
        assert_eq!(c.fsdir(), "");
        let c = run(&[
            "--root_fs_dir=/mnt/ssd/",
            "--global_file_segment_size=1073741824",
            "--cluster_id=c1",
        ]);
        assert!(c.offloads());
        assert_eq!(c.fsdir(), "/mnt/ssd/c1");
        assert_eq!(c.global_file_segment_size, 1 << 30);
        let (code, msg) = exit(&["--root_fs_dir=relative/dir"]);
        assert_eq!(code, 1);
        assert!(msg.contains("absolute path"), "{msg}");
        assert_eq!(exit(&["--global_file_segment_size=-1"]).0, 1);
    }

    #[test]
    fn ha_flags() {
        let c = run(&[
            "--enable_ha=true",
            "--ha_backend_type=etcd",
            "--ha_backend_connstring=h1:2379;h2:2380",
            "--rpc_address=10.0.0.1",
            "--cluster_id=prod",
        ]);
        assert!(c.enable_ha);
        assert_eq!(c.ha_endpoints, vec!["http://h1:2379", "http://h2:2380"]);
        assert_eq!(c.cluster_id, "prod");
        // The legacy alias is used when the connstring is empty.
        let c = run(&[
            "--enable_ha",
            "--etcd_endpoints=e:1",
            "--rpc_address=10.0.0.1",
        ]);
        assert_eq!(c.ha_endpoints, vec!["http://e:1"]);
        assert_eq!(c.cluster_id, "mooncake_cluster");
        // ... but the connstring wins when both are given.
        let c = run(&[
            "--enable_ha",
            "--etcd_endpoints=e:1",
            "--ha_backend_connstring=c:2",
            "--rpc_address=10.0.0.1",
        ]);
        assert_eq!(c.ha_endpoints, vec!["http://c:2"]);
        // Bad inputs, each with its reason.
        for (args, needle) in [
            (
                vec!["--enable_ha", "--rpc_address=10.0.0.1"],
                "needs --ha_backend_connstring",
            ),
            (
                vec!["--enable_ha", "--etcd_endpoints=e:1"],
                "needs a reachable --rpc_address",
            ),
            (
                vec!["--enable_ha", "--etcd_endpoints=e:1", "--rpc_address=::"],
                "needs a reachable --rpc_address",
            ),
            (
                vec![
                    "--enable_ha",
                    "--ha_backend_type=redis",
                    "--etcd_endpoints=e:1",
                    "--rpc_address=1.2.3.4",
                ],
                "supports only the etcd HA backend",
            ),
            (
                vec![
                    "--enable_ha",
                    "--ha_backend_connstring=nohost",
                    "--rpc_address=1.2.3.4",
                ],
                "for flag 'ha_backend_connstring'",
            ),
            (
                vec![
                    "--enable_ha",
                    "--etcd_endpoints=https://h:1",
                    "--rpc_address=1.2.3.4",
                ],
                "TLS",
            ),
            (
                vec![
                    "--enable_ha",
                    "--etcd_endpoints=h:1",
                    "--rpc_address=1.2.3.4",
                    "--cluster_id=a/b",
                ],
                "for flag 'cluster_id'",
            ),
        ] {
            let (code, msg) = exit(&args);
            assert_eq!(code, 1, "{args:?}");
            assert!(msg.contains(needle), "{args:?}: {msg}");
        }
        // Without --enable_ha the HA flags only warn.
        let (c, w) = run_w(&["--etcd_endpoints=a:1"]);
        assert!(!c.enable_ha);
        assert!(
            w.iter()
                .any(|w| w.contains("--etcd_endpoints has no effect")),
            "{w:?}"
        );
    }

    #[test]
    fn unimplemented_flags_warn_only_when_non_default() {
        let (_, w) = run_w(&["--cluster_id=mooncake_cluster", "--max_retry_attempts=10"]);
        assert!(w.is_empty(), "{w:?}");
        let (_, w) = run_w(&["--max_retry_attempts=3", "--vmodule=x=2"]);
        assert_eq!(w.len(), 2, "{w:?}");
        assert!(w[0].contains("--max_retry_attempts=3"));
        // Type checked nonetheless.
        assert_eq!(exit(&["--max_retry_attempts=x"]).0, 1);
        assert_eq!(exit(&["--enable_disk_eviction=x"]).0, 1);
    }

    #[test]
    fn deprecated_port_and_threads() {
        let (c, w) = run_w(&["--port=6000"]);
        assert_eq!(c.rpc_port, 6000);
        assert!(w.iter().any(|w| w.contains("--port is deprecated")));
        let (c, _) = run_w(&["--port=6000", "--rpc_port=6001"]);
        assert_eq!(c.rpc_port, 6001);
        let (c, w) = run_w(&["--max_threads=8"]);
        assert_eq!(c.rpc_thread_num, 8);
        assert!(w.iter().any(|w| w.contains("max_threads")));
        let (c, _) = run_w(&["--max_threads=8", "--rpc_thread_num=3"]);
        assert_eq!(c.rpc_thread_num, 3);
    }

    #[test]
    fn allocator_and_strategy() {
        assert_eq!(
            run(&["--allocation_strategy=free_ratio_first"]).allocation_strategy,
            AllocationStrategy::FreeRatioFirst
        );
        assert_eq!(
            run(&["--allocation_strategy=local_first"]).allocation_strategy,
            AllocationStrategy::LocalFirst
        );
        assert_eq!(
            exit(&["--allocation_strategy=best"]).1,
            "ERROR: failed validation of new value 'best' for flag 'allocation_strategy'"
        );
        let (_, w) = run_w(&["--memory_allocator=cachelib"]);
        assert!(w.iter().any(|w| w.contains("cachelib")));
        assert_eq!(exit(&["--memory_allocator=jemalloc"]).0, 1);
    }

    #[test]
    fn log_flags() {
        assert_eq!(run(&["--v=1"]).log_level, "debug");
        assert_eq!(run(&["--v=2"]).log_level, "trace");
        assert_eq!(run(&["--logtostderr"]).log_level, "info");
        assert_eq!(
            run(&["--alsologtostderr", "--minloglevel=1"]).log_level,
            "warn"
        );
        assert_eq!(run(&["--stderrthreshold=0"]).log_level, "info");
        assert_eq!(run(&["--stderrthreshold=2"]).log_level, "error");
        assert_eq!(run(&["--minloglevel=2"]).log_level, "error");
        assert_eq!(run(&["--minloglevel=3"]).log_level, "off");
        let (c, w) = run_w(&["--log_dir=/tmp"]);
        assert_eq!(c.log_level, "warn");
        assert_eq!(w.len(), 1);
    }

    #[test]
    fn auth_and_connection_limits() {
        let d = run(&[]);
        assert!(d.auth.is_none() && d.auth_token_file.is_empty());
        assert_eq!(
            (
                d.max_connections,
                d.max_connections_per_peer,
                d.idle_connection_timeout_sec
            ),
            (4096, 1024, 60)
        );
        let token = tmp("token", "s3cret\n");
        let c = run(&[
            &format!("--auth_token_file={token}"),
            "--max_connections=10",
            "--max_connections_per_peer=3",
            "--idle_connection_timeout_sec=0",
        ]);
        let key = c.auth.clone().expect("key loaded");
        assert_eq!(
            key.fingerprint(),
            AuthKey::new("s3cret").expect("key").fingerprint()
        );
        let l = c.rpc_limits();
        assert_eq!((l.max_total, l.max_per_peer, l.idle_timeout), (10, 3, None));
        let c = run(&["--rpc_conn_timeout_seconds=5"]);
        assert_eq!(
            c.rpc_limits().idle_timeout,
            Some(std::time::Duration::from_secs(5))
        );
        assert_eq!(
            c.http_limits().idle_timeout,
            Some(std::time::Duration::from_secs(60))
        );
        for bad in ["/nonexistent/token", &tmp("empty-token", " \n")] {
            let (code, msg) = exit(&[&format!("--auth_token_file={bad}")]);
            assert_eq!(code, 1, "{msg}");
            assert!(msg.contains("auth_token_file"), "{msg}");
        }
        assert_eq!(exit(&["--max_connections=-1"]).0, 1);
    }

    #[test]
    fn rpc_interface() {
        let c = run(&["--rpc_interface=lo", "--rpc_address=10.0.0.1"]);
        assert_eq!(c.rpc_address, "127.0.0.1");
        let (code, msg) = exit(&["--rpc_interface=definitely_no_such_if0"]);
        assert_eq!(code, 1);
        assert!(msg.contains("rpc_interface"));
    }

    #[test]
    fn flagfile() {
        let inner = tmp("inner", "--client_ttl=7\n");
        let path = tmp(
            "flags",
            &format!(
                "# comment\n\n--rpc_port=4321\n-default_kv_lease_ttl 3s\n--enable_http_metadata_server\n--flagfile={inner}\n"
            ),
        );
        let c = run(&[&format!("--flagfile={path}"), "--metrics_port=1"]);
        assert_eq!(c.rpc_port, 4321);
        assert_eq!(c.default_kv_lease_ttl_ms, 3000);
        assert!(c.enable_http_metadata_server);
        assert_eq!(c.client_ttl_sec, 7);
        assert_eq!(c.metrics_port, 1);
        // Later command-line flags override the flagfile.
        assert_eq!(run(&["--flagfile", &path, "--rpc_port=1"]).rpc_port, 1);
        let bad = tmp("bad", "--bogus=2\n");
        assert_eq!(
            exit(&[&format!("--flagfile={bad}")]).1,
            "ERROR: unknown command line flag 'bogus'"
        );
        assert_eq!(exit(&["--flagfile=/nonexistent/mc-flags"]).0, 1);
        let _ = std::fs::remove_file(inner);
        let _ = std::fs::remove_file(path);
        let _ = std::fs::remove_file(bad);
    }

    #[test]
    fn config_json() {
        let path = tmp(
            "cfg.json",
            r#"{"rpc_port": 5555, "default_kv_lease_ttl": "2s", "enable_http_metadata_server": true,
                "eviction_ratio": 0.1, "metrics_port": "9200", "some_unknown_key": 1}"#,
        );
        let (c, w) = run_w(&[&format!("--config_path={path}")]);
        assert_eq!(c.rpc_port, 5555);
        assert_eq!(c.default_kv_lease_ttl_ms, 2000);
        assert!(c.enable_http_metadata_server);
        assert_eq!(c.eviction_ratio, 0.1);
        assert_eq!(c.metrics_port, 9200);
        assert!(w.iter().any(|w| w.contains("some_unknown_key")));
        // Explicit command-line flags override the file, wherever they appear.
        let c = run(&["--rpc_port=1", &format!("--config_path={path}")]);
        assert_eq!(c.rpc_port, 1);
        assert_eq!(c.metrics_port, 9200);

        let bad = tmp("bad.json", r#"{"rpc_port": "abc"}"#);
        let (code, msg) = exit(&[&format!("--config_path={bad}")]);
        assert_eq!(code, 1);
        assert!(msg.starts_with("ERROR: illegal value 'abc' specified for int32 flag 'rpc_port'"));
        let feat = tmp("feat.json", r#"{"enable_cxl": true}"#);
        assert!(exit(&[&format!("--config_path={feat}")])
            .1
            .contains("enable_cxl requires"));
        let notobj = tmp("arr.json", "[1,2]");
        assert_eq!(exit(&[&format!("--config_path={notobj}")]).0, 1);
        assert_eq!(exit(&["--config_path=/nonexistent/x.json"]).0, 1);
        for p in [path, bad, feat, notobj] {
            let _ = std::fs::remove_file(p);
        }
    }

    #[test]
    fn fromenv_missing() {
        // Reading a present variable is covered by tests/cli.rs (no set_var
        // in a multi-threaded test binary).
        run(&["--tryfromenv=pod_namespace"]);
        let (code, msg) = exit(&["--fromenv=pod_namespace"]);
        assert_eq!(code, 1);
        assert!(msg.contains("FLAGS_pod_namespace"));
        assert!(exit(&["--fromenv=bogus"]).1.contains("'bogus'"));
    }

    #[test]
    fn duration_parser() {
        assert_eq!(parse_duration_ms("15"), Some(15));
        assert_eq!(parse_duration_ms("15ms"), Some(15));
        assert_eq!(parse_duration_ms("1s"), Some(1000));
        assert_eq!(parse_duration_ms("+1"), None);
        assert_eq!(parse_duration_ms(" 1"), None);
    }
}
