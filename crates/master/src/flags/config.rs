//! From parsed flags to the effective [`MasterConfig`]: value checks that
//! span several flags (HA, auth, eviction ratios), and interface lookup.

use std::net::Ipv4Addr;

use super::find_flag;
use crate::config::{AllocationStrategy, MasterConfig};
use crate::error::MasterError;
use mooncake_common::gflags::{failed_validation, Flags};
use mooncake_common::AuthKey;

/// The message for `--name`, whose raw value is refused because of `why`.
fn invalid(fl: &Flags, name: &str, why: impl std::fmt::Display) -> String {
    format!("{}: {why}", failed_validation(name, &fl.raw(name)))
}

/// Warns, for each of `names` set to other than its default, that it
/// changes nothing without `needed`.
fn no_effect_without(fl: &Flags, warnings: &mut Vec<String>, names: &[&str], needed: &str) {
    for name in names {
        let default = find_flag(name).map(|d| d.default).unwrap_or_default();
        if fl.is_set(name) && fl.raw(name) != default {
            warnings.push(format!("flag --{name} has no effect without {needed}"));
        }
    }
}

/// Translate the merged flags into the effective configuration.
pub(super) fn build_config(
    fl: &Flags,
    warnings: &mut Vec<String>,
) -> Result<MasterConfig, MasterError> {
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
                )
                .into())
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
            return Err(failed_validation(name, &fl.raw(name)).into());
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
    cfg.put_space_wait_ms = fl.uint("put_space_wait_ms");

    match fl.string("memory_allocator").as_str() {
        "offset" => {}
        "cachelib" => return Err(
            "ERROR: flag --memory_allocator=cachelib: this build has only the offset allocator \
                 (--memory_allocator=offset, the default)"
                .to_string()
                .into(),
        ),
        _ => return Err(failed_validation("memory_allocator", &fl.raw("memory_allocator")).into()),
    }
    cfg.allocation_strategy = match fl.string("allocation_strategy").as_str() {
        "random" => AllocationStrategy::Random,
        "free_ratio_first" => AllocationStrategy::FreeRatioFirst,
        "local_first" => AllocationStrategy::LocalFirst,
        _ => {
            return Err(
                failed_validation("allocation_strategy", &fl.raw("allocation_strategy")).into(),
            )
        }
    };
    cfg.enable_metadata_cleanup_on_timeout = fl.bool("enable_metadata_cleanup_on_timeout");
    cfg.auth_token_file = fl.string("auth_token_file");
    if !cfg.auth_token_file.is_empty() {
        let key = AuthKey::from_file(std::path::Path::new(&cfg.auth_token_file))
            .map_err(|e| invalid(fl, "auth_token_file", e))?;
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
        return Err(invalid(
            fl,
            "root_fs_dir",
            "the root directory must be an absolute path",
        )
        .into());
    }
    cfg.global_file_segment_size = fl.int_range("global_file_segment_size", 0, i64::MAX)? as u64;
    offload_config(fl, &mut cfg, warnings)?;
    tenant_config(fl, &mut cfg, warnings)?;
    let u32_of = |name: &str| u32::try_from(fl.uint(name)).unwrap_or(u32::MAX);
    cfg.max_total_pending_tasks = u32_of("max_total_pending_tasks");
    cfg.max_total_processing_tasks = u32_of("max_total_processing_tasks");
    cfg.max_total_finished_tasks = u32_of("max_total_finished_tasks");
    cfg.pending_task_timeout_sec = fl.uint("pending_task_timeout_sec");
    cfg.processing_task_timeout_sec = fl.uint("processing_task_timeout_sec");
    cfg.max_retry_attempts = u32_of("max_retry_attempts");
    cfg.log_level = fl.log_level(warnings);
    cfg.log_file = fl.log_file();
    Ok(cfg)
}

/// The tenant flags: `--enable_multi_tenants` with the file connector
/// (`--tenant_quota_connector_type=file`, the policy file in
/// `--tenant_quota_connector_uri`, read and checked now so a bad policy
/// fails the start). Set without multi-tenancy they change nothing and say
/// so.
fn tenant_config(
    fl: &Flags,
    cfg: &mut MasterConfig,
    warnings: &mut Vec<String>,
) -> Result<(), MasterError> {
    cfg.enable_multi_tenants = fl.bool("enable_multi_tenants");
    let kind = fl.string("tenant_quota_connector_type");
    cfg.tenant_quota_file = fl.string("tenant_quota_connector_uri");
    if !cfg.enable_multi_tenants {
        no_effect_without(
            fl,
            warnings,
            &["tenant_quota_connector_type", "tenant_quota_connector_uri"],
            "--enable_multi_tenants",
        );
        return Ok(());
    }
    if kind != "file" {
        return Err(format!(
            "{}: this build keeps tenant quota policies in a file only \
             (--tenant_quota_connector_type=file)",
            failed_validation("tenant_quota_connector_type", &kind)
        )
        .into());
    }
    if cfg.tenant_quota_file.is_empty() {
        return Err(format!(
            "{}: --enable_multi_tenants needs the policy file in --tenant_quota_connector_uri",
            failed_validation("tenant_quota_connector_uri", "")
        )
        .into());
    }
    crate::tenants::Tenants::load(cfg.tenant_quota_file.clone().into()).map_err(|e| {
        format!(
            "{}: {e}",
            failed_validation("tenant_quota_connector_uri", &cfg.tenant_quota_file)
        )
    })?;
    Ok(())
}

/// The offload tuning flags: `--offload_on_evict`, `--offload_force_evict`,
/// `--offload_cap_ratio` (0 to 1), `--offloading_queue_limit` (1 to 1e8),
/// `--enable_disk_eviction`, `--promotion_on_hit` with
/// `--promotion_admission_threshold` (clamped into 1 to 255) and
/// `--promotion_queue_limit` and `--promotion_max_per_heartbeat` (at
/// least 1). Set where they cannot act (without offload,
/// force-evict or the cap ratio without offload-on-evict, the promotion
/// knobs without promotion, disk eviction without `--root_fs_dir`) they
/// change nothing and say so.
fn offload_config(
    fl: &Flags,
    cfg: &mut MasterConfig,
    warnings: &mut Vec<String>,
) -> Result<(), MasterError> {
    cfg.offload_on_evict = fl.bool("offload_on_evict");
    cfg.offload_force_evict = fl.bool("offload_force_evict");
    cfg.offload_cap_ratio = fl.double("offload_cap_ratio");
    if !(0.0..=1.0).contains(&cfg.offload_cap_ratio) {
        return Err(invalid(
            fl,
            "offload_cap_ratio",
            "offload_cap_ratio must be between 0.0 and 1.0",
        )
        .into());
    }
    cfg.offloading_queue_limit = fl.uint("offloading_queue_limit");
    if !(1..=100_000_000).contains(&cfg.offloading_queue_limit) {
        return Err(invalid(
            fl,
            "offloading_queue_limit",
            "offloading_queue_limit must be between 1 and 100000000",
        )
        .into());
    }
    cfg.enable_disk_eviction = fl.bool("enable_disk_eviction");
    cfg.quota_bytes = fl.uint("quota_bytes");
    cfg.promotion_on_hit = fl.bool("promotion_on_hit");
    // Upstream clamps the threshold into 1..=255.
    cfg.promotion_admission_threshold =
        u32::try_from(fl.uint("promotion_admission_threshold").clamp(1, 255)).unwrap_or(255);
    cfg.promotion_queue_limit = u32::try_from(fl.uint("promotion_queue_limit")).unwrap_or(u32::MAX);
    // Upstream clamps 0 to 1.
    cfg.promotion_max_per_heartbeat =
        u32::try_from(fl.uint("promotion_max_per_heartbeat").max(1)).unwrap_or(u32::MAX);
    if !cfg.offloads() {
        no_effect_without(
            fl,
            warnings,
            &[
                "offload_on_evict",
                "offload_force_evict",
                "offload_cap_ratio",
                "offloading_queue_limit",
                "promotion_on_hit",
                "promotion_admission_threshold",
                "promotion_queue_limit",
                "promotion_max_per_heartbeat",
            ],
            "--enable_offload or --root_fs_dir",
        );
    } else if !cfg.promotion_on_hit {
        no_effect_without(
            fl,
            warnings,
            &[
                "promotion_admission_threshold",
                "promotion_queue_limit",
                "promotion_max_per_heartbeat",
            ],
            "--promotion_on_hit",
        );
    }
    if cfg.offloads() && !cfg.offload_on_evict {
        no_effect_without(
            fl,
            warnings,
            &["offload_force_evict", "offload_cap_ratio"],
            "--offload_on_evict",
        );
    }
    if cfg.root_fs_dir.is_empty() {
        no_effect_without(
            fl,
            warnings,
            &["enable_disk_eviction", "quota_bytes"],
            "--root_fs_dir (owners set up with their own disk tier follow \
             MOONCAKE_OFFLOAD_* settings)",
        );
    }
    Ok(())
}

/// The HA flags (upstream's names and forms): `--enable_ha`,
/// `--ha_backend_type` (etcd only), `--ha_backend_connstring` (or the legacy
/// `--etcd_endpoints` when it is empty), `--cluster_id`.
fn ha_config(
    fl: &Flags,
    cfg: &mut MasterConfig,
    warnings: &mut Vec<String>,
) -> Result<(), MasterError> {
    cfg.enable_ha = fl.bool("enable_ha");
    cfg.cluster_id = fl.string("cluster_id");
    let conn = match fl.string("ha_backend_connstring") {
        c if c.trim().is_empty() => fl.string("etcd_endpoints"),
        c => c,
    };
    if !cfg.enable_ha {
        no_effect_without(
            fl,
            warnings,
            &[
                "ha_backend_connstring",
                "etcd_endpoints",
                "ha_backend_type",
                "cluster_id",
            ],
            "--enable_ha",
        );
        return Ok(());
    }
    let ty = fl.string("ha_backend_type");
    if ty != "etcd" {
        return Err(format!(
            "ERROR: --ha_backend_type={ty}: this build supports only the etcd HA backend"
        )
        .into());
    }
    if conn.trim().is_empty() {
        return Err(
            "ERROR: --enable_ha needs --ha_backend_connstring=h1:2379;h2:2379 (or the legacy --etcd_endpoints)"
                .to_string()
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
        )
        .into());
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
        )
        .into());
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
