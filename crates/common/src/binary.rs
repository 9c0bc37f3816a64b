//! What every binary of the project does before its own work: print the
//! command line's exit message where gflags prints it, and log to stderr
//! at the level the flags (or `MC_LOG_LEVEL`) ask for, and stop on
//! SIGTERM or SIGINT.

use crate::gflags::LogFile;

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

/// The filter for `level` (`MC_LOG_LEVEL` overrides it; an invalid filter
/// falls back to `warn` and says so).
fn filter(level: &str) -> tracing_subscriber::EnvFilter {
    use tracing_subscriber::EnvFilter;
    let wanted = std::env::var(LOG_ENV)
        .ok()
        .filter(|s| !s.trim().is_empty())
        .unwrap_or_else(|| level.to_string());
    EnvFilter::try_new(&wanted).unwrap_or_else(|e| {
        eprintln!("WARNING: invalid log level '{wanted}' ({e}); using 'warn'");
        EnvFilter::new("warn")
    })
}

/// Install the stderr subscriber at `level`, and the `--log_dir` file at
/// its own level when `file` is given (`MC_LOG_LEVEL` overrides both), then
/// log the command line's `warnings`. A log file that cannot be opened is
/// said on stderr and logging goes on there.
pub fn start_logging(level: &str, file: Option<&LogFile>, warnings: &[String]) {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::Layer;
    let stderr = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_filter(filter(level));
    let opened = file.map(|f| {
        std::fs::create_dir_all(f.path.parent().unwrap_or(std::path::Path::new(".")))
            .and_then(|()| {
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&f.path)
            })
            .map(|w| (w, f))
    });
    let (to_file, failed) = match opened {
        Some(Ok((w, f))) => (
            Some(
                tracing_subscriber::fmt::layer()
                    .with_writer(std::sync::Mutex::new(w))
                    .with_ansi(false)
                    .with_filter(filter(&f.level)),
            ),
            None,
        ),
        Some(Err(e)) => (None, Some(e)),
        None => (None, None),
    };
    let _ = tracing_subscriber::registry()
        .with(stderr)
        .with(to_file)
        .try_init();
    if let (Some(e), Some(f)) = (failed, file) {
        tracing::warn!(
            "cannot open the log file {}: {e}; logging to stderr only",
            f.path.display()
        );
    }
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
