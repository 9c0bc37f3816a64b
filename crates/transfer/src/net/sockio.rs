//! Vectored socket IO on raw descriptors: gather sends (`sendmsg` with up
//! to `IOV_MAX` slices), `sendfile` from a segment's memfd, and scatter
//! receives straight into many destinations (`recvmsg`), each looping over
//! partial transfers and `EINTR`; and bytes with descriptors attached
//! (`SCM_RIGHTS`) over a Unix socket.

use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags};
use std::io::{self, IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

/// Most iovecs one syscall takes (Linux `IOV_MAX`).
pub const IOV_MAX: usize = 1024;

/// An `iovec` for `len` bytes at `ptr`.
pub fn iov(ptr: *const u8, len: usize) -> libc::iovec {
    libc::iovec {
        iov_base: ptr as *mut libc::c_void,
        iov_len: len,
    }
}

/// Drop the first `n` bytes from `iovs[*start..]`, advancing `*start`.
fn advance(iovs: &mut [libc::iovec], start: &mut usize, mut n: usize) {
    while n > 0 && *start < iovs.len() {
        let v = &mut iovs[*start];
        if n >= v.iov_len {
            n -= v.iov_len;
            *start += 1;
        } else {
            v.iov_base = (v.iov_base as usize + n) as *mut libc::c_void;
            v.iov_len -= n;
            n = 0;
        }
    }
    while *start < iovs.len() && iovs[*start].iov_len == 0 {
        *start += 1;
    }
}

fn msghdr(iovs: &mut [libc::iovec]) -> libc::msghdr {
    // SAFETY: msghdr is plain data; zero is a valid empty header.
    let mut m: libc::msghdr = unsafe { std::mem::zeroed() };
    m.msg_iov = iovs.as_mut_ptr();
    m.msg_iovlen = iovs.len().min(IOV_MAX) as _;
    m
}

/// Interpret a transfer syscall's return value: `Ok(None)` after `EINTR`
/// (retry), the OS error for a failure, `zero` as an error for 0 bytes,
/// else the byte count.
fn moved(n: isize, zero: io::ErrorKind) -> io::Result<Option<usize>> {
    if n < 0 {
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::Interrupted {
            return Ok(None);
        }
        return Err(e);
    }
    if n == 0 {
        return Err(zero.into());
    }
    Ok(Some(n as usize))
}

/// Send every byte described by `iovs` (which this call consumes). With
/// `more`, the kernel may hold a partial segment for the next send.
///
/// # Safety
/// Every iovec must describe readable memory.
pub unsafe fn send_all(fd: RawFd, iovs: &mut [libc::iovec], more: bool) -> io::Result<()> {
    let mut start = 0usize;
    advance(iovs, &mut start, 0);
    while start < iovs.len() {
        let m = msghdr(&mut iovs[start..]);
        let mut flags = libc::MSG_NOSIGNAL;
        if more || start + IOV_MAX < iovs.len() {
            flags |= libc::MSG_MORE;
        }
        // SAFETY: the header points into `iovs`, which describe readable
        // memory (the caller's contract).
        let sent = unsafe { libc::sendmsg(fd, &m, flags) };
        let Some(n) = moved(sent, io::ErrorKind::WriteZero)? else {
            continue;
        };
        advance(iovs, &mut start, n);
    }
    Ok(())
}

/// `sendfile` `len` bytes of `file` from `offset` into the socket.
pub fn sendfile_all(sock: RawFd, file: RawFd, offset: u64, len: u64) -> io::Result<()> {
    let mut off = offset as libc::off_t;
    let mut left = len;
    while left > 0 {
        let chunk = left.min(1 << 30) as usize;
        // SAFETY: plain syscall on descriptors we hold; `off` is ours.
        let n = unsafe { libc::sendfile(sock, file, &mut off, chunk) };
        let Some(n) = moved(n, io::ErrorKind::UnexpectedEof)? else {
            continue;
        };
        left -= n as u64;
    }
    Ok(())
}

/// Receive exactly the bytes described by `iovs` (which this call consumes).
///
/// # Safety
/// Every iovec must describe writable memory.
pub unsafe fn recv_all(fd: RawFd, iovs: &mut [libc::iovec]) -> io::Result<()> {
    let mut start = 0usize;
    advance(iovs, &mut start, 0);
    while start < iovs.len() {
        let mut m = msghdr(&mut iovs[start..]);
        // SAFETY: the header points into `iovs`, which describe writable
        // memory (the caller's contract).
        let got = unsafe { libc::recvmsg(fd, &mut m, libc::MSG_WAITALL) };
        let Some(n) = moved(got, io::ErrorKind::UnexpectedEof)? else {
            continue;
        };
        advance(iovs, &mut start, n);
    }
    Ok(())
}

/// A streamed reply ([`recv_status_then`]) of fewer bytes is received
/// straight into its destinations: the status then costs no syscall of its
/// own.
const STREAMED_RECV_MIN: usize = 64 << 10;

/// Bytes of the bounce buffer of [`recv_streamed`]: small enough to stay in
/// this core's cache between the receive and the copy.
const BOUNCE: usize = 128 << 10;

/// Receive exactly the bytes described by `iovs` (which this call
/// consumes) through a cache-sized buffer of this thread, copying each
/// piece on with streaming stores. The kernel's copy into a destination that
/// is not in the cache reads every destination line before writing it; a
/// large reply (a many-megabyte batch into a caller's buffer) then moves
/// about twice the bytes over the memory bus that the streaming copy does,
/// while its receive into the bounce buffer stays in the cache.
///
/// # Safety
/// Every iovec must describe writable memory.
pub unsafe fn recv_streamed(fd: RawFd, iovs: &mut [libc::iovec]) -> io::Result<()> {
    thread_local! {
        static BUF: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    BUF.with(|b| {
        let mut buf = b.borrow_mut();
        if buf.len() < BOUNCE {
            buf.resize(BOUNCE, 0);
        }
        let mut start = 0usize;
        advance(iovs, &mut start, 0);
        while start < iovs.len() {
            let left: usize = iovs[start..].iter().map(|v| v.iov_len).sum();
            let want = left.min(BOUNCE);
            // SAFETY: `buf` holds at least `want` writable bytes.
            let got = unsafe {
                libc::recv(
                    fd,
                    buf.as_mut_ptr() as *mut libc::c_void,
                    want,
                    libc::MSG_WAITALL,
                )
            };
            let Some(n) = moved(got, io::ErrorKind::UnexpectedEof)? else {
                continue;
            };
            let mut at = 0usize;
            while at < n && start < iovs.len() {
                let v = iovs[start];
                let take = v.iov_len.min(n - at);
                // SAFETY: `at..at + take` lies in the bytes just received,
                // and the iovec is the caller's writable memory.
                unsafe {
                    mooncake_common::memcopy::copy(
                        buf.as_ptr().add(at),
                        v.iov_base as *mut u8,
                        take,
                        true,
                    )
                };
                at += take;
                advance(iovs, &mut start, take);
            }
        }
        Ok(())
    })
}

/// Receive a 4-byte status; when it is 0, also receive `iovs` (with the
/// status read in the same syscall when the data is already there). With
/// `streamed`, data of [`STREAMED_RECV_MIN`] bytes and more is received
/// through [`recv_streamed`] instead (the status first, on its own).
/// Returns the status.
///
/// # Safety
/// Every iovec must describe writable memory.
pub unsafe fn recv_status_then(
    fd: RawFd,
    data: &mut [libc::iovec],
    streamed: bool,
) -> io::Result<i32> {
    let mut st = [0u8; 4];
    let total: usize = data.iter().map(|v| v.iov_len).sum();
    if streamed && total >= STREAMED_RECV_MIN {
        let mut head = [iov(st.as_mut_ptr(), 4)];
        // SAFETY: `head` describes `st`.
        unsafe { recv_all(fd, &mut head)? };
        let status = i32::from_le_bytes(st);
        if status == 0 {
            // SAFETY: the caller's writable iovecs.
            unsafe { recv_streamed(fd, data)? };
        }
        return Ok(status);
    }
    let mut got: usize;
    // First call: whatever is there, at most the status plus the data.
    {
        let mut first: Vec<libc::iovec> = Vec::with_capacity(data.len().min(IOV_MAX - 1) + 1);
        first.push(iov(st.as_mut_ptr(), 4));
        first.extend(data.iter().take(IOV_MAX - 1).copied());
        loop {
            let mut m = msghdr(&mut first);
            // SAFETY: `first` describes `st` and the caller's writable memory.
            let r = unsafe { libc::recvmsg(fd, &mut m, 0) };
            if let Some(n) = moved(r, io::ErrorKind::UnexpectedEof)? {
                got = n;
                break;
            }
        }
    }
    if got < 4 {
        let mut rest = [iov(st[got..].as_mut_ptr(), 4 - got)];
        // SAFETY: `rest` describes the unread tail of `st`.
        unsafe { recv_all(fd, &mut rest)? };
        got = 4;
    }
    let status = i32::from_le_bytes(st);
    let extra = got - 4;
    if status != 0 {
        if extra > 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "data after an error status",
            ));
        }
        return Ok(status);
    }
    let mut start = 0usize;
    advance(data, &mut start, extra);
    // SAFETY: the rest of the caller's writable iovecs.
    unsafe { recv_all(fd, &mut data[start..])? };
    Ok(0)
}

/// Send `bytes` (one `sendmsg`, at least one byte) on `s` with the
/// descriptors `fds` attached (`SCM_RIGHTS`).
pub fn send_with_fds(s: &UnixStream, bytes: &[u8], fds: &[RawFd]) -> io::Result<()> {
    let cmsg = [ControlMessage::ScmRights(fds)];
    sendmsg::<()>(
        s.as_raw_fd(),
        &[IoSlice::new(bytes)],
        &cmsg,
        MsgFlags::empty(),
        None,
    )
    .map_err(io::Error::from)?;
    Ok(())
}

/// One `recvmsg` on `s` into `buf`, with room for `N` descriptors sent
/// along (`SCM_RIGHTS`, received close-on-exec): the bytes received (at
/// least one; the end of the stream is `UnexpectedEof`) and the
/// descriptors, now owned by the caller.
pub fn recv_with_fds<const N: usize>(
    s: &UnixStream,
    buf: &mut [u8],
) -> io::Result<(usize, Vec<OwnedFd>)> {
    let mut cmsg_buf = nix::cmsg_space!([RawFd; N]);
    let mut iov = [IoSliceMut::new(buf)];
    let msg = recvmsg::<()>(
        s.as_raw_fd(),
        &mut iov,
        Some(&mut cmsg_buf),
        MsgFlags::MSG_CMSG_CLOEXEC,
    )
    .map_err(io::Error::from)?;
    let mut fds: Vec<OwnedFd> = Vec::new();
    for cm in msg.cmsgs().map_err(io::Error::from)? {
        if let ControlMessageOwned::ScmRights(v) = cm {
            for fd in v {
                // SAFETY: each descriptor was just received with SCM_RIGHTS
                // and is owned by nobody else.
                fds.push(unsafe { OwnedFd::from_raw_fd(fd) });
            }
        }
    }
    if msg.bytes == 0 {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    Ok((msg.bytes, fds))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::fd::AsRawFd;
    use std::os::unix::net::UnixStream;

    #[test]
    fn scatter_gather_roundtrip() {
        let (a, b) = UnixStream::pair().unwrap();
        let src: Vec<u8> = (0..5000u32).map(|i| i as u8).collect();
        let s2 = src.clone();
        let t = std::thread::spawn(move || {
            let src = s2;
            let mut iovs: Vec<libc::iovec> = (0..2000)
                .map(|i| iov(src[i * 2..].as_ptr(), 2))
                .chain(std::iter::once(iov(src[4000..].as_ptr(), 1000)))
                .collect();
            let mut a = a;
            a.write_all(&0i32.to_le_bytes()).unwrap();
            // SAFETY: the iovecs point into `src`, alive here.
            unsafe { send_all(a.as_raw_fd(), &mut iovs, false) }.unwrap();
            a.write_all(&7i32.to_le_bytes()).unwrap();
        });
        let mut dst = vec![0u8; 5000];
        let mut d: Vec<libc::iovec> = (0..5)
            .map(|i| iov(dst[i * 1000..].as_mut_ptr(), 1000))
            .collect();
        assert_eq!(
            // SAFETY: the iovecs point into `dst`, alive and unused meanwhile.
            unsafe { recv_status_then(b.as_raw_fd(), &mut d, false) }.unwrap(),
            0
        );
        assert_eq!(dst, src);
        let mut none = Vec::new();
        assert_eq!(
            // SAFETY: no iovecs.
            unsafe { recv_status_then(b.as_raw_fd(), &mut none, false) }.unwrap(),
            7
        );
        t.join().unwrap();
    }

    #[test]
    fn streamed_reply_lands_in_every_destination() {
        let (a, b) = UnixStream::pair().unwrap();
        // Past the bounce buffer, in destinations of odd sizes and offsets.
        let n = 300 * 1024 + 77;
        let src: Vec<u8> = (0..n as u32).map(|i| (i * 31 % 253) as u8).collect();
        let s2 = src.clone();
        let t = std::thread::spawn(move || {
            let mut a = a;
            a.write_all(&0i32.to_le_bytes()).unwrap();
            a.write_all(&s2).unwrap();
            // A refused request: the status alone, though data was asked for.
            a.write_all(&(-704i32).to_le_bytes()).unwrap();
        });
        let mut dst = vec![0u8; n + 3];
        let cuts = [0usize, 1, 4099, 131_072 + 5, 200_000, n];
        let mut d: Vec<libc::iovec> = cuts
            .windows(2)
            .map(|w| iov(dst[w[0] + 3..].as_mut_ptr(), w[1] - w[0]))
            .collect();
        assert_eq!(
            // SAFETY: the iovecs point into `dst`, alive and unused meanwhile.
            unsafe { recv_status_then(b.as_raw_fd(), &mut d, true) }.unwrap(),
            0
        );
        assert_eq!(&dst[3..], &src[..]);
        assert_eq!(&dst[..3], &[0, 0, 0]);
        let mut more = vec![0u8; 100_000];
        let mut d = vec![iov(more.as_mut_ptr(), more.len())];
        assert_eq!(
            // SAFETY: the iovec points into `more`.
            unsafe { recv_status_then(b.as_raw_fd(), &mut d, true) }.unwrap(),
            -704
        );
        assert!(more.iter().all(|&x| x == 0));
        t.join().unwrap();
    }
}
