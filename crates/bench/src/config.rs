//! The command line: upstream's flag table (names, types, defaults, help),
//! parsed with the gflags rules shared by every binary of this stack, and
//! checked into a [`BenchConfig`].

use mooncake_common::gflags::{f, failed_validation, FlagDef, FlagRole, FlagType, Parsed, Program};
use mooncake_transfer::engine::Opcode;
use std::sync::OnceLock;

use FlagRole::{Core, Unsupported};
use FlagType::{Bool, Int32, Str, Uint32, Uint64};

/// Which side of the benchmark this process is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Registers buffers and serves them.
    Target,
    /// Reads from or writes to a target's buffers and reports throughput.
    Initiator,
}

/// A checked command line.
#[derive(Debug, Clone)]
pub struct BenchConfig {
    /// `--mode`.
    pub mode: Mode,
    /// `--local_server_name`: this engine's name (`host[:port]`).
    pub local_server_name: String,
    /// `--metadata_server` as the engine takes it (a bare `host:port` is etcd).
    pub metadata_server: String,
    /// `--operation`.
    pub operation: Opcode,
    /// `--protocol` (`rdma`, `tcp`, `barex`, `efa`: this build's transports).
    pub protocol: String,
    /// `--device_name`.
    pub device_name: String,
    /// `--segment_id`: the target's segment name.
    pub segment_id: String,
    /// `--buffer_size`, raised to what one round needs (with a warning).
    pub buffer_size: u64,
    /// `--batch_size`.
    pub batch_size: u64,
    /// `--block_size`.
    pub block_size: u64,
    /// `--duration`, seconds.
    pub duration_secs: u64,
    /// `--threads`.
    pub threads: u64,
    /// `--report_unit` (`GB` when the given one is not known).
    pub report_unit: String,
    /// `--report_precision`.
    pub report_precision: usize,
    /// The tracing level from the glog flags.
    pub log_level: String,
    /// `--log_dir`: the file log lines also go to.
    pub log_file: Option<mooncake_common::gflags::LogFile>,
}

/// Bytes per unit of `--report_unit` (upstream's table).
pub(crate) fn unit_bytes(unit: &str) -> Option<f64> {
    Some(match unit {
        "GB" => 1e9,
        "GiB" => (1u64 << 30) as f64,
        "Gb" => 1e9 / 8.0,
        "MB" => 1e6,
        "MiB" => (1u64 << 20) as f64,
        "Mb" => 1e6 / 8.0,
        "KB" => 1e3,
        "KiB" => 1024.0,
        "Kb" => 1e3 / 8.0,
        _ => return None,
    })
}

/// The protocols this build runs (over its own transports).
const PROTOCOLS: [&str; 4] = ["rdma", "tcp", "barex", "efa"];
/// Upstream's protocols for device memory, which this build does not move.
const DEVICE_PROTOCOLS: [&str; 7] = [
    "nvlink",
    "musa",
    "nvlink_intra",
    "hip",
    "sunrise_link",
    "ubshmem",
    "ub",
];

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_string())
}

/// The command line (built once: `--local_server_name` defaults to this
/// host's name, as upstream's does).
pub(crate) fn program() -> &'static Program {
    static PROGRAM: OnceLock<Program> = OnceLock::new();
    PROGRAM.get_or_init(|| {
        let host: &'static str = Box::leak(hostname().into_boxed_str());
        let flags: Vec<FlagDef> = vec![
            f("local_server_name", Str, host, Core, "Local server name for segment discovery"),
            f("metadata_server", Str, "192.168.3.77:2379", Core, "etcd server host address"),
            f(
                "mode",
                Str,
                "initiator",
                Core,
                "Running mode: initiator or target. Initiator node read/write data blocks from target node",
            ),
            f("operation", Str, "read", Core, "Operation type: read or write"),
            f(
                "protocol",
                Str,
                "rdma",
                Core,
                "Transfer protocol: rdma|barex|tcp|efa|nvlink|musa|nvlink_intra|hip|sunrise_link",
            ),
            f("device_name", Str, "mlx5_2", Core, "Device name to use, valid if protocol=rdma"),
            f(
                "nic_priority_matrix",
                Str,
                "",
                Unsupported,
                "Path to RDMA NIC priority matrix file (Advanced); this build drives no RDMA NIC",
            ),
            f("segment_id", Str, "192.168.3.76", Core, "Segment ID to access data"),
            f("buffer_size", Uint64, "1073741824", Core, "total size of data buffer"),
            f("batch_size", Int32, "128", Core, "Batch size"),
            f("block_size", Uint64, "65536", Core, "Block size for each transfer request"),
            f("duration", Int32, "10", Core, "Test duration in seconds"),
            f("threads", Int32, "12", Core, "Task submission threads"),
            f("auto_discovery", Bool, "false", Unsupported, "Enable RDMA device auto discovery; this build drives no RDMA device"),
            f("report_unit", Str, "GB", Core, "Report unit: GB|GiB|Gb|MB|MiB|Mb|KB|KiB|Kb"),
            f("report_precision", Uint32, "2", Core, "Report precision"),
            f("backend", Str, "classic", Core, "Backend to use: classic|tent"),
        ];
        Program {
            name: "transfer_engine_bench",
            title: "Mooncake transfer engine benchmark (Rust)",
            flags: Box::leak(flags.into_boxed_slice()),
        }
    })
}

/// What `value` names among the two `choices`, or the message that `what`
/// must be one of them.
fn one_of<T>(value: &str, what: &str, choices: [(&str, T); 2]) -> Result<T, String> {
    let msg = format!(
        "Unsupported {what}: must be '{}' or '{}'",
        choices[0].0, choices[1].0
    );
    choices
        .into_iter()
        .find(|(name, _)| *name == value)
        .map(|(_, v)| v)
        .ok_or(msg)
}

/// Parse and check the command line: the configuration and the warnings
/// to log, or the exit status and message (`ERROR: ...` for a bad one).
pub fn parse_bench_args(args: &[String]) -> Result<(BenchConfig, Vec<String>), (i32, String)> {
    let (parsed, mut warnings) = program().parse(args);
    let fl = match parsed {
        Parsed::Run(fl) => fl,
        Parsed::Exit { code, message } => return Err((code, message)),
    };
    let bad = |msg: String| (1, format!("ERROR: {msg}"));
    match fl.string("backend").as_str() {
        "classic" => {}
        "tent" => {
            return Err(bad(
                "the TENT backend is not part of this build: use --backend=classic".into(),
            ))
        }
        _ => {
            return Err(bad(
                "Unsupported backend: must be 'classic' or 'tent'".into()
            ))
        }
    }
    let mode = one_of(
        &fl.string("mode"),
        "mode",
        [("initiator", Mode::Initiator), ("target", Mode::Target)],
    )
    .map_err(bad)?;
    let operation = one_of(
        &fl.string("operation"),
        "operation",
        [("read", Opcode::Read), ("write", Opcode::Write)],
    )
    .map_err(bad)?;
    let protocol = fl.string("protocol");
    if DEVICE_PROTOCOLS.contains(&protocol.as_str()) {
        return Err(bad(format!(
            "--protocol={protocol} moves GPU/NPU memory, which this build does not (use rdma or tcp)"
        )));
    }
    if !PROTOCOLS.contains(&protocol.as_str()) {
        return Err(bad(format!("Unsupported protocol: {protocol}")));
    }
    let positive = |name: &str| -> Result<u64, (i32, String)> {
        match fl.uint(name) {
            0 => Err((1, failed_validation(name, &fl.raw(name)))),
            v => Ok(v),
        }
    };
    let batch_size = fl.int_range("batch_size", 1, 1 << 20).map_err(|e| (1, e))? as u64;
    let threads = fl.int_range("threads", 1, 4096).map_err(|e| (1, e))? as u64;
    let duration_secs = fl
        .int_range("duration", 0, i64::from(i32::MAX))
        .map_err(|e| (1, e))? as u64;
    let block_size = positive("block_size")?;
    let mut buffer_size = fl.uint("buffer_size");
    let need = block_size
        .checked_mul(batch_size)
        .and_then(|n| n.checked_mul(threads))
        .ok_or_else(|| bad("--block_size x --batch_size x --threads overflows".into()))?;
    if buffer_size < need {
        buffer_size = need;
        warnings.push(format!(
            "Invalid flag: buffer size is smaller than require_size, adjust to {need}"
        ));
    }
    let mut report_unit = fl.string("report_unit");
    if unit_bytes(&report_unit).is_none() {
        warnings.push(format!(
            "Invalid flag: report_unit only support GB|GiB|Gb|MB|MiB|Mb|KB|KiB|Kb, not support {report_unit} . Now use GB(default) as report_unit"
        ));
        report_unit = "GB".into();
    }
    let log_level = fl.log_level(&mut warnings);
    Ok((
        BenchConfig {
            mode,
            local_server_name: fl.string("local_server_name"),
            metadata_server: fl.string("metadata_server"),
            operation,
            protocol,
            device_name: fl.string("device_name"),
            segment_id: fl.string("segment_id"),
            buffer_size,
            batch_size,
            block_size,
            duration_secs,
            threads,
            report_unit,
            report_precision: fl.uint("report_precision").min(30) as usize,
            log_level,
            log_file: fl.log_file(),
        },
        warnings,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<(BenchConfig, Vec<String>), (i32, String)> {
        let mut v = vec!["transfer_engine_bench".to_string()];
        v.extend(args.iter().map(|s| s.to_string()));
        parse_bench_args(&v)
    }

    #[test]
    fn upstream_defaults() {
        let (c, w) = parse(&[]).expect("defaults parse");
        assert!(w.is_empty(), "{w:?}");
        assert_eq!(c.mode, Mode::Initiator);
        assert_eq!(c.metadata_server, "192.168.3.77:2379");
        assert_eq!(c.segment_id, "192.168.3.76");
        assert_eq!(c.operation, Opcode::Read);
        assert_eq!(c.protocol, "rdma");
        assert_eq!(
            (c.buffer_size, c.batch_size, c.block_size),
            (1 << 30, 128, 65536)
        );
        assert_eq!((c.duration_secs, c.threads), (10, 12));
        assert_eq!((c.report_unit.as_str(), c.report_precision), ("GB", 2));
        assert_eq!(c.local_server_name, hostname());
    }

    #[test]
    fn flags_in_both_spellings() {
        let (c, _) = parse(&[
            "--mode=target",
            "-operation",
            "write",
            "--protocol=tcp",
            "--block_size=4096",
            "--batch_size",
            "8",
            "--threads=2",
            "--duration=0",
        ])
        .expect("parse");
        assert_eq!(
            (c.mode, c.operation, c.protocol.as_str()),
            (Mode::Target, Opcode::Write, "tcp")
        );
        assert_eq!((c.block_size, c.batch_size, c.threads), (4096, 8, 2));
    }

    #[test]
    fn bad_command_lines_exit_1_saying_why() {
        for (args, says) in [
            (&["--nope=1"][..], "unknown command line flag 'nope'"),
            (&["--mode=both"], "Unsupported mode"),
            (&["--operation=copy"], "Unsupported operation"),
            (&["--protocol=carrier_pigeon"], "Unsupported protocol"),
            (&["--protocol=nvlink"], "GPU/NPU memory"),
            (&["--backend=tent"], "TENT"),
            (&["--backend=x"], "Unsupported backend"),
            (&["--threads=0"], "threads"),
            (&["--batch_size=0"], "batch_size"),
            (&["--block_size=0"], "block_size"),
            (&["--block_size=abc"], "block_size"),
            (&["--duration=-1"], "duration"),
        ] {
            match parse(args) {
                Err((1, msg)) => {
                    assert!(msg.starts_with("ERROR"), "{args:?}: {msg}");
                    assert!(msg.contains(says), "{args:?}: {msg}");
                }
                other => panic!("{args:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn small_buffers_grow_and_unknown_units_fall_back() {
        let (c, w) = parse(&[
            "--buffer_size=1",
            "--block_size=1024",
            "--batch_size=4",
            "--threads=2",
            "--report_unit=furlongs",
        ])
        .expect("parse");
        assert_eq!(c.buffer_size, 8192);
        assert_eq!(c.report_unit, "GB");
        assert_eq!(w.len(), 2, "{w:?}");
    }

    #[test]
    fn help_lists_upstreams_flags() {
        let text = program().help_text("");
        for flag in [
            "-mode",
            "-metadata_server",
            "-segment_id",
            "-operation",
            "-block_size",
            "-batch_size",
            "-duration",
            "-threads",
            "-protocol",
            "-buffer_size",
            "-report_unit",
            "-local_server_name",
        ] {
            assert!(text.contains(flag), "{flag}");
        }
    }
}
