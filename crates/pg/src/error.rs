//! The crate's one error type. Every failure carries its reason as data
//! (which rank, which sizes, which rule), so callers never re-derive it; the
//! Python binding maps [`PgError::kind`] to an exception class in one place.

use mooncake_common::AuthKey;
use std::sync::Arc;

/// How a failure is surfaced to Python: `ValueError`, `TimeoutError` or
/// `RuntimeError`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// Bad arguments, detected before any communication (`ValueError`).
    InvalidArgument,
    /// A deadline passed (`TimeoutError`).
    Timeout,
    /// Communication, protocol or state failure (`RuntimeError`).
    Runtime,
}

/// Errors of the PG core.
#[derive(Clone, Debug, thiserror::Error)]
pub enum PgError {
    /// A rank outside `[0, size)`.
    #[error("rank {rank} is outside a group of size {size}")]
    RankOutOfRange {
        /// The offending rank.
        rank: usize,
        /// The declared group size.
        size: usize,
    },
    /// A capacity outside `[size, max]`.
    #[error("capacity must satisfy group size ({size}) <= capacity <= {max}, got {capacity}")]
    BadCapacity {
        /// Declared group size.
        size: usize,
        /// Requested capacity.
        capacity: usize,
        /// Largest supported capacity.
        max: usize,
    },
    /// A peer rank that is outside the group or is the caller itself.
    #[error("peer rank {peer} is invalid for rank {rank} in a group of capacity {capacity}")]
    BadPeer {
        /// The requested peer.
        peer: usize,
        /// The caller's rank.
        rank: usize,
        /// The group's capacity.
        capacity: usize,
    },
    /// A dtype code the core does not know.
    #[error("unknown dtype code {0}")]
    UnknownDtype(u32),
    /// A reduce-op code the core does not know.
    #[error("unknown reduce op code {0}")]
    UnknownOp(u32),
    /// A collective name the core does not know.
    #[error("unknown collective {0:?}")]
    UnknownCollective(String),
    /// A reduction that is not defined on this dtype.
    #[error("ReduceOp.{op} is not supported for dtype {dtype}: {reason}")]
    UnsupportedReduction {
        /// The dtype's name (`float32`).
        dtype: &'static str,
        /// The operator's name (`AVG`).
        op: &'static str,
        /// Why not.
        reason: &'static str,
    },
    /// `all_to_all` addresses and sizes of different lengths.
    #[error("all_to_all: one size per address is required ({addrs} addresses, {sizes} sizes)")]
    SplitCount {
        /// Number of addresses.
        addrs: usize,
        /// Number of sizes.
        sizes: usize,
    },
    /// A second live member of the same group in one process.
    #[error("a process group with this id is already live in this process")]
    DuplicateGroup,
    /// A malformed fault-injection rule.
    #[error("fault rule {rule:?}: {reason}")]
    FaultRule {
        /// The rule as written.
        rule: String,
        /// What is wrong with it.
        reason: String,
    },
    /// Peers disagree on an op (sizes, dtypes or ops).
    #[error(
        "collective mismatch with rank {peer}: tensor sizes, dtypes or ops differ across ranks"
    )]
    Mismatch {
        /// The peer whose piece did not match.
        peer: usize,
    },
    /// A peer aborted the op after detecting a mismatch.
    #[error("collective aborted by rank {peer}: tensor sizes, dtypes or ops differ across ranks")]
    AbortedByPeer {
        /// The peer that aborted.
        peer: usize,
    },
    /// A per-slot list shorter than the active ranks need.
    #[error("{what} too small for active rank {rank} ({slots} slots)")]
    TooFewSlots {
        /// Which argument.
        what: &'static str,
        /// The first active rank without a slot.
        rank: usize,
        /// Slots provided.
        slots: usize,
    },
    /// A rooted op whose root is not active.
    #[error("root rank {root} is not an active member of the group")]
    RootInactive {
        /// The root.
        root: usize,
    },
    /// An `all_to_all` whose self-chunk sizes disagree.
    #[error("all_to_all: rank {rank} sends {sent} bytes to itself but expects {expected}")]
    SelfSizeMismatch {
        /// The caller's rank.
        rank: usize,
        /// Bytes sent to itself.
        sent: usize,
        /// Bytes expected from itself.
        expected: usize,
    },
    /// A receive whose size differs from the message.
    #[error("recv size mismatch: posted {posted} bytes but rank {src} sent {sent} bytes")]
    RecvSizeMismatch {
        /// Bytes posted.
        posted: usize,
        /// The sender.
        src: usize,
        /// Bytes sent.
        sent: u64,
    },
    /// Peers that did not connect before the deadline.
    #[error("timed out after {secs:.1}s connecting to rank(s) {missing:?}")]
    ConnectTimeout {
        /// The deadline in seconds.
        secs: f64,
        /// Ranks still missing.
        missing: Vec<usize>,
    },
    /// A shared-memory segment that cannot be used.
    #[error("shm segment {name}: {reason}")]
    BadSegment {
        /// Segment name.
        name: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The group was shut down.
    #[error("process group has been shut down")]
    Shutdown,
    /// The membership coordinator's session ended (its process is gone).
    #[error("lost the membership coordinator at {endpoint}")]
    CoordinatorLost {
        /// Where it was.
        endpoint: String,
    },
    /// The membership coordinator did not answer in time.
    #[error("the membership coordinator did not answer within {secs:.1}s")]
    CoordinatorTimeout {
        /// The deadline in seconds.
        secs: f64,
    },
    /// The coordinator refused a registration or request.
    #[error("{reason}")]
    Membership {
        /// The coordinator's reason.
        reason: String,
    },
    /// `join_group` was called on a member that cannot join.
    #[error("join_group: {reason}")]
    NotJoinable {
        /// Why.
        reason: &'static str,
    },
    /// `join_group` ran out of time before an activation committed.
    #[error("join_group: no activation committed within {secs:.1}s (call activate_ranks/recover_ranks on a healthy rank)")]
    JoinTimeout {
        /// The deadline in seconds.
        secs: f64,
    },
    /// The cluster-token authentication of a rank link or of the session
    /// with the membership coordinator failed, or the token could not be
    /// loaded (`MC_AUTH_TOKEN` / `MC_AUTH_TOKEN_FILE`).
    #[error("authentication failed: {reason}")]
    Auth {
        /// Who refused whom and why.
        reason: String,
    },
    /// Operating-system error.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// Underlying error.
        source: Arc<std::io::Error>,
    },
}

impl PgError {
    /// The cluster secret configured for this process, if any (the token
    /// variables are read when a group or coordinator is created).
    pub(crate) fn load_auth() -> Result<Option<AuthKey>, PgError> {
        AuthKey::from_env().map_err(|e| PgError::Auth {
            reason: format!("cannot load the cluster token: {e}"),
        })
    }

    /// Wraps an I/O error with context.
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        PgError::Io {
            context: context.into(),
            source: Arc::new(source),
        }
    }

    /// Wraps a `nix` error with context.
    pub(crate) fn nix(context: impl Into<String>, e: nix::Error) -> Self {
        Self::io(context, std::io::Error::from(e))
    }

    /// Which Python exception class this error maps to.
    pub fn kind(&self) -> ErrorKind {
        use PgError::*;
        match self {
            RankOutOfRange { .. }
            | BadCapacity { .. }
            | BadPeer { .. }
            | UnknownDtype(_)
            | UnknownOp(_)
            | UnknownCollective(_)
            | UnsupportedReduction { .. }
            | SplitCount { .. }
            | DuplicateGroup
            | FaultRule { .. } => ErrorKind::InvalidArgument,
            ConnectTimeout { .. } | CoordinatorTimeout { .. } | JoinTimeout { .. } => {
                ErrorKind::Timeout
            }
            Mismatch { .. }
            | AbortedByPeer { .. }
            | TooFewSlots { .. }
            | RootInactive { .. }
            | SelfSizeMismatch { .. }
            | RecvSizeMismatch { .. }
            | BadSegment { .. }
            | Shutdown
            | CoordinatorLost { .. }
            | Membership { .. }
            | NotJoinable { .. }
            | Auth { .. }
            | Io { .. } => ErrorKind::Runtime,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_carry_their_reason_and_kind() {
        let e = PgError::TooFewSlots {
            what: "output",
            rank: 3,
            slots: 2,
        };
        assert_eq!(
            e.to_string(),
            "output too small for active rank 3 (2 slots)"
        );
        assert_eq!(e.kind(), ErrorKind::Runtime);
        let e = PgError::BadCapacity {
            size: 4,
            capacity: 2,
            max: 64,
        };
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
        assert!(e.to_string().contains("got 2"));
        let e = PgError::ConnectTimeout {
            secs: 3.0,
            missing: vec![1],
        };
        assert_eq!(e.kind(), ErrorKind::Timeout);
        assert!(e.to_string().contains("[1]"));
    }
}
