//! Futex-backed doorbell: the only blocking primitive the engine waits on.
//!
//! A [`Doorbell`] is an event counter plus a sleeper count. It may live in
//! ordinary heap memory or inside a shared-memory segment, so that a process
//! can wake a peer process directly (the futex calls are not `PRIVATE`).

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// Event counter that waiters sleep on with a futex.
#[repr(C)]
#[derive(Default)]
pub(crate) struct Doorbell {
    seq: AtomicU32,
    sleepers: AtomicU32,
}

impl Doorbell {
    /// Current event count; pass it to [`Doorbell::wait`] after a scan that
    /// found nothing to do.
    pub(crate) fn observe(&self) -> u32 {
        self.seq.load(Ordering::SeqCst)
    }

    /// Signals an event, waking sleepers only when there are any.
    pub(crate) fn ring(&self) {
        self.seq.fetch_add(1, Ordering::SeqCst);
        if self.sleepers.load(Ordering::SeqCst) != 0 {
            futex_wake(&self.seq);
        }
    }

    /// Sleeps until the counter moves past `seen`, or `timeout` passes.
    /// Spins for up to `spin` first (zero disables spinning).
    pub(crate) fn wait(&self, seen: u32, timeout: Duration, spin: Duration) {
        if !spin.is_zero() {
            let end = Instant::now() + spin;
            while Instant::now() < end {
                if self.seq.load(Ordering::Acquire) != seen {
                    return;
                }
                std::hint::spin_loop();
            }
        }
        self.sleepers.fetch_add(1, Ordering::SeqCst);
        if self.seq.load(Ordering::SeqCst) == seen {
            futex_wait(&self.seq, seen, timeout);
        }
        self.sleepers.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Blocks while `*word == expected`, for at most `timeout`.
fn futex_wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: `word` is a valid, aligned u32 for the duration of the call;
    // the kernel only reads it. Shared (non-private) futex so that waiters in
    // other processes mapping the same page are reached.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            &ts as *const libc::timespec,
        );
    }
}

/// Wakes every waiter on `word`.
fn futex_wake(word: &AtomicU32) {
    // SAFETY: see `futex_wait`.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, i32::MAX);
    }
}
