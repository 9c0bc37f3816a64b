//! The reader of a connection thread. It polls the socket briefly for the
//! next bytes (a request that follows its predecessor closely is picked up
//! without a wakeup), then waits in `poll(2)` one tick at a time: at each
//! tick with nothing to read it runs its tick hook (the master's hook
//! releases memory that a removal on another thread freed from this
//! thread's heap), and once the connection has stayed silent for its
//! timeout the read fails with `TimedOut`.
//!
//! How long it polls: a client's requests often come a few hundred
//! microseconds apart (a lookup, the caller's own work, the next lookup),
//! longer than a caller's reply poll (`MC_RPC_SPIN_US`). A thread that
//! parks in between must be woken for the next request, and on a VM whose
//! idle vCPU halted that wakeup costs the request hundreds of microseconds
//! whenever the host is busy. So a connection thread polls for its next
//! request `MC_RPC_SPIN_US` first, and when nothing came by then, on up to
//! [`wait_spin`] (`MC_MASTER_SPIN_US`) in all if it gets one of the
//! process's poll slots (half the cores, at least one; [`PollSlots`]),
//! yielding its core between polls. The slots thus go to the connections
//! that need them: a client that sends back to back (a writer storing pages
//! in a loop) is served by the short poll and never holds one, and a client
//! that pauses a few hundred microseconds between lookups finds one free.
//! A connection whose last [`SLOW_WAITS`] waits beyond the short poll each
//! outlasted that budget (a client that calls rarely, or in bursts with
//! long pauses between them) polls only `MC_RPC_SPIN_US` too, until a
//! request comes after the short poll but within the budget again: polling
//! for it would only burn the core.

use std::io::{self, Read};
use std::net::TcpStream;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use mooncake_common::spin_read::recv_spin;

/// Consecutive waits longer than [`wait_spin`] after which a connection
/// stops polling long.
pub(crate) const SLOW_WAITS: u8 = 2;

/// How long a connection thread holding a poll slot polls for its next
/// request, in microseconds: `MC_MASTER_SPIN_US` (default 2000; read once;
/// below `MC_RPC_SPIN_US` that budget applies).
pub(crate) fn wait_spin() -> Duration {
    static US: OnceLock<u64> = OnceLock::new();
    let us = *US.get_or_init(|| {
        std::env::var("MC_MASTER_SPIN_US")
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(2000)
    });
    Duration::from_micros(us).max(mooncake_common::spin_read::spin_budget())
}

/// Slots for polling longer than a reply poll: a thread polls for
/// [`wait_spin`] only while it holds one, so at most `cap` threads poll at
/// once.
pub(crate) struct PollSlots {
    used: AtomicUsize,
    cap: usize,
}

impl PollSlots {
    pub(crate) const fn new(cap: usize) -> Self {
        PollSlots {
            used: AtomicUsize::new(0),
            cap,
        }
    }

    /// The process's slots: half the cores, at least one, so polling never
    /// takes more than half the machine.
    fn process() -> &'static PollSlots {
        static SLOTS: OnceLock<PollSlots> = OnceLock::new();
        SLOTS.get_or_init(|| {
            PollSlots::new(
                std::thread::available_parallelism()
                    .map_or(1, |n| n.get() / 2)
                    .max(1),
            )
        })
    }

    /// A free slot, if any (released on drop).
    pub(crate) fn take(&self) -> Option<PollSlot<'_>> {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.cap).then_some(n + 1)
            })
            .ok()
            .map(|_| PollSlot(self))
    }
}

/// One held slot of a [`PollSlots`].
pub(crate) struct PollSlot<'a>(&'a PollSlots);

impl Drop for PollSlot<'_> {
    fn drop(&mut self) {
        self.0.used.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Reads a connection's socket; see the module documentation.
pub(crate) struct ConnReader {
    sock: TcpStream,
    /// The poll without a slot.
    spin: Duration,
    /// The poll with a slot.
    wait_spin: Duration,
    /// Consecutive reads that waited longer than `wait_spin`.
    slow_waits: u8,
    /// Where the long poll's slot comes from (the process's slots).
    slots: &'static PollSlots,
    timeout: Option<Duration>,
    tick: Duration,
    on_tick: fn(),
}

impl ConnReader {
    /// A reader of `sock` that fails a read silent for `timeout` (never when
    /// `None`) and runs `on_tick` every `tick` it waits.
    pub(crate) fn new(
        sock: TcpStream,
        timeout: Option<Duration>,
        tick: Duration,
        on_tick: fn(),
    ) -> Self {
        ConnReader {
            sock,
            spin: mooncake_common::spin_read::spin_budget(),
            wait_spin: wait_spin(),
            slow_waits: 0,
            slots: PollSlots::process(),
            timeout,
            tick: tick.max(Duration::from_millis(1)),
            on_tick,
        }
    }

    /// Replaces the silence a read tolerates.
    pub(crate) fn set_timeout(&mut self, timeout: Option<Duration>) {
        self.timeout = timeout;
    }
}

/// Waits up to `wait` for `fd` to become readable (or to report an error or
/// hang-up, which the next `recv` returns); false when the wait ran out.
fn wait_readable(fd: RawFd, wait: Duration) -> io::Result<bool> {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = i32::try_from(wait.as_millis().max(1)).unwrap_or(i32::MAX);
    // SAFETY: one pollfd, alive for the whole call.
    let r = unsafe { libc::poll(&mut pfd, 1, ms) };
    if r < 0 {
        let e = io::Error::last_os_error();
        return match e.kind() {
            io::ErrorKind::Interrupted => Ok(true),
            _ => Err(e),
        };
    }
    Ok(r > 0)
}

impl Read for ConnReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let fd = self.sock.as_raw_fd();
        let start = Instant::now();
        let deadline = self.timeout.map(|t| start + t);
        // The short poll first, without a slot: a client whose requests
        // follow each other closely is served by it and leaves the slots to
        // the connections whose client pauses longer between requests.
        let mut got = recv_spin(fd, buf, self.spin)?;
        if got.is_none() && self.wait_spin > self.spin && self.slow_waits < SLOW_WAITS {
            if let Some(_slot) = self.slots.take() {
                got = recv_spin(fd, buf, self.wait_spin - self.spin)?;
            }
        }
        // Then wait in poll(2), one tick at a time.
        loop {
            if let Some(n) = got {
                self.slow_waits =
                    slow_waits(self.slow_waits, start.elapsed(), self.spin, self.wait_spin);
                return Ok(n);
            }
            let now = Instant::now();
            let mut wait = self.tick;
            if let Some(d) = deadline {
                let left = d.saturating_duration_since(now);
                if left.is_zero() {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "connection silent past its timeout",
                    ));
                }
                wait = wait.min(left);
            }
            if !wait_readable(fd, wait)? {
                (self.on_tick)();
            }
            got = recv_spin(fd, buf, Duration::ZERO)?;
        }
    }
}

/// The count of slow waits after a read that waited `waited`: one more when
/// it was slow (longer than `budget`; saturates at [`SLOW_WAITS`]), back to
/// 0 when the long poll served it or would have (longer than the short
/// poll `spin`, within `budget`), unchanged when the short poll served it.
/// A client that sends in bursts with long pauses between them (a writer
/// storing a batch of pages now and then) thus stops being polled for
/// through its pauses, although the requests of each burst come quickly.
fn slow_waits(before: u8, waited: Duration, spin: Duration, budget: Duration) -> u8 {
    if waited > budget {
        before.saturating_add(1).min(SLOW_WAITS)
    } else if waited > spin {
        0
    } else {
        before
    }
}

#[cfg(test)]
mod tests {
    use super::{slow_waits, ConnReader, PollSlots, SLOW_WAITS};
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let a = TcpStream::connect(l.local_addr().expect("addr")).expect("connect");
        let (b, _) = l.accept().expect("accept");
        (a, b)
    }

    static TICKS: AtomicUsize = AtomicUsize::new(0);

    fn count_tick() {
        TICKS.fetch_add(1, Ordering::Relaxed);
    }

    fn nothing() {}

    #[test]
    fn a_waiting_read_runs_the_hook_each_tick_and_returns_late_bytes() {
        let (mut a, b) = pair();
        let mut r = ConnReader::new(b, None, Duration::from_millis(5), count_tick);
        let before = TICKS.load(Ordering::Relaxed);
        let writer = std::thread::spawn(move || {
            // The reader waits through several ticks before the bytes come:
            // wait until it has ticked instead of sleeping a fixed time.
            while TICKS.load(Ordering::Relaxed) < before + 3 {
                std::thread::yield_now();
            }
            a.write_all(b"late").expect("write");
            a
        });
        let mut buf = [0u8; 8];
        let n = r.read(&mut buf).expect("read");
        assert_eq!(&buf[..n], b"late");
        assert!(TICKS.load(Ordering::Relaxed) >= before + 3);
        let a = writer.join().expect("join");
        drop(a);
        // A closed peer reads as end of stream.
        assert_eq!(r.read(&mut buf).expect("eof"), 0);
    }

    #[test]
    fn a_silent_connection_times_out_and_the_timeout_can_change() {
        let (mut a, b) = pair();
        let mut r = ConnReader::new(
            b,
            Some(Duration::from_millis(30)),
            Duration::from_millis(10),
            nothing,
        );
        let mut buf = [0u8; 4];
        let e = r.read(&mut buf).expect_err("silent");
        assert_eq!(e.kind(), std::io::ErrorKind::TimedOut);
        r.set_timeout(None);
        a.write_all(b"ok").expect("write");
        assert_eq!(r.read(&mut buf).expect("read"), 2);
        assert_eq!(&buf[..2], b"ok");
    }

    #[test]
    fn the_long_poll_takes_a_slot_only_after_the_short_poll_found_nothing() {
        static SLOTS: PollSlots = PollSlots::new(1);
        let (mut a, b) = pair();
        let mut r = ConnReader::new(b, None, Duration::from_millis(5), nothing);
        r.slots = &SLOTS;
        r.spin = Duration::from_micros(50);
        r.wait_spin = Duration::from_secs(30);
        // Bytes already there: served by the short poll, no slot taken.
        a.write_all(b"now").expect("write");
        let mut buf = [0u8; 8];
        assert_eq!(r.read(&mut buf).expect("read"), 3);
        assert_eq!(SLOTS.used.load(Ordering::Acquire), 0);
        // Nothing there: after the short poll the reader holds the slot
        // while it polls on, and gives it back once the bytes come.
        let reader = std::thread::spawn(move || {
            let mut buf = [0u8; 8];
            let n = r.read(&mut buf).expect("read");
            buf[..n].to_vec()
        });
        while SLOTS.used.load(Ordering::Acquire) == 0 {
            std::thread::yield_now();
        }
        a.write_all(b"later").expect("write");
        assert_eq!(reader.join().expect("join"), b"later");
        assert_eq!(SLOTS.used.load(Ordering::Acquire), 0);
    }

    #[test]
    fn poll_slots_admit_up_to_their_cap_and_free_on_drop() {
        let slots = PollSlots::new(2);
        let a = slots.take().expect("first slot");
        let b = slots.take().expect("second slot");
        assert!(slots.take().is_none(), "a third poller must not get a slot");
        drop(a);
        let c = slots.take().expect("a released slot is free again");
        assert!(slots.take().is_none());
        drop((b, c));
        assert_eq!(slots.used.load(std::sync::atomic::Ordering::Acquire), 0);
    }

    /// The short poll and the long poll's budget of the slow-wait tests.
    const SPIN: Duration = Duration::from_micros(50);
    const BUDGET: Duration = Duration::from_millis(2);

    /// The count after a series of waits, from 0.
    fn after(waits: &[Duration]) -> u8 {
        waits.iter().fold(0, |n, &w| slow_waits(n, w, SPIN, BUDGET))
    }

    #[test]
    fn a_connection_stops_polling_long_after_consecutive_slow_waits_only() {
        let slow = Duration::from_millis(30);
        let mid = Duration::from_micros(300);
        assert_eq!(after(&[slow]), 1, "one slow wait is not yet a slow client");
        assert!(after(&[slow]) < SLOW_WAITS);
        assert_eq!(after(&[slow, slow]), SLOW_WAITS);
        assert_eq!(
            after(&[slow, slow, slow]),
            SLOW_WAITS,
            "the count saturates"
        );
        assert_eq!(
            after(&[slow, slow, mid]),
            0,
            "a request within the budget resumes long polls"
        );
        assert_eq!(after(&[slow, BUDGET]), 0, "exactly the budget is not slow");
    }

    #[test]
    fn the_quick_requests_of_a_burst_do_not_resume_long_polls() {
        let pause = Duration::from_millis(4);
        let quick = Duration::from_micros(10);
        // A burst of quick requests, a pause longer than the budget, again.
        let mut burst = vec![quick; 16];
        burst.push(pause);
        assert_eq!(
            after(&burst.repeat(3)),
            SLOW_WAITS,
            "the pauses count although bursts come between"
        );
        assert_eq!(after(&[quick]), 0);
        assert_eq!(after(&[pause, SPIN]), 1, "the short poll served it");
    }
}
