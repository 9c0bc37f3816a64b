//! End-to-end tests of the `mooncake_master` binary: flag errors, startup,
//! the metadata and admin HTTP servers, the config log line and SIGTERM.

use std::io::{BufRead, BufReader};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_mooncake_master");

fn run(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .env_remove("MC_LOG_LEVEL")
        .output()
        .expect("run mooncake_master")
}

/// What a run that must fail with status 1 said on stderr.
fn failure_message(o: &Output) -> String {
    assert_eq!(o.status.code(), Some(1));
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

/// Kills the child when dropped (test failure included).
struct Guard(Option<Child>);

impl Drop for Guard {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

struct Reply {
    status: u16,
    headers: String,
    body: String,
}

/// One HTTP request (over `ureq`); header names and values lower-cased,
/// one `name: value` per line.
fn http(port: u16, method: &str, path: &str, body: &str) -> Reply {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(10)))
        .build()
        .into();
    let url = format!("http://127.0.0.1:{port}{path}");
    let resp = match method {
        "GET" => agent.get(&url).call(),
        "DELETE" => agent.delete(&url).call(),
        "PUT" => agent.put(&url).send(body),
        other => panic!("unsupported method {other}"),
    }
    .expect("HTTP request");
    let status = resp.status().as_u16();
    let headers = resp
        .headers()
        .iter()
        .map(|(k, v)| format!("{}: {}", k.as_str(), v.to_str().unwrap_or("")))
        .collect::<Vec<_>>()
        .join("\n")
        .to_ascii_lowercase();
    let body = resp.into_body().read_to_string().expect("response body");
    Reply {
        status,
        headers,
        body,
    }
}

fn wait_tcp(port: u16, deadline: Instant) {
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "port {port} never accepted");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn unknown_flag_fails() {
    let err = failure_message(&run(&["--bogus=1"]));
    assert!(err.contains("unknown command line flag 'bogus'"), "{err}");
}

#[test]
fn bad_int_fails() {
    let err = failure_message(&run(&["--rpc_port=abc"]));
    assert!(
        err.contains("ERROR: illegal value 'abc' specified for int32 flag 'rpc_port'"),
        "{err}"
    );
    assert!(failure_message(&run(&["--default_kv_lease_ttl=abc"]))
        .contains("failed validation of new value 'abc' for flag 'default_kv_lease_ttl'"));
}

#[test]
fn fromenv_reads_flags_env() {
    let o = Command::new(BIN)
        .args(["--fromenv=rpc_port"])
        .env("FLAGS_rpc_port", "abc")
        .output()
        .expect("run mooncake_master");
    assert!(failure_message(&o).contains("illegal value 'abc' specified for int32 flag 'rpc_port'"));
}

#[test]
fn unimplemented_feature_fails() {
    let err = failure_message(&run(&["--enable_cxl=true"]));
    assert!(err.contains("--enable_cxl"), "{err}");
    assert!(err.contains("does not implement"), "{err}");
    // HA is implemented, but needs its backend.
    let err = failure_message(&run(&["--enable_ha=true"]));
    assert!(
        err.contains("--enable_ha needs --ha_backend_connstring"),
        "{err}"
    );
}

#[test]
fn version_and_help() {
    let o = run(&["--version"]);
    assert_eq!(o.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&o.stdout).starts_with("mooncake_master version "));
    let o = run(&["--help"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stdout).contains("-default_kv_lease_ttl"));
}

#[test]
fn bind_failure_names_the_address() {
    let taken = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = taken.local_addr().expect("addr").port().to_string();
    let o = run(&[
        "--rpc_address=127.0.0.1",
        "--rpc_port",
        &port,
        "--metrics_port=0",
    ]);
    let err = failure_message(&o);
    assert!(err.contains(&format!("127.0.0.1:{port}")), "{err}");
}

#[test]
fn serves_and_stops_on_sigterm() {
    let rpc = free_port();
    let meta = free_port();
    let admin = free_port();
    let child = Command::new(BIN)
        .args([
            "-rpc_port",
            &rpc.to_string(),
            "-enable_http_metadata_server",
            "-http_metadata_server_port",
            &meta.to_string(),
            "-metrics_port",
            &admin.to_string(),
            "--default_kv_lease_ttl=2s",
            "--cluster_id=other",
        ])
        .env_remove("MC_LOG_LEVEL")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut guard = Guard(Some(child));
    let stderr = guard
        .0
        .as_mut()
        .and_then(|c| c.stderr.take())
        .expect("stderr");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });

    let deadline = Instant::now() + Duration::from_secs(20);
    wait_tcp(rpc, deadline);
    wait_tcp(meta, deadline);
    wait_tcp(admin, deadline);

    // Startup log: effective configuration on one line, warning for the ignored flag.
    let mut lines = Vec::new();
    while !lines
        .iter()
        .any(|l: &String| l.contains("effective configuration"))
    {
        let left = deadline.saturating_duration_since(Instant::now());
        lines.push(rx.recv_timeout(left).expect("config log line"));
    }
    let cfg_line = lines
        .iter()
        .find(|l| l.contains("effective configuration"))
        .expect("config line");
    assert!(cfg_line.contains("default_kv_lease_ttl=2000"), "{cfg_line}");
    assert!(cfg_line.contains(&format!("rpc_port={rpc}")), "{cfg_line}");

    // Metadata server.
    let r = http(meta, "GET", "/metadata?key=x", "");
    assert_eq!((r.status, r.body.as_str()), (404, "metadata not found"));
    let r = http(meta, "PUT", "/metadata?key=k", r#"{"a":1}"#);
    assert_eq!(r.status, 200);
    let r = http(meta, "GET", "/metadata?key=k", "");
    assert_eq!((r.status, r.body.as_str()), (200, r#"{"a":1}"#));
    assert!(r.headers.contains("content-type: application/json"));
    assert_eq!(http(meta, "DELETE", "/metadata?key=k", "").status, 200);
    let r = http(meta, "DELETE", "/metadata?key=k", "");
    assert_eq!((r.status, r.body.as_str()), (404, "metadata not found"));
    let r = http(meta, "GET", "/metadata", "");
    assert_eq!((r.status, r.body.as_str()), (400, "Missing key parameter"));
    assert_eq!(
        http(meta, "PUT", "/metadata?key=mooncake/rpc_meta/h", "a").status,
        200
    );
    let r = http(meta, "PUT", "/metadata?key=mooncake/rpc_meta/h", "b");
    assert_eq!(
        (r.status, r.body.as_str()),
        (400, "Duplicate rpc_meta key not allowed")
    );

    // Admin server.
    let r = http(admin, "GET", "/metrics", "");
    assert_eq!(r.status, 200);
    assert!(r
        .headers
        .contains("content-type: text/plain; version=0.0.4"));
    assert!(
        r.body.lines().any(|l| l == "master_key_count 0"),
        "{}",
        r.body
    );
    let r = http(admin, "GET", "/health", "");
    assert_eq!(r.status, 200);
    let health: serde_json::Value = serde_json::from_str(&r.body).expect("health json");
    assert_eq!(health["status"], "ok");
    assert_eq!(health["service_ready"], true);
    let r = http(admin, "GET", "/query_key?key=missing", "");
    assert_eq!(r.status, 404);
    assert!(r.body.contains("\"error_code\":-704"));
    assert_eq!(http(admin, "GET", "/get_all_keys", "").body, "");

    // SIGTERM → exit 0.
    let mut child = guard.0.take().expect("child");
    // SAFETY: plain kill(2) on our own child's pid.
    let rc = unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    assert_eq!(rc, 0);
    let t0 = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        if t0.elapsed() > Duration::from_secs(10) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("master did not exit after SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(0));
    // The ignored flag produced a warning.
    lines.extend(rx.try_iter());
    assert!(lines.iter().any(|l| l.contains("cluster_id")), "{lines:#?}");
}
