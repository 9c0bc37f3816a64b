//! The master's command line: every flag of the table, upstream's forms
//! and the configuration they produce.

use super::*;
use crate::config::AllocationStrategy;
use mooncake_common::AuthKey;
use FlagRole::{Feature, Replaced};

fn args(list: &[&str]) -> Vec<String> {
    std::iter::once("mooncake_master")
        .chain(list.iter().copied())
        .map(String::from)
        .collect()
}

fn run(list: &[&str]) -> MasterConfig {
    match parse_master_args(&args(list)) {
        FlagOutcome::Run(c) => *c,
        FlagOutcome::Exit { code, message } => panic!("exit {code}: {message}"),
    }
}

fn run_w(list: &[&str]) -> (MasterConfig, Vec<String>) {
    match parse_master_args_with_warnings(&args(list)) {
        (FlagOutcome::Run(c), w) => (*c, w),
        (FlagOutcome::Exit { code, message }, _) => panic!("exit {code}: {message}"),
    }
}

fn exit(list: &[&str]) -> (i32, String) {
    match parse_master_args(&args(list)) {
        FlagOutcome::Exit { code, message } => (code, message),
        FlagOutcome::Run(c) => panic!("unexpectedly ran: {c:?}"),
    }
}

/// One of the warnings `w` says `needle`.
fn assert_warns(w: &[String], needle: &str) {
    assert!(w.iter().any(|w| w.contains(needle)), "{needle}: {w:?}");
}

fn tmp(name: &str, content: &str) -> String {
    let path = std::env::temp_dir().join(format!(
        "mc-flags-{}-{}-{name}",
        std::process::id(),
        rand::random::<u32>()
    ));
    std::fs::write(&path, content).expect("write temp file");
    path.to_string_lossy().into_owned()
}

#[test]
fn table_is_consistent() {
    assert_eq!(MASTER.table_errors(), Vec::<String>::new());
    for d in MASTER.all() {
        if let Replaced(_) = d.role {
            assert_eq!(d.ty, FlagType::Bool);
        }
    }
    for name in ["enable_oplog", "enable_snapshot", "enable_snapshot_restore"] {
        assert!(matches!(find_flag(name).map(|d| d.role), Some(Replaced(_))));
    }
    for name in ["enable_cxl", "enable_kv_events", "dynamic_replication_mode"] {
        assert!(matches!(find_flag(name).map(|d| d.role), Some(Feature(_))));
    }
}

#[test]
fn defaults() {
    let c = run(&[]);
    let d = MasterConfig::default();
    assert_eq!(c.rpc_address, "0.0.0.0");
    assert_eq!(c.rpc_port, 50051);
    assert_eq!(c.rpc_thread_num, 0);
    assert!(c.rpc_enable_tcp_no_delay);
    assert!(!c.enable_http_metadata_server);
    assert_eq!(c.http_metadata_server_port, 8080);
    assert_eq!(c.metrics_port, 9003);
    assert_eq!(c.default_kv_lease_ttl_ms, d.default_kv_lease_ttl_ms);
    assert_eq!(c.default_kv_soft_pin_ttl_ms, 1_800_000);
    assert_eq!(c.max_kv_soft_pin_ttl_ms, 86_400_000);
    assert_eq!(c.eviction_high_watermark_ratio, 0.9);
    assert_eq!(c.eviction_ratio, 0.05);
    assert_eq!(c.client_ttl_sec, 10);
    assert_eq!(c.put_start_discard_timeout_sec, 30);
    assert_eq!(c.put_start_release_timeout_sec, 600);
    assert_eq!(c.allocation_strategy, AllocationStrategy::Random);
    assert_eq!(c.log_level, "warn");
}

#[test]
fn syntax_forms() {
    let c = run(&[
        "--rpc_port=1234",
        "-metrics_port=9100",
        "--http_metadata_server_port",
        "8081",
        "-rpc_address",
        "127.0.0.1",
        "--enable_http_metadata_server",
        "--noenable_metric_reporting",
        "positional",
        "-rpc_enable_tcp_no_delay=F",
    ]);
    assert_eq!(c.rpc_port, 1234);
    assert_eq!(c.metrics_port, 9100);
    assert_eq!(c.http_metadata_server_port, 8081);
    assert_eq!(c.rpc_address, "127.0.0.1");
    assert!(c.enable_http_metadata_server);
    assert!(!c.enable_metric_reporting);
    assert!(!c.rpc_enable_tcp_no_delay);
}

#[test]
fn bool_spellings() {
    for (s, v) in [
        ("true", true),
        ("TRUE", true),
        ("t", true),
        ("yes", true),
        ("Y", true),
        ("1", true),
        ("false", false),
        ("f", false),
        ("No", false),
        ("n", false),
        ("0", false),
    ] {
        let c = run(&[&format!("--enable_http_metadata_server={s}")]);
        assert_eq!(c.enable_http_metadata_server, v, "{s}");
    }
    let (code, msg) = exit(&["--enable_http_metadata_server=maybe"]);
    assert_eq!(code, 1);
    assert_eq!(
        msg,
        "ERROR: illegal value 'maybe' specified for bool flag 'enable_http_metadata_server'"
    );
    // A bool never consumes the next argument.
    let c = run(&["--enable_http_metadata_server", "false"]);
    assert!(c.enable_http_metadata_server);
}

#[test]
fn double_dash_ends_flags() {
    let c = run(&["--rpc_port=7", "--", "--bogus=1", "--rpc_port=8"]);
    assert_eq!(c.rpc_port, 7);
}

#[test]
fn last_assignment_wins() {
    assert_eq!(run(&["--rpc_port=7", "--rpc_port=9"]).rpc_port, 9);
}

#[test]
fn unknown_flag() {
    let (code, msg) = exit(&["--bogus=1"]);
    assert_eq!(code, 1);
    assert_eq!(msg, "ERROR: unknown command line flag 'bogus'");
    let (code, msg) = exit(&["-nobogus"]);
    assert_eq!(code, 1);
    assert!(msg.contains("unknown command line flag 'nobogus'"));
}

#[test]
fn undefok_suppresses_unknown() {
    let c = run(&[
        "--bogus=1",
        "--nofoo",
        "--undefok=bogus,foo",
        "--rpc_port=5",
    ]);
    assert_eq!(c.rpc_port, 5);
}

#[test]
fn bad_numbers() {
    for (flag, value, ty) in [
        ("rpc_port", "abc", "int32"),
        ("client_ttl", "1.5", "int64"),
        ("put_start_release_timeout_sec", "-1", "uint64"),
        ("eviction_ratio", "x", "double"),
        ("kv_events_block_size", "4294967296", "uint32"),
        ("rpc_port", "99999999999", "int32"),
    ] {
        assert_eq!(
            exit(&[&format!("--{flag}={value}")]),
            (
                1,
                format!("ERROR: illegal value '{value}' specified for {ty} flag '{flag}'")
            )
        );
    }
    assert_eq!(exit(&["--rpc_port="]).0, 1);
    // Hex is accepted, like strtol.
    assert_eq!(run(&["--rpc_port=0x10"]).rpc_port, 16);
}

#[test]
fn range_validation() {
    assert_eq!(
        exit(&["--rpc_port=70000"]).1,
        "ERROR: failed validation of new value '70000' for flag 'rpc_port'"
    );
    assert_eq!(exit(&["--metrics_port=-1"]).0, 1);
    assert_eq!(exit(&["--eviction_ratio=1.5"]).0, 1);
    assert_eq!(exit(&["--client_ttl=0"]).0, 1);
}

#[test]
fn missing_argument_and_no_prefix_on_non_bool() {
    let (code, msg) = exit(&["--rpc_port"]);
    assert_eq!(code, 1);
    assert!(msg.contains("flag 'rpc_port' is missing its argument"));
    let (code, msg) = exit(&["--norpc_port"]);
    assert_eq!(code, 1);
    assert!(msg.contains("int32 command line flag 'rpc_port'"));
}

#[test]
fn durations() {
    let cases = [
        ("2s", 2000),
        ("2000", 2000),
        ("500ms", 500),
        ("3m", 180_000),
        ("1h", 3_600_000),
        ("0", 0),
    ];
    for (raw, ms) in cases {
        assert_eq!(
            run(&[&format!("--default_kv_lease_ttl={raw}")]).default_kv_lease_ttl_ms,
            ms,
            "{raw}"
        );
    }
    assert_eq!(
        run(&["--max_kv_soft_pin_ttl", "2h"]).max_kv_soft_pin_ttl_ms,
        7_200_000
    );
    assert_eq!(
        run(&["--default_kv_soft_pin_ttl=10s"]).default_kv_soft_pin_ttl_ms,
        10_000
    );
    for bad in ["abc", "-5", "5d", "s", "1.5s", "", "99999999999999999999h"] {
        assert_eq!(
            exit(&[&format!("--default_kv_lease_ttl={bad}")]),
            (
                1,
                format!(
                    "ERROR: failed validation of new value '{bad}' for flag 'default_kv_lease_ttl'"
                )
            ),
            "{bad}"
        );
    }
}

#[test]
fn help_and_version() {
    let (code, msg) = exit(&["--help"]);
    assert_eq!(code, 1);
    for d in FLAGS {
        assert!(
            msg.contains(&format!("-{} (", d.name)),
            "help lacks {}",
            d.name
        );
    }
    let (code, msg) = exit(&["--version"]);
    assert_eq!(code, 0);
    assert_eq!(
        msg,
        format!("mooncake_master version {}", env!("CARGO_PKG_VERSION"))
    );
    let (code, msg) = exit(&["--helpmatch=lease"]);
    assert_eq!(code, 1);
    assert!(msg.contains("default_kv_lease_ttl"));
    assert!(!msg.contains("rpc_port"));
    // Errors win over help.
    assert!(exit(&["--help", "--bogus"]).1.starts_with("ERROR"));
}

#[test]
fn feature_switches_fail_fast() {
    let (code, msg) = exit(&["--enable_oplog=true"]);
    assert_eq!(code, 1);
    assert!(
        msg.contains("flag --enable_oplog: this build keeps no operation log"),
        "{msg}"
    );
    assert!(msg.contains("re-report"), "{msg}");
    for name in ["enable_snapshot", "enable_snapshot_restore"] {
        let (code, msg) = exit(&[&format!("--{name}")]);
        assert_eq!(code, 1);
        assert!(msg.contains(&format!("flag --{name}: ")), "{msg}");
    }
    for name in ["enable_cxl", "enable_kv_events"] {
        let (code, msg) = exit(&[&format!("--{name}")]);
        assert_eq!(code, 1);
        assert!(msg.contains(&format!("flag --{name} requires")), "{msg}");
    }
    // Explicitly false is fine.
    run(&[
        "--enable_ha=false",
        "--noenable_snapshot",
        "--noenable_oplog",
    ]);
}

#[test]
fn offload_flags() {
    let c = run(&[]);
    assert!(!c.offloads());
    assert_eq!(c.global_file_segment_size, i64::MAX as u64);
    let c = run(&["--enable_offload=true", "--offload_on_evict=true"]);
    assert!(c.offload_on_evict);
    assert!(c.offloads());
    assert_eq!(c.fsdir(), "");
    let c = run(&[
        "--root_fs_dir=/mnt/ssd/",
        "--global_file_segment_size=1073741824",
        "--cluster_id=c1",
    ]);
    assert!(c.offloads());
    assert_eq!(c.fsdir(), "/mnt/ssd/c1");
    assert_eq!(c.global_file_segment_size, 1 << 30);
    let (code, msg) = exit(&["--root_fs_dir=relative/dir"]);
    assert_eq!(code, 1);
    assert!(msg.contains("absolute path"), "{msg}");
    assert_eq!(exit(&["--global_file_segment_size=-1"]).0, 1);
}

#[test]
fn ha_flags() {
    let c = run(&[
        "--enable_ha=true",
        "--ha_backend_type=etcd",
        "--ha_backend_connstring=h1:2379;h2:2380",
        "--rpc_address=10.0.0.1",
        "--cluster_id=prod",
    ]);
    assert!(c.enable_ha);
    assert_eq!(c.ha_endpoints, vec!["http://h1:2379", "http://h2:2380"]);
    assert_eq!(c.cluster_id, "prod");
    // The legacy alias is used when the connstring is empty.
    let c = run(&[
        "--enable_ha",
        "--etcd_endpoints=e:1",
        "--rpc_address=10.0.0.1",
    ]);
    assert_eq!(c.ha_endpoints, vec!["http://e:1"]);
    assert_eq!(c.cluster_id, "mooncake_cluster");
    // ... but the connstring wins when both are given.
    let c = run(&[
        "--enable_ha",
        "--etcd_endpoints=e:1",
        "--ha_backend_connstring=c:2",
        "--rpc_address=10.0.0.1",
    ]);
    assert_eq!(c.ha_endpoints, vec!["http://c:2"]);
    // Bad inputs, each with its reason.
    for (args, needle) in [
        (
            vec!["--enable_ha", "--rpc_address=10.0.0.1"],
            "needs --ha_backend_connstring",
        ),
        (
            vec!["--enable_ha", "--etcd_endpoints=e:1"],
            "needs a reachable --rpc_address",
        ),
        (
            vec!["--enable_ha", "--etcd_endpoints=e:1", "--rpc_address=::"],
            "needs a reachable --rpc_address",
        ),
        (
            vec![
                "--enable_ha",
                "--ha_backend_type=redis",
                "--etcd_endpoints=e:1",
                "--rpc_address=1.2.3.4",
            ],
            "supports only the etcd HA backend",
        ),
        (
            vec![
                "--enable_ha",
                "--ha_backend_connstring=nohost",
                "--rpc_address=1.2.3.4",
            ],
            "for flag 'ha_backend_connstring'",
        ),
        (
            vec![
                "--enable_ha",
                "--etcd_endpoints=https://h:1",
                "--rpc_address=1.2.3.4",
            ],
            "TLS",
        ),
        (
            vec![
                "--enable_ha",
                "--etcd_endpoints=h:1",
                "--rpc_address=1.2.3.4",
                "--cluster_id=a/b",
            ],
            "for flag 'cluster_id'",
        ),
    ] {
        let (code, msg) = exit(&args);
        assert_eq!(code, 1, "{args:?}");
        assert!(msg.contains(needle), "{args:?}: {msg}");
    }
    // Without --enable_ha the HA flags only warn.
    let (c, w) = run_w(&["--etcd_endpoints=a:1"]);
    assert!(!c.enable_ha);
    assert_warns(&w, "--etcd_endpoints has no effect");
}

#[test]
fn unimplemented_flags_are_refused_when_non_default() {
    let (_, w) = run_w(&[
        "--cluster_id=mooncake_cluster",
        "--snapshot_retention_count=2",
    ]);
    assert!(w.is_empty(), "{w:?}");
    for arg in ["--snapshot_retention_count=3", "--vmodule=x=2"] {
        let (code, msg) = exit(&[arg]);
        assert_eq!(code, 1, "{arg}");
        assert!(
            msg.contains(&format!("flag {arg} is not implemented by this build")),
            "{msg}"
        );
    }
    // Type checked nonetheless.
    assert_eq!(exit(&["--snapshot_retention_count=x"]).0, 1);
    assert_eq!(exit(&["--enable_disk_eviction=x"]).0, 1);
}

#[test]
fn deprecated_port_and_threads() {
    let (c, w) = run_w(&["--port=6000"]);
    assert_eq!(c.rpc_port, 6000);
    assert_warns(&w, "--port is deprecated");
    let (c, _) = run_w(&["--port=6000", "--rpc_port=6001"]);
    assert_eq!(c.rpc_port, 6001);
    let (c, w) = run_w(&["--max_threads=8"]);
    assert_eq!(c.rpc_thread_num, 8);
    assert_warns(&w, "max_threads");
    let (c, _) = run_w(&["--max_threads=8", "--rpc_thread_num=3"]);
    assert_eq!(c.rpc_thread_num, 3);
}

#[test]
fn allocator_and_strategy() {
    assert_eq!(
        run(&["--allocation_strategy=free_ratio_first"]).allocation_strategy,
        AllocationStrategy::FreeRatioFirst
    );
    assert_eq!(
        run(&["--allocation_strategy=local_first"]).allocation_strategy,
        AllocationStrategy::LocalFirst
    );
    assert_eq!(
        exit(&["--allocation_strategy=best"]).1,
        "ERROR: failed validation of new value 'best' for flag 'allocation_strategy'"
    );
    let (code, msg) = exit(&["--memory_allocator=cachelib"]);
    assert_eq!(code, 1);
    assert!(msg.contains("--memory_allocator=cachelib"), "{msg}");
    run(&["--memory_allocator=offset"]);
    assert_eq!(exit(&["--memory_allocator=jemalloc"]).0, 1);
}

#[test]
fn log_flags() {
    assert_eq!(run(&["--v=1"]).log_level, "debug");
    assert_eq!(run(&["--v=2"]).log_level, "trace");
    assert_eq!(run(&["--logtostderr"]).log_level, "info");
    assert_eq!(
        run(&["--alsologtostderr", "--minloglevel=1"]).log_level,
        "warn"
    );
    assert_eq!(run(&["--stderrthreshold=0"]).log_level, "info");
    assert_eq!(run(&["--stderrthreshold=2"]).log_level, "error");
    assert_eq!(run(&["--minloglevel=2"]).log_level, "error");
    assert_eq!(run(&["--minloglevel=3"]).log_level, "off");
    let (c, w) = run_w(&["--log_dir=/tmp"]);
    assert_eq!(c.log_level, "warn");
    assert!(w.is_empty(), "{w:?}");
    assert_eq!(
        c.log_file.map(|f| f.path),
        Some(std::path::PathBuf::from("/tmp/mooncake_master.INFO"))
    );
}

#[test]
fn auth_and_connection_limits() {
    let d = run(&[]);
    assert!(d.auth.is_none() && d.auth_token_file.is_empty());
    assert_eq!(
        (
            d.max_connections,
            d.max_connections_per_peer,
            d.idle_connection_timeout_sec
        ),
        (4096, 1024, 60)
    );
    let token = tmp("token", "s3cret\n");
    let c = run(&[
        &format!("--auth_token_file={token}"),
        "--max_connections=10",
        "--max_connections_per_peer=3",
        "--idle_connection_timeout_sec=0",
    ]);
    let key = c.auth.clone().expect("key loaded");
    assert_eq!(
        key.fingerprint(),
        AuthKey::new("s3cret").expect("key").fingerprint()
    );
    let l = c.rpc_limits();
    assert_eq!((l.max_total, l.max_per_peer, l.idle_timeout), (10, 3, None));
    let c = run(&["--rpc_conn_timeout_seconds=5"]);
    assert_eq!(
        c.rpc_limits().idle_timeout,
        Some(std::time::Duration::from_secs(5))
    );
    assert_eq!(
        c.http_limits().idle_timeout,
        Some(std::time::Duration::from_secs(60))
    );
    for bad in ["/nonexistent/token", &tmp("empty-token", " \n")] {
        let (code, msg) = exit(&[&format!("--auth_token_file={bad}")]);
        assert_eq!(code, 1, "{msg}");
        assert!(msg.contains("auth_token_file"), "{msg}");
    }
    assert_eq!(exit(&["--max_connections=-1"]).0, 1);
}

#[test]
fn rpc_interface() {
    let c = run(&["--rpc_interface=lo", "--rpc_address=10.0.0.1"]);
    assert_eq!(c.rpc_address, "127.0.0.1");
    let (code, msg) = exit(&["--rpc_interface=definitely_no_such_if0"]);
    assert_eq!(code, 1);
    assert!(msg.contains("rpc_interface"));
}

#[test]
fn flagfile() {
    let inner = tmp("inner", "--client_ttl=7\n");
    let path = tmp(
        "flags",
        &format!(
            "# comment\n\n--rpc_port=4321\n-default_kv_lease_ttl 3s\n--enable_http_metadata_server\n--flagfile={inner}\n"
        ),
    );
    let c = run(&[&format!("--flagfile={path}"), "--metrics_port=1"]);
    assert_eq!(c.rpc_port, 4321);
    assert_eq!(c.default_kv_lease_ttl_ms, 3000);
    assert!(c.enable_http_metadata_server);
    assert_eq!(c.client_ttl_sec, 7);
    assert_eq!(c.metrics_port, 1);
    // Later command-line flags override the flagfile.
    assert_eq!(run(&["--flagfile", &path, "--rpc_port=1"]).rpc_port, 1);
    let bad = tmp("bad", "--bogus=2\n");
    assert_eq!(
        exit(&[&format!("--flagfile={bad}")]).1,
        "ERROR: unknown command line flag 'bogus'"
    );
    assert_eq!(exit(&["--flagfile=/nonexistent/mc-flags"]).0, 1);
    let _ = std::fs::remove_file(inner);
    let _ = std::fs::remove_file(path);
    let _ = std::fs::remove_file(bad);
}

#[test]
fn config_json() {
    let path = tmp(
        "cfg.json",
        r#"{"rpc_port": 5555, "default_kv_lease_ttl": "2s", "enable_http_metadata_server": true,
            "eviction_ratio": 0.1, "metrics_port": "9200", "some_unknown_key": 1}"#,
    );
    let (c, w) = run_w(&[&format!("--config_path={path}")]);
    assert_eq!(c.rpc_port, 5555);
    assert_eq!(c.default_kv_lease_ttl_ms, 2000);
    assert!(c.enable_http_metadata_server);
    assert_eq!(c.eviction_ratio, 0.1);
    assert_eq!(c.metrics_port, 9200);
    assert_warns(&w, "some_unknown_key");
    // Explicit command-line flags override the file, wherever they appear.
    let c = run(&["--rpc_port=1", &format!("--config_path={path}")]);
    assert_eq!(c.rpc_port, 1);
    assert_eq!(c.metrics_port, 9200);

    let bad = tmp("bad.json", r#"{"rpc_port": "abc"}"#);
    let (code, msg) = exit(&[&format!("--config_path={bad}")]);
    assert_eq!(code, 1);
    assert!(msg.starts_with("ERROR: illegal value 'abc' specified for int32 flag 'rpc_port'"));
    let feat = tmp("feat.json", r#"{"enable_cxl": true}"#);
    assert!(exit(&[&format!("--config_path={feat}")])
        .1
        .contains("enable_cxl requires"));
    let notobj = tmp("arr.json", "[1,2]");
    assert_eq!(exit(&[&format!("--config_path={notobj}")]).0, 1);
    assert_eq!(exit(&["--config_path=/nonexistent/x.json"]).0, 1);
    for p in [path, bad, feat, notobj] {
        let _ = std::fs::remove_file(p);
    }
}

#[test]
fn fromenv_missing() {
    // Reading a present variable is covered by tests/cli.rs (no set_var
    // in a multi-threaded test binary).
    run(&["--tryfromenv=pod_namespace"]);
    let (code, msg) = exit(&["--fromenv=pod_namespace"]);
    assert_eq!(code, 1);
    assert!(msg.contains("FLAGS_pod_namespace"));
    assert!(exit(&["--fromenv=bogus"]).1.contains("'bogus'"));
}

#[test]
fn duration_parser() {
    assert_eq!(parse_duration_ms("15"), Some(15));
    assert_eq!(parse_duration_ms("15ms"), Some(15));
    assert_eq!(parse_duration_ms("1s"), Some(1000));
    assert_eq!(parse_duration_ms("+1"), None);
    assert_eq!(parse_duration_ms(" 1"), None);
}

/// A value of `d`'s type other than its default.
fn non_default(d: &FlagDef) -> String {
    match d.ty {
        FlagType::Bool => if d.default == "true" { "false" } else { "true" }.to_string(),
        FlagType::Str => format!("{}-changed", d.default),
        FlagType::Double => {
            let v: f64 = d.default.parse().expect("double default");
            format!("{}", v + 1.0)
        }
        _ => {
            let v: i128 = d.default.parse().expect("integer default");
            if v > 0 { v - 1 } else { v + 1 }.to_string()
        }
    }
}

#[test]
fn every_unimplemented_flag_is_refused_when_set() {
    for d in MASTER.all() {
        let arg = format!("--{}={}", d.name, non_default(d));
        match d.role {
            FlagRole::Core | FlagRole::Log => {}
            FlagRole::Builtin => {}
            Feature(_) | FlagRole::Unsupported => {
                let (code, msg) = exit(&[&arg]);
                assert_eq!(code, 1, "{arg} must be refused");
                assert!(msg.contains(&format!("--{}", d.name)), "{arg}: {msg}");
            }
            Replaced(_) => {
                let (code, msg) = exit(&[&format!("--{}=true", d.name)]);
                assert_eq!(code, 1, "--{}=true must be refused", d.name);
                assert!(msg.contains(&format!("--{}", d.name)), "{msg}");
            }
        }
    }
}

#[test]
fn log_dir_writes_the_program_log_file() {
    let dir = std::env::temp_dir().join(format!("mc-logdir-{}", std::process::id()));
    let c = run(&[&format!("--log_dir={}", dir.display()), "--minloglevel=1"]);
    let file = c.log_file.expect("a log file");
    assert_eq!(file.path, dir.join("mooncake_master.INFO"));
    assert_eq!(file.level, "warn");
    let c = run(&[&format!("--log_dir={}", dir.display()), "--v=1"]);
    assert_eq!(c.log_file.expect("a log file").level, "debug");
    assert!(run(&[]).log_file.is_none());
}

/// A valid value other than `d`'s default (with the flags it needs to act),
/// for a flag whose effect shows in the configuration or in a warning
/// naming it.
fn other_value(d: &FlagDef) -> (String, Vec<String>) {
    let v = match d.name {
        "rpc_address" | "http_metadata_server_host" | "metrics_host" => "127.0.0.1".to_string(),
        "rpc_interface" => "lo".to_string(),
        "allocation_strategy" => "free_ratio_first".to_string(),
        "memory_allocator" => "cachelib".to_string(),
        "ha_backend_type" => "redis".to_string(),
        "auth_token_file" => tmp("token", "a-cluster-secret-of-some-length"),
        "root_fs_dir" => "/tmp/mc-flags-root".to_string(),
        "log_dir" => std::env::temp_dir().to_string_lossy().into_owned(),
        "offload_cap_ratio" => "0.25".to_string(),
        // 1 (WARNING) is this build's default level already.
        "minloglevel" => "2".to_string(),
        _ => match d.ty {
            FlagType::Bool => (d.default != "true").to_string(),
            FlagType::Double => {
                let x: f64 = d.default.parse().unwrap_or(0.0);
                (if x > 0.3 { x / 2.0 } else { x + 0.1 }).to_string()
            }
            FlagType::Str => "x".to_string(),
            _ => (d.default.parse::<i128>().unwrap_or(0) + 1).to_string(),
        },
    };
    // Flags that act only with another one.
    let with: &[&str] = match d.name {
        "offload_force_evict" | "offload_cap_ratio" => &["--enable_offload", "--offload_on_evict"],
        "offloading_queue_limit" | "offload_on_evict" => &["--enable_offload"],
        "enable_disk_eviction" | "quota_bytes" => &["--root_fs_dir=/tmp/mc-flags-root"],
        "enable_multi_tenants" => {
            let policy = tmp("tenants.yaml", "version: 1\ntenants: []\n");
            return (v, vec![format!("--tenant_quota_connector_uri={policy}")]);
        }
        _ => &[],
    };
    (v, with.iter().map(|s| s.to_string()).collect())
}

#[test]
fn every_flag_is_implemented_or_refused_when_set() {
    let base = format!("{:?}", run(&["--enable_offload", "--offload_on_evict"]));
    let plain = format!("{:?}", run(&[]));
    let root = format!("{:?}", run(&["--root_fs_dir=/tmp/mc-flags-root"]));
    let mut idle = Vec::new();
    for d in MASTER.all() {
        let (value, with) = other_value(d);
        let arg = format!("--{}={value}", d.name);
        let mut list: Vec<&str> = with.iter().map(String::as_str).collect();
        list.push(&arg);
        match d.role {
            FlagRole::Builtin => continue,
            FlagRole::Feature(_) | FlagRole::Unsupported | FlagRole::Replaced(_) => {
                let (code, msg) = exit(&list);
                assert_eq!(code, 1, "{arg}");
                assert!(msg.contains(&format!("--{}", d.name)), "{arg}: {msg}");
            }
            FlagRole::Core | FlagRole::Log => {
                let outcome = parse_master_args_with_warnings(&args(&list));
                match outcome {
                    (FlagOutcome::Run(c), warnings) => {
                        let before = match with.first().map(String::as_str) {
                            Some("--enable_offload") if with.len() == 2 => &base,
                            Some("--enable_offload") => {
                                &format!("{:?}", run(&["--enable_offload"]))
                            }
                            Some(_) => &root,
                            None => &plain,
                        };
                        let said = warnings
                            .iter()
                            .any(|w| w.contains(&format!("--{}", d.name)));
                        if format!("{c:?}") == *before && !said {
                            idle.push(d.name);
                        }
                    }
                    // Refused, naming the flag: a value this build lacks.
                    (FlagOutcome::Exit { code, message }, _) => {
                        assert_eq!(code, 1, "{arg}");
                        assert!(message.contains(d.name), "{arg}: {message}");
                    }
                }
            }
        }
    }
    assert!(idle.is_empty(), "accepted and ignored: {idle:?}");
}

#[test]
fn offload_tuning_flags() {
    let c = run(&[]);
    assert!(!c.offload_on_evict && !c.offload_force_evict && c.enable_disk_eviction);
    assert_eq!(
        (c.offload_cap_ratio, c.offloading_queue_limit),
        (0.5, 50_000)
    );
    assert_eq!(c.offload_cap(), 25_000);
    assert!(!c.writes_through(), "no offload, no write-through");
    assert!(run(&["--enable_offload"]).writes_through());
    assert!(run(&["--root_fs_dir=/mnt/ssd"]).writes_through());
    let (c, w) = run_w(&[
        "--enable_offload",
        "--offload_on_evict",
        "--offload_force_evict",
        "--offloading_queue_limit=500000",
        "--offload_cap_ratio=0.8",
    ]);
    assert!(w.is_empty(), "{w:?}");
    assert!(c.offload_on_evict && c.offload_force_evict && !c.writes_through());
    assert_eq!(c.offload_cap(), 400_000);
    let c = run(&["--root_fs_dir=/mnt/ssd", "--noenable_disk_eviction"]);
    assert!(!c.enable_disk_eviction);
    assert_eq!(c.quota_bytes, 0, "0: 90% of the file system");
    assert_eq!(
        run(&["--root_fs_dir=/mnt/ssd", "--quota_bytes=1048576"]).quota_bytes,
        1 << 20
    );
    let c = run(&[
        "--enable_offload",
        "--promotion_on_hit",
        "--promotion_admission_threshold=0",
        "--promotion_queue_limit=7",
        "--promotion_max_per_heartbeat=0",
    ]);
    assert!(c.promotes());
    assert_eq!(c.promotion_max_per_heartbeat, 1);
    assert_eq!(
        (c.promotion_admission_threshold, c.promotion_queue_limit),
        (1, 7)
    );
    assert_eq!(
        run(&["--promotion_admission_threshold=1000"]).promotion_admission_threshold,
        255
    );
    assert!(!run(&["--promotion_on_hit"]).promotes(), "needs offload");
    let (code, msg) = exit(&["--dynamic_replication_mode=enforce"]);
    assert_eq!(code, 1);
    assert!(
        msg.contains("--dynamic_replication_mode requires dynamic replication"),
        "{msg}"
    );
    for bad in [
        "--offload_cap_ratio=1.5",
        "--offload_cap_ratio=-0.1",
        "--offloading_queue_limit=0",
        "--offloading_queue_limit=100000001",
    ] {
        let (code, msg) = exit(&[bad]);
        assert_eq!(code, 1, "{bad}");
        let name = bad.trim_start_matches("--").split('=').next().unwrap_or("");
        assert!(msg.contains(name), "{bad}: {msg}");
    }
    // Set where they cannot act, they say so.
    let (_, w) = run_w(&["--offload_on_evict"]);
    assert_warns(
        &w,
        "--offload_on_evict has no effect without --enable_offload",
    );
    let (_, w) = run_w(&["--enable_offload", "--offload_force_evict"]);
    assert_warns(
        &w,
        "--offload_force_evict has no effect without --offload_on_evict",
    );
    let (_, w) = run_w(&["--enable_offload", "--enable_disk_eviction=false"]);
    assert_warns(
        &w,
        "--enable_disk_eviction has no effect without --root_fs_dir",
    );
    let (_, w) = run_w(&["--tenant_quota_connector_uri=/x.yaml"]);
    assert_warns(
        &w,
        "--tenant_quota_connector_uri has no effect without --enable_multi_tenants",
    );
    let policy = tmp(
        "tq.yaml",
        "version: 1\ntenants:\n  - {name: a, quota: 2MB}\n",
    );
    let c = run(&[
        "--enable_multi_tenants",
        &format!("--tenant_quota_connector_uri={policy}"),
    ]);
    assert!(c.enable_multi_tenants);
    assert_eq!(c.tenant_quota_file, policy);
    for (bad, needle) in [
        (
            vec!["--enable_multi_tenants".to_string()],
            "--tenant_quota_connector_uri",
        ),
        (
            vec![
                "--enable_multi_tenants".to_string(),
                "--tenant_quota_connector_type=etcd".to_string(),
                format!("--tenant_quota_connector_uri={policy}"),
            ],
            "--tenant_quota_connector_type",
        ),
        (
            vec![
                "--enable_multi_tenants".to_string(),
                format!(
                    "--tenant_quota_connector_uri={}",
                    tmp("bad.yaml", "version: 2\n")
                ),
            ],
            "version",
        ),
    ] {
        let list: Vec<&str> = bad.iter().map(String::as_str).collect();
        let (code, msg) = exit(&list);
        assert_eq!(code, 1, "{bad:?}");
        assert!(msg.contains(needle), "{bad:?}: {msg}");
    }
    let (_, w) = run_w(&["--quota_bytes=1048576"]);
    assert_warns(&w, "--quota_bytes has no effect without --root_fs_dir");
}
