//! The data path's error: the upstream code a caller returns, what
//! failed, with which peer, and the OS error underneath (kept as the
//! `source`, so a log line several layers up still says why).

use mooncake_common::ErrorCode;
use std::fmt;
use std::io;

/// A failed transfer.
#[derive(Debug)]
pub struct Error {
    code: ErrorCode,
    what: &'static str,
    peer: Option<String>,
    source: Option<io::Error>,
}

/// Result alias of the transfer crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// `what` failed with `code` (no peer, no OS error).
    pub fn new(code: ErrorCode, what: &'static str) -> Self {
        Error {
            code,
            what,
            peer: None,
            source: None,
        }
    }

    /// `what` with the peer at `peer` failed on the OS error `source`:
    /// TRANSFER_FAIL.
    pub fn io(what: &'static str, peer: &str, source: io::Error) -> Self {
        Error {
            code: ErrorCode::TransferFail,
            what,
            peer: Some(peer.to_string()),
            source: Some(source),
        }
    }

    /// The same error, naming `peer`.
    pub fn with_peer(mut self, peer: &str) -> Self {
        self.peer = Some(peer.to_string());
        self
    }

    /// The upstream code a caller returns for it.
    pub fn code(&self) -> ErrorCode {
        self.code
    }

    /// The peer involved, when one was.
    pub fn peer(&self) -> Option<&str> {
        self.peer.as_deref()
    }

    /// The OS error underneath, when there was one.
    pub fn os_error(&self) -> Option<&io::Error> {
        self.source.as_ref()
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.what)?;
        if let Some(p) = &self.peer {
            write!(f, " (peer {p})")?;
        }
        match &self.source {
            Some(e) => write!(f, ": {e}"),
            None => write!(f, ": {}", self.code.name()),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_ref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

impl From<ErrorCode> for Error {
    fn from(code: ErrorCode) -> Self {
        Error::new(code, "transfer")
    }
}

impl From<Error> for ErrorCode {
    fn from(e: Error) -> Self {
        e.code
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_read_names_the_peer_and_the_os_error() {
        let e = Error::io(
            "data read",
            "10.0.0.2:15000",
            io::Error::from(io::ErrorKind::ConnectionRefused),
        );
        assert_eq!(e.code(), ErrorCode::TransferFail);
        assert_eq!(e.peer(), Some("10.0.0.2:15000"));
        let text = e.to_string();
        assert!(
            text.starts_with("data read (peer 10.0.0.2:15000): "),
            "{text}"
        );
        assert!(text.contains("refused"), "{text}");
        assert!(std::error::Error::source(&e).is_some());
        let bare = Error::new(ErrorCode::InvalidParams, "range check");
        assert_eq!(bare.to_string(), "range check: INVALID_PARAMS");
        assert_eq!(ErrorCode::from(bare), ErrorCode::InvalidParams);
    }
}
