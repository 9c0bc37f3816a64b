//! gflags-compatible command line for `mooncake_master` (spec §4.1, §4.2, §4.4).
//!
//! Owns the single static flag table ([`FLAGS`]), argument scanning
//! (`--flag=value`, `-flag value`, `--noflag`, `--`), `--flagfile`,
//! `--config_path` (JSON), the gflags built-ins (`--help*`, `--version`,
//! `--undefok`, `--fromenv`, `--tryfromenv`) and the translation of the
//! parsed values into the effective [`MasterConfig`].

use std::collections::{HashMap, HashSet};
use std::net::Ipv4Addr;

use crate::config::{AllocationStrategy, MasterConfig};
use mooncake_common::AuthKey;

/// Result of parsing the master command line.
#[derive(Debug)]
pub enum FlagOutcome {
    /// Start the master with this effective configuration.
    Run(Box<MasterConfig>),
    /// Exit immediately. Messages starting with `ERROR` belong on stderr;
    /// anything else (help, version) belongs on stdout.
    Exit {
        /// Process exit status.
        code: i32,
        /// Text to print (without trailing newline).
        message: String,
    },
}

/// Value type of a flag, as gflags names it in error messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlagType {
    /// `true/false/t/f/yes/no/y/n/1/0`, or bare `--flag` / `--noflag`.
    Bool,
    /// Signed 32-bit integer.
    Int32,
    /// Signed 64-bit integer.
    Int64,
    /// Unsigned 32-bit integer.
    Uint32,
    /// Unsigned 64-bit integer.
    Uint64,
    /// Floating point.
    Double,
    /// Any string.
    Str,
    /// Non-negative integer with optional `ms`/`s`/`m`/`h` suffix; stored in ms.
    Duration,
}

impl FlagType {
    /// The gflags type name (`int32`, `bool`, …).
    pub fn name(self) -> &'static str {
        match self {
            FlagType::Bool => "bool",
            FlagType::Int32 => "int32",
            FlagType::Int64 => "int64",
            FlagType::Uint32 => "uint32",
            FlagType::Uint64 => "uint64",
            FlagType::Double => "double",
            FlagType::Str => "string",
            FlagType::Duration => "duration",
        }
    }
}

/// What the master does with a flag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlagRole {
    /// Implemented (Tier 1, §4.2): feeds [`MasterConfig`].
    Core,
    /// Mapped onto our stderr logger.
    Log,
    /// Feature switch of an unimplemented feature: `true` fails fast.
    Feature(&'static str),
    /// Feature switch whose guarantee this build provides by another
    /// mechanism (named in the text): `true` fails fast with that text.
    Replaced(&'static str),
    /// Recognised and type-checked; a non-default value only warns.
    Ignored,
    /// gflags built-in handled by the parser itself (help, flagfile, …).
    Builtin,
}

/// One row of the flag table.
#[derive(Debug)]
pub struct FlagDef {
    /// Flag name without dashes.
    pub name: &'static str,
    /// Value type.
    pub ty: FlagType,
    /// Default value, in command-line syntax.
    pub default: &'static str,
    /// How the master treats it.
    pub role: FlagRole,
    /// One-line description for `--help`.
    pub help: &'static str,
}

const fn f(
    name: &'static str,
    ty: FlagType,
    default: &'static str,
    role: FlagRole,
    help: &'static str,
) -> FlagDef {
    FlagDef {
        name,
        ty,
        default,
        role,
        help,
    }
}

use FlagRole::{Builtin, Core, Feature, Ignored, Log, Replaced};
use FlagType::{Bool, Double, Duration, Int32, Int64, Str, Uint32, Uint64};

const IGN: &str = "not implemented by this build; accepted and ignored";
const NO_LOG: &str = "this build keeps no operation log and takes no snapshots: metadata \
survives a master restart or failover because the clients re-report the replicas their segments \
hold when they remount (README, 'HA and durability')";

/// Every flag the master recognises.
#[rustfmt::skip]
pub static FLAGS: &[FlagDef] = &[
    // ---- Tier 1 (§4.2) ----
    f("rpc_address", Str, "0.0.0.0", Core, "RPC bind address"),
    f("rpc_port", Int32, "0", Core, "RPC port; 0 means use --port"),
    f("port", Int32, "50051", Core, "deprecated: use --rpc_port"),
    f("rpc_thread_num", Int32, "0", Core, "worker threads; 0 = automatic (2-4)"),
    f("max_threads", Int32, "16", Core, "deprecated: use --rpc_thread_num"),
    f("rpc_interface", Str, "", Core, "network interface whose IPv4 address overrides --rpc_address"),
    f("rpc_conn_timeout_seconds", Int32, "0", Core, "idle RPC connection timeout in seconds (0 = --idle_connection_timeout_sec)"),
    f("rpc_enable_tcp_no_delay", Bool, "true", Core, "set TCP_NODELAY on RPC connections"),
    f("enable_http_metadata_server", Bool, "false", Core, "run the embedded HTTP metadata server"),
    f("http_metadata_server_host", Str, "0.0.0.0", Core, "HTTP metadata server bind host"),
    f("http_metadata_server_port", Int32, "8080", Core, "HTTP metadata server port"),
    f("metrics_host", Str, "0.0.0.0", Core, "admin/metrics HTTP server bind host"),
    f("metrics_port", Int32, "9003", Core, "admin/metrics HTTP server port"),
    f("enable_metric_reporting", Bool, "true", Core, "log a one-line summary every 10 s"),
    f("default_kv_lease_ttl", Duration, "10000", Core, "read lease duration (ms, or with ms/s/m/h suffix)"),
    f("default_kv_soft_pin_ttl", Duration, "1800000", Core, "default soft-pin duration"),
    f("max_kv_soft_pin_ttl", Duration, "86400000", Core, "maximum soft-pin duration"),
    f("allow_evict_soft_pinned_objects", Bool, "true", Core, "allow evicting soft-pinned objects as a last resort"),
    f("eviction_high_watermark_ratio", Double, "0.9", Core, "usage ratio that triggers eviction"),
    f("eviction_ratio", Double, "0.05", Core, "fraction of capacity to free per eviction round"),
    f("client_ttl", Int64, "10", Core, "seconds without a ping before a client expires"),
    f("put_start_discard_timeout_sec", Uint64, "30", Core, "seconds before an unfinished put may be discarded"),
    f("put_start_release_timeout_sec", Uint64, "600", Core, "seconds before an unfinished put's space is released"),
    f("memory_allocator", Str, "offset", Core, "segment allocator: offset (cachelib accepted, uses offset)"),
    f("allocation_strategy", Str, "random", Core, "random | free_ratio_first | local_first"),
    f("enable_metadata_cleanup_on_timeout", Bool, "false", Core, "delete mooncake/ram/<segment> when a client expires"),
    // ---- ours (issue 10): authentication and connection limits ----
    f("auth_token_file", Str, "", Core, "file holding the cluster token; clients must prove it (MC_AUTH_TOKEN / MC_AUTH_TOKEN_FILE)"),
    f("max_connections", Uint32, "4096", Core, "most open connections per listener (RPC, metadata, admin)"),
    f("max_connections_per_peer", Uint32, "1024", Core, "most open connections per peer address and listener"),
    f("idle_connection_timeout_sec", Uint32, "60", Core, "close connections silent this long (0 = never); --rpc_conn_timeout_seconds overrides it for RPC"),
    // ---- ours: versioned upserts ----
    f("max_pending_versions_per_key", Uint32, "4", Core, "replaced versions of one key kept for their readers before an upsert of the key waits for one to be freed"),
    f("pending_version_wait_ms", Uint64, "5000", Core, "how long such an upsert waits before it returns OBJECT_REPLICA_BUSY (-714)"),
    // ---- glog flags mapped to our logger ----
    f("v", Int32, "0", Log, "verbose logging (>0 = debug, >1 = trace)"),
    f("logtostderr", Bool, "false", Log, "log everything (from --minloglevel) to stderr"),
    f("alsologtostderr", Bool, "false", Log, "same as --logtostderr (we only log to stderr)"),
    f("minloglevel", Int32, "0", Log, "0=INFO 1=WARNING 2=ERROR 3=FATAL"),
    f("stderrthreshold", Int32, "2", Log, "severity copied to stderr"),
    f("log_dir", Str, "", Log, "ignored: logs always go to stderr"),
    // ---- feature switches that fail fast (§4.2) ----
    f("enable_ha", Bool, "false", Core, "HA: masters elect one leader through etcd; clients use etcd://<connstring>"),
    f("enable_oplog", Bool, "false", Replaced(NO_LOG), "operation log"),
    f("enable_snapshot", Bool, "false", Replaced(NO_LOG), "metadata snapshots"),
    f("enable_snapshot_restore", Bool, "false", Replaced(NO_LOG), "restore from snapshot"),
    f("enable_offload", Bool, "false", Feature("SSD/DFS offload"), "offload to storage"),
    f("enable_cxl", Bool, "false", Feature("CXL memory"), "CXL memory"),
    f("enable_multi_tenants", Bool, "false", Feature("multi-tenancy"), "multi-tenancy"),
    f("enable_kv_events", Bool, "false", Feature("KV event publishing"), "KV events"),
    f("offload_on_evict", Bool, "false", Feature("offload on eviction"), "offload evicted objects"),
    f("promotion_on_hit", Bool, "false", Feature("promotion from the offload tier"), "promote on hit"),
    // ---- recognised but unimplemented (§4.4) ----
    f("batch_oplog_retry_timeout_sec", Uint32, "180", Ignored, IGN),
    f("cluster_id", Str, "mooncake_cluster", Core, "HA cluster name (etcd key prefix); clients set MC_STORE_CLUSTER_ID to match"),
    f("cxl_path", Str, "/dev/dax0.0", Ignored, IGN),
    f("cxl_size", Uint64, "8589934592", Ignored, IGN),
    f("dynamic_replication_admission_qps_threshold", Double, "0.8", Ignored, IGN),
    f("dynamic_replication_heat_window_seconds", Uint32, "10", Ignored, IGN),
    f("dynamic_replication_max_memory_replicas", Uint64, "2", Ignored, IGN),
    f("dynamic_replication_mode", Str, "off", Ignored, IGN),
    f("enable_disk_eviction", Bool, "true", Ignored, IGN),
    f("etcd_endpoints", Str, "", Core, "legacy alias of --ha_backend_connstring, used when that is empty"),
    f("global_file_segment_size", Int64, "9223372036854775807", Ignored, IGN),
    f("ha_backend_connstring", Str, "", Core, "HA backend endpoints: etcd h1:2379;h2:2379"),
    f("ha_backend_type", Str, "etcd", Core, "HA backend: etcd (redis and k8s are not supported by this build)"),
    f("kv_events_additional_salt", Str, "", Ignored, IGN),
    f("kv_events_backend_id", Str, "", Ignored, IGN),
    f("kv_events_bind_endpoint", Str, "", Ignored, IGN),
    f("kv_events_block_size", Uint32, "0", Ignored, IGN),
    f("kv_events_dp_rank", Uint32, "0", Ignored, IGN),
    f("kv_events_emit_legacy_compat", Bool, "true", Ignored, IGN),
    f("kv_events_emit_object_key", Bool, "true", Ignored, IGN),
    f("kv_events_lora_name", Str, "", Ignored, IGN),
    f("kv_events_model_name", Str, "", Ignored, IGN),
    f("kv_events_queue_capacity", Uint32, "65536", Ignored, IGN),
    f("kv_events_tenant_id", Str, "default", Ignored, IGN),
    f("max_retry_attempts", Uint32, "10", Ignored, IGN),
    f("max_total_finished_tasks", Uint32, "10000", Ignored, IGN),
    f("max_total_pending_tasks", Uint32, "10000", Ignored, IGN),
    f("max_total_processing_tasks", Uint32, "10000", Ignored, IGN),
    f("nof_eviction_high_watermark_ratio", Double, "0.9", Ignored, IGN),
    f("nof_eviction_ratio", Double, "0.05", Ignored, IGN),
    f("nof_heartbeat_failures_threshold", Uint32, "3", Ignored, IGN),
    f("nof_heartbeat_interval_sec", Int64, "10", Ignored, IGN),
    f("nof_heartbeat_probe_timeout_ms", Uint32, "1000", Ignored, IGN),
    f("offload_cap_ratio", Double, "0.5", Ignored, IGN),
    f("offload_force_evict", Bool, "false", Ignored, IGN),
    f("offloading_queue_limit", Uint64, "50000", Ignored, IGN),
    f("oplog_batch_max_entries", Uint32, "1024", Ignored, IGN),
    f("oplog_poll_interval_ms", Int32, "1000", Ignored, IGN),
    f("pending_task_timeout_sec", Uint64, "300", Ignored, IGN),
    f("pod_name", Str, "", Ignored, IGN),
    f("pod_namespace", Str, "", Ignored, IGN),
    f("processing_task_timeout_sec", Uint64, "300", Ignored, IGN),
    f("promotion_admission_threshold", Uint32, "2", Ignored, IGN),
    f("promotion_max_per_heartbeat", Uint32, "1", Ignored, IGN),
    f("promotion_queue_limit", Uint32, "50000", Ignored, IGN),
    f("quota_bytes", Uint64, "0", Ignored, IGN),
    f("root_fs_dir", Str, "", Ignored, IGN),
    f("snapshot_backup_dir", Str, "", Ignored, IGN),
    f("snapshot_catalog_backend_connstring", Str, "", Ignored, IGN),
    f("snapshot_catalog_backend_type", Str, "", Ignored, IGN),
    f("snapshot_catalog_store_connstring", Str, "", Ignored, IGN),
    f("snapshot_catalog_store_type", Str, "", Ignored, IGN),
    f("snapshot_child_timeout_seconds", Uint64, "300", Ignored, IGN),
    f("snapshot_interval_seconds", Uint64, "600", Ignored, IGN),
    f("snapshot_object_store_type", Str, "", Ignored, IGN),
    f("snapshot_payload_backend_type", Str, "", Ignored, IGN),
    f("snapshot_payload_store_type", Str, "", Ignored, IGN),
    f("snapshot_retention_count", Uint32, "2", Ignored, IGN),
    f("tenant_quota_connector_type", Str, "file", Ignored, IGN),
    f("tenant_quota_connector_uri", Str, "", Ignored, IGN),
    f("mmap_arena_pool_size", Uint64, "8589934592", Ignored, IGN),
    f("use_mmap_arena_allocator", Bool, "false", Ignored, IGN),
    // ---- gflags / glog built-ins ----
    f("help", Bool, "false", Builtin, "show help on all flags and exit"),
    f("helpfull", Bool, "false", Builtin, "same as --help"),
    f("helpshort", Bool, "false", Builtin, "same as --help"),
    f("helppackage", Bool, "false", Builtin, "same as --help"),
    f("helpxml", Bool, "false", Builtin, "same as --help"),
    f("helpmatch", Str, "", Builtin, "show help on flags whose name contains this string"),
    f("helpon", Str, "", Builtin, "same as --helpmatch"),
    f("version", Bool, "false", Builtin, "show version and exit"),
    f("flagfile", Str, "", Builtin, "load flags from file (one per line)"),
    f("config_path", Str, "", Builtin, "JSON file of flag -> value; command-line flags override it"),
    f("fromenv", Str, "", Builtin, "comma-separated flags to read from FLAGS_<name> (must exist)"),
    f("tryfromenv", Str, "", Builtin, "comma-separated flags to read from FLAGS_<name> if set"),
    f("undefok", Str, "", Builtin, "comma-separated flag names that may be unknown"),
    f("tab_completion_columns", Int32, "80", Ignored, IGN),
    f("tab_completion_word", Str, "", Ignored, IGN),
    f("alsologtoemail", Str, "", Ignored, IGN),
    f("colorlogtostderr", Bool, "false", Ignored, IGN),
    f("drop_log_memory", Bool, "true", Ignored, IGN),
    f("log_backtrace_at", Str, "", Ignored, IGN),
    f("log_link", Str, "", Ignored, IGN),
    f("log_prefix", Bool, "true", Ignored, IGN),
    f("logbuflevel", Int32, "0", Ignored, IGN),
    f("logbufsecs", Int32, "30", Ignored, IGN),
    f("logemaillevel", Int32, "999", Ignored, IGN),
    f("logfile_mode", Int32, "436", Ignored, IGN),
    f("logmailer", Str, "/bin/mail", Ignored, IGN),
    f("max_log_size", Int32, "1800", Ignored, IGN),
    f("stop_logging_if_full_disk", Bool, "false", Ignored, IGN),
    f("symbolize_stacktrace", Bool, "true", Ignored, IGN),
    f("vmodule", Str, "", Ignored, IGN),
];

/// Look a flag up by exact name.
pub fn find_flag(name: &str) -> Option<&'static FlagDef> {
    FLAGS.iter().find(|d| d.name == name)
}

/// A parsed flag value.
#[derive(Debug, Clone, PartialEq)]
enum Value {
    Bool(bool),
    Int(i64),
    UInt(u64),
    Double(f64),
    Str(String),
}

fn illegal(def: &FlagDef, raw: &str) -> String {
    format!(
        "ERROR: illegal value '{raw}' specified for {} flag '{}'",
        def.ty.name(),
        def.name
    )
}

fn failed_validation(name: &str, raw: &str) -> String {
    format!("ERROR: failed validation of new value '{raw}' for flag '{name}'")
}

fn parse_bool(raw: &str) -> Option<bool> {
    match raw.to_ascii_lowercase().as_str() {
        "true" | "t" | "yes" | "y" | "1" => Some(true),
        "false" | "f" | "no" | "n" | "0" => Some(false),
        _ => None,
    }
}

/// strtol-like: optional sign, decimal or `0x` hex, nothing else.
fn parse_signed(raw: &str) -> Option<i128> {
    let (neg, rest) = match raw.as_bytes().first() {
        Some(b'-') => (true, &raw[1..]),
        Some(b'+') => (false, &raw[1..]),
        _ => (false, raw),
    };
    if rest.is_empty() || rest.starts_with(['+', '-']) {
        return None;
    }
    let mag = if let Some(hex) = rest.strip_prefix("0x").or_else(|| rest.strip_prefix("0X")) {
        i128::from_str_radix(hex, 16).ok()?
    } else {
        rest.parse::<i128>().ok()?
    };
    Some(if neg { -mag } else { mag })
}

/// Parse a duration: non-negative integer with optional `ms`/`s`/`m`/`h`; result in ms.
pub fn parse_duration_ms(raw: &str) -> Option<u64> {
    let (digits, mult) = if let Some(d) = raw.strip_suffix("ms") {
        (d, 1)
    } else if let Some(d) = raw.strip_suffix('s') {
        (d, 1_000)
    } else if let Some(d) = raw.strip_suffix('m') {
        (d, 60_000)
    } else if let Some(d) = raw.strip_suffix('h') {
        (d, 3_600_000)
    } else {
        (raw, 1)
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse::<u64>().ok()?.checked_mul(mult)
}

fn parse_value(def: &FlagDef, raw: &str) -> Result<Value, String> {
    let int_in = |lo: i128, hi: i128| -> Result<i128, String> {
        match parse_signed(raw) {
            Some(v) if v >= lo && v <= hi => Ok(v),
            _ => Err(illegal(def, raw)),
        }
    };
    Ok(match def.ty {
        FlagType::Bool => Value::Bool(parse_bool(raw).ok_or_else(|| illegal(def, raw))?),
        FlagType::Int32 => Value::Int(int_in(i32::MIN.into(), i32::MAX.into())? as i64),
        FlagType::Int64 => Value::Int(int_in(i64::MIN.into(), i64::MAX.into())? as i64),
        FlagType::Uint32 if raw.starts_with('-') => return Err(illegal(def, raw)),
        FlagType::Uint32 => Value::UInt(int_in(0, u32::MAX.into())? as u64),
        FlagType::Uint64 if raw.starts_with('-') => return Err(illegal(def, raw)),
        FlagType::Uint64 => Value::UInt(int_in(0, u64::MAX.into())? as u64),
        FlagType::Double => match raw.trim().parse::<f64>() {
            Ok(v) if !v.is_nan() && !raw.trim().is_empty() => Value::Double(v),
            _ => return Err(illegal(def, raw)),
        },
        FlagType::Str => Value::Str(raw.to_string()),
        FlagType::Duration => {
            Value::UInt(parse_duration_ms(raw).ok_or_else(|| failed_validation(def.name, raw))?)
        }
    })
}

/// Where a setting came from (command line / flagfile / env, or the JSON config).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    CommandLine,
    ConfigFile,
}

#[derive(Debug, Clone)]
struct Setting {
    def: &'static FlagDef,
    value: Value,
    raw: String,
    source: Source,
}

/// Accumulates everything found while scanning arguments.
#[derive(Default)]
struct Scan {
    settings: Vec<Setting>,
    errors: Vec<String>,
    unknown: Vec<String>,
    undefok: HashSet<String>,
    config_path: Option<String>,
    help: Option<String>,
    version: bool,
}

const MAX_FLAGFILE_DEPTH: usize = 16;

impl Scan {
    /// Scan argv-style tokens. Returns after `--` or the end.
    fn scan_args(&mut self, args: &[String], depth: usize) {
        let mut i = 0;
        while i < args.len() {
            let arg = &args[i];
            i += 1;
            if arg == "--" {
                break;
            }
            let body = match arg.strip_prefix("--").or_else(|| arg.strip_prefix('-')) {
                Some(b) if !b.is_empty() => b,
                _ => continue, // positional (or a lone "-"): ignored
            };
            let (name, inline) = match body.split_once('=') {
                Some((n, v)) => (n, Some(v.to_string())),
                None => (body, None),
            };
            if let Some(def) = find_flag(name) {
                let raw = match inline {
                    Some(v) => v,
                    None if def.ty == FlagType::Bool => "true".to_string(),
                    None => {
                        if i < args.len() {
                            i += 1;
                            args[i - 1].clone()
                        } else {
                            self.errors
                                .push(format!("ERROR: flag '{name}' is missing its argument"));
                            continue;
                        }
                    }
                };
                self.set(def, &raw, depth);
            } else if let Some(def) = name.strip_prefix("no").and_then(find_flag) {
                if inline.is_some() {
                    self.unknown.push(name.to_string());
                } else if def.ty == FlagType::Bool {
                    self.set(def, "false", depth);
                } else {
                    self.errors.push(format!(
                        "ERROR: boolean value ({name}) specified for {} command line flag '{}'",
                        def.ty.name(),
                        def.name
                    ));
                }
            } else {
                self.unknown.push(name.to_string());
            }
        }
    }

    /// Record one command-line assignment (handling built-ins immediately).
    fn set(&mut self, def: &'static FlagDef, raw: &str, depth: usize) {
        let value = match parse_value(def, raw) {
            Ok(v) => v,
            Err(e) => {
                self.errors.push(e);
                return;
            }
        };
        if def.role == Builtin {
            self.builtin(def.name, &value, depth);
            return;
        }
        self.settings.push(Setting {
            def,
            value,
            raw: raw.to_string(),
            source: Source::CommandLine,
        });
    }

    fn builtin(&mut self, name: &str, value: &Value, depth: usize) {
        match (name, value) {
            ("help" | "helpfull" | "helpshort" | "helppackage" | "helpxml", Value::Bool(b)) => {
                if *b {
                    self.help = Some(String::new());
                } else if name == "help" {
                    self.help = None;
                }
            }
            ("helpmatch" | "helpon", Value::Str(s)) if !s.is_empty() => {
                self.help = Some(s.clone());
            }
            ("version", Value::Bool(b)) => self.version = *b,
            ("flagfile", Value::Str(path)) if !path.is_empty() => {
                for p in path.split(',').filter(|p| !p.is_empty()) {
                    self.flagfile(p, depth);
                }
            }
            ("config_path", Value::Str(path)) => {
                self.config_path = (!path.is_empty()).then(|| path.clone());
            }
            ("undefok", Value::Str(list)) => {
                self.undefok
                    .extend(list.split(',').map(str::trim).map(String::from));
            }
            ("fromenv" | "tryfromenv", Value::Str(list)) => {
                let required = name == "fromenv";
                for flag in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
                    let Some(def) = find_flag(flag) else {
                        self.errors.push(format!(
                            "ERROR: unknown command line flag '{flag}' (via --{name})"
                        ));
                        continue;
                    };
                    match std::env::var(format!("FLAGS_{flag}")) {
                        Ok(v) => self.set(def, &v, depth + 1),
                        Err(_) if required => self
                            .errors
                            .push(format!("ERROR: FLAGS_{flag} not found in environment")),
                        Err(_) => {}
                    }
                }
            }
            _ => {}
        }
    }

    fn flagfile(&mut self, path: &str, depth: usize) {
        if depth >= MAX_FLAGFILE_DEPTH {
            self.errors
                .push(format!("ERROR: flagfile '{path}' nested too deeply"));
            return;
        }
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) => {
                self.errors
                    .push(format!("ERROR: unable to open flagfile '{path}': {e}"));
                return;
            }
        };
        let mut tokens = Vec::new();
        for line in text.lines() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') || !line.starts_with('-') {
                continue;
            }
            // `--name=value` keeps the whole rest of the line as the value;
            // `--name value` is accepted too.
            match (line.find('='), line.find(char::is_whitespace)) {
                (None, Some(ws)) => {
                    tokens.push(line[..ws].to_string());
                    tokens.push(line[ws..].trim().to_string());
                }
                (Some(eq), Some(ws)) if ws < eq => {
                    tokens.push(line[..ws].to_string());
                    tokens.push(line[ws..].trim().to_string());
                }
                _ => tokens.push(line.to_string()),
            }
        }
        self.scan_args(&tokens, depth + 1);
    }
}

/// Load `--config_path`: a flat JSON object of flag name → value.
fn load_config_json(
    path: &str,
    errors: &mut Vec<String>,
    warnings: &mut Vec<String>,
) -> Vec<Setting> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) => {
            errors.push(format!("ERROR: unable to read config file '{path}': {e}"));
            return Vec::new();
        }
    };
    let obj = match serde_json::from_str::<serde_json::Value>(&text) {
        Ok(serde_json::Value::Object(m)) => m,
        Ok(_) => {
            errors.push(format!(
                "ERROR: config file '{path}' must hold a JSON object"
            ));
            return Vec::new();
        }
        Err(e) => {
            errors.push(format!(
                "ERROR: config file '{path}' is not valid JSON: {e}"
            ));
            return Vec::new();
        }
    };
    let mut out = Vec::new();
    for (key, val) in obj {
        let Some(def) = find_flag(&key) else {
            warnings.push(format!("config file '{path}': unknown key '{key}' ignored"));
            continue;
        };
        if def.role == Builtin {
            warnings.push(format!(
                "config file '{path}': key '{key}' is only valid on the command line; ignored"
            ));
            continue;
        }
        let raw = match &val {
            serde_json::Value::String(s) => s.clone(),
            serde_json::Value::Bool(b) => b.to_string(),
            serde_json::Value::Number(n) => n.to_string(),
            other => {
                errors.push(illegal(def, &other.to_string()));
                continue;
            }
        };
        match parse_value(def, &raw) {
            Ok(value) => out.push(Setting {
                def,
                value,
                raw,
                source: Source::ConfigFile,
            }),
            Err(e) => errors.push(format!("{e} (in config file '{path}')")),
        }
    }
    out
}

/// Text printed by `--help` (optionally only flags whose name contains `filter`).
pub fn help_text(filter: &str) -> String {
    let mut s = format!(
        "mooncake_master: Mooncake store master (Rust), version {}\n\n  Flags:\n",
        env!("CARGO_PKG_VERSION")
    );
    for d in FLAGS.iter().filter(|d| d.name.contains(filter)) {
        let help = match d.role {
            Feature(feat) => format!("requires {feat}, which this build does not implement"),
            Replaced(why) => format!("refused when true: {why}"),
            _ => d.help.to_string(),
        };
        s.push_str(&format!(
            "    -{} ({}) type: {} default: \"{}\"\n",
            d.name,
            help,
            d.ty.name(),
            d.default
        ));
    }
    s.trim_end().to_string()
}

/// Text printed by `--version`.
pub fn version_text() -> String {
    format!("mooncake_master version {}", env!("CARGO_PKG_VERSION"))
}

/// Merged view of the final flag values (defaults + config file + command line).
struct Flags {
    set: HashMap<&'static str, Setting>,
}

impl Flags {
    fn value(&self, name: &str) -> Value {
        if let Some(s) = self.set.get(name) {
            return s.value.clone();
        }
        match find_flag(name).map(|d| parse_value(d, d.default)) {
            Some(Ok(v)) => v,
            _ => {
                debug_assert!(false, "flag table default for '{name}' is invalid");
                Value::Str(String::new())
            }
        }
    }
    fn is_set(&self, name: &str) -> bool {
        self.set.contains_key(name)
    }
    fn raw(&self, name: &str) -> String {
        match (self.set.get(name), find_flag(name)) {
            (Some(s), _) => s.raw.clone(),
            (None, Some(d)) => d.default.to_string(),
            _ => String::new(),
        }
    }
    fn bool(&self, name: &str) -> bool {
        matches!(self.value(name), Value::Bool(true))
    }
    fn int(&self, name: &str) -> i64 {
        match self.value(name) {
            Value::Int(v) => v,
            Value::UInt(v) => v.min(i64::MAX as u64) as i64,
            _ => 0,
        }
    }
    fn uint(&self, name: &str) -> u64 {
        match self.value(name) {
            Value::UInt(v) => v,
            Value::Int(v) => v.max(0) as u64,
            _ => 0,
        }
    }
    fn double(&self, name: &str) -> f64 {
        match self.value(name) {
            Value::Double(v) => v,
            _ => 0.0,
        }
    }
    fn string(&self, name: &str) -> String {
        match self.value(name) {
            Value::Str(v) => v,
            _ => String::new(),
        }
    }
    /// Integer flag constrained to `lo..=hi`, else a validation error.
    fn int_range(&self, name: &str, lo: i64, hi: i64) -> Result<i64, String> {
        let v = self.int(name);
        if (lo..=hi).contains(&v) {
            Ok(v)
        } else {
            Err(failed_validation(name, &self.raw(name)))
        }
    }
}

/// Parse the master command line; warnings are logged through `tracing`.
pub fn parse_master_args(args: &[String]) -> FlagOutcome {
    let (outcome, warnings) = parse_master_args_with_warnings(args);
    for w in &warnings {
        tracing::warn!("{w}");
    }
    outcome
}

/// Parse the master command line, returning the warnings (deprecated flags,
/// ignored unimplemented flags, …) instead of logging them, so the caller can
/// log them once its logger is configured.
pub fn parse_master_args_with_warnings(args: &[String]) -> (FlagOutcome, Vec<String>) {
    let mut warnings = Vec::new();
    let exit_err = |errors: Vec<String>| FlagOutcome::Exit {
        code: 1,
        message: errors.join("\n"),
    };

    let mut scan = Scan::default();
    scan.scan_args(args.get(1..).unwrap_or(&[]), 0);
    for name in std::mem::take(&mut scan.unknown) {
        let base = name.strip_prefix("no").unwrap_or(&name);
        if !scan.undefok.contains(&name) && !scan.undefok.contains(base) {
            scan.errors
                .push(format!("ERROR: unknown command line flag '{name}'"));
        }
    }
    let mut errors = std::mem::take(&mut scan.errors);

    let mut merged: HashMap<&'static str, Setting> = HashMap::new();
    if let Some(path) = &scan.config_path {
        for s in load_config_json(path, &mut errors, &mut warnings) {
            merged.insert(s.def.name, s);
        }
    }
    for s in std::mem::take(&mut scan.settings) {
        merged.insert(s.def.name, s);
    }
    if !errors.is_empty() {
        return (exit_err(errors), warnings);
    }
    if let Some(filter) = &scan.help {
        return (
            FlagOutcome::Exit {
                code: 1,
                message: help_text(filter),
            },
            warnings,
        );
    }
    if scan.version {
        return (
            FlagOutcome::Exit {
                code: 0,
                message: version_text(),
            },
            warnings,
        );
    }

    let flags = Flags { set: merged };
    // Feature switches fail fast; other unimplemented flags only warn.
    for def in FLAGS {
        let Some(s) = flags.set.get(def.name) else {
            continue;
        };
        match def.role {
            Feature(feature) if s.value == Value::Bool(true) => {
                errors.push(format!(
                    "ERROR: flag --{} requires {feature}, which this build does not implement",
                    def.name
                ));
            }
            Replaced(why) if s.value == Value::Bool(true) => {
                errors.push(format!("ERROR: flag --{}: {why}", def.name));
            }
            Ignored if parse_value(def, def.default).ok().as_ref() != Some(&s.value) => {
                let origin = match s.source {
                    Source::CommandLine => "",
                    Source::ConfigFile => " (from config file)",
                };
                warnings.push(format!(
                    "flag --{}={}{origin} is not implemented by this build; ignored",
                    def.name, s.raw
                ));
            }
            _ => {}
        }
    }
    if !errors.is_empty() {
        return (exit_err(errors), warnings);
    }
    match build_config(&flags, &mut warnings) {
        Ok(cfg) => (FlagOutcome::Run(Box::new(cfg)), warnings),
        Err(e) => (exit_err(vec![e]), warnings),
    }
}

/// Translate the merged flags into the effective configuration.
fn build_config(fl: &Flags, warnings: &mut Vec<String>) -> Result<MasterConfig, String> {
    let mut cfg = MasterConfig {
        rpc_address: fl.string("rpc_address"),
        ..MasterConfig::default()
    };

    let iface = fl.string("rpc_interface");
    if !iface.is_empty() {
        match interface_ipv4(&iface) {
            Some(ip) => cfg.rpc_address = ip.to_string(),
            None => {
                return Err(format!(
                    "{}: interface has no IPv4 address",
                    failed_validation("rpc_interface", &iface)
                ))
            }
        }
    }

    let rpc_port = fl.int_range("rpc_port", 0, 65535)?;
    let port = fl.int_range("port", 0, 65535)?;
    if fl.is_set("port") {
        warnings.push("flag --port is deprecated; use --rpc_port".into());
    }
    cfg.rpc_port = if rpc_port != 0 { rpc_port } else { port } as u16;

    let threads = fl.int_range("rpc_thread_num", 0, 4096)?;
    let max_threads = fl.int_range("max_threads", 0, 4096)?;
    if fl.is_set("max_threads") {
        warnings.push("flag --max_threads is deprecated; use --rpc_thread_num".into());
    }
    cfg.rpc_thread_num = if fl.is_set("max_threads") && !fl.is_set("rpc_thread_num") {
        max_threads
    } else {
        threads
    } as u32;

    cfg.rpc_conn_timeout_seconds =
        fl.int_range("rpc_conn_timeout_seconds", 0, i32::MAX as i64)? as u32;
    cfg.rpc_enable_tcp_no_delay = fl.bool("rpc_enable_tcp_no_delay");
    cfg.enable_http_metadata_server = fl.bool("enable_http_metadata_server");
    cfg.http_metadata_server_host = fl.string("http_metadata_server_host");
    cfg.http_metadata_server_port = fl.int_range("http_metadata_server_port", 0, 65535)? as u16;
    cfg.metrics_host = fl.string("metrics_host");
    cfg.metrics_port = fl.int_range("metrics_port", 0, 65535)? as u16;
    cfg.enable_metric_reporting = fl.bool("enable_metric_reporting");
    cfg.default_kv_lease_ttl_ms = fl.uint("default_kv_lease_ttl");
    cfg.default_kv_soft_pin_ttl_ms = fl.uint("default_kv_soft_pin_ttl");
    cfg.max_kv_soft_pin_ttl_ms = fl.uint("max_kv_soft_pin_ttl");
    cfg.allow_evict_soft_pinned_objects = fl.bool("allow_evict_soft_pinned_objects");
    for name in ["eviction_high_watermark_ratio", "eviction_ratio"] {
        if !(0.0..=1.0).contains(&fl.double(name)) {
            return Err(failed_validation(name, &fl.raw(name)));
        }
    }
    cfg.eviction_high_watermark_ratio = fl.double("eviction_high_watermark_ratio");
    cfg.eviction_ratio = fl.double("eviction_ratio");
    cfg.client_ttl_sec = fl.int_range("client_ttl", 1, i64::MAX)?;
    cfg.put_start_discard_timeout_sec = fl.uint("put_start_discard_timeout_sec");
    cfg.put_start_release_timeout_sec = fl.uint("put_start_release_timeout_sec");
    cfg.max_pending_versions_per_key =
        fl.int_range("max_pending_versions_per_key", 1, u32::MAX as i64)? as u32;
    cfg.pending_version_wait_ms = fl.uint("pending_version_wait_ms");

    match fl.string("memory_allocator").as_str() {
        "offset" => {}
        "cachelib" => warnings.push(
            "--memory_allocator=cachelib is not available in this build; using offset".into(),
        ),
        _ => {
            return Err(failed_validation(
                "memory_allocator",
                &fl.raw("memory_allocator"),
            ))
        }
    }
    cfg.allocation_strategy = match fl.string("allocation_strategy").as_str() {
        "random" => AllocationStrategy::Random,
        "free_ratio_first" => AllocationStrategy::FreeRatioFirst,
        "local_first" => AllocationStrategy::LocalFirst,
        _ => {
            return Err(failed_validation(
                "allocation_strategy",
                &fl.raw("allocation_strategy"),
            ))
        }
    };
    cfg.enable_metadata_cleanup_on_timeout = fl.bool("enable_metadata_cleanup_on_timeout");
    cfg.auth_token_file = fl.string("auth_token_file");
    if !cfg.auth_token_file.is_empty() {
        let key = AuthKey::from_file(std::path::Path::new(&cfg.auth_token_file)).map_err(|e| {
            format!(
                "{}: {e}",
                failed_validation("auth_token_file", &fl.raw("auth_token_file"))
            )
        })?;
        cfg.auth = Some(key);
    }
    cfg.max_connections = u32::try_from(fl.uint("max_connections").max(1)).unwrap_or(u32::MAX);
    cfg.max_connections_per_peer =
        u32::try_from(fl.uint("max_connections_per_peer").max(1)).unwrap_or(u32::MAX);
    cfg.idle_connection_timeout_sec =
        u32::try_from(fl.uint("idle_connection_timeout_sec")).unwrap_or(u32::MAX);
    ha_config(fl, &mut cfg, warnings)?;
    cfg.log_level = log_level(fl, warnings);
    Ok(cfg)
}

/// The HA flags (upstream's names and forms): `--enable_ha`,
/// `--ha_backend_type` (etcd only), `--ha_backend_connstring` (or the legacy
/// `--etcd_endpoints` when it is empty), `--cluster_id`.
fn ha_config(fl: &Flags, cfg: &mut MasterConfig, warnings: &mut Vec<String>) -> Result<(), String> {
    cfg.enable_ha = fl.bool("enable_ha");
    cfg.cluster_id = fl.string("cluster_id");
    let conn = match fl.string("ha_backend_connstring") {
        c if c.trim().is_empty() => fl.string("etcd_endpoints"),
        c => c,
    };
    if !cfg.enable_ha {
        for name in [
            "ha_backend_connstring",
            "etcd_endpoints",
            "ha_backend_type",
            "cluster_id",
        ] {
            let default = find_flag(name).map(|d| d.default).unwrap_or_default();
            if fl.is_set(name) && fl.raw(name) != default {
                warnings.push(format!("flag --{name} has no effect without --enable_ha"));
            }
        }
        return Ok(());
    }
    let ty = fl.string("ha_backend_type");
    if ty != "etcd" {
        return Err(format!(
            "ERROR: --ha_backend_type={ty}: this build supports only the etcd HA backend"
        ));
    }
    if conn.trim().is_empty() {
        return Err(
            "ERROR: --enable_ha needs --ha_backend_connstring=h1:2379;h2:2379 (or the legacy --etcd_endpoints)"
                .into(),
        );
    }
    cfg.ha_endpoints = mooncake_common::ha::parse_etcd_endpoints(&conn).map_err(|e| {
        let name = if fl.string("ha_backend_connstring").trim().is_empty() {
            "etcd_endpoints"
        } else {
            "ha_backend_connstring"
        };
        format!("{}: {e}", failed_validation(name, &conn))
    })?;
    if cfg.cluster_id.is_empty() || cfg.cluster_id.contains('/') {
        return Err(format!(
            "{}: a cluster id is a non-empty name without '/'",
            failed_validation("cluster_id", &cfg.cluster_id)
        ));
    }
    let unspecified = cfg
        .rpc_address
        .trim_matches(['[', ']'])
        .parse::<std::net::IpAddr>()
        .is_ok_and(|ip| ip.is_unspecified());
    if unspecified || cfg.rpc_address.is_empty() {
        return Err(format!(
            "ERROR: --enable_ha needs a reachable --rpc_address (or --rpc_interface), not '{}': \
             the leader publishes rpc_address:rpc_port for the clients",
            cfg.rpc_address
        ));
    }
    Ok(())
}

/// Map the glog flags onto a tracing level. Without any log flag: `warn`.
fn log_level(fl: &Flags, warnings: &mut Vec<String>) -> String {
    const NAMES: [&str; 3] = ["info", "warn", "error"];
    let sev = |v: i64| NAMES[v.clamp(0, 2) as usize];
    let min = fl.int("minloglevel");
    let mut level = if fl.bool("logtostderr") || fl.bool("alsologtostderr") {
        sev(min)
    } else if fl.is_set("stderrthreshold") {
        sev(fl.int("stderrthreshold").max(min))
    } else if fl.is_set("minloglevel") {
        sev(min.max(1))
    } else {
        "warn"
    };
    if min >= 3 {
        level = "off";
    }
    let v = fl.int("v");
    if v >= 2 {
        level = "trace";
    } else if v == 1 {
        level = "debug";
    }
    if !fl.string("log_dir").is_empty() {
        warnings.push("--log_dir is ignored: this build logs to stderr only".into());
    }
    level.to_string()
}

/// IPv4 address of a network interface.
pub fn interface_ipv4(name: &str) -> Option<Ipv4Addr> {
    nix::ifaddrs::getifaddrs()
        .ok()?
        .filter(|ifa| ifa.interface_name == name)
        .find_map(|ifa| {
            ifa.address
                .as_ref()
                .and_then(|a| a.as_sockaddr_in())
                .map(|sin| sin.ip())
        })
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let mut seen = HashSet::new();
        for d in FLAGS {
            assert!(seen.insert(d.name), "duplicate flag {}", d.name);
            assert!(
                parse_value(d, d.default).is_ok(),
                "bad default for {}",
                d.name
            );
            if let Feature(_) | Replaced(_) = d.role {
                assert_eq!(d.ty, FlagType::Bool);
            }
        }
        for name in ["enable_oplog", "enable_snapshot", "enable_snapshot_restore"] {
            assert!(matches!(find_flag(name).map(|d| d.role), Some(Replaced(_))));
        }
        for name in [
            "enable_offload",
            "enable_cxl",
            "enable_multi_tenants",
            "enable_kv_events",
            "offload_on_evict",
            "promotion_on_hit",
        ] {
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
        assert_eq!(
            exit(&["--rpc_port=abc"]),
            (
                1,
                "ERROR: illegal value 'abc' specified for int32 flag 'rpc_port'".into()
            )
        );
        assert_eq!(
            exit(&["--client_ttl=1.5"]).1,
            "ERROR: illegal value '1.5' specified for int64 flag 'client_ttl'"
        );
        assert_eq!(
            exit(&["--put_start_release_timeout_sec=-1"]).1,
            "ERROR: illegal value '-1' specified for uint64 flag 'put_start_release_timeout_sec'"
        );
        assert_eq!(
            exit(&["--eviction_ratio=x"]).1,
            "ERROR: illegal value 'x' specified for double flag 'eviction_ratio'"
        );
        assert_eq!(
            exit(&["--kv_events_block_size=4294967296"]).1,
            "ERROR: illegal value '4294967296' specified for uint32 flag 'kv_events_block_size'"
        );
        assert_eq!(
            exit(&["--rpc_port=99999999999"]).1,
            "ERROR: illegal value '99999999999' specified for int32 flag 'rpc_port'"
        );
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
                    format!("ERROR: failed validation of new value '{bad}' for flag 'default_kv_lease_ttl'")
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
        for name in ["enable_offload", "promotion_on_hit", "enable_kv_events"] {
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
        assert!(
            w.iter()
                .any(|w| w.contains("--etcd_endpoints has no effect")),
            "{w:?}"
        );
    }

    #[test]
    fn unimplemented_flags_warn_only_when_non_default() {
        let (_, w) = run_w(&["--cluster_id=mooncake_cluster", "--max_retry_attempts=10"]);
        assert!(w.is_empty(), "{w:?}");
        let (_, w) = run_w(&["--max_retry_attempts=3", "--vmodule=x=2"]);
        assert_eq!(w.len(), 2, "{w:?}");
        assert!(w[0].contains("--max_retry_attempts=3"));
        // Type checked nonetheless.
        assert_eq!(exit(&["--max_retry_attempts=x"]).0, 1);
        assert_eq!(exit(&["--enable_disk_eviction=x"]).0, 1);
    }

    #[test]
    fn deprecated_port_and_threads() {
        let (c, w) = run_w(&["--port=6000"]);
        assert_eq!(c.rpc_port, 6000);
        assert!(w.iter().any(|w| w.contains("--port is deprecated")));
        let (c, _) = run_w(&["--port=6000", "--rpc_port=6001"]);
        assert_eq!(c.rpc_port, 6001);
        let (c, w) = run_w(&["--max_threads=8"]);
        assert_eq!(c.rpc_thread_num, 8);
        assert!(w.iter().any(|w| w.contains("max_threads")));
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
        let (_, w) = run_w(&["--memory_allocator=cachelib"]);
        assert!(w.iter().any(|w| w.contains("cachelib")));
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
        assert_eq!(w.len(), 1);
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
        assert!(w.iter().any(|w| w.contains("some_unknown_key")));
        // Explicit command-line flags override the file, wherever they appear.
        let c = run(&["--rpc_port=1", &format!("--config_path={path}")]);
        assert_eq!(c.rpc_port, 1);
        assert_eq!(c.metrics_port, 9200);

        let bad = tmp("bad.json", r#"{"rpc_port": "abc"}"#);
        let (code, msg) = exit(&[&format!("--config_path={bad}")]);
        assert_eq!(code, 1);
        assert!(msg.starts_with("ERROR: illegal value 'abc' specified for int32 flag 'rpc_port'"));
        let feat = tmp("feat.json", r#"{"enable_offload": true}"#);
        assert!(exit(&[&format!("--config_path={feat}")])
            .1
            .contains("enable_offload requires"));
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
}
