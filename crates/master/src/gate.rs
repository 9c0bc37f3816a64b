//! Which metadata state serves client RPCs, if any. Without HA there is one
//! term for the life of the process. With HA each election won starts a term
//! with a fresh [`MasterState`] (rebuilt from the clients' reports), and the
//! term ends when leadership is lost: its state stops and is dropped, and
//! the RPC server answers UNAVAILABLE_IN_CURRENT_STATUS until the next win.
//! The admin server reads the serving state (or an empty view) and the HA
//! status through the gate.

use crate::admin::{AdminView, GaugeSnapshot, ReplicaView, HEALTH_BODY};
use crate::config::MasterConfig;
use crate::ha::{HaStatus, Role, Terms};
use crate::state::MasterState;
use mooncake_common::ErrorCode;
use parking_lot::RwLock;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// A serving term: its number and its state.
#[derive(Clone)]
pub struct Term {
    /// Term number (0 without HA).
    pub epoch: u64,
    /// The metadata of this term.
    pub state: Arc<MasterState>,
}

type Factory = Box<dyn Fn() -> Arc<MasterState> + Send + Sync>;

/// The serving term and the HA status.
pub struct Gate {
    status: Arc<HaStatus>,
    cfg: MasterConfig,
    term: RwLock<Option<Term>>,
    make: Factory,
    /// The takeover hold's quiet window (see `takeover`).
    takeover_quiet: std::time::Duration,
}

impl Gate {
    /// A gate that builds each term's state with `make` (from `cfg`).
    pub fn new(
        status: Arc<HaStatus>,
        cfg: MasterConfig,
        make: impl Fn() -> Arc<MasterState> + Send + Sync + 'static,
    ) -> Arc<Gate> {
        Arc::new(Gate {
            status,
            cfg,
            term: RwLock::new(None),
            make: Box::new(make),
            takeover_quiet: crate::takeover::quiet_from_env(),
        })
    }

    /// A gate serving `state` for good (no HA).
    pub fn single(state: Arc<MasterState>) -> Arc<Gate> {
        let gate = Gate::new(Arc::new(HaStatus::single()), state.config().clone(), {
            let st = Arc::clone(&state);
            move || Arc::clone(&st)
        });
        *gate.term.write() = Some(Term { epoch: 0, state });
        gate
    }

    /// The term that may serve a request now: none while standby, and none
    /// once the leader's lease clock ran out (even before the term ends).
    pub fn serving(&self) -> Option<Term> {
        if !self.status.may_serve() {
            return None;
        }
        self.term.read().clone()
    }

    /// The HA status.
    pub fn status(&self) -> &Arc<HaStatus> {
        &self.status
    }

    /// The master's configuration (the same for every term).
    pub fn config(&self) -> &MasterConfig {
        &self.cfg
    }

    fn state(&self) -> Option<Arc<MasterState>> {
        self.term.read().as_ref().map(|t| Arc::clone(&t.state))
    }
}

impl Terms for Gate {
    fn start_term(&self, epoch: u64, owners: Option<Vec<String>>) {
        let state = (self.make)();
        state.hold_after_takeover(self.takeover_quiet, owners);
        state.start_background();
        let old = self.term.write().replace(Term { epoch, state });
        if let Some(t) = old {
            t.state.stop();
        }
    }

    fn end_term(&self, reason: &str) {
        if let Some(t) = self.term.write().take() {
            tracing::warn!(epoch = t.epoch, reason, "term ended; metadata dropped");
            t.state.stop();
        }
    }

    fn owners(&self) -> Option<Vec<String>> {
        let state = self.state()?;
        // While the term holds for the previous owners, their list stands.
        if !state.takeover_over() {
            return None;
        }
        let mut names = state.all_segments();
        names.sort();
        Some(names)
    }
}

impl AdminView for Gate {
    fn tenant_quotas(
        &self,
        only: Option<&str>,
    ) -> Result<Vec<crate::tenants::TenantQuota>, crate::tenants::QuotaAdminError> {
        match self.serving() {
            Some(t) => t.state.tenant_quotas(only),
            None => Err(crate::tenants::QuotaAdminError::Standby),
        }
    }

    fn upsert_tenant_quota(
        &self,
        tenant: &str,
        bytes: u64,
    ) -> Result<crate::tenants::TenantQuota, crate::tenants::QuotaAdminError> {
        match self.serving() {
            Some(t) => t.state.upsert_tenant_quota(tenant, bytes),
            None => Err(crate::tenants::QuotaAdminError::Standby),
        }
    }

    fn delete_tenant_quota(
        &self,
        tenant: &str,
    ) -> Result<crate::tenants::TenantQuota, crate::tenants::QuotaAdminError> {
        match self.serving() {
            Some(t) => t.state.delete_tenant_quota(tenant),
            None => Err(crate::tenants::QuotaAdminError::Standby),
        }
    }

    fn query_key(&self, key: &str) -> Result<Vec<ReplicaView>, ErrorCode> {
        match self.serving() {
            Some(t) => t.state.query_key(key),
            None => Err(ErrorCode::UnavailableInCurrentStatus),
        }
    }

    fn all_keys(&self) -> Vec<String> {
        self.state().map(|s| s.all_keys()).unwrap_or_default()
    }

    fn all_segments(&self) -> Vec<String> {
        self.state().map(|s| s.all_segments()).unwrap_or_default()
    }

    fn gauges(&self) -> GaugeSnapshot {
        let mut g = self.state().map(|s| s.gauges()).unwrap_or_default();
        let st = &self.status;
        g.ha_is_leader = u64::from(st.may_serve());
        g.ha_epoch = st.epoch();
        g.ha_elections = st.elections_won.load(Ordering::Relaxed);
        g.ha_step_downs = st.step_downs.load(Ordering::Relaxed);
        g.ha_leader_changes = st.leader_changes.load(Ordering::Relaxed);
        g
    }

    fn health(&self) -> String {
        let st = &self.status;
        if !st.enabled() {
            return HEALTH_BODY.to_string();
        }
        let leader = st.role() == Role::Leader;
        let serving = st.may_serve();
        serde_json::json!({
            "status": "ok",
            "role": if leader { "leader" } else { "standby" },
            "ha_state": if serving { "serving" } else if leader { "leader_warmup" } else { "standby" },
            "service_ready": serving,
            "leader_address": st.leader_address(),
            "view_version": match st.leader_rev() {
                0 => None,
                v => Some(v),
            },
            "cluster_id": st.cluster_id(),
            "serving_since_ms": st.serving_since_ms(),
            "last_write_ms": st.last_write_ms(),
        })
        .to_string()
    }
}
