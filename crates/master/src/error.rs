//! The master's error: why it cannot start or serve, with the cause kept
//! (`source`) for whoever logs it. Its text is what the master prints
//! before it exits 1.

use crate::ha::HaError;
use std::io;

/// A failure of the master process.
#[derive(Debug, thiserror::Error)]
pub enum MasterError {
    /// A flag value, or a combination of flags, the master cannot run with;
    /// the text names the flag and what is wrong with it.
    #[error("{0}")]
    Config(String),
    /// A listener could not be bound.
    #[error("ERROR: failed to bind the {what} on {addr}: {source}")]
    Bind {
        /// Which listener.
        what: &'static str,
        /// The address tried.
        addr: String,
        /// The operating system's answer.
        #[source]
        source: io::Error,
    },
    /// High availability could not start (etcd unreachable, a duplicate
    /// address).
    #[error(transparent)]
    Ha(#[from] HaError),
}

impl From<String> for MasterError {
    fn from(message: String) -> Self {
        MasterError::Config(message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bind_failure_says_which_listener_where_and_why() {
        let e = MasterError::Bind {
            what: "RPC listener",
            addr: "0.0.0.0:50051".into(),
            source: io::Error::from(io::ErrorKind::AddrInUse),
        };
        let text = e.to_string();
        assert!(
            text.starts_with("ERROR: failed to bind the RPC listener on 0.0.0.0:50051: "),
            "{text}"
        );
        assert!(std::error::Error::source(&e).is_some());
        assert_eq!(
            MasterError::from("ERROR: bad flag".to_string()).to_string(),
            "ERROR: bad flag"
        );
    }
}
