//! How busy the machine's CPUs are right now: the runnable threads (the
//! fourth field of `/proc/loadavg`, an instantaneous count, not an
//! average) against the online CPUs.
//!
//! The background page committer of a segment steps aside by it when the
//! machine has no core to spare.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::OnceLock;

/// The runnable threads and the online CPUs at one instant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Load {
    /// Threads running or waiting for a CPU, the reader among them.
    pub(crate) runnable: u64,
    /// Online CPUs (at least 1).
    pub(crate) cpus: u64,
}

impl Load {
    /// True when the runnable threads (the reader among them) fill at most
    /// half the CPUs (at least one).
    pub(crate) fn mostly_idle(&self) -> bool {
        self.runnable <= (self.cpus / 2).max(1)
    }
}

/// The runnable count in `/proc/loadavg`'s text (its fourth field,
/// `runnable/total`); `None` when the text has no such field.
fn runnable_in(loadavg: &str) -> Option<u64> {
    loadavg
        .split_whitespace()
        .nth(3)?
        .split_once('/')?
        .0
        .parse()
        .ok()
}

/// The machine's load now (about a microsecond: one `pread` of a file kept
/// open); `None` where `/proc/loadavg` cannot be read or parsed.
pub(crate) fn now() -> Option<Load> {
    static SRC: OnceLock<Option<(File, u64)>> = OnceLock::new();
    let (file, cpus) = SRC
        .get_or_init(|| {
            // SAFETY: sysconf reads a system constant; no memory is passed.
            let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
            let cpus = u64::try_from(n).ok().filter(|&n| n > 0)?;
            Some((File::open("/proc/loadavg").ok()?, cpus))
        })
        .as_ref()?;
    let mut text = [0u8; 128];
    let n = file.read_at(&mut text, 0).ok()?;
    let runnable = runnable_in(std::str::from_utf8(&text[..n]).ok()?)?;
    Some(Load {
        runnable,
        cpus: *cpus,
    })
}

#[cfg(test)]
mod tests {
    use super::{now, runnable_in, Load};

    #[test]
    fn the_runnable_count_is_the_fourth_field() {
        assert_eq!(runnable_in("0.90 1.63 1.77 3/81 1297\n"), Some(3));
        assert_eq!(runnable_in("0.90 1.63 1.77 12/4081 9\n"), Some(12));
        assert_eq!(runnable_in("0.90 1.63 1.77"), None);
        assert_eq!(runnable_in("0.90 1.63 1.77 x/81 1297"), None);
        assert_eq!(runnable_in("0.90 1.63 1.77 381 1297"), None);
    }

    #[test]
    fn a_live_read_counts_at_least_this_thread() {
        let l = now().expect("/proc/loadavg");
        assert!(l.runnable >= 1 && l.cpus >= 1, "{l:?}");
    }

    #[test]
    fn mostly_idle_is_at_most_half_the_cpus_runnable() {
        let l = |runnable, cpus| Load { runnable, cpus };
        assert!(l(1, 2).mostly_idle());
        assert!(!l(2, 2).mostly_idle());
        assert!(l(1, 1).mostly_idle(), "one CPU: the reader alone");
        assert!(l(8, 16).mostly_idle());
        assert!(!l(9, 16).mostly_idle());
    }
}
