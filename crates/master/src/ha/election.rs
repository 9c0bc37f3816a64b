//! The leader election of HA masters on etcd: one etcd lease per term, the
//! etcd v3 election service (`Campaign`/`Observe`/`Resign`) to pick one
//! leader among the masters of a cluster, and lease keep-alives that decide
//! how long the leader may keep serving.
//!
//! Safety rule (no split brain): a leader serves only until `t + ttl -
//! margin`, where `t` is when it *sent* the last keep-alive etcd confirmed.
//! etcd cannot expire that lease before `t + ttl`, and another master wins
//! only after the lease expired (its campaign key is deleted with it), so the
//! old leader has stopped accepting writes before a new one starts. When the
//! lease is known lost (a keep-alive answers TTL 0, or the confirmation is
//! older than the TTL) the leader steps down: its term ends, its state is
//! dropped, and it campaigns again with a fresh lease.

use super::status::{HaStatus, Role};
use super::HaConfig;
use etcd_client::{Client, Compare, CompareOp, ConnectOptions, GetOptions, PutOptions, Txn, TxnOp};
use mooncake_common::ha::{election_name, member_key, owners_key};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Notify;

/// Everything that can stop an HA master from starting, with its reason.
#[derive(Debug, thiserror::Error)]
pub enum HaError {
    /// etcd did not answer within the startup timeout.
    #[error("cannot reach etcd at {endpoints} within {secs} s: {reason}")]
    Unreachable {
        /// The endpoints tried.
        endpoints: String,
        /// The timeout.
        secs: u64,
        /// What failed.
        reason: String,
    },
    /// Another master of the cluster advertises the same RPC address.
    #[error(
        "another master is registered with rpc address {addr} in cluster '{cluster}' \
         (etcd key {key}); give each master its own --rpc_address/--rpc_port"
    )]
    DuplicateAddress {
        /// The address.
        addr: String,
        /// The cluster id.
        cluster: String,
        /// The etcd key that holds it.
        key: String,
    },
    /// An etcd request failed.
    #[error("etcd request failed: {0}")]
    Etcd(String),
}

/// What the master does when a term starts or ends.
pub trait Terms: Send + Sync {
    /// This process was elected for term `epoch`: start serving with fresh
    /// state. `owners`: the segments the previous leader last published as
    /// mounted (None when they could not be read).
    fn start_term(&self, epoch: u64, owners: Option<Vec<String>>);
    /// The term ended (`reason` is logged): stop serving and drop the state.
    fn end_term(&self, reason: &str);
    /// The segments this term has mounted, to publish for the next leader;
    /// None while there is nothing new to publish.
    fn owners(&self) -> Option<Vec<String>> {
        None
    }
}

/// Startup timeout for reaching etcd: an unreachable etcd is a clear error
/// within this time, not a hang.
pub const STARTUP_TIMEOUT: Duration = Duration::from_secs(5);
/// Timeout of one ordinary etcd request after startup.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

async fn timed<T, F>(what: &str, d: Duration, f: F) -> Result<T, String>
where
    F: std::future::Future<Output = Result<T, etcd_client::Error>>,
{
    match tokio::time::timeout(d, f).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(format!("{what}: {e}")),
        Err(_) => Err(format!("{what}: no answer within {} ms", d.as_millis())),
    }
}

/// A connected HA runtime, before its election loop runs.
pub struct HaRuntime {
    cfg: HaConfig,
    client: Client,
    status: Arc<HaStatus>,
    lease_id: i64,
    stop: Arc<Notify>,
}

impl HaRuntime {
    /// Connect to etcd, take a lease and register this master's address.
    /// Fails within [`STARTUP_TIMEOUT`] when etcd is unreachable, and when
    /// another live master of the cluster has the same RPC address (after
    /// waiting out the lease of a predecessor that died at that address).
    pub async fn connect(cfg: HaConfig, status: Arc<HaStatus>) -> Result<HaRuntime, HaError> {
        let eps = cfg.endpoints.join(";");
        let unreachable = |reason: String| HaError::Unreachable {
            endpoints: eps.clone(),
            secs: STARTUP_TIMEOUT.as_secs(),
            reason,
        };
        let started = Instant::now();
        let opts = ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(1))
            .with_keep_alive(Duration::from_millis(500), Duration::from_secs(1));
        let client = timed(
            "connect",
            STARTUP_TIMEOUT,
            Client::connect(cfg.endpoints.clone(), Some(opts)),
        )
        .await
        .map_err(unreachable)?;
        let left = STARTUP_TIMEOUT.saturating_sub(started.elapsed());
        let mut c = client.clone();
        let lease_id = timed(
            "lease grant",
            left,
            c.lease_grant(cfg.lease_ttl_secs(), None),
        )
        .await
        .map_err(unreachable)?
        .id();
        let rt = HaRuntime {
            cfg,
            client,
            status,
            lease_id,
            stop: Arc::new(Notify::new()),
        };
        rt.register_member().await?;
        Ok(rt)
    }

    /// Put `members/<addr>` under our lease unless someone else holds it.
    async fn register_member(&self) -> Result<(), HaError> {
        let key = member_key(&self.cfg.cluster_id, &self.cfg.advertise);
        // A master that died at this address leaves its key until its lease
        // expires: wait that long before calling it a duplicate.
        let deadline = Instant::now() + self.cfg.lease_ttl + Duration::from_secs(1);
        loop {
            let txn = Txn::new()
                .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
                .and_then([TxnOp::put(
                    key.clone(),
                    self.cfg.advertise.clone(),
                    Some(PutOptions::new().with_lease(self.lease_id)),
                )])
                .or_else([TxnOp::get(key.clone(), None)]);
            let mut c = self.client.clone();
            let resp = tokio::time::timeout(REQUEST_TIMEOUT, c.txn(txn))
                .await
                .map_err(|_| HaError::Unreachable {
                    endpoints: self.cfg.endpoints.join(";"),
                    secs: REQUEST_TIMEOUT.as_secs(),
                    reason: "member registration: no answer".into(),
                })?
                .map_err(|e| HaError::Etcd(e.to_string()))?;
            if resp.succeeded() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(HaError::DuplicateAddress {
                    addr: self.cfg.advertise.clone(),
                    cluster: self.cfg.cluster_id.clone(),
                    key,
                });
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// A handle that makes [`HaRuntime::run`] resign and return.
    pub fn stopper(&self) -> Arc<Notify> {
        Arc::clone(&self.stop)
    }

    /// Run the election loop until stopped: campaign, serve while the lease
    /// holds, step down when it does not, campaign again.
    pub async fn run(mut self, terms: Arc<dyn Terms>) {
        tokio::spawn(observe_loop(
            self.client.clone(),
            election_name(&self.cfg.cluster_id),
            Arc::clone(&self.status),
        ));
        loop {
            let keeper = tokio::spawn(keep_alive_loop(
                self.client.clone(),
                self.lease_id,
                self.cfg.lease_ttl,
                Arc::clone(&self.status),
            ));
            let outcome = self.one_term(&terms).await;
            keeper.abort();
            self.status.lease.invalidate();
            // Best effort: revoking deletes our campaign and member keys so a
            // standby can win at once instead of after the TTL.
            let mut c = self.client.clone();
            let _ =
                tokio::time::timeout(Duration::from_secs(1), c.lease_revoke(self.lease_id)).await;
            if outcome == TermOutcome::Stopped {
                return;
            }
            self.renew_lease().await;
        }
    }

    /// Campaign once and serve the term if elected.
    async fn one_term(&self, terms: &Arc<dyn Terms>) -> TermOutcome {
        let name = election_name(&self.cfg.cluster_id);
        let mut c = self.client.clone();
        let won = tokio::select! {
            r = c.campaign(name.clone(), self.cfg.advertise.clone(), self.lease_id) => r,
            _ = self.stop.notified() => return TermOutcome::Stopped,
            _ = wait_lease_lost(&self.status, self.cfg.lease_ttl) => return TermOutcome::Lost,
        };
        let leader = match won {
            Ok(mut r) => r.take_leader(),
            Err(e) => {
                tracing::warn!(error = %e, "etcd campaign failed; retrying");
                tokio::time::sleep(Duration::from_millis(500)).await;
                return TermOutcome::Lost;
            }
        };
        let Some(leader) = leader else {
            return TermOutcome::Lost;
        };
        // The lease must be confirmed alive before the first request is served.
        let confirm_deadline = Instant::now() + self.cfg.lease_ttl;
        while !self.status.lease.valid() {
            if Instant::now() >= confirm_deadline {
                return TermOutcome::Lost;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // Read after winning: the old leader's key is gone, so its list is
        // final (its publisher writes only while that key stands).
        let key = owners_key(&self.cfg.cluster_id);
        let owners = read_owners(&self.client, &key).await;
        let epoch = leader.rev().max(1) as u64;
        self.status.become_leader(epoch);
        self.status.observe_leader(Some((
            self.cfg.advertise.clone(),
            leader.rev().max(0) as u64,
        )));
        terms.start_term(epoch, owners.clone());
        tracing::warn!(
            epoch,
            address = %self.cfg.advertise,
            cluster = %self.cfg.cluster_id,
            owners = owners.as_ref().map_or(-1, |o| o.len() as i64),
            "elected leader; serving"
        );
        let publisher = tokio::spawn(publish_owners(
            self.client.clone(),
            key,
            leader.key().to_vec(),
            leader.rev(),
            Arc::clone(terms),
            owners,
        ));
        let reason = tokio::select! {
            _ = self.stop.notified() => None,
            r = wait_lease_lost(&self.status, self.cfg.lease_ttl) => Some(r),
            r = wait_leader_replaced(&self.status, epoch) => Some(r),
        };
        publisher.abort();
        self.status.become_standby();
        let why = reason.unwrap_or("shutting down");
        terms.end_term(why);
        tracing::warn!(epoch, reason = why, "stepped down; now standby");
        if reason.is_none() {
            let mut c = self.client.clone();
            let _ = tokio::time::timeout(
                Duration::from_secs(1),
                c.resign(Some(etcd_client::ResignOptions::new().with_leader(leader))),
            )
            .await;
            return TermOutcome::Stopped;
        }
        TermOutcome::Lost
    }

    /// Take a new lease (retrying until etcd answers) and re-register.
    async fn renew_lease(&mut self) {
        loop {
            let mut c = self.client.clone();
            match tokio::time::timeout(
                REQUEST_TIMEOUT,
                c.lease_grant(self.cfg.lease_ttl_secs(), None),
            )
            .await
            {
                Ok(Ok(r)) => {
                    self.lease_id = r.id();
                    match self.register_member().await {
                        Ok(()) => return,
                        Err(e) => tracing::warn!(error = %e, "re-registering this master failed"),
                    }
                }
                Ok(Err(e)) => tracing::warn!(error = %e, "etcd lease grant failed; retrying"),
                Err(_) => tracing::warn!("etcd lease grant timed out; retrying"),
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TermOutcome {
    /// The runtime was asked to stop.
    Stopped,
    /// Leadership or the lease was lost; campaign again.
    Lost,
}

/// Resolves when the lease is known lost: invalid for longer than the TTL
/// (etcd has expired it by then) or explicitly dead (invalidated with a
/// zero TTL by the keep-alive loop).
async fn wait_lease_lost(status: &HaStatus, ttl: Duration) -> &'static str {
    let mut invalid_since: Option<Instant> = None;
    loop {
        tokio::time::sleep(Duration::from_millis(20)).await;
        if status.lease.valid() {
            invalid_since = None;
            continue;
        }
        let since = *invalid_since.get_or_insert_with(Instant::now);
        if status.lease_dead() || since.elapsed() >= ttl {
            return "etcd lease lost (etcd unreachable or the lease expired)";
        }
    }
}

/// Resolves when etcd shows a leader elected after term `epoch`.
async fn wait_leader_replaced(status: &HaStatus, epoch: u64) -> &'static str {
    loop {
        tokio::time::sleep(Duration::from_millis(50)).await;
        if status.leader_rev() > epoch {
            return "etcd shows another leader";
        }
    }
}

/// The segment names the previous leader published under `key` (an
/// absent key: none), or None when etcd did not answer or the value is not
/// a JSON array of strings.
async fn read_owners(client: &Client, key: &str) -> Option<Vec<String>> {
    let mut c = client.clone();
    let resp = match timed("read owners", REQUEST_TIMEOUT, c.get(key, None)).await {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!(error = %e, "the previous leader's segment list is unreadable; holding for the quiet window");
            return None;
        }
    };
    let Some(kv) = resp.kvs().first() else {
        return Some(Vec::new());
    };
    match serde_json::from_slice::<Vec<String>>(kv.value()) {
        Ok(v) => Some(v),
        Err(e) => {
            tracing::warn!(error = %e, key, "the previous leader's segment list is malformed; holding for the quiet window");
            None
        }
    }
}

/// How long a published segment list outlives its last refresh: a list
/// left by a cluster that was down longer than this names owners that will
/// not come back, and a first leader after such an outage should not wait
/// for them.
const OWNERS_TTL_SECS: i64 = 30;

/// Publish the term's segment list under `key` whenever it changed, and
/// again every third of [`OWNERS_TTL_SECS`] under a fresh etcd lease of
/// that TTL, while this master's election key (`leader_key`, created at
/// `leader_rev`) still stands: a deposed leader cannot overwrite its
/// successor's list. While the term still holds for the previous owners
/// (`owners()` is None) their list is refreshed as it was read.
async fn publish_owners(
    client: Client,
    key: String,
    leader_key: Vec<u8>,
    leader_rev: i64,
    terms: Arc<dyn Terms>,
    mut published: Option<Vec<String>>,
) {
    let refresh = Duration::from_secs(OWNERS_TTL_SECS as u64 / 3);
    let mut refreshed = Instant::now();
    loop {
        tokio::time::sleep(crate::takeover::PUBLISH_EVERY).await;
        let now = terms.owners().or_else(|| published.clone());
        let Some(now) = now else { continue };
        if published.as_ref() == Some(&now) && refreshed.elapsed() < refresh {
            continue;
        }
        let Ok(value) = serde_json::to_vec(&now) else {
            continue;
        };
        let mut c = client.clone();
        let lease = match timed(
            "owners lease",
            REQUEST_TIMEOUT,
            c.lease_grant(OWNERS_TTL_SECS, None),
        )
        .await
        {
            Ok(l) => l.id(),
            Err(e) => {
                tracing::debug!(error = %e, "publishing the segment list failed; retrying");
                continue;
            }
        };
        let txn = Txn::new()
            .when([Compare::create_revision(
                leader_key.clone(),
                CompareOp::Equal,
                leader_rev,
            )])
            .and_then([TxnOp::put(
                key.clone(),
                value,
                Some(PutOptions::new().with_lease(lease)),
            )]);
        match timed("publish owners", REQUEST_TIMEOUT, c.txn(txn)).await {
            Ok(r) if r.succeeded() => {
                published = Some(now);
                refreshed = Instant::now();
            }
            Ok(_) => return,
            Err(e) => tracing::debug!(error = %e, "publishing the segment list failed; retrying"),
        }
    }
}

/// `(value, create revision)` of an election key-value.
fn leader_of(kv: Option<&etcd_client::KeyValue>) -> Option<(String, u64)> {
    let kv = kv?;
    let v = kv.value_str().ok()?.to_string();
    Some((v, kv.create_revision().max(0) as u64))
}

/// Keep the lease alive; each confirmation extends the lease clock.
async fn keep_alive_loop(client: Client, lease_id: i64, ttl: Duration, status: Arc<HaStatus>) {
    let interval = ttl / 4;
    let margin = ttl / 4;
    status.set_lease_dead(false);
    loop {
        let mut c = client.clone();
        let (mut keeper, mut stream) =
            match tokio::time::timeout(REQUEST_TIMEOUT, c.lease_keep_alive(lease_id)).await {
                Ok(Ok(ks)) => ks,
                _ => {
                    tokio::time::sleep(interval).await;
                    continue;
                }
            };
        loop {
            let sent = Instant::now();
            if keeper.keep_alive().await.is_err() {
                break;
            }
            match tokio::time::timeout(ttl, stream.message()).await {
                Ok(Ok(Some(resp))) if resp.ttl() > 0 => {
                    status
                        .lease
                        .confirm(sent, Duration::from_secs(resp.ttl() as u64), margin);
                }
                Ok(Ok(Some(_))) => {
                    // TTL 0: etcd says the lease no longer exists.
                    status.lease.invalidate();
                    status.set_lease_dead(true);
                    return;
                }
                _ => break,
            }
            tokio::time::sleep(interval.saturating_sub(sent.elapsed())).await;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Follow the election's leader for `/health` and the leader-change metric.
async fn observe_loop(client: Client, name: String, status: Arc<HaStatus>) {
    loop {
        let mut c = client.clone();
        if let Ok(Ok(r)) = tokio::time::timeout(REQUEST_TIMEOUT, c.leader(name.clone())).await {
            status.observe_leader(leader_of(r.kv()));
        }
        let mut c = client.clone();
        match c.observe(name.clone()).await {
            Ok(mut stream) => {
                while let Ok(Some(r)) = stream.message().await {
                    status.observe_leader(leader_of(r.kv()));
                }
            }
            Err(e) => tracing::debug!(error = %e, "etcd observe failed"),
        }
        if status.role() != Role::Leader {
            status.observe_leader(None);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The current leader's address for `cluster_id`, if any (used by tools and tests).
pub async fn current_leader(client: &Client, cluster_id: &str) -> Option<String> {
    let mut c = client.clone();
    let r = c
        .get(
            election_name(cluster_id),
            Some(GetOptions::new().with_prefix()),
        )
        .await
        .ok()?;
    r.kvs()
        .iter()
        .min_by_key(|kv| kv.create_revision())
        .and_then(|kv| kv.value_str().ok().map(str::to_string))
}
