//! Reads that poll briefly before blocking: on a VM, waking a thread parked
//! in `read` costs more than a loopback round trip, so request/response
//! callers (the client's master RPC, the master's per-connection threads)
//! poll a bounded time first, yielding the core between polls.

use nix::errno::Errno;
use nix::sys::socket::{recv, MsgFlags};
use std::io::{self, Read};
use std::os::fd::{AsRawFd, RawFd};

/// How long a waiting reader polls its socket before blocking, in
/// microseconds: `MC_RPC_SPIN_US` (default 50, 0 disables; read once).
///
/// On a VM an idle vCPU halts, and waking a thread blocked in `read` costs
/// tens of microseconds, more than a loopback round trip itself. A caller that
/// is going to wait for a reply anyway spins this long first (non-blocking
/// `recv`), so a fast reply is picked up without a wakeup.
pub fn spin_budget() -> std::time::Duration {
    static SPIN_US: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    let us = *SPIN_US.get_or_init(|| {
        std::env::var("MC_RPC_SPIN_US")
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(50)
    });
    std::time::Duration::from_micros(us)
}

/// One step of a polling loop: give the core to any other runnable thread
/// (`sched_yield`). On a 2-core host three parties can be waiting at once
/// (the client for a reply, the master for the next request, a data server
/// for its peer); a pure spin would hold a core the party that has work
/// needs, which costs far more than the yield syscall.
#[inline]
fn spin_pause() {
    std::thread::yield_now();
}

/// Read at least one byte into `buf` if some arrive within `spin`, polling
/// with non-blocking `recv` (at least once). `None`: nothing arrived.
/// `Some(0)` means the peer closed.
pub fn recv_spin(
    sock: RawFd,
    buf: &mut [u8],
    spin: std::time::Duration,
) -> io::Result<Option<usize>> {
    let deadline = std::time::Instant::now() + spin;
    loop {
        match recv(sock, buf, MsgFlags::MSG_DONTWAIT) {
            Ok(n) => return Ok(Some(n)),
            Err(Errno::EINTR) => continue,
            Err(Errno::EAGAIN) => {
                if std::time::Instant::now() >= deadline {
                    return Ok(None);
                }
                spin_pause();
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// Read at least one byte into `buf`: poll with non-blocking `recv` for up
/// to `spin`, then fall back to a blocking `recv` (which honours the socket's
/// read timeout). Returns the byte count; 0 means the peer closed.
pub fn recv_spin_then_block(
    sock: RawFd,
    buf: &mut [u8],
    spin: std::time::Duration,
) -> io::Result<usize> {
    if buf.is_empty() {
        return Ok(0);
    }
    if let Some(n) = recv_spin(sock, buf, spin)? {
        return Ok(n);
    }
    loop {
        match recv(sock, buf, MsgFlags::empty()) {
            Ok(n) => return Ok(n),
            Err(Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// A `Read` over a socket whose reads poll for [`spin_budget`] before blocking.
pub struct SpinReader<S: AsRawFd> {
    sock: S,
    spin: std::time::Duration,
}

impl<S: AsRawFd> SpinReader<S> {
    /// Wrap `sock` with the process-wide spin budget.
    pub fn new(sock: S) -> Self {
        SpinReader {
            sock,
            spin: spin_budget(),
        }
    }
}

impl<S: AsRawFd> Read for SpinReader<S> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        recv_spin_then_block(self.sock.as_raw_fd(), buf, self.spin)
    }
}

/// Poll `sock` with a non-blocking one-byte `MSG_PEEK` for up to `spin`,
/// returning as soon as data (or EOF, or an error) is pending. Nothing is
/// consumed; the caller's following blocking read then returns at once
/// instead of parking the thread.
pub fn spin_until_readable(sock: RawFd, spin: std::time::Duration) {
    if spin.is_zero() {
        return;
    }
    let deadline = std::time::Instant::now() + spin;
    let mut byte = [0u8; 1];
    loop {
        match recv(sock, &mut byte, MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT) {
            Err(Errno::EAGAIN | Errno::EINTR) => {}
            _ => return,
        }
        if std::time::Instant::now() >= deadline {
            return;
        }
        spin_pause();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::net::UnixStream;
    use std::time::Duration;

    #[test]
    fn reads_pending_data_late_data_and_eof() {
        let (mut a, b) = UnixStream::pair().expect("socketpair");
        a.write_all(b"abc").expect("write");
        let mut r = SpinReader::new(b.try_clone().expect("clone"));
        let mut buf = [0u8; 8];
        assert_eq!(r.read(&mut buf).expect("read"), 3);
        assert_eq!(&buf[..3], b"abc");
        // Data that arrives after the spin budget is still read (blocking).
        let writer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(30));
            a.write_all(b"z").expect("write");
            a
        });
        let n =
            recv_spin_then_block(b.as_raw_fd(), &mut buf, Duration::from_micros(10)).expect("read");
        assert_eq!((n, buf[0]), (1, b'z'));
        drop(writer.join().expect("join"));
        // The peer closed: a read returns 0.
        spin_until_readable(b.as_raw_fd(), Duration::from_millis(5));
        assert_eq!(r.read(&mut buf).expect("read"), 0);
    }

    #[test]
    fn blocking_read_honours_the_socket_timeout() {
        let (_a, b) = UnixStream::pair().expect("socketpair");
        b.set_read_timeout(Some(Duration::from_millis(20)))
            .expect("timeout");
        let mut buf = [0u8; 4];
        let err = recv_spin_then_block(b.as_raw_fd(), &mut buf, Duration::from_micros(10))
            .expect_err("no data");
        assert!(matches!(
            err.kind(),
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
        ));
    }
}
