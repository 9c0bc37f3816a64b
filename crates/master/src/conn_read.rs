//! The reader of a connection thread. It polls the socket briefly for the
//! next bytes (a request that follows its predecessor closely is picked up
//! without a wakeup), then waits in `poll(2)` one tick at a time: at each
//! tick with nothing to read it runs its tick hook (the master's hook
//! releases memory that a removal on another thread freed from this
//! thread's heap), and once the connection has stayed silent for its
//! timeout the read fails with `TimedOut`.

use std::io::{self, Read};
use std::net::TcpStream;
use std::os::fd::{AsRawFd, RawFd};
use std::time::{Duration, Instant};

use mooncake_common::spin_read::recv_spin;

/// Reads a connection's socket; see the module documentation.
pub(crate) struct ConnReader {
    sock: TcpStream,
    spin: Duration,
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
        let deadline = self.timeout.map(|t| Instant::now() + t);
        let mut spin = self.spin;
        loop {
            if let Some(n) = recv_spin(fd, buf, spin)? {
                return Ok(n);
            }
            // After a wait, one non-blocking look is enough.
            spin = Duration::ZERO;
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
        }
    }
}

#[cfg(test)]
mod tests {
    use super::ConnReader;
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
}
