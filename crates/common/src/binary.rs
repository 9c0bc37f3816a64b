//! What every binary of the project does before its own work: print the
//! command line's exit message where gflags prints it, and log to stderr
//! at the level the flags (or `MC_LOG_LEVEL`) ask for, and stop on
//! SIGTERM or SIGINT.

/// Environment variable that overrides the binaries' log filter.
pub const LOG_ENV: &str = "MC_LOG_LEVEL";

/// Print the message of a command line that ends the program: errors on
/// stderr, help and version text on stdout.
pub fn print_exit(message: &str) {
    if message.starts_with("ERROR") {
        eprintln!("{message}");
    } else {
        println!("{message}");
    }
}

/// Install the stderr subscriber at `level` (`MC_LOG_LEVEL` overrides it;
/// an invalid filter falls back to `warn` and says so), then log the
/// command line's `warnings`.
pub fn start_logging(level: &str, warnings: &[String]) {
    use tracing_subscriber::EnvFilter;
    let wanted = std::env::var(LOG_ENV)
        .ok()
        .filter(|s| !s.trim().is_empty())
        .unwrap_or_else(|| level.to_string());
    let filter = EnvFilter::try_new(&wanted).unwrap_or_else(|e| {
        eprintln!("WARNING: invalid log level '{wanted}' ({e}); using 'warn'");
        EnvFilter::new("warn")
    });
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(filter)
        .try_init();
    for w in warnings {
        tracing::warn!("{w}");
    }
}

/// The signals that stop a binary gracefully: SIGTERM and SIGINT.
pub struct StopSignals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl StopSignals {
    /// Install the handlers of both (inside a tokio runtime).
    pub fn install() -> std::io::Result<StopSignals> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(StopSignals {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
        })
    }

    /// Wait for the next SIGTERM or SIGINT; returns its name.
    pub async fn recv(&mut self) -> &'static str {
        tokio::select! {
            _ = self.term.recv() => "SIGTERM",
            _ = self.int.recv() => "SIGINT",
        }
    }
}
