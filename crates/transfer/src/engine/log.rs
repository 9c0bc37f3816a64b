//! Where the engine's own log lines go: events that no caller receives as
//! a return value (a target refusing a peer's out-of-bounds range, the
//! cross-process copy falling back to TCP, a protocol run over other
//! transports). A binding installs a sink once (Python's `mooncake.engine`
//! logger); without one, lines go to `tracing`.

use std::sync::OnceLock;

/// Severity of a line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    /// Worth knowing.
    Info,
    /// Something was refused or degraded.
    Warning,
}

type Sink = Box<dyn Fn(Level, &str) + Send + Sync>;

static SINK: OnceLock<Sink> = OnceLock::new();

/// Send the engine's lines to `sink` from now on (the first call wins).
pub fn set_sink(sink: impl Fn(Level, &str) + Send + Sync + 'static) {
    let _ = SINK.set(Box::new(sink));
}

/// Log one line.
pub(crate) fn emit(level: Level, msg: &str) {
    match SINK.get() {
        Some(s) => s(level, msg),
        None => match level {
            Level::Info => tracing::info!("{msg}"),
            Level::Warning => tracing::warn!("{msg}"),
        },
    }
}
