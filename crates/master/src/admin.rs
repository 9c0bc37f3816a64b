//! STUB — replaced by the master-io branch at merge.
use crate::metrics::MasterMetrics;
use std::sync::Arc;

pub struct ReplicaView {
    pub size: u64,
    pub buffer_address: u64,
    pub transport_endpoint: String,
}
#[derive(Default, Clone, Debug)]
pub struct GaugeSnapshot {
    pub allocated_bytes: u64,
    pub total_capacity_bytes: u64,
    pub key_count: u64,
    pub soft_pin_key_count: u64,
    pub active_clients: u64,
}
pub trait AdminView: Send + Sync + 'static {
    fn query_key(&self, key: &str) -> Result<Vec<ReplicaView>, mooncake_common::ErrorCode>;
    fn all_keys(&self) -> Vec<String>;
    fn all_segments(&self) -> Vec<String>;
    fn gauges(&self) -> GaugeSnapshot;
}
pub async fn serve_admin(
    _listener: tokio::net::TcpListener,
    _view: Arc<dyn AdminView>,
    _metrics: Arc<MasterMetrics>,
) {
}
