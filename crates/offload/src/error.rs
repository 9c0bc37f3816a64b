//! Errors of the disk tier, each with its cause.

use std::path::PathBuf;

/// A disk-tier failure.
#[derive(Debug, thiserror::Error)]
pub enum OffloadError {
    /// The directory cannot be used (missing, not a directory, not writable).
    #[error("offload directory {path:?}: {reason}")]
    Setup {
        /// The directory.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
        /// The system error, if one.
        #[source]
        source: Option<std::io::Error>,
    },
    /// Another owner holds the directory.
    #[error("offload directory {0:?} is in use by another owner (its .lock is held)")]
    Locked(PathBuf),
    /// The key (at that version) is not in the tier.
    #[error("object {key:?} (version {version}) is not in the disk tier")]
    NotFound {
        /// The key.
        key: String,
        /// The version asked for.
        version: u64,
    },
    /// A checksum or structure check failed; the bucket was dropped.
    #[error("bucket {bucket} holding {key:?} is corrupt ({why}); dropped")]
    Corrupt {
        /// The bucket id.
        bucket: u64,
        /// The key being read.
        key: String,
        /// Which check failed.
        why: String,
    },
    /// No room within the cap, even after evicting every older bucket.
    #[error("the disk tier has no room for {need} bytes (cap {cap}, used {used})")]
    Full {
        /// Bytes the write needs.
        need: u64,
        /// The cap.
        cap: u64,
        /// Bytes in use on disk.
        used: u64,
    },
    /// A read or write failed.
    #[error("disk tier I/O on {path:?}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The system error.
        #[source]
        source: std::io::Error,
    },
}

impl OffloadError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> OffloadError {
        OffloadError::Io {
            path: path.into(),
            source,
        }
    }

    pub(crate) fn setup(path: impl Into<PathBuf>, reason: impl Into<String>) -> OffloadError {
        OffloadError::Setup {
            path: path.into(),
            reason: reason.into(),
            source: None,
        }
    }

    /// Whether the failure is the file system running out of space.
    pub fn is_no_space(&self) -> bool {
        matches!(self, OffloadError::Io { source, .. } if source.raw_os_error() == Some(libc::ENOSPC))
            || matches!(self, OffloadError::Full { .. })
    }
}

/// Result of a disk-tier operation.
pub type Result<T> = std::result::Result<T, OffloadError>;
