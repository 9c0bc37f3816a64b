//! Process orchestration for `mooncake_master`: parse flags, set
//! up logging and the tokio runtime, bind RPC → metadata → admin listeners in
//! that order, log the effective configuration, start the core, then run
//! until SIGINT/SIGTERM.

use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;

use crate::admin::{serve_admin, AdminView};
use crate::config::{AllocationStrategy, MasterConfig};
use crate::error::MasterError;
use crate::flags::{parse_master_args_with_warnings, FlagOutcome};
use crate::gate::Gate;
use crate::ha::{lease_ttl_from_env, HaConfig, HaRuntime, HaStatus, Terms};
use crate::http_meta::serve_metadata;
use crate::metadata_kv::MetadataKv;
use crate::metrics::MasterMetrics;
use crate::state::MasterState;
use mooncake_common::binary::{self, StopSignals};

/// Environment variable overriding the log filter (e.g. `info`, `debug`).
pub use mooncake_common::binary::LOG_ENV;

/// Interval of the `--enable_metric_reporting` summary line.
pub const REPORT_INTERVAL: Duration = Duration::from_secs(10);

/// Run the master with `args` (`args[0]` is the program name); returns the
/// process exit code.
pub fn run_master(args: Vec<String>) -> i32 {
    let (outcome, warnings) = parse_master_args_with_warnings(&args);
    let cfg = match outcome {
        FlagOutcome::Run(cfg) => *cfg,
        FlagOutcome::Exit { code, message } => {
            binary::print_exit(&message);
            return code;
        }
    };
    binary::start_logging(&cfg.log_level, cfg.log_file.as_ref(), &warnings);
    // Before the runtime's threads exist (see `memory`).
    crate::memory::one_arena();

    let threads = worker_threads(&cfg);
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .thread_name("mc-master")
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("ERROR: failed to start the tokio runtime: {e}");
            return 1;
        }
    };
    let code = rt.block_on(run_async(cfg, threads));
    rt.shutdown_timeout(Duration::from_secs(2));
    code
}

/// Worker threads: `rpc_thread_num`, or 2–4 (by CPU count) when 0.
pub fn worker_threads(cfg: &MasterConfig) -> usize {
    if cfg.rpc_thread_num > 0 {
        cfg.rpc_thread_num as usize
    } else {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(2)
            .clamp(2, 4)
    }
}

/// `host:port`, bracketing bare IPv6 addresses.
pub fn host_port(host: &str, port: u16) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

async fn bind(
    what: &'static str,
    host: &str,
    port: u16,
) -> Result<(TcpListener, u16), MasterError> {
    let addr = host_port(host, port);
    let l = match TcpListener::bind(&addr).await {
        Ok(l) => l,
        Err(source) => return Err(MasterError::Bind { what, addr, source }),
    };
    let bound = l.local_addr().map(|a| a.port()).unwrap_or(port);
    Ok((l, bound))
}

fn strategy_name(s: AllocationStrategy) -> &'static str {
    match s {
        AllocationStrategy::Random => "random",
        AllocationStrategy::FreeRatioFirst => "free_ratio_first",
        AllocationStrategy::LocalFirst => "local_first",
    }
}

/// One-line `name=value` rendering of the effective configuration, using
/// flag names (durations in ms).
pub fn config_summary(cfg: &MasterConfig) -> String {
    format!(
        "rpc_address={} rpc_port={} rpc_thread_num={} rpc_conn_timeout_seconds={} \
         rpc_enable_tcp_no_delay={} enable_http_metadata_server={} \
         http_metadata_server_host={} http_metadata_server_port={} metrics_host={} \
         metrics_port={} enable_metric_reporting={} default_kv_lease_ttl={} \
         default_kv_soft_pin_ttl={} max_kv_soft_pin_ttl={} allow_evict_soft_pinned_objects={} \
         eviction_high_watermark_ratio={} eviction_ratio={} client_ttl={} \
         put_start_discard_timeout_sec={} put_start_release_timeout_sec={} \
         allocation_strategy={} enable_metadata_cleanup_on_timeout={} log_level={} \
         auth={} max_connections={} max_connections_per_peer={} \
         idle_connection_timeout_sec={} enable_ha={} ha_backend_connstring={} cluster_id={}",
        cfg.rpc_address,
        cfg.rpc_port,
        cfg.rpc_thread_num,
        cfg.rpc_conn_timeout_seconds,
        cfg.rpc_enable_tcp_no_delay,
        cfg.enable_http_metadata_server,
        cfg.http_metadata_server_host,
        cfg.http_metadata_server_port,
        cfg.metrics_host,
        cfg.metrics_port,
        cfg.enable_metric_reporting,
        cfg.default_kv_lease_ttl_ms,
        cfg.default_kv_soft_pin_ttl_ms,
        cfg.max_kv_soft_pin_ttl_ms,
        cfg.allow_evict_soft_pinned_objects,
        cfg.eviction_high_watermark_ratio,
        cfg.eviction_ratio,
        cfg.client_ttl_sec,
        cfg.put_start_discard_timeout_sec,
        cfg.put_start_release_timeout_sec,
        strategy_name(cfg.allocation_strategy),
        cfg.enable_metadata_cleanup_on_timeout,
        cfg.log_level,
        if cfg.auth.is_some() { "token" } else { "off" },
        cfg.max_connections,
        cfg.max_connections_per_peer,
        cfg.idle_connection_timeout_sec,
        cfg.enable_ha,
        cfg.ha_endpoints.join(";"),
        cfg.cluster_id,
    )
}

async fn run_async(mut cfg: MasterConfig, threads: usize) -> i32 {
    // Install signal handlers before anything is reachable, so an early
    // SIGTERM still takes the graceful path.
    let mut stop = match StopSignals::install() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("ERROR: failed to install signal handlers: {e}");
            return 1;
        }
    };

    // HA: reach etcd and register this master's address before binding
    // anything, so a bad backend fails fast (within 5 s) with its reason.
    let ha = if cfg.enable_ha {
        let status = Arc::new(HaStatus::ha(&cfg.cluster_id));
        let hcfg = HaConfig {
            endpoints: cfg.ha_endpoints.clone(),
            cluster_id: cfg.cluster_id.clone(),
            advertise: host_port(&cfg.rpc_address, cfg.rpc_port),
            lease_ttl: lease_ttl_from_env(),
        };
        match HaRuntime::connect(hcfg, Arc::clone(&status)).await {
            Ok(rt) => Some((rt, status)),
            Err(e) => {
                eprintln!("ERROR: --enable_ha: {e}");
                return 1;
            }
        }
    } else {
        None
    };

    // Bind order: RPC, metadata (if enabled), admin.
    let (rpc_listener, port) = match bind("RPC listener", &cfg.rpc_address, cfg.rpc_port).await {
        Ok(v) => v,
        Err(e) => {
            eprintln!("{e}");
            return 1;
        }
    };
    cfg.rpc_port = port;
    let mut meta_listener = None;
    if cfg.enable_http_metadata_server {
        match bind(
            "HTTP metadata server",
            &cfg.http_metadata_server_host,
            cfg.http_metadata_server_port,
        )
        .await
        {
            Ok((l, port)) => {
                cfg.http_metadata_server_port = port;
                meta_listener = Some(l);
            }
            Err(e) => {
                eprintln!("{e}");
                return 1;
            }
        }
    }
    let (admin_listener, port) =
        match bind("admin/metrics server", &cfg.metrics_host, cfg.metrics_port).await {
            Ok(v) => v,
            Err(e) => {
                eprintln!("{e}");
                return 1;
            }
        };
    cfg.metrics_port = port;

    eprintln!(
        "mooncake_master {}: effective configuration: {} worker_threads={threads}",
        env!("CARGO_PKG_VERSION"),
        config_summary(&cfg)
    );

    if cfg.auth.is_none() {
        tracing::warn!(
            "no --auth_token_file: any peer that reaches the RPC, metadata or data ports is trusted"
        );
    }
    let metrics = Arc::new(MasterMetrics::default());
    let metadata = meta_listener.as_ref().map(|_| Arc::new(MetadataKv::new()));
    let reporting = cfg.enable_metric_reporting;
    let http_limits = cfg.http_limits();
    let auth = cfg.auth.clone();
    let mut ha_task = None;
    let gate = match ha {
        None => {
            let state = MasterState::new(cfg, metrics.clone(), metadata.clone());
            state.start_background();
            Gate::single(state)
        }
        Some((rt, status)) => {
            let (c, m, md) = (cfg.clone(), metrics.clone(), metadata.clone());
            let gate = Gate::new(status, cfg, move || {
                MasterState::new(c.clone(), Arc::clone(&m), md.clone())
            });
            let terms: Arc<dyn Terms> = gate.clone();
            let stop = rt.stopper();
            ha_task = Some((tokio::spawn(rt.run(terms)), stop));
            gate
        }
    };

    tokio::spawn(crate::rpc::serve(rpc_listener, gate.clone()));
    if let (Some(l), Some(kv)) = (meta_listener, metadata) {
        tokio::spawn(serve_metadata(l, kv, auth, http_limits));
    }
    let view: Arc<dyn AdminView> = gate.clone();
    tokio::spawn(serve_admin(
        admin_listener,
        view.clone(),
        metrics,
        http_limits,
    ));
    if reporting {
        tokio::spawn(report_loop(view));
    }
    tracing::info!("mooncake_master is ready");

    let sig = stop.recv().await;
    tracing::info!("received {sig}; shutting down");
    if let Some((task, stop)) = ha_task {
        // A leader resigns, so that a standby takes over at once.
        stop.notify_one();
        let _ = tokio::time::timeout(Duration::from_secs(3), task).await;
    }
    drop(gate);
    0
}

/// Log a one-line summary every [`REPORT_INTERVAL`] at INFO.
async fn report_loop(view: Arc<dyn AdminView>) {
    let mut tick = tokio::time::interval(REPORT_INTERVAL);
    tick.tick().await; // the first tick fires immediately
    loop {
        tick.tick().await;
        let g = view.gauges();
        tracing::info!(
            "master summary: keys={} soft_pinned_keys={} allocated_bytes={} capacity_bytes={} active_clients={}",
            g.key_count,
            g.soft_pin_key_count,
            g.allocated_bytes,
            g.total_capacity_bytes,
            g.active_clients
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_uses_flag_names_and_ms() {
        let cfg = MasterConfig {
            default_kv_lease_ttl_ms: 2000,
            ..MasterConfig::default()
        };
        let s = config_summary(&cfg);
        assert!(s.contains("default_kv_lease_ttl=2000 "), "{s}");
        assert!(s.contains("allocation_strategy=random "), "{s}");
        assert!(s.contains(" auth=off "), "{s}");
        assert!(!s.contains('\n'));
    }

    #[test]
    fn host_port_brackets_ipv6() {
        assert_eq!(host_port("0.0.0.0", 1), "0.0.0.0:1");
        assert_eq!(host_port("::", 2), "[::]:2");
        assert_eq!(host_port("[::1]", 3), "[::1]:3");
    }

    #[test]
    fn thread_count() {
        let mut cfg = MasterConfig::default();
        assert!((2..=4).contains(&worker_threads(&cfg)));
        cfg.rpc_thread_num = 7;
        assert_eq!(worker_threads(&cfg), 7);
    }

    #[test]
    fn exit_paths() {
        assert_eq!(run_master(vec!["m".into(), "--version".into()]), 0);
        assert_eq!(run_master(vec!["m".into(), "--bogus".into()]), 1);
    }
}
