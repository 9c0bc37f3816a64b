//! The HA election against a real etcd (Debian `etcd-server`), started by the
//! test on loopback ports. Skips (passes with a message) when `etcd` is not
//! installed; CI installs it.

use mooncake_master::ha::{HaConfig, HaError, HaRuntime, HaStatus, Terms};
use parking_lot::Mutex;
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

struct Etcd {
    child: Child,
    dir: std::path::PathBuf,
    endpoint: String,
}

impl Drop for Etcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

fn start_etcd() -> Option<Etcd> {
    let bin = ["/usr/bin/etcd", "/usr/local/bin/etcd"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists())?;
    let (cport, pport) = (free_port(), free_port());
    let base = if std::path::Path::new("/dev/shm").is_dir() {
        std::path::PathBuf::from("/dev/shm")
    } else {
        std::env::temp_dir()
    };
    let dir = base.join(format!("mc-etcd-test-{}-{cport}", std::process::id()));
    let child = Command::new(bin)
        .arg("--name=t")
        .arg(format!("--data-dir={}", dir.display()))
        .arg(format!("--listen-client-urls=http://127.0.0.1:{cport}"))
        .arg(format!("--advertise-client-urls=http://127.0.0.1:{cport}"))
        .arg(format!("--listen-peer-urls=http://127.0.0.1:{pport}"))
        .arg(format!(
            "--initial-advertise-peer-urls=http://127.0.0.1:{pport}"
        ))
        .arg(format!("--initial-cluster=t=http://127.0.0.1:{pport}"))
        .arg("--log-level=error")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let etcd = Etcd {
        child,
        dir,
        endpoint: format!("http://127.0.0.1:{cport}"),
    };
    // etcd accepts connections before it has elected itself leader, and
    // answers requests only after that: wait for `/health` to say so.
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if etcd_healthy(cport) {
            return Some(etcd);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("etcd did not become healthy within 30 s");
}

/// Whether etcd on `port` answers `GET /health` with `"health":"true"`.
fn etcd_healthy(port: u16) -> bool {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    let req = format!("GET /health HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\n\r\n");
    if s.write_all(req.as_bytes()).is_err() {
        return false;
    }
    let mut body = String::new();
    let _ = s.read_to_string(&mut body);
    body.contains("\"health\":\"true\"")
}

/// Records term starts (with the owner list they were given) and ends;
/// reports `mounted` as its segments.
#[derive(Default)]
struct Recorder {
    events: Mutex<Vec<(String, Instant)>>,
    given: Mutex<Vec<Option<Vec<String>>>>,
    mounted: Mutex<Option<Vec<String>>>,
}

impl Terms for Recorder {
    fn start_term(&self, epoch: u64, owners: Option<Vec<String>>) {
        self.events
            .lock()
            .push((format!("start {epoch}"), Instant::now()));
        self.given.lock().push(owners);
    }
    fn owners(&self) -> Option<Vec<String>> {
        self.mounted.lock().clone()
    }
    fn end_term(&self, reason: &str) {
        self.events
            .lock()
            .push((format!("end {reason}"), Instant::now()));
    }
}

/// One master's HA runtime on its own tokio runtime (dropping it = SIGKILL).
struct Node {
    rt: Option<tokio::runtime::Runtime>,
    status: Arc<HaStatus>,
    terms: Arc<Recorder>,
    stop: Option<Arc<tokio::sync::Notify>>,
}

impl Node {
    fn start(endpoint: &str, cluster: &str, addr: &str) -> Result<Node, HaError> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime");
        let status = Arc::new(HaStatus::ha(cluster));
        let cfg = HaConfig {
            endpoints: vec![endpoint.to_string()],
            cluster_id: cluster.to_string(),
            advertise: addr.to_string(),
            lease_ttl: Duration::from_secs(2),
        };
        let ha = rt.block_on(HaRuntime::connect(cfg, Arc::clone(&status)))?;
        let stop = ha.stopper();
        let terms = Arc::new(Recorder::default());
        let t: Arc<dyn Terms> = terms.clone();
        rt.spawn(ha.run(t));
        Ok(Node {
            rt: Some(rt),
            status,
            terms,
            stop: Some(stop),
        })
    }

    fn kill(&mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill();
    }
}

fn wait_for(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A real etcd and master `a` (10.0.0.1:50051) leading `cluster` on it;
/// None (after saying so) when etcd is not installed.
fn first_leader(cluster: &str) -> Option<(Etcd, Node)> {
    let Some(etcd) = start_etcd() else {
        eprintln!("SKIP: etcd not installed (apt-get install etcd-server)");
        return None;
    };
    let a = Node::start(&etcd.endpoint, cluster, "10.0.0.1:50051").expect("a");
    wait_for("a to lead", Duration::from_secs(10), || {
        a.status.may_serve()
    });
    Some((etcd, a))
}

#[test]
fn unreachable_etcd_fails_fast_with_the_reason() {
    let port = free_port(); // nothing listens there
    let t0 = Instant::now();
    let err = Node::start(&format!("http://127.0.0.1:{port}"), "c", "127.0.0.1:1")
        .err()
        .expect("must fail");
    assert!(
        t0.elapsed() < Duration::from_millis(5500),
        "{:?}",
        t0.elapsed()
    );
    let msg = err.to_string();
    assert!(matches!(err, HaError::Unreachable { .. }), "{msg}");
    assert!(msg.contains("cannot reach etcd at"), "{msg}");
}

#[test]
fn one_leader_then_failover_without_overlap() {
    let Some((etcd, mut a)) = first_leader("failover") else {
        return;
    };
    let cluster = "failover";
    let b = Node::start(&etcd.endpoint, cluster, "10.0.0.2:50051").expect("b");
    std::thread::sleep(Duration::from_millis(500));
    assert!(a.status.may_serve());
    assert!(!b.status.may_serve(), "two leaders");
    wait_for("b to see a", Duration::from_secs(5), || {
        b.status.leader_address().as_deref() == Some("10.0.0.1:50051")
    });

    // SIGKILL-like: a's runtime vanishes without resigning. a's lease clock
    // must run out before b starts serving.
    let a_status = Arc::clone(&a.status);
    a.kill();
    let killed = Instant::now();
    let mut a_stopped_at = None;
    let deadline = Instant::now() + Duration::from_secs(10);
    while !b.status.may_serve() {
        assert!(Instant::now() < deadline, "no failover");
        if a_stopped_at.is_none() && !a_status.lease.valid() {
            a_stopped_at = Some(Instant::now());
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    let b_at = Instant::now();
    let a_stopped_at = a_stopped_at.expect("the old leader's lease clock never ran out");
    assert!(
        a_stopped_at < b_at,
        "split brain: new leader before the old lease ran out"
    );
    eprintln!(
        "failover after kill: {:?} (old leader stopped after {:?})",
        b_at - killed,
        a_stopped_at - killed
    );
    assert!(b.status.epoch() > a_status.epoch());
    let ev = b.terms.events.lock().clone();
    assert_eq!(ev.len(), 1, "{ev:?}");
    assert!(ev[0].0.starts_with("start "));
}

#[test]
fn the_next_leader_is_given_the_segments_the_last_one_published() {
    let Some((etcd, mut a)) = first_leader("owners") else {
        return;
    };
    let cluster = "owners";
    // The first leader of a cluster finds an empty list.
    assert_eq!(a.terms.given.lock().clone(), vec![Some(Vec::new())]);
    *a.terms.mounted.lock() = Some(vec!["h1:1".to_string(), "h2:2".to_string()]);
    let b = Node::start(&etcd.endpoint, cluster, "10.0.0.2:50051").expect("b");
    // Published within a few publication periods.
    std::thread::sleep(Duration::from_millis(600));
    a.kill();
    wait_for("b to lead", Duration::from_secs(10), || {
        b.status.may_serve()
    });
    assert_eq!(
        b.terms.given.lock().clone(),
        vec![Some(vec!["h1:1".to_string(), "h2:2".to_string()])]
    );
}

#[test]
fn resign_hands_over_at_once_and_duplicates_are_refused() {
    let Some(etcd) = start_etcd() else {
        eprintln!("SKIP: etcd not installed (apt-get install etcd-server)");
        return;
    };
    let cluster = "resign";
    let a = Node::start(&etcd.endpoint, cluster, "10.0.0.1:50051").expect("a");
    wait_for("a to lead", Duration::from_secs(10), || {
        a.status.may_serve()
    });
    let b = Node::start(&etcd.endpoint, cluster, "10.0.0.2:50051").expect("b");

    // Same address as a, while a lives: refused with the reason.
    let t0 = Instant::now();
    let dup = Node::start(&etcd.endpoint, cluster, "10.0.0.1:50051")
        .err()
        .expect("duplicate address accepted");
    assert!(matches!(dup, HaError::DuplicateAddress { .. }), "{dup}");
    assert!(dup.to_string().contains("10.0.0.1:50051"));
    assert!(t0.elapsed() < Duration::from_secs(6));
    // Another cluster may reuse the address.
    let other = Node::start(&etcd.endpoint, "other-cluster", "10.0.0.1:50051").expect("other");
    wait_for("other cluster leader", Duration::from_secs(10), || {
        other.status.may_serve()
    });

    // A graceful stop resigns: b leads well before a lease TTL would pass.
    if let Some(s) = &a.stop {
        s.notify_one();
    }
    let t0 = Instant::now();
    wait_for("b to lead", Duration::from_secs(10), || {
        b.status.may_serve()
    });
    eprintln!("handover after resign: {:?}", t0.elapsed());
    wait_for("a to stop", Duration::from_secs(5), || {
        !a.status.may_serve()
    });
    let ev = a.terms.events.lock().clone();
    assert_eq!(ev.len(), 2, "{ev:?}");
    assert!(ev[1].0.starts_with("end "));
}
