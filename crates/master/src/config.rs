//! Effective master configuration (what the flag parser produces).

/// How the allocator picks segments for replicas.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AllocationStrategy {
    /// Random segment with enough free space.
    Random,
    /// Segment with the highest free ratio first.
    FreeRatioFirst,
    /// Random, but segments on the writer's host first.
    LocalFirst,
}

/// Every setting the master acts on. Durations are in milliseconds unless named `_sec`.
#[derive(Debug, Clone)]
pub struct MasterConfig {
    pub rpc_address: String,
    pub rpc_port: u16,
    pub rpc_thread_num: u32,
    pub rpc_conn_timeout_seconds: u32,
    pub rpc_enable_tcp_no_delay: bool,
    pub enable_http_metadata_server: bool,
    pub http_metadata_server_host: String,
    pub http_metadata_server_port: u16,
    pub metrics_host: String,
    pub metrics_port: u16,
    pub enable_metric_reporting: bool,
    pub default_kv_lease_ttl_ms: u64,
    pub default_kv_soft_pin_ttl_ms: u64,
    pub max_kv_soft_pin_ttl_ms: u64,
    pub allow_evict_soft_pinned_objects: bool,
    pub eviction_high_watermark_ratio: f64,
    pub eviction_ratio: f64,
    pub client_ttl_sec: i64,
    pub put_start_discard_timeout_sec: u64,
    pub put_start_release_timeout_sec: u64,
    pub allocation_strategy: AllocationStrategy,
    pub enable_metadata_cleanup_on_timeout: bool,
    /// Log filter for the tracing subscriber (e.g. `warn`, `info`).
    pub log_level: String,
    /// `--enable_ha`: elect a leader among the masters of `cluster_id` through etcd.
    pub enable_ha: bool,
    /// etcd endpoints (`http://host:port`) from `--ha_backend_connstring` or `--etcd_endpoints`.
    pub ha_endpoints: Vec<String>,
    /// `--cluster_id`.
    pub cluster_id: String,
}

impl Default for MasterConfig {
    fn default() -> Self {
        MasterConfig {
            rpc_address: "0.0.0.0".into(),
            rpc_port: 50051,
            rpc_thread_num: 0,
            rpc_conn_timeout_seconds: 0,
            rpc_enable_tcp_no_delay: true,
            enable_http_metadata_server: false,
            http_metadata_server_host: "0.0.0.0".into(),
            http_metadata_server_port: 8080,
            metrics_host: "0.0.0.0".into(),
            metrics_port: 9003,
            enable_metric_reporting: true,
            default_kv_lease_ttl_ms: 10_000,
            default_kv_soft_pin_ttl_ms: 1_800_000,
            max_kv_soft_pin_ttl_ms: 86_400_000,
            allow_evict_soft_pinned_objects: true,
            eviction_high_watermark_ratio: 0.9,
            eviction_ratio: 0.05,
            client_ttl_sec: 10,
            put_start_discard_timeout_sec: 30,
            put_start_release_timeout_sec: 600,
            allocation_strategy: AllocationStrategy::Random,
            enable_metadata_cleanup_on_timeout: false,
            log_level: "warn".into(),
            enable_ha: false,
            ha_endpoints: Vec::new(),
            cluster_id: mooncake_common::ha::DEFAULT_CLUSTER_ID.into(),
        }
    }
}
