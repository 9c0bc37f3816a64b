//! STUB — replaced by the master-io branch at merge.
use prometheus_client::metrics::counter::Counter;
#[derive(Default)]
pub struct MasterMetrics {
    pub put_start_requests: Counter,
    pub put_start_failures: Counter,
    pub put_start_alloc_failures: Counter,
    pub put_start_partial_allocations: Counter,
    pub get_replica_list_requests: Counter,
    pub remove_requests: Counter,
    pub ping_requests: Counter,
    pub mount_segment_requests: Counter,
    pub unmount_segment_requests: Counter,
    pub successful_evictions: Counter,
    pub attempted_evictions: Counter,
    pub evicted_key_count: Counter,
    pub evicted_size_bytes: Counter,
}
