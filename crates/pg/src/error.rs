//! Error type of the PG core.

/// Errors surfaced to Python (mapped to `ValueError`, `RuntimeError`,
/// `TimeoutError` by the bindings).
#[derive(Debug, thiserror::Error)]
pub enum PgError {
    /// Bad arguments detected before any communication.
    #[error("{0}")]
    InvalidArgument(String),
    /// A deadline passed.
    #[error("{0}")]
    Timeout(String),
    /// Communication or protocol failure.
    #[error("{0}")]
    Comm(String),
    /// The group was shut down.
    #[error("process group has been shut down")]
    Shutdown,
    /// Operating-system error.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// Underlying error.
        source: std::io::Error,
    },
}

impl PgError {
    /// Wraps an I/O error with context.
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        PgError::Io {
            context: context.into(),
            source,
        }
    }
}
