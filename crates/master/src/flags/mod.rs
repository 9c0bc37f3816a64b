//! gflags-compatible command line for `mooncake_master`: every upstream flag
//! is recognised and type-checked; the implemented ones configure the master,
//! feature switches this build lacks fail fast, and the rest warn when set.
//!
//! Owns the master's flag table ([`FLAGS`]) and the translation of the
//! parsed values into the effective [`MasterConfig`]. The parser itself
//! (syntax, `--flagfile`, `--config_path`, the gflags built-ins and glog's
//! logging flags) is the one every binary of this stack shares,
//! [`mooncake_common::gflags`].
//!
//! The table itself is [`table`]; turning parsed values into a
//! [`MasterConfig`] is [`config`].

mod config;
mod table;
#[cfg(test)]
mod tests;

use crate::config::MasterConfig;
pub use config::interface_ipv4;
use mooncake_common::gflags::Parsed;
pub use mooncake_common::gflags::{parse_duration_ms, FlagDef, FlagRole, FlagType};
pub use table::{FLAGS, MASTER};

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

/// Look a flag up by exact name (the master's and the common flags).
pub fn find_flag(name: &str) -> Option<&'static FlagDef> {
    MASTER.find(name)
}

/// Text printed by `--help` (optionally only flags whose name contains `filter`).
pub fn help_text(filter: &str) -> String {
    MASTER.help_text(filter)
}

/// Text printed by `--version`.
pub fn version_text() -> String {
    MASTER.version_text()
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
    let (parsed, mut warnings) = MASTER.parse(args);
    let flags = match parsed {
        Parsed::Run(flags) => flags,
        Parsed::Exit { code, message } => return (FlagOutcome::Exit { code, message }, warnings),
    };
    match config::build_config(&flags, &mut warnings) {
        Ok(cfg) => (FlagOutcome::Run(Box::new(cfg)), warnings),
        Err(e) => (
            FlagOutcome::Exit {
                code: 1,
                message: e.to_string(),
            },
            warnings,
        ),
    }
}
