//! Effective master configuration (what the flag parser produces).

use mooncake_common::AuthKey;

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
    /// RPC bind address.
    pub rpc_address: String,
    /// RPC port.
    pub rpc_port: u16,
    /// Tokio worker threads (0 = automatic).
    pub rpc_thread_num: u32,
    /// Idle RPC connection timeout in seconds; 0 means the master's own
    /// default ([`MasterConfig::idle_connection_timeout_sec`]).
    pub rpc_conn_timeout_seconds: u32,
    /// Set `TCP_NODELAY` on RPC connections.
    pub rpc_enable_tcp_no_delay: bool,
    /// Run the embedded HTTP metadata server.
    pub enable_http_metadata_server: bool,
    /// Metadata server bind host.
    pub http_metadata_server_host: String,
    /// Metadata server port.
    pub http_metadata_server_port: u16,
    /// Admin server bind host.
    pub metrics_host: String,
    /// Admin server port.
    pub metrics_port: u16,
    /// Log a one-line summary periodically.
    pub enable_metric_reporting: bool,
    /// Read lease granted by every read.
    pub default_kv_lease_ttl_ms: u64,
    /// Soft-pin duration when a write asks for one without a TTL.
    pub default_kv_soft_pin_ttl_ms: u64,
    /// Longest soft pin a write may ask for.
    pub max_kv_soft_pin_ttl_ms: u64,
    /// Evict soft-pinned objects when unpinned ones do not suffice.
    pub allow_evict_soft_pinned_objects: bool,
    /// Usage ratio that triggers eviction.
    pub eviction_high_watermark_ratio: f64,
    /// Fraction of objects evicted per round.
    pub eviction_ratio: f64,
    /// Seconds without a ping before a client expires.
    pub client_ttl_sec: i64,
    /// Seconds before an unfinished put may be discarded.
    pub put_start_discard_timeout_sec: u64,
    /// Seconds before a discarded put's space is released.
    pub put_start_release_timeout_sec: u64,
    /// Replaced versions of one key whose replicas may still be read (kept
    /// allocated until their readers finish) beyond which an upsert of the
    /// key waits for one to be freed.
    pub max_pending_versions_per_key: u32,
    /// How long such an upsert waits before it fails with
    /// OBJECT_REPLICA_BUSY (ms).
    pub pending_version_wait_ms: u64,
    /// How long a put that finds no room waits for space already on its
    /// way back (evicted objects being copied to disk or forgotten by
    /// their owners) before it fails with NO_AVAILABLE_HANDLE (ms; 0: it
    /// fails at once, as a put does when nothing is on its way).
    pub put_space_wait_ms: u64,
    /// How replicas are placed.
    pub allocation_strategy: AllocationStrategy,
    /// Delete `mooncake/ram/<segment>` when a client expires.
    pub enable_metadata_cleanup_on_timeout: bool,
    /// Log filter for the tracing subscriber (e.g. `warn`, `info`).
    pub log_level: String,
    /// `--log_dir`: the file log lines also go to.
    pub log_file: Option<mooncake_common::gflags::LogFile>,
    /// File the cluster token was read from (`--auth_token_file`; empty: none).
    pub auth_token_file: String,
    /// The cluster secret: with it, every RPC connection and
    /// every metadata write must prove the secret, and puts hand out
    /// signed write tickets. `None`: today's behaviour, for trusted
    /// networks only.
    pub auth: Option<AuthKey>,
    /// Most open connections per listener (RPC, metadata, admin).
    pub max_connections: u32,
    /// Most open connections per peer address and listener.
    pub max_connections_per_peer: u32,
    /// Close a connection silent this long (seconds; 0 = never).
    pub idle_connection_timeout_sec: u32,
    /// `--enable_ha`: elect a leader among the masters of `cluster_id` through etcd.
    pub enable_ha: bool,
    /// etcd endpoints (`http://host:port`) from `--ha_backend_connstring` or `--etcd_endpoints`.
    pub ha_endpoints: Vec<String>,
    /// `--cluster_id`.
    pub cluster_id: String,
    /// `--enable_offload`: objects are copied to their owner's disk tier
    /// (owners that have one): each committed write, or with
    /// `offload_on_evict` each object eviction selects, which then stays
    /// readable from disk instead of being dropped.
    pub enable_offload: bool,
    /// `--root_fs_dir`: owners keep their disk tiers under
    /// `<root_fs_dir>/<cluster_id>/` (each in a directory of its own), and
    /// offload is on; empty = off.
    pub root_fs_dir: String,
    /// `--global_file_segment_size`: most bytes of disk copies over all
    /// owners. Past it, eviction keeps objects it would move to disk (they
    /// stay in memory, nothing is dropped) and a put that needs their space
    /// fails with NO_AVAILABLE_HANDLE.
    pub global_file_segment_size: u64,
    /// `--offload_on_evict`: in a master that offloads, copy an object to
    /// its owner's disk tier only when memory eviction selects it. Off
    /// (the default): every committed write is also queued for a copy to
    /// disk (write-through), and eviction then only drops memory replicas
    /// of objects that have a disk copy.
    pub offload_on_evict: bool,
    /// `--offload_force_evict` (with `offload_on_evict`): objects eviction
    /// cannot queue for disk (past the per-pass cap, the owner's queue or
    /// `--global_file_segment_size` full) are dropped instead of kept in
    /// memory.
    pub offload_force_evict: bool,
    /// `--offload_cap_ratio`: with `offload_on_evict`, one eviction pass
    /// queues at most `offloading_queue_limit * offload_cap_ratio` objects
    /// for disk; the rest stay in memory (or are dropped with
    /// `offload_force_evict`).
    pub offload_cap_ratio: f64,
    /// `--offloading_queue_limit`: most copies to disk queued for one owner
    /// and not yet acknowledged; an object that would pass it is not
    /// queued.
    pub offloading_queue_limit: u64,
    /// `--enable_disk_eviction`: owners whose disk tier lives under
    /// `--root_fs_dir` evict their oldest disk copies to make room; off, a
    /// full tier refuses new copies instead.
    pub enable_disk_eviction: bool,
    /// `--quota_bytes`: the most bytes each owner's disk tier under
    /// `--root_fs_dir` may hold; 0 means 90% of its file system.
    pub quota_bytes: u64,
    /// `--enable_multi_tenants`: tenant namespaces and quotas, the policy
    /// read from `tenant_quota_file` (`--tenant_quota_connector_uri`) when
    /// each term starts.
    pub enable_multi_tenants: bool,
    /// The tenant quota policy file.
    pub tenant_quota_file: String,
    /// `--promotion_on_hit` (in a master that offloads): an object read
    /// from its disk copy `promotion_admission_threshold` times is copied
    /// back into its owner's memory by the owner.
    pub promotion_on_hit: bool,
    /// `--promotion_admission_threshold` (1 to 255): reads of a disk-only
    /// object before it is promoted.
    pub promotion_admission_threshold: u32,
    /// `--promotion_queue_limit`: most promotions in flight at once.
    pub promotion_queue_limit: u32,
    /// `--promotion_max_per_heartbeat` (at least 1): most promotions one
    /// push of an owner's ledger stream carries (each a disk read the owner
    /// makes before it acknowledges the push).
    pub promotion_max_per_heartbeat: u32,
    /// `--max_total_pending_tasks`: copy and move tasks queued at most;
    /// more are refused with TASK_PENDING_LIMIT_EXCEEDED.
    pub max_total_pending_tasks: u32,
    /// `--max_total_processing_tasks`: tasks copying at once at most.
    pub max_total_processing_tasks: u32,
    /// `--max_total_finished_tasks`: finished tasks kept for `QueryTask`.
    pub max_total_finished_tasks: u32,
    /// `--pending_task_timeout_sec`: a task queued longer fails (0: never).
    pub pending_task_timeout_sec: u64,
    /// `--processing_task_timeout_sec`: a task copying longer fails (0:
    /// never).
    pub processing_task_timeout_sec: u64,
    /// `--max_retry_attempts`: times a task that found no room on its
    /// targets is queued again before it fails.
    pub max_retry_attempts: u32,
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
            max_pending_versions_per_key: 4,
            pending_version_wait_ms: 5000,
            put_space_wait_ms: 5000,
            allocation_strategy: AllocationStrategy::Random,
            enable_metadata_cleanup_on_timeout: false,
            log_level: "warn".into(),
            log_file: None,
            enable_ha: false,
            ha_endpoints: Vec::new(),
            cluster_id: mooncake_common::ha::DEFAULT_CLUSTER_ID.into(),
            auth_token_file: String::new(),
            auth: None,
            max_connections: 4096,
            max_connections_per_peer: 1024,
            idle_connection_timeout_sec: 60,
            enable_offload: false,
            root_fs_dir: String::new(),
            global_file_segment_size: i64::MAX as u64,
            offload_on_evict: false,
            offload_force_evict: false,
            offload_cap_ratio: 0.5,
            offloading_queue_limit: 50_000,
            enable_disk_eviction: true,
            quota_bytes: 0,
            enable_multi_tenants: false,
            tenant_quota_file: String::new(),
            promotion_on_hit: false,
            promotion_admission_threshold: 2,
            promotion_queue_limit: 50_000,
            promotion_max_per_heartbeat: 1,
            max_total_pending_tasks: 10_000,
            max_total_processing_tasks: 10_000,
            max_total_finished_tasks: 10_000,
            pending_task_timeout_sec: 300,
            processing_task_timeout_sec: 300,
            max_retry_attempts: 10,
        }
    }
}

impl MasterConfig {
    /// The bounds of the copy and move task table.
    pub(crate) fn task_limits(&self) -> crate::tasks::TaskLimits {
        let secs = |s: u64| (s > 0).then(|| std::time::Duration::from_secs(s));
        crate::tasks::TaskLimits {
            max_pending: self.max_total_pending_tasks as usize,
            max_processing: self.max_total_processing_tasks.max(1) as usize,
            max_finished: self.max_total_finished_tasks as usize,
            pending_timeout: secs(self.pending_task_timeout_sec),
            processing_timeout: secs(self.processing_task_timeout_sec),
            max_retries: self.max_retry_attempts,
        }
    }

    /// Whether objects are copied to owners' disk tiers.
    pub fn offloads(&self) -> bool {
        self.enable_offload || !self.root_fs_dir.is_empty()
    }

    /// Whether every committed write is copied to its owner's disk tier
    /// (offload on, `--offload_on_evict` off).
    pub fn writes_through(&self) -> bool {
        self.offloads() && !self.offload_on_evict
    }

    /// Whether disk-only objects read often enough come back to memory.
    pub fn promotes(&self) -> bool {
        self.offloads() && self.promotion_on_hit
    }

    /// With `--offload_on_evict`: most objects one eviction pass queues
    /// for disk.
    pub fn offload_cap(&self) -> u64 {
        (self.offloading_queue_limit as f64 * self.offload_cap_ratio) as u64
    }

    /// Where owners keep their disk tiers (`<root_fs_dir>/<cluster_id>`),
    /// or empty.
    pub fn fsdir(&self) -> String {
        if self.root_fs_dir.is_empty() {
            return String::new();
        }
        format!(
            "{}/{}",
            self.root_fs_dir.trim_end_matches('/'),
            self.cluster_id
        )
    }

    /// Admission limits of the RPC listener: the caps, and as idle timeout
    /// `rpc_conn_timeout_seconds` when set, else the master-wide one.
    pub fn rpc_limits(&self) -> mooncake_common::limits::ConnLimits {
        let idle = if self.rpc_conn_timeout_seconds > 0 {
            self.rpc_conn_timeout_seconds
        } else {
            self.idle_connection_timeout_sec
        };
        self.limits_with_idle(idle)
    }

    /// Admission limits of the HTTP listeners (metadata and admin).
    pub fn http_limits(&self) -> mooncake_common::limits::ConnLimits {
        self.limits_with_idle(self.idle_connection_timeout_sec)
    }

    fn limits_with_idle(&self, idle_sec: u32) -> mooncake_common::limits::ConnLimits {
        mooncake_common::limits::ConnLimits {
            max_total: self.max_connections.max(1) as usize,
            max_per_peer: self.max_connections_per_peer.max(1) as usize,
            idle_timeout: Some(std::time::Duration::from_secs(u64::from(idle_sec)))
                .filter(|d| !d.is_zero()),
        }
    }
}
