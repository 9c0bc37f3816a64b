//! STUB — replaced by the lead.
//!
//! Minimal stand-in for the master core so the command line, HTTP servers and
//! process orchestration build and run on the `master-io` branch.

use std::sync::Arc;

use mooncake_common::ErrorCode;

use crate::admin::{AdminView, GaugeSnapshot, ReplicaView};
use crate::config::MasterConfig;
use crate::metadata_kv::MetadataKv;
use crate::metrics::MasterMetrics;

/// The master's object/segment/client state (stub: empty).
pub struct MasterState;

impl MasterState {
    /// Build the state from the effective configuration.
    pub fn new(
        cfg: MasterConfig,
        metrics: Arc<MasterMetrics>,
        metadata: Option<Arc<MetadataKv>>,
    ) -> Arc<Self> {
        let _ = (cfg, metrics, metadata);
        Arc::new(MasterState)
    }

    /// Spawn background tasks (eviction, client TTL); call inside the runtime.
    pub fn start_background(self: &Arc<Self>) {}
}

impl AdminView for MasterState {
    fn query_key(&self, _key: &str) -> Result<Vec<ReplicaView>, ErrorCode> {
        Err(ErrorCode::ObjectNotFound)
    }
    fn all_keys(&self) -> Vec<String> {
        Vec::new()
    }
    fn all_segments(&self) -> Vec<String> {
        Vec::new()
    }
    fn gauges(&self) -> GaugeSnapshot {
        GaugeSnapshot::default()
    }
}
