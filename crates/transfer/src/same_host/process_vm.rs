//! Copies between this process and another process of the same host with
//! `process_vm_readv` / `process_vm_writev`: one copy, no socket, no shared
//! mapping. The kernel allows them only towards a process this one may
//! ptrace (same user, and no Yama or container policy against it); a
//! refusal is `EPERM`, which callers answer by falling back to TCP.

use crate::op::Op;
use crate::workers;
use std::io;

/// Pairs per system call (the kernel's `IOV_MAX`).
const IOV_MAX: usize = 1024;
/// Bytes above which a copy is split over two threads.
const PAR_COPY: u64 = 8 << 20;

/// Which way bytes move.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Direction {
    /// From the other process into this one (`process_vm_readv`).
    FromPeer,
    /// From this process into the other one (`process_vm_writev`).
    ToPeer,
}

fn iov(addr: u64, len: u64) -> libc::iovec {
    libc::iovec {
        iov_base: addr as usize as *mut libc::c_void,
        iov_len: len as usize,
    }
}

/// Copy every `(peer address, own address, length)` pair between process
/// `pid` and this one.
///
/// # Safety
/// For [`Direction::FromPeer`] every own range must be writable memory of
/// this process that nothing else uses meanwhile; for
/// [`Direction::ToPeer`] every own range must be readable.
pub(crate) unsafe fn copy(pid: i32, dir: Direction, pairs: &[(u64, u64, u64)]) -> io::Result<()> {
    let total: u64 = pairs.iter().map(|p| p.2).sum();
    if total < PAR_COPY || pairs.is_empty() {
        // SAFETY: the caller's contract.
        return unsafe { copy_serial(pid, dir, pairs) };
    }
    let halves = Op::split(
        &pairs
            .iter()
            .map(|&(peer, own, len)| Op {
                seg_offset: peer,
                local_ptr: own as usize,
                len,
            })
            .collect::<Vec<_>>(),
        2,
        u64::MAX,
    );
    let parts: Vec<Vec<(u64, u64, u64)>> = halves
        .into_iter()
        .map(|h| {
            h.into_iter()
                .map(|o| (o.seg_offset, o.local_ptr as u64, o.len))
                .collect()
        })
        .collect();
    let workers = parts.len();
    workers::run_all(&parts, workers, |p| {
        // SAFETY: disjoint pieces of the caller's valid ranges.
        unsafe { copy_serial(pid, dir, p) }
    })
    .into_iter()
    .collect()
}

/// `(address, address, length)` pairs of a cross-process copy.
pub(crate) type Pairs = Vec<(u64, u64, u64)>;

/// Split `(address, address, length)` pairs at byte `at`, counted along
/// the pairs: the pairs of the first `at` bytes, and those of the rest (a
/// pair that straddles `at` is cut in two, both addresses advanced).
pub(crate) fn split_at(pairs: &[(u64, u64, u64)], at: u64) -> (Pairs, Pairs) {
    let mut head = Vec::new();
    let mut tail = Vec::new();
    let mut seen = 0u64;
    for &(a, b, l) in pairs {
        if l == 0 {
            continue;
        }
        if seen >= at {
            tail.push((a, b, l));
        } else if seen + l <= at {
            head.push((a, b, l));
        } else {
            let k = at - seen;
            head.push((a, b, k));
            tail.push((a + k, b + k, l - k));
        }
        seen = seen.saturating_add(l);
    }
    (head, tail)
}

/// [`copy`] on the calling thread.
///
/// # Safety
/// As [`copy`].
pub(crate) unsafe fn copy_serial(
    pid: i32,
    dir: Direction,
    pairs: &[(u64, u64, u64)],
) -> io::Result<()> {
    // The two calls take the same arguments: the local iovecs, then the
    // other process's.
    let syscall = match dir {
        Direction::FromPeer => libc::process_vm_readv,
        Direction::ToPeer => libc::process_vm_writev,
    };
    let mut own: Vec<libc::iovec> = Vec::with_capacity(pairs.len().min(IOV_MAX));
    let mut peer: Vec<libc::iovec> = Vec::with_capacity(pairs.len().min(IOV_MAX));
    let mut i = 0usize;
    // Bytes of pairs[i] already moved.
    let mut done_in_first = 0u64;
    while i < pairs.len() {
        own.clear();
        peer.clear();
        for (k, &(p, o, l)) in pairs[i..].iter().take(IOV_MAX).enumerate() {
            let skip = if k == 0 { done_in_first } else { 0 };
            if l > skip {
                peer.push(iov(p + skip, l - skip));
                own.push(iov(o + skip, l - skip));
            }
        }
        let chunk = pairs.len().min(i + IOV_MAX) - i;
        if own.is_empty() {
            i += chunk;
            done_in_first = 0;
            continue;
        }
        // SAFETY: the iovecs describe the caller's own ranges (see the
        // contract) and ranges of the other process, which the kernel
        // checks itself.
        let n = unsafe {
            syscall(
                pid,
                own.as_ptr(),
                own.len() as libc::c_ulong,
                peer.as_ptr(),
                peer.len() as libc::c_ulong,
                0,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "cross-process copy moved nothing",
            ));
        }
        // Advance past the `n` bytes moved.
        let mut left = n as u64;
        while left > 0 && i < pairs.len() {
            let rem = pairs[i].2 - done_in_first;
            if left >= rem {
                left -= rem;
                i += 1;
                done_in_first = 0;
            } else {
                done_in_first += left;
                left = 0;
            }
        }
        while i < pairs.len() && pairs[i].2 == done_in_first {
            i += 1;
            done_in_first = 0;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_split_at_a_byte_offset() {
        let pairs = [(100, 1000, 10), (200, 2000, 0), (300, 3000, 6)];
        assert_eq!(
            split_at(&pairs, 0),
            (vec![], vec![(100, 1000, 10), (300, 3000, 6)])
        );
        assert_eq!(
            split_at(&pairs, 10),
            (vec![(100, 1000, 10)], vec![(300, 3000, 6)])
        );
        assert_eq!(
            split_at(&pairs, 13),
            (vec![(100, 1000, 10), (300, 3000, 3)], vec![(303, 3003, 3)])
        );
        assert_eq!(
            split_at(&pairs, 4),
            (vec![(100, 1000, 4)], vec![(104, 1004, 6), (300, 3000, 6)])
        );
        assert_eq!(split_at(&pairs, 99).1, vec![]);
    }

    #[test]
    fn copies_within_this_process_both_ways() {
        let pid = std::process::id() as i32;
        let src: Vec<u8> = (0..3 * IOV_MAX as u32 + 7).map(|i| i as u8).collect();
        let mut dst = vec![0u8; src.len()];
        // Many one-byte and odd pairs, more than one call's worth.
        let pairs: Vec<(u64, u64, u64)> = (0..src.len())
            .step_by(3)
            .map(|i| {
                let l = (src.len() - i).min(3) as u64;
                (
                    src.as_ptr() as u64 + i as u64,
                    dst.as_mut_ptr() as u64 + i as u64,
                    l,
                )
            })
            .collect();
        // SAFETY: `dst` is ours and unused meanwhile.
        unsafe { copy(pid, Direction::FromPeer, &pairs) }.unwrap();
        assert_eq!(dst, src);
        let mut back = vec![0u8; 1 << 20];
        let big = vec![7u8; 1 << 20];
        let pairs = [(back.as_mut_ptr() as u64, big.as_ptr() as u64, 1 << 20)];
        // SAFETY: `big` is readable; `back` is ours.
        unsafe { copy(pid, Direction::ToPeer, &pairs) }.unwrap();
        assert_eq!(back, big);
        // An unmapped peer address fails instead of copying.
        let bad = [(8u64, dst.as_mut_ptr() as u64, 8)];
        // SAFETY: `dst` is ours.
        assert!(unsafe { copy(pid, Direction::FromPeer, &bad) }.is_err());
    }
}
