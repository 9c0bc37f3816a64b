//! The clock that link liveness is measured on: monotonic nanoseconds,
//! read through [`Clock`] so that tests can set the time instead of
//! sleeping.

use std::sync::OnceLock;
use std::time::Instant;

/// A source of monotonic nanoseconds.
pub(crate) trait Clock: Send + Sync {
    /// Nanoseconds since an arbitrary fixed point; never decreases.
    fn now_ns(&self) -> u64;
}

/// The process's monotonic clock: nanoseconds since its first reading.
pub(crate) struct Monotonic;

impl Clock for Monotonic {
    fn now_ns(&self) -> u64 {
        static EPOCH: OnceLock<Instant> = OnceLock::new();
        EPOCH.get_or_init(Instant::now).elapsed().as_nanos() as u64
    }
}

/// A clock that moves only when told to (tests).
#[cfg(test)]
#[derive(Default)]
pub(crate) struct Manual(std::sync::atomic::AtomicU64);

#[cfg(test)]
impl Manual {
    /// Moves the clock forward by `d`.
    pub(crate) fn advance(&self, d: std::time::Duration) {
        self.0
            .fetch_add(d.as_nanos() as u64, std::sync::atomic::Ordering::SeqCst);
    }
}

#[cfg(test)]
impl Clock for Manual {
    fn now_ns(&self) -> u64 {
        self.0.load(std::sync::atomic::Ordering::SeqCst)
    }
}
