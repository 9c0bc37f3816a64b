//! Finding the master: a fixed `host:port`, or the leader of an HA cluster
//! named by `etcd://h1:2379;h2:2379` (upstream's form), which is followed
//! across failovers without the application doing anything.
//!
//! For etcd, a background thread (with its own small tokio runtime, since the
//! client is otherwise blocking) reads the election's leader value and then
//! observes it; every change is published to the listeners (the master
//! connection pool, which drops connections to the old leader, and the
//! heartbeat, which remounts on the new one at once).

use mooncake_common::ha::{election_name, parse_master_addr, HaAddrError, MasterAddr};
use parking_lot::{Condvar, Mutex};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Why no master address could be found.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum DiscoveryError {
    /// `master_server_addr` is malformed or names an unsupported backend.
    #[error(transparent)]
    BadAddress(#[from] HaAddrError),
    /// etcd did not answer.
    #[error("cannot reach etcd at {endpoints}: {reason}")]
    EtcdUnreachable {
        /// The endpoints tried.
        endpoints: String,
        /// The last error.
        reason: String,
    },
    /// etcd answered, but no master of the cluster is registered as leader.
    #[error(
        "no master is registered in etcd at {endpoints} for cluster '{cluster}' (election {name})"
    )]
    NoLeader {
        /// The endpoints.
        endpoints: String,
        /// The cluster id followed.
        cluster: String,
        /// The election name looked up.
        name: String,
    },
}

type Listener = Box<dyn Fn(&str) + Send + Sync>;

/// What the watcher knows.
#[derive(Default)]
struct Known {
    leader: Option<String>,
    /// etcd answered at least once since the watcher started.
    reached: bool,
    last_error: Option<String>,
}

/// Where the master is; cheap to query on every RPC.
pub(crate) struct MasterLocator {
    direct: Option<String>,
    known: Mutex<Known>,
    changed: Condvar,
    listeners: Mutex<Vec<Listener>>,
    stop: Arc<AtomicBool>,
    endpoints: String,
    cluster: String,
}

impl MasterLocator {
    /// Parse `master_server_addr` and, for `etcd://`, start following the
    /// leader of `cluster_id`.
    pub(crate) fn start(
        addr: &str,
        cluster_id: &str,
    ) -> Result<Arc<MasterLocator>, DiscoveryError> {
        match parse_master_addr(addr)? {
            MasterAddr::Direct(a) => Ok(Arc::new(MasterLocator {
                direct: Some(a.clone()),
                known: Mutex::new(Known {
                    leader: Some(a),
                    reached: true,
                    last_error: None,
                }),
                changed: Condvar::new(),
                listeners: Mutex::new(Vec::new()),
                stop: Arc::new(AtomicBool::new(false)),
                endpoints: String::new(),
                cluster: String::new(),
            })),
            MasterAddr::Etcd(endpoints) => {
                let loc = Arc::new(MasterLocator {
                    direct: None,
                    known: Mutex::new(Known::default()),
                    changed: Condvar::new(),
                    listeners: Mutex::new(Vec::new()),
                    stop: Arc::new(AtomicBool::new(false)),
                    endpoints: endpoints.join(";"),
                    cluster: cluster_id.to_string(),
                });
                let weak = Arc::downgrade(&loc);
                let stop = Arc::clone(&loc.stop);
                let name = election_name(cluster_id);
                std::thread::Builder::new()
                    .name("mc-etcd-watch".into())
                    .spawn(move || watch_thread(endpoints, name, weak, stop))
                    .map_err(|e| DiscoveryError::EtcdUnreachable {
                        endpoints: String::new(),
                        reason: format!("cannot start the watcher thread: {e}"),
                    })?;
                Ok(loc)
            }
        }
    }

    /// Whether the address is discovered through etcd.
    pub(crate) fn is_ha(&self) -> bool {
        self.direct.is_none()
    }

    /// The master to talk to now, if known.
    pub(crate) fn current(&self) -> Option<String> {
        self.known.lock().leader.clone()
    }

    /// Wait up to `timeout` for a leader; the error says whether etcd was
    /// unreachable or had no master registered.
    pub(crate) fn wait_leader(&self, timeout: Duration) -> Result<String, DiscoveryError> {
        let deadline = Instant::now() + timeout;
        let mut g = self.known.lock();
        loop {
            if let Some(l) = &g.leader {
                return Ok(l.clone());
            }
            if self.changed.wait_until(&mut g, deadline).timed_out() {
                break;
            }
        }
        if let Some(l) = &g.leader {
            return Ok(l.clone());
        }
        if g.reached {
            Err(DiscoveryError::NoLeader {
                endpoints: self.endpoints.clone(),
                cluster: self.cluster.clone(),
                name: election_name(&self.cluster),
            })
        } else {
            Err(DiscoveryError::EtcdUnreachable {
                endpoints: self.endpoints.clone(),
                reason: g
                    .last_error
                    .clone()
                    .unwrap_or_else(|| format!("no answer within {} ms", timeout.as_millis())),
            })
        }
    }

    /// Call `f` with the new leader's address on every change.
    pub(crate) fn on_change(&self, f: impl Fn(&str) + Send + Sync + 'static) {
        self.listeners.lock().push(Box::new(f));
    }

    fn publish(&self, leader: Option<String>, error: Option<String>) {
        let changed_to = {
            let mut g = self.known.lock();
            if error.is_none() {
                g.reached = true;
            }
            if error.is_some() {
                g.last_error = error;
            }
            if leader.is_some() && g.leader != leader {
                g.leader = leader.clone();
                leader
            } else {
                None
            }
        };
        self.changed.notify_all();
        if let Some(l) = changed_to {
            tracing::warn!(leader = %l, "master leader changed (etcd)");
            for f in self.listeners.lock().iter() {
                f(&l);
            }
        }
    }
}

impl Drop for MasterLocator {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
    }
}

fn leader_value(kv: Option<&etcd_client::KeyValue>) -> Option<String> {
    kv.and_then(|kv| kv.value_str().ok()).map(str::to_string)
}

/// Follow the election until the locator is dropped.
fn watch_thread(
    endpoints: Vec<String>,
    name: String,
    loc: std::sync::Weak<MasterLocator>,
    stop: Arc<AtomicBool>,
) {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            if let Some(l) = loc.upgrade() {
                l.publish(None, Some(format!("cannot start a tokio runtime: {e}")));
            }
            return;
        }
    };
    rt.block_on(async move {
        let step = Duration::from_millis(200);
        while !stop.load(Ordering::Acquire) {
            let opts = etcd_client::ConnectOptions::new()
                .with_connect_timeout(Duration::from_secs(1))
                .with_keep_alive(Duration::from_millis(500), Duration::from_secs(1));
            let client = match tokio::time::timeout(
                Duration::from_secs(2),
                etcd_client::Client::connect(endpoints.clone(), Some(opts)),
            )
            .await
            {
                Ok(Ok(c)) => c,
                Ok(Err(e)) => {
                    report(&loc, None, Some(e.to_string()));
                    tokio::time::sleep(step).await;
                    continue;
                }
                Err(_) => {
                    report(&loc, None, Some("connect timed out".into()));
                    continue;
                }
            };
            let mut c = client.clone();
            match tokio::time::timeout(Duration::from_secs(2), c.leader(name.clone())).await {
                Ok(Ok(r)) => report(&loc, leader_value(r.kv()), None),
                // "election: no leader" is an answer: etcd is reachable.
                Ok(Err(etcd_client::Error::GRpcStatus(s))) if s.message().contains("no leader") => {
                    report(&loc, None, None)
                }
                Ok(Err(e)) => report(&loc, None, Some(e.to_string())),
                Err(_) => report(&loc, None, Some("leader lookup timed out".into())),
            }
            let mut c = client.clone();
            if let Ok(Ok(mut stream)) =
                tokio::time::timeout(Duration::from_secs(2), c.observe(name.clone())).await
            {
                loop {
                    if stop.load(Ordering::Acquire) || loc.strong_count() == 0 {
                        return;
                    }
                    match tokio::time::timeout(step * 5, stream.message()).await {
                        Ok(Ok(Some(r))) => report(&loc, leader_value(r.kv()), None),
                        Ok(_) => break,
                        Err(_) => continue,
                    }
                }
            }
            tokio::time::sleep(step).await;
        }
    });
}

fn report(loc: &std::sync::Weak<MasterLocator>, leader: Option<String>, err: Option<String>) {
    if let Some(l) = loc.upgrade() {
        l.publish(leader, err);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn direct_addresses_need_no_etcd() {
        let l = MasterLocator::start("127.0.0.1:50051", "c").unwrap();
        assert!(!l.is_ha());
        assert_eq!(l.wait_leader(Duration::ZERO).unwrap(), "127.0.0.1:50051");
    }

    #[test]
    fn bad_addresses_say_why() {
        assert!(matches!(
            MasterLocator::start("redis://r:1", "c"),
            Err(DiscoveryError::BadAddress(HaAddrError::UnsupportedBackend(
                ..
            )))
        ));
        assert!(matches!(
            MasterLocator::start("etcd://", "c"),
            Err(DiscoveryError::BadAddress(HaAddrError::Empty(_)))
        ));
    }

    #[test]
    fn unreachable_etcd_is_reported_as_such() {
        // Port 1 on loopback refuses connections.
        let l = MasterLocator::start("etcd://127.0.0.1:1", "c").unwrap();
        let t0 = Instant::now();
        let e = l.wait_leader(Duration::from_millis(1500)).unwrap_err();
        assert!(t0.elapsed() < Duration::from_secs(5));
        assert!(matches!(e, DiscoveryError::EtcdUnreachable { .. }), "{e}");
    }
}
