//! The master's notion of time for leases, pins, client TTLs, discard and
//! release delays, and retired versions. The state reads it through
//! [`Clock`] so tests can advance time instead of sleeping; waits on other
//! processes (ledger acks, sockets) use real time.

use parking_lot::Mutex;
use std::fmt::Debug;
use std::time::{Duration, Instant};

/// A monotonic clock.
pub trait Clock: Send + Sync + Debug {
    /// The current instant.
    fn now(&self) -> Instant;
}

/// Real time (`Instant::now`).
#[derive(Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Instant {
        Instant::now()
    }
}

/// A clock that moves only when told to: it starts at the instant it was
/// made and [`ManualClock::advance`] moves it forward.
#[derive(Debug)]
pub struct ManualClock {
    base: Instant,
    offset: Mutex<Duration>,
}

impl Default for ManualClock {
    fn default() -> Self {
        ManualClock {
            base: Instant::now(),
            offset: Mutex::new(Duration::ZERO),
        }
    }
}

impl ManualClock {
    /// Move the clock forward by `d`.
    pub fn advance(&self, d: Duration) {
        let mut o = self.offset.lock();
        *o = o.saturating_add(d);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Instant {
        self.base + *self.offset.lock()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manual_clock_moves_only_when_advanced() {
        let c = ManualClock::default();
        let t0 = c.now();
        assert_eq!(c.now(), t0);
        c.advance(Duration::from_secs(5));
        assert_eq!(c.now() - t0, Duration::from_secs(5));
    }
}
