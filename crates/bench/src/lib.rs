//! `transfer_engine_bench`: upstream's transfer-engine benchmark over this
//! stack's transfer engine (`mooncake_transfer::engine`). Upstream's gflags, defaults
//! and output: a `target` process registers one buffer of `--buffer_size`
//! bytes per NUMA node and serves until SIGINT or SIGTERM; an `initiator`
//! process reads from (or writes to) the target's buffers for `--duration`
//! seconds with `--threads` threads, each submitting batches of
//! `--batch_size` blocks of `--block_size` bytes, then prints
//!
//! ```text
//! Test completed: duration 10.00, batch count 1234, throughput 5.18 GB/s
//! ```
//!
//! Peers are found as the engine finds them (`--metadata_server`:
//! `P2PHANDSHAKE`, `http://host:port/metadata`, etcd). A segment that
//! cannot be reached or holds too little memory is an error before any
//! transfer (exit 1), and so is a failed transfer.

mod config;
mod run;

use mooncake_common::binary;

pub use config::{parse_bench_args, BenchConfig, Mode};
pub use run::{run_initiator, run_target, Report};

/// Run the benchmark with `args` (`args[0]` is the program name); returns
/// the exit status.
pub fn run_transfer_engine_bench(args: Vec<String>) -> i32 {
    let (cfg, warnings) = match parse_bench_args(&args) {
        Ok(v) => v,
        Err((code, message)) => {
            binary::print_exit(&message);
            return code;
        }
    };
    binary::start_logging(&cfg.log_level, cfg.log_file.as_ref(), &warnings);
    let result = match cfg.mode {
        Mode::Target => run_target(&cfg),
        Mode::Initiator => run_initiator(&cfg).map(|report| {
            eprintln!("{}", report.line(&cfg));
        }),
    };
    match result {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("ERROR: {e}");
            1
        }
    }
}
