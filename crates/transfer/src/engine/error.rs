//! The engine's one error type: what went wrong ([`ErrorKind`]), with whom
//! (the peer's segment name, when a peer was involved), a sentence for the
//! log, and the underlying IO error when there is one. Bindings map the kind
//! to a return code in one place; the text is what they log.

use std::fmt;
use std::io;

/// What went wrong, independent of the words used to say it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// A call that needs `initialize` came before it.
    NotInitialized,
    /// `initialize` was called on an engine that already runs.
    AlreadyInitialized,
    /// An argument is malformed (bad name, bad protocol string, bad sizes).
    InvalidArgument,
    /// A memory region of zero bytes.
    ZeroLength,
    /// A region that overlaps one already registered.
    Overlap,
    /// A region that is not mapped memory of this process.
    NotMapped,
    /// Unregistering an address that starts no registered region.
    NotRegistered,
    /// Unregistering (or freeing) memory that a transfer is still using.
    InUse,
    /// The lists of a batch call differ in length.
    LengthMismatch,
    /// Lengths or addresses whose sum does not fit in 64 bits.
    Overflow,
    /// A local buffer of a transfer lies outside the memory registered here.
    LocalNotRegistered,
    /// The peer refused a range that lies outside the memory it registered.
    OutOfBounds,
    /// The target's name does not resolve to an engine (no such metadata
    /// entry, or a host name that does not resolve).
    UnknownPeer,
    /// The target could not be reached, or failed mid-transfer.
    Unreachable,
    /// The peer refused our cluster token (or we refused its lack of one).
    AuthRefused,
    /// The target did not answer within the transfer timeout.
    Timeout,
    /// The RPC port could not be bound.
    AddressInUse,
    /// The metadata server failed or is malformed.
    Metadata,
    /// A batch id that names no batch in flight.
    UnknownBatch,
    /// A CUDA pointer or call without a usable CUDA driver.
    Cuda,
    /// An internal failure (a thread could not be started, ...).
    Internal,
}

/// An engine failure: its kind, the peer it concerns, what happened and why.
#[derive(Debug, thiserror::Error)]
pub struct EngineError {
    kind: ErrorKind,
    peer: Option<String>,
    detail: String,
    #[source]
    source: Option<io::Error>,
}

impl fmt::Display for EngineError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.detail)?;
        if let Some(p) = &self.peer {
            write!(f, " (peer {p})")?;
        }
        if let Some(s) = &self.source {
            write!(f, ": {s}")?;
        }
        Ok(())
    }
}

impl EngineError {
    /// A failure of `kind` described by `detail`.
    pub fn new(kind: ErrorKind, detail: impl Into<String>) -> EngineError {
        EngineError {
            kind,
            peer: None,
            detail: detail.into(),
            source: None,
        }
    }

    /// The same failure, concerning `peer`.
    pub fn with_peer(mut self, peer: &str) -> EngineError {
        self.peer = Some(peer.to_string());
        self
    }

    /// The same failure, caused by `source`.
    pub fn with_source(mut self, source: io::Error) -> EngineError {
        self.source = Some(source);
        self
    }

    /// What went wrong.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The peer concerned, if any.
    pub fn peer(&self) -> Option<&str> {
        self.peer.as_deref()
    }

    /// An IO failure talking to `peer`: a timeout, a refused token, or the
    /// peer being unreachable or gone.
    pub(crate) fn io(peer: &str, what: &str, e: io::Error) -> EngineError {
        let kind = match e.kind() {
            io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock => ErrorKind::Timeout,
            io::ErrorKind::PermissionDenied => ErrorKind::AuthRefused,
            _ => ErrorKind::Unreachable,
        };
        EngineError::new(kind, what.to_string())
            .with_peer(peer)
            .with_source(e)
    }
}

/// Results of engine calls.
pub type Result<T, E = EngineError> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_names_peer_and_cause() {
        let e = EngineError::new(ErrorKind::Unreachable, "cannot connect")
            .with_peer("h:1")
            .with_source(io::Error::from(io::ErrorKind::ConnectionRefused));
        let s = e.to_string();
        assert!(s.starts_with("cannot connect (peer h:1): "), "{s}");
        assert_eq!(e.kind(), ErrorKind::Unreachable);
        assert_eq!(e.peer(), Some("h:1"));
        let t = EngineError::io("p", "read", io::Error::from(io::ErrorKind::TimedOut));
        assert_eq!(t.kind(), ErrorKind::Timeout);
    }
}
