//! `mooncake_client`: the standalone store daemon. It sets up one store
//! client (a segment of `--global_segment_size` bytes lent to the pool,
//! mounted on the master at `--master_server_address`), serves the dummy
//! clients of this host that attach with `setup_dummy("host:<port>")`, and
//! runs until SIGTERM or SIGINT, then unmounts cleanly.
//!
//! Flags and defaults are upstream's; the command line follows the gflags
//! rules every binary of this stack shares ([`mooncake_common::gflags`]):
//! an unknown flag exits with status 1 and gflags' message.
//!
//! A master that cannot be reached is retried every second, with a warning
//! each time, until it answers or the daemon is stopped. A port another
//! daemon serves on this host is an error (exit 1).

use crate::daemon::DummyServer;
use mooncake_client::{Client, ClientConfig};
use mooncake_common::binary;
use mooncake_common::gflags::{f, failed_validation, FlagRole, FlagType, Parsed, Program};
use std::net::TcpListener;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use FlagRole::Core;
use FlagType::{Bool, Int32, Str};

/// `mooncake_client`'s own flags (upstream's names, types and defaults).
#[rustfmt::skip]
pub static FLAGS: &[mooncake_common::gflags::FlagDef] = &[
    f("host", Str, "0.0.0.0", Core, "Local hostname"),
    f("metadata_server", Str, "http://127.0.0.1:8080/metadata", Core, "Metadata server connection string"),
    f("device_names", Str, "", Core, "Device names"),
    f("master_server_address", Str, "127.0.0.1:50051", Core, "Master server address"),
    f("protocol", Str, "tcp", Core, "Protocol"),
    f("port", Int32, "50052", Core, "Real Client service port"),
    f("global_segment_size", Str, "4 GB", Core, "Size of global segment"),
    f("local_buffer_size", Str, "0", Core, "Size of local buffer (e.g., 16MB, 1GB)"),
    f("threads", Int32, "1", Core, "Number of threads for client service (each dummy client connection has a thread of its own)"),
    f("tenant_id", Str, "default", Core, "Tenant identifier"),
    f("enable_offload", Bool, "false", Core, "Enable SSD offload: a disk tier in MOONCAKE_OFFLOAD_FILE_STORAGE_PATH, which the master has objects copied to (see its --enable_offload)"),
    f("start_offload_rpc_server", Bool, "true", Core, "Serve disk-tier reads to other processes; effective only with --enable_offload"),
    f("enable_http_server", Bool, "false", Core, "Enable embedded HTTP server for health check and metrics"),
    f("http_port", Int32, "9300", Core, "Port for client HTTP server (only effective when --enable_http_server=true)"),
];

/// The `mooncake_client` command line.
pub static CLIENT: Program = Program {
    name: "mooncake_client",
    title: "Mooncake standalone store client (Rust)",
    flags: FLAGS,
};

/// What the daemon runs with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DaemonConfig {
    /// The store client's setup arguments.
    pub client: ClientConfig,
    /// The service port (`--port`).
    pub port: u16,
    /// `--host`, where the service port is bound.
    pub host: String,
    /// The tracing level from the glog flags.
    pub log_level: String,
    /// `--log_dir`: the file log lines also go to.
    pub log_file: Option<mooncake_common::gflags::LogFile>,
}

/// Parse the command line: the configuration and the warnings to log, or
/// the exit status and message.
pub fn parse_client_args(args: &[String]) -> Result<(DaemonConfig, Vec<String>), (i32, String)> {
    let (parsed, mut warnings) = CLIENT.parse(args);
    let fl = match parsed {
        Parsed::Run(fl) => fl,
        Parsed::Exit { code, message } => return Err((code, message)),
    };
    let size = |name: &str| {
        mooncake_common::size::parse_size(&fl.string(name))
            .ok_or_else(|| (1, failed_validation(name, &fl.raw(name))))
    };
    let port = fl.int_range("port", 1, 65535).map_err(|e| (1, e))? as u16;
    let http_port = fl.int_range("http_port", 0, 65535).map_err(|e| (1, e))? as u64;
    fl.int_range("threads", 1, 4096).map_err(|e| (1, e))?;
    if fl.is_set("threads") {
        warnings.push(
            "--threads has no effect: every dummy client connection is served on a thread of its own"
                .into(),
        );
    }
    let host = fl.string("host");
    let client = ClientConfig {
        local_hostname: host.clone(),
        metadata_server: fl.string("metadata_server"),
        global_segment_size: size("global_segment_size")?,
        local_buffer_size: size("local_buffer_size")?,
        protocol: fl.string("protocol"),
        rdma_devices: fl.string("device_names"),
        master_server_addr: fl.string("master_server_address"),
        tenant_id: fl.string("tenant_id"),
        enable_client_http_server: fl.bool("enable_http_server"),
        client_http_port: http_port,
        enable_ssd_offload: fl.bool("enable_offload"),
        serve_disk_reads: fl.bool("start_offload_rpc_server"),
        ..ClientConfig::default()
    };
    if fl.is_set("start_offload_rpc_server") && !fl.bool("enable_offload") {
        warnings.push("--start_offload_rpc_server has no effect without --enable_offload".into());
    }
    let mut notes = Vec::new();
    client
        .check(&mut notes)
        .map_err(|e| (1, format!("ERROR: the store client cannot be set up: {e}")))?;
    warnings.extend(notes);
    let log_level = fl.log_level(&mut warnings);
    Ok((
        DaemonConfig {
            client,
            port,
            host,
            log_level,
            log_file: fl.log_file(),
        },
        warnings,
    ))
}

/// Set up the store client, retrying while the master (or the metadata
/// server) cannot be reached; `None` when stopped first.
fn setup_client(cfg: &ClientConfig, stop: &AtomicBool) -> Option<Arc<Client>> {
    let mut tries = 0u64;
    loop {
        match Client::setup(cfg.clone()) {
            Ok(c) => {
                if tries > 0 {
                    tracing::warn!(master = %cfg.master_server_addr, "store client set up after {tries} retries");
                }
                return Some(c);
            }
            Err(e) => {
                tries += 1;
                tracing::warn!(
                    master = %cfg.master_server_addr,
                    attempt = tries,
                    "cannot set up the store client ({e}); retrying in 1 s"
                );
            }
        }
        for _ in 0..10 {
            if stop.load(Ordering::Acquire) {
                return None;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// The service port: a plain TCP listener on `--host:--port` that answers
/// every connection with one line naming the abstract socket dummy clients
/// use; it holds the port for this daemon.
fn bind_service_port(host: &str, port: u16) -> std::io::Result<TcpListener> {
    let l = TcpListener::bind((host, port))?;
    let line = format!(
        "mooncake_client {}: dummy clients of this host attach on the abstract socket @{}\n",
        env!("CARGO_PKG_VERSION"),
        crate::wire::socket_name(port)
    );
    let accept = l.try_clone()?;
    std::thread::Builder::new()
        .name("mc-client-port".into())
        .spawn(move || {
            use std::io::Write;
            for c in accept.incoming().flatten() {
                let mut c = c;
                let _ = c.set_write_timeout(Some(Duration::from_secs(1)));
                let _ = c.write_all(line.as_bytes());
            }
        })?;
    Ok(l)
}

/// Run the daemon with `args` (`args[0]` is the program name); the exit status.
pub fn run_client(args: Vec<String>) -> i32 {
    let (cfg, warnings) = match parse_client_args(&args) {
        Ok(x) => x,
        Err((code, message)) => {
            binary::print_exit(&message);
            return code;
        }
    };
    binary::start_logging(&cfg.log_level, cfg.log_file.as_ref(), &warnings);
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("ERROR: cannot start the signal runtime: {e}");
            return 1;
        }
    };
    // SIGTERM / SIGINT set `stop` and wake the main thread.
    let stop = Arc::new(AtomicBool::new(false));
    let (stopped_tx, stopped_rx) = std::sync::mpsc::channel::<()>();
    let signals = rt.block_on(async {
        use tokio::signal::unix::{signal, SignalKind};
        Ok::<_, std::io::Error>((
            signal(SignalKind::terminate())?,
            signal(SignalKind::interrupt())?,
        ))
    });
    let (mut term, mut int) = match signals {
        Ok(s) => s,
        Err(e) => {
            eprintln!("ERROR: cannot install signal handlers: {e}");
            return 1;
        }
    };
    let flag = Arc::clone(&stop);
    let waiter = std::thread::Builder::new()
        .name("mc-client-signals".into())
        .spawn(move || {
            rt.block_on(async {
                tokio::select! {
                    _ = term.recv() => {},
                    _ = int.recv() => {},
                }
            });
            flag.store(true, Ordering::Release);
            let _ = stopped_tx.send(());
        });
    if let Err(e) = waiter {
        eprintln!("ERROR: cannot start the signal thread: {e}");
        return 1;
    }
    // The service port first: a second daemon for this port fails at once.
    let _port = match bind_service_port(&cfg.host, cfg.port) {
        Ok(l) => l,
        Err(e) => {
            eprintln!(
                "ERROR: cannot bind the service port {}:{}: {e} (another mooncake_client serves it?)",
                cfg.host, cfg.port
            );
            return 1;
        }
    };
    let Some(client) = setup_client(&cfg.client, &stop) else {
        tracing::warn!("stopped before the store client was set up");
        return 0;
    };
    let server = match DummyServer::start(Arc::clone(&client), cfg.port) {
        Ok(s) => s,
        Err(e) => {
            eprintln!(
                "ERROR: {e} (another mooncake_client serves port {}?)",
                cfg.port
            );
            client.close();
            return 1;
        }
    };
    tracing::warn!(
        segment = %client.hostname(),
        port = cfg.port,
        "mooncake_client serving dummy clients on @{}",
        crate::wire::socket_name(cfg.port)
    );
    let _ = stopped_rx.recv();
    tracing::warn!(
        dummies = server.dummies(),
        "mooncake_client stopping: unmounting"
    );
    server.stop();
    client.close();
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Vec<String> {
        std::iter::once("mooncake_client")
            .chain(list.iter().copied())
            .map(String::from)
            .collect()
    }

    #[test]
    fn upstream_defaults() {
        let (c, w) = parse_client_args(&args(&[])).unwrap();
        assert!(w.is_empty(), "{w:?}");
        assert_eq!(c.host, "0.0.0.0");
        assert_eq!(c.port, 50052);
        assert_eq!(c.client.local_hostname, "0.0.0.0");
        assert_eq!(c.client.metadata_server, "http://127.0.0.1:8080/metadata");
        assert_eq!(c.client.master_server_addr, "127.0.0.1:50051");
        assert_eq!(c.client.protocol, "tcp");
        assert_eq!(c.client.rdma_devices, "");
        assert_eq!(c.client.global_segment_size, 4 << 30);
        assert_eq!(c.client.local_buffer_size, 0);
        assert_eq!(c.client.tenant_id, "default");
        assert!(!c.client.enable_client_http_server);
        assert_eq!(c.client.client_http_port, 9300);
        assert_eq!(c.log_level, "warn");
    }

    #[test]
    fn flags_reach_the_client() {
        let (c, _) = parse_client_args(&args(&[
            "--host=127.0.0.1",
            "--port=6000",
            "--global_segment_size=256MB",
            "--local_buffer_size",
            "16 MB",
            "--master_server_address=10.0.0.1:7000",
            "--metadata_server=P2PHANDSHAKE",
        ]))
        .unwrap();
        assert_eq!(c.port, 6000);
        assert_eq!(c.client.local_hostname, "127.0.0.1");
        assert_eq!(c.client.global_segment_size, 256 << 20);
        assert_eq!(c.client.local_buffer_size, 16 << 20);
        assert_eq!(c.client.master_server_addr, "10.0.0.1:7000");
        assert_eq!(c.client.metadata_server, "P2PHANDSHAKE");
    }

    #[test]
    fn bad_command_lines_exit_with_gflags_messages() {
        let e = parse_client_args(&args(&["--bogus=1"])).unwrap_err();
        assert_eq!(
            e,
            (1, "ERROR: unknown command line flag 'bogus'".to_string())
        );
        let e = parse_client_args(&args(&["--port=x"])).unwrap_err();
        assert_eq!(
            e,
            (
                1,
                "ERROR: illegal value 'x' specified for int32 flag 'port'".to_string()
            )
        );
        let e = parse_client_args(&args(&["--global_segment_size=lots"])).unwrap_err();
        assert_eq!(
            e,
            (
                1,
                "ERROR: failed validation of new value 'lots' for flag 'global_segment_size'"
                    .to_string()
            )
        );
        let (c, _) = parse_client_args(&args(&[
            "--enable_offload",
            "--start_offload_rpc_server=false",
        ]))
        .expect("offload flags");
        assert!(c.client.enable_ssd_offload);
        assert!(!c.client.serve_disk_reads);
        let (c, _) = parse_client_args(&args(&[])).expect("defaults");
        assert!(!c.client.enable_ssd_offload);
        assert!(c.client.serve_disk_reads);
        let (c, _) = parse_client_args(&args(&["--tenant_id=t1"])).expect("a tenant");
        assert_eq!(c.client.tenant_id, "t1");
        let e = parse_client_args(&args(&["--tenant_id=_t1"])).unwrap_err();
        assert_eq!(e.0, 1);
        assert!(e.1.contains("tenant_id"), "{}", e.1);
        let (code, help) = parse_client_args(&args(&["--help"])).unwrap_err();
        assert_eq!(code, 1);
        assert!(help.starts_with("mooncake_client: "), "{help}");
        assert!(help.contains(
            "-global_segment_size (Size of global segment) type: string default: \"4 GB\""
        ));
    }
}
