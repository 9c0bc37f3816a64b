//! The master's flag table: every upstream `mooncake_master` flag with its
//! type, default and role (implemented, a feature switch this build lacks,
//! replaced by another mechanism, or not implemented: then only its default
//! is accepted).

use mooncake_common::gflags::{f, FlagDef, FlagRole, FlagType, Program, IGN};
use FlagRole::{Core, Feature, Replaced, Unsupported};
use FlagType::{Bool, Double, Duration, Int32, Int64, Str, Uint32, Uint64};

const NO_LOG: &str = "this build keeps no operation log and takes no snapshots: metadata \
survives a master restart or failover because the clients re-report the replicas their segments \
hold when they remount (README, 'HA and durability')";

const DYN_REP: &str = "dynamic replication (extra memory replicas of hot keys)";

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
    f("memory_allocator", Str, "offset", Core, "segment allocator: offset (cachelib is refused: this build has only offset)"),
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
    // ---- ours: writes under memory pressure ----
    f("put_space_wait_ms", Uint64, "5000", Core, "how long a put that finds memory full waits for eviction in flight (objects being moved to disk or forgotten) to free space before it returns NO_AVAILABLE_HANDLE (-200); 0 = no wait"),
    // ---- copy and move tasks ----
    f("max_total_pending_tasks", Uint32, "10000", Core, "queued copy and move tasks at most (more: TASK_PENDING_LIMIT_EXCEEDED, -1401)"),
    f("max_total_processing_tasks", Uint32, "10000", Core, "copy and move tasks copying at once at most"),
    f("max_total_finished_tasks", Uint32, "10000", Core, "finished copy and move tasks kept for query_task"),
    f("pending_task_timeout_sec", Uint64, "300", Core, "seconds a copy or move task may stay PENDING before it fails (0 = never)"),
    f("processing_task_timeout_sec", Uint64, "300", Core, "seconds a copy or move task may stay PROCESSING before it fails (0 = never)"),
    f("max_retry_attempts", Uint32, "10", Core, "times a copy or move task that found no room on its targets is queued again before it fails"),
    // ---- feature switches: true fails fast unless this build implements the feature ----
    f("enable_ha", Bool, "false", Core, "HA: masters elect one leader through etcd; clients use etcd://<connstring>"),
    f("enable_oplog", Bool, "false", Replaced(NO_LOG), "operation log"),
    f("enable_snapshot", Bool, "false", Replaced(NO_LOG), "metadata snapshots"),
    f("enable_snapshot_restore", Bool, "false", Replaced(NO_LOG), "restore from snapshot"),
    f("enable_offload", Bool, "false", Core, "copy objects to their owners' disk tiers (owners set up with enable_ssd_offload / --enable_offload): each completed put, or with --offload_on_evict each object eviction selects"),
    f("enable_cxl", Bool, "false", Feature("CXL memory"), "CXL memory"),
    f("enable_multi_tenants", Bool, "false", Core, "each client tenant_id gets its own key namespace, and writes are admitted against the tenant's memory quota (policy from --tenant_quota_connector_uri)"),
    f("enable_kv_events", Bool, "false", Feature("KV event publishing"), "KV events"),
    f("offload_on_evict", Bool, "false", Core, "copy objects to their owners' disk tiers only when memory eviction selects them; false: every completed put is also queued for a copy to disk (write-through)"),
    f("offload_force_evict", Bool, "false", Core, "with --offload_on_evict: drop the objects an eviction pass cannot queue for disk (past the per-pass cap, the owner's queue or --global_file_segment_size full) instead of keeping them in memory"),
    f("offload_cap_ratio", Double, "0.5", Core, "with --offload_on_evict: one eviction pass queues at most offloading_queue_limit * offload_cap_ratio objects for disk (0 to 1)"),
    f("offloading_queue_limit", Uint64, "50000", Core, "most copies to disk queued for one owner and not yet done (1 to 100000000); an object past it is not queued"),
    f("quota_bytes", Uint64, "0", Core, "bytes each owner's disk tier under --root_fs_dir may hold (0 = 90% of its file system); a tier over it evicts its oldest copies, or with --noenable_disk_eviction refuses new ones"),
    f("enable_disk_eviction", Bool, "true", Core, "owners with a disk tier under --root_fs_dir evict their oldest disk copies to make room; false: a full tier refuses new copies"),
    f("promotion_on_hit", Bool, "false", Core, "copy an object read from its owner's disk tier promotion_admission_threshold times back into the owner's memory"),
    f("promotion_admission_threshold", Uint32, "2", Core, "reads of a disk-only object before it is promoted (1 to 255)"),
    f("promotion_queue_limit", Uint32, "50000", Core, "most promotions in flight at once"),
    f("promotion_max_per_heartbeat", Uint32, "1", Core, "most promotions one push to an owner carries (each a disk read before the owner acknowledges; 0 means 1)"),
    f("root_fs_dir", Str, "", Core, "owners keep their disk tiers under <root_fs_dir>/<cluster_id>/ and objects are copied there (turns offload on)"),
    f("global_file_segment_size", Int64, "9223372036854775807", Core, "most bytes of disk copies over all owners; beyond it eviction keeps objects in memory (none is dropped) and puts needing their space return NO_AVAILABLE_HANDLE (-200)"),
    // ---- recognised but unimplemented: a non-default value is refused ----
    f("batch_oplog_retry_timeout_sec", Uint32, "180", Unsupported, IGN),
    f("cluster_id", Str, "mooncake_cluster", Core, "HA cluster name (etcd key prefix); clients set MC_STORE_CLUSTER_ID to match"),
    f("cxl_path", Str, "/dev/dax0.0", Unsupported, IGN),
    f("cxl_size", Uint64, "8589934592", Unsupported, IGN),
    f("dynamic_replication_admission_qps_threshold", Double, "0.8", Feature(DYN_REP), "hot-key reads per second that admit an extra memory replica"),
    f("dynamic_replication_heat_window_seconds", Uint32, "10", Feature(DYN_REP), "heat observation window"),
    f("dynamic_replication_max_memory_replicas", Uint64, "2", Feature(DYN_REP), "most memory replicas of a hot key"),
    f("dynamic_replication_mode", Str, "off", Feature(DYN_REP), "off | observe | enforce"),
    f("etcd_endpoints", Str, "", Core, "legacy alias of --ha_backend_connstring, used when that is empty"),
    f("ha_backend_connstring", Str, "", Core, "HA backend endpoints: etcd h1:2379;h2:2379"),
    f("ha_backend_type", Str, "etcd", Core, "HA backend: etcd (redis and k8s are not supported by this build)"),
    f("kv_events_additional_salt", Str, "", Unsupported, IGN),
    f("kv_events_backend_id", Str, "", Unsupported, IGN),
    f("kv_events_bind_endpoint", Str, "", Unsupported, IGN),
    f("kv_events_block_size", Uint32, "0", Unsupported, IGN),
    f("kv_events_dp_rank", Uint32, "0", Unsupported, IGN),
    f("kv_events_emit_legacy_compat", Bool, "true", Unsupported, IGN),
    f("kv_events_emit_object_key", Bool, "true", Unsupported, IGN),
    f("kv_events_lora_name", Str, "", Unsupported, IGN),
    f("kv_events_model_name", Str, "", Unsupported, IGN),
    f("kv_events_queue_capacity", Uint32, "65536", Unsupported, IGN),
    f("kv_events_tenant_id", Str, "default", Unsupported, IGN),
    f("nof_eviction_high_watermark_ratio", Double, "0.9", Unsupported, IGN),
    f("nof_eviction_ratio", Double, "0.05", Unsupported, IGN),
    f("nof_heartbeat_failures_threshold", Uint32, "3", Unsupported, IGN),
    f("nof_heartbeat_interval_sec", Int64, "10", Unsupported, IGN),
    f("nof_heartbeat_probe_timeout_ms", Uint32, "1000", Unsupported, IGN),
    f("oplog_batch_max_entries", Uint32, "1024", Unsupported, IGN),
    f("oplog_poll_interval_ms", Int32, "1000", Unsupported, IGN),
    f("pod_name", Str, "", Unsupported, IGN),
    f("pod_namespace", Str, "", Unsupported, IGN),
    f("snapshot_backup_dir", Str, "", Unsupported, IGN),
    f("snapshot_catalog_backend_connstring", Str, "", Unsupported, IGN),
    f("snapshot_catalog_backend_type", Str, "", Unsupported, IGN),
    f("snapshot_catalog_store_connstring", Str, "", Unsupported, IGN),
    f("snapshot_catalog_store_type", Str, "", Unsupported, IGN),
    f("snapshot_child_timeout_seconds", Uint64, "300", Unsupported, IGN),
    f("snapshot_interval_seconds", Uint64, "600", Unsupported, IGN),
    f("snapshot_object_store_type", Str, "", Unsupported, IGN),
    f("snapshot_payload_backend_type", Str, "", Unsupported, IGN),
    f("snapshot_payload_store_type", Str, "", Unsupported, IGN),
    f("snapshot_retention_count", Uint32, "2", Unsupported, IGN),
    f("tenant_quota_connector_type", Str, "file", Core, "where tenant quota policies live: file (etcd is refused by this build)"),
    f("tenant_quota_connector_uri", Str, "", Core, "the tenant quota policy file (YAML: version: 1, tenants: [{name, quota}]); the admin API writes it back"),
    f("mmap_arena_pool_size", Uint64, "8589934592", Unsupported, IGN),
    f("use_mmap_arena_allocator", Bool, "false", Unsupported, IGN),
];

/// The `mooncake_master` command line.
pub static MASTER: Program = Program {
    name: "mooncake_master",
    title: "Mooncake store master (Rust)",
    flags: FLAGS,
};
