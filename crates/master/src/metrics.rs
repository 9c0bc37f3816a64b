//! Master counters and their Prometheus text exposition.
//!
//! The counters are prometheus-client [`Counter`]s that the core increments;
//! [`MasterMetrics::encode`] renders them, together with a [`GaugeSnapshot`]
//! taken from the master state, in the Prometheus text format 0.0.4. The
//! text is rendered by hand (rather than through a registry) so that the
//! exported names are exactly upstream's: most counters end in `_total`, but
//! `master_evicted_key_count` / `master_evicted_size_bytes` do not.

use std::fmt::Write as _;

use prometheus_client::metrics::counter::Counter;

/// Point-in-time values of the gauges exported by `/metrics`.
#[derive(Default, Clone, Debug)]
pub struct GaugeSnapshot {
    /// Sum of allocated bytes over all segments.
    pub allocated_bytes: u64,
    /// Sum of mounted segment sizes.
    pub total_capacity_bytes: u64,
    /// Number of objects.
    pub key_count: u64,
    /// Number of soft-pinned objects.
    pub soft_pin_key_count: u64,
    /// Number of live clients.
    pub active_clients: u64,
    /// Replaced versions still kept for reads in flight.
    pub retired_versions: u64,
    /// Bytes those versions hold (all replicas).
    pub retired_bytes: u64,
    /// 1 while serving (HA leader, or a master without HA).
    pub ha_is_leader: u64,
    /// HA term served or last served.
    pub ha_epoch: u64,
    /// Elections won by this process.
    pub ha_elections: u64,
    /// Step-downs of this process.
    pub ha_step_downs: u64,
    /// Leader changes observed in etcd.
    pub ha_leader_changes: u64,
    /// Each known tenant's quota (multi-tenancy only).
    pub tenants: Vec<crate::tenants::TenantQuota>,
}

/// One per-tenant gauge's value.
type TenantValue = fn(&crate::tenants::TenantQuota) -> u64;

/// Content type of [`MasterMetrics::encode`]'s output.
pub const PROMETHEUS_CONTENT_TYPE: &str = "text/plain; version=0.0.4";

/// Every counter the master exports. Increment with `inc()` / `inc_by(n)`.
#[derive(Debug, Default)]
pub struct MasterMetrics {
    /// PutStart requests (`master_put_start_requests_total`).
    pub put_start_requests: Counter,
    /// Failed PutStart requests (`master_put_start_failures_total`).
    pub put_start_failures: Counter,
    /// PutStart requests that failed to allocate (`master_put_start_alloc_failures_total`).
    pub put_start_alloc_failures: Counter,
    /// PutStart requests that got fewer replicas than asked
    /// (`master_put_start_partial_allocations_total`).
    pub put_start_partial_allocations: Counter,
    /// GetReplicaList requests (`master_get_replica_list_requests_total`).
    pub get_replica_list_requests: Counter,
    /// Remove requests (`master_remove_requests_total`).
    pub remove_requests: Counter,
    /// Ping requests (`master_ping_requests_total`).
    pub ping_requests: Counter,
    /// MountSegment requests (`master_mount_segment_requests_total`).
    pub mount_segment_requests: Counter,
    /// UnmountSegment requests (`master_unmount_segment_requests_total`).
    pub unmount_segment_requests: Counter,
    /// CreateCopyTask requests (`master_create_copy_task_requests_total`).
    pub copy_task_requests: Counter,
    /// CreateMoveTask requests (`master_create_move_task_requests_total`).
    pub move_task_requests: Counter,
    /// QueryTask requests (`master_query_task_requests_total`).
    pub query_task_requests: Counter,
    /// Eviction rounds that freed something (`master_successful_evictions_total`).
    pub successful_evictions: Counter,
    /// Eviction rounds started (`master_attempted_evictions_total`).
    pub attempted_evictions: Counter,
    /// Objects evicted (`master_evicted_key_count`).
    pub evicted_key_count: Counter,
    /// Bytes evicted (`master_evicted_size_bytes`).
    pub evicted_size_bytes: Counter,
    /// Segments remounted with a ledger report after this master lost (or
    /// never had) their metadata (`master_recovered_segments_total`).
    pub recovered_segments: Counter,
    /// Objects rebuilt from ledger reports (`master_recovered_objects_total`).
    pub recovered_objects: Counter,
    /// Replicas adopted from ledger reports (`master_recovered_replicas_total`).
    pub recovered_replicas: Counter,
    /// Reported ledger entries dropped as stale or invalid
    /// (`master_recovery_stale_entries_total`).
    pub recovery_stale_entries: Counter,
    /// Commits or forgets acknowledged to the caller without the segment
    /// owner's ack (owner unreachable; `master_ledger_unconfirmed_total`).
    pub ledger_unconfirmed: Counter,
    /// Upserts committed as a new version over a committed one
    /// (`master_upsert_versions_total`).
    pub upsert_versions: Counter,
    /// Upserts of an unread key written into its committed replicas
    /// (`master_upsert_in_place_total`).
    pub upsert_in_place: Counter,
    /// Upserts that waited for a replaced version of their key to be freed
    /// (`master_upsert_version_waits_total`).
    pub upsert_version_waits: Counter,
    /// Replaced versions freed once their last read ended
    /// (`master_retired_versions_freed_total`).
    pub retired_versions_freed: Counter,
    /// Puts that found memory full and waited for evicted space to come
    /// back (`master_put_space_waits_total`).
    pub put_space_waits: Counter,
    /// Disk-only objects copied back into memory after reads
    /// (`master_promoted_objects_total`).
    pub promoted_objects: Counter,
}

impl MasterMetrics {
    /// The counters as (exported name, help, counter).
    fn counters(&self) -> [(&'static str, &'static str, &Counter); 27] {
        [
            (
                "master_put_start_requests_total",
                "Total PutStart requests",
                &self.put_start_requests,
            ),
            (
                "master_put_start_failures_total",
                "Total failed PutStart requests",
                &self.put_start_failures,
            ),
            (
                "master_put_start_alloc_failures_total",
                "Total PutStart requests that failed to allocate space",
                &self.put_start_alloc_failures,
            ),
            (
                "master_put_start_partial_allocations_total",
                "Total PutStart requests that allocated fewer replicas than requested",
                &self.put_start_partial_allocations,
            ),
            (
                "master_get_replica_list_requests_total",
                "Total GetReplicaList requests",
                &self.get_replica_list_requests,
            ),
            (
                "master_remove_requests_total",
                "Total Remove requests",
                &self.remove_requests,
            ),
            (
                "master_ping_requests_total",
                "Total Ping requests",
                &self.ping_requests,
            ),
            (
                "master_mount_segment_requests_total",
                "Total MountSegment requests",
                &self.mount_segment_requests,
            ),
            (
                "master_unmount_segment_requests_total",
                "Total UnmountSegment requests",
                &self.unmount_segment_requests,
            ),
            (
                "master_create_copy_task_requests_total",
                "Total CreateCopyTask requests",
                &self.copy_task_requests,
            ),
            (
                "master_create_move_task_requests_total",
                "Total CreateMoveTask requests",
                &self.move_task_requests,
            ),
            (
                "master_query_task_requests_total",
                "Total QueryTask requests",
                &self.query_task_requests,
            ),
            (
                "master_successful_evictions_total",
                "Total eviction rounds that freed space",
                &self.successful_evictions,
            ),
            (
                "master_attempted_evictions_total",
                "Total eviction rounds attempted",
                &self.attempted_evictions,
            ),
            (
                "master_evicted_key_count",
                "Total objects evicted",
                &self.evicted_key_count,
            ),
            (
                "master_evicted_size_bytes",
                "Total bytes evicted",
                &self.evicted_size_bytes,
            ),
            (
                "master_recovered_segments_total",
                "Segments remounted with a report of the objects they hold",
                &self.recovered_segments,
            ),
            (
                "master_recovered_objects_total",
                "Objects rebuilt from segment owners' reports",
                &self.recovered_objects,
            ),
            (
                "master_recovered_replicas_total",
                "Replicas adopted from segment owners' reports",
                &self.recovered_replicas,
            ),
            (
                "master_recovery_stale_entries_total",
                "Reported replicas dropped as stale (a newer version exists) or invalid",
                &self.recovery_stale_entries,
            ),
            (
                "master_ledger_unconfirmed_total",
                "Writes or removals acknowledged without the segment owner's ack",
                &self.ledger_unconfirmed,
            ),
            (
                "master_upsert_versions_total",
                "Upserts committed as a new version while the old one stays readable",
                &self.upsert_versions,
            ),
            (
                "master_upsert_in_place_total",
                "Upserts of a key nobody was reading, written over its committed replicas",
                &self.upsert_in_place,
            ),
            (
                "master_upsert_version_waits_total",
                "Upserts that waited for a replaced version of their key to be freed",
                &self.upsert_version_waits,
            ),
            (
                "master_retired_versions_freed_total",
                "Replaced versions freed once the reads still using them ended",
                &self.retired_versions_freed,
            ),
            (
                "master_put_space_waits_total",
                "Puts that found memory full and waited for evicted space to come back",
                &self.put_space_waits,
            ),
            (
                "master_promoted_objects_total",
                "Disk-only objects copied back into memory after reads (--promotion_on_hit)",
                &self.promoted_objects,
            ),
        ]
    }

    /// Render all counters plus the gauges in `g` as Prometheus text (0.0.4).
    pub fn encode(&self, g: &GaugeSnapshot) -> String {
        let mut out = String::with_capacity(4096);
        let gauges = [
            (
                "master_allocated_bytes",
                "Bytes allocated in mounted segments",
                g.allocated_bytes,
            ),
            (
                "master_total_capacity_bytes",
                "Total bytes of mounted segments",
                g.total_capacity_bytes,
            ),
            ("master_key_count", "Number of objects", g.key_count),
            (
                "master_soft_pin_key_count",
                "Number of soft-pinned objects",
                g.soft_pin_key_count,
            ),
            (
                "master_active_clients",
                "Number of live clients",
                g.active_clients,
            ),
            (
                "master_retired_versions",
                "Replaced object versions kept allocated for reads still in flight",
                g.retired_versions,
            ),
            (
                "master_retired_bytes",
                "Bytes held by replaced versions kept for reads in flight",
                g.retired_bytes,
            ),
        ];
        let ha_gauges = [
            (
                "master_ha_is_leader",
                "1 while this master serves (the HA leader, or a master without HA)",
                g.ha_is_leader,
            ),
            (
                "master_ha_epoch",
                "HA term this master serves or last served (etcd revision; 0 without HA)",
                g.ha_epoch,
            ),
        ];
        for (name, help, v) in gauges.into_iter().chain(ha_gauges) {
            let _ = write!(
                out,
                "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}\n"
            );
        }
        if !g.tenants.is_empty() {
            let per_tenant: [(&str, &str, TenantValue); 5] = [
                (
                    "mooncake_tenant_quota_requested_bytes",
                    "Quota the tenant's policy asks for",
                    |t| t.requested_quota_bytes,
                ),
                (
                    "mooncake_tenant_quota_effective_bytes",
                    "Quota in force for the tenant",
                    |t| t.effective_quota_bytes,
                ),
                (
                    "mooncake_tenant_quota_charged_bytes",
                    "Bytes of the tenant's memory replicas, completed and in flight",
                    |t| t.charged_bytes,
                ),
                (
                    "mooncake_tenant_quota_admission_closed",
                    "1 while the tenant's writes are refused (no policy)",
                    |t| u64::from(t.admission_closed),
                ),
                (
                    "mooncake_tenant_quota_over_quota",
                    "1 while the tenant is charged beyond its effective quota",
                    |t| u64::from(t.over_quota),
                ),
            ];
            for (name, help, value) in per_tenant {
                let _ = write!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n");
                for t in &g.tenants {
                    let label = t.tenant_id.replace('\\', "\\\\").replace('"', "\\\"");
                    let _ = writeln!(out, "{name}{{tenant_id=\"{label}\"}} {}", value(t));
                }
            }
        }
        let ha_counters = [
            (
                "master_ha_leader_elections_total",
                "Elections this master won",
                g.ha_elections,
            ),
            (
                "master_ha_step_downs_total",
                "Times this master stopped serving (lost its etcd lease or leadership)",
                g.ha_step_downs,
            ),
            (
                "master_ha_leader_changes_total",
                "Leader changes this master observed in etcd",
                g.ha_leader_changes,
            ),
        ];
        for (name, help, v) in ha_counters {
            let _ = write!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}\n"
            );
        }
        for (name, help, c) in self.counters() {
            let _ = write!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}\n",
                c.get()
            );
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fresh_snapshot_and_counters() {
        let m = MasterMetrics::default();
        let text = m.encode(&GaugeSnapshot::default());
        assert!(text.contains("\nmaster_key_count 0\n"));
        assert!(text.contains("# TYPE master_key_count gauge\n"));
        assert!(text.contains("# HELP master_active_clients "));
        assert!(text.contains("\nmaster_put_start_requests_total 0\n"));
        assert!(text.contains("\nmaster_evicted_key_count 0\n"));
        for (name, _, _) in m.counters() {
            assert!(text.contains(&format!("# TYPE {name} counter\n")), "{name}");
            assert!(text.contains(&format!("# HELP {name} ")), "{name}");
        }
    }

    #[test]
    fn increments_show_up() {
        let m = MasterMetrics::default();
        m.put_start_requests.inc();
        m.evicted_size_bytes.inc_by(4096);
        m.put_start_partial_allocations.inc();
        let g = GaugeSnapshot {
            allocated_bytes: 5,
            total_capacity_bytes: 64,
            key_count: 1,
            soft_pin_key_count: 0,
            active_clients: 2,
            ..Default::default()
        };
        let text = m.encode(&g);
        for line in [
            "master_put_start_requests_total 1",
            "master_put_start_failures_total 0",
            "master_put_start_partial_allocations_total 1",
            "master_evicted_size_bytes 4096",
            "master_allocated_bytes 5",
            "master_total_capacity_bytes 64",
            "master_key_count 1",
            "master_active_clients 2",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in\n{text}"
            );
        }
        assert!(text.ends_with('\n'));
    }
}
