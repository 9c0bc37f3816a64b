//! Accepting connections on the PG listeners (the process engine's link
//! listener and the membership coordinator's), under the rules every
//! listener of the stack follows, so that no peer, broken or hostile, can
//! starve the others:
//! - each accepted connection runs its handshake on its own thread, so a
//!   peer that connects and stays silent delays nobody else (it only holds
//!   its own thread until the handshake's read timeout);
//! - connections still in their handshake are capped in total and per peer
//!   address (`MC_PG_MAX_CONNS`, `MC_PG_MAX_CONNS_PER_PEER`), so silent
//!   connections cannot pile up threads and descriptors; a connection over
//!   the cap is closed at once;
//! - the accept loop backs off when the process is out of descriptors
//!   (`EMFILE`/`ENFILE`) instead of spinning.
//!
//! Established links are not counted: a group has at most one link per
//! peer, bounded by the group size, and the watchdog closes silent ones.

use mooncake_common::limits::{accept_until, ConnLimits, ConnPermit, ConnTracker};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::time::Duration;

/// Handshakes in progress at once, at most (scaled down to the descriptor
/// limit by [`ConnLimits::scaled_to_fd_limit`]).
const MAX_PENDING: usize = 256;
/// Handshakes in progress from one peer address, at most.
const MAX_PENDING_PER_PEER: usize = 64;

/// The caps on connections in their handshake, with the environment's
/// overrides.
fn limits() -> ConnLimits {
    ConnLimits::scaled_to_fd_limit(MAX_PENDING, MAX_PENDING_PER_PEER, Duration::ZERO)
        .with_env("MC_PG")
}

/// Serves `listener` until `stopped()` holds after an accept: each admitted
/// connection goes to `handle` on a thread named `name`, with the permit
/// that counts it as pending; `handle` drops the permit once the handshake
/// is over.
pub(crate) fn serve<S, H>(listener: TcpListener, name: &str, stopped: S, handle: H)
where
    S: Fn() -> bool,
    H: Fn(TcpStream, ConnPermit) + Send + Sync + 'static,
{
    serve_with(limits(), listener, name, stopped, handle)
}

fn serve_with<S, H>(limits: ConnLimits, listener: TcpListener, name: &str, stopped: S, handle: H)
where
    S: Fn() -> bool,
    H: Fn(TcpStream, ConnPermit) + Send + Sync + 'static,
{
    let tracker = ConnTracker::new(limits);
    let handle = Arc::new(handle);
    accept_until(
        "pg admission",
        stopped,
        || listener.accept(),
        |(s, peer)| {
            let Ok(permit) = tracker.try_acquire(peer.ip()) else {
                // Over the cap: closed at once (dropping `s`).
                return;
            };
            let handle = Arc::clone(&handle);
            // A failed spawn drops the closure, and with it the connection.
            let _ = std::thread::Builder::new()
                .name(name.to_string())
                .spawn(move || handle(s, permit));
        },
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::sync::atomic::{AtomicBool, Ordering};

    /// Silent connections do not delay an honest peer's handshake: each
    /// waits on its own thread.
    #[test]
    fn a_silent_connection_does_not_block_the_next_one() {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = l.local_addr().expect("addr");
        let stop = Arc::new(AtomicBool::new(false));
        let st = stop.clone();
        std::thread::spawn(move || {
            serve(
                l,
                "test-acc",
                move || st.load(Ordering::Acquire),
                |mut s, permit| {
                    // A 30 s handshake timeout: far longer than the reads
                    // below wait, so a serial acceptor would fail them.
                    let _ = s.set_read_timeout(Some(Duration::from_secs(30)));
                    let mut b = [0u8; 1];
                    if s.read_exact(&mut b).is_ok() {
                        let _ = s.write_all(&[b[0].wrapping_add(1)]);
                    }
                    drop(permit);
                },
            )
        });
        let silent: Vec<TcpStream> = (0..3)
            .map(|_| TcpStream::connect(addr).expect("connect"))
            .collect();
        for i in 0..3u8 {
            let mut c = TcpStream::connect(addr).expect("connect");
            c.set_read_timeout(Some(Duration::from_secs(10)))
                .expect("timeout");
            c.write_all(&[i]).expect("write");
            let mut r = [0u8; 1];
            c.read_exact(&mut r)
                .expect("answered while others stay silent");
            assert_eq!(r[0], i + 1);
        }
        drop(silent);
        stop.store(true, Ordering::Release);
        let _ = TcpStream::connect(addr);
    }

    /// Past the per-peer cap of pending handshakes, a connection is closed
    /// at once; once a pending one finishes, the next is served again.
    #[test]
    fn connections_over_the_pending_cap_are_closed() {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = l.local_addr().expect("addr");
        let limits = ConnLimits {
            max_total: 8,
            max_per_peer: 2,
            idle_timeout: None,
        };
        std::thread::spawn(move || {
            serve_with(
                limits,
                l,
                "test-cap",
                || false,
                |mut s, permit| {
                    let _ = s.set_read_timeout(Some(Duration::from_secs(30)));
                    let mut b = [0u8; 1];
                    if s.read_exact(&mut b).is_ok() {
                        drop(permit);
                        let _ = s.write_all(&[b[0].wrapping_add(1)]);
                    }
                },
            )
        });
        let mut held: Vec<TcpStream> = (0..2)
            .map(|_| TcpStream::connect(addr).expect("connect"))
            .collect();
        // Both slots are taken: the third is closed without an answer.
        let mut over = TcpStream::connect(addr).expect("connect");
        over.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        let _ = over.write_all(&[7]);
        let mut r = [0u8; 1];
        match over.read(&mut r) {
            Ok(0) | Err(_) => {}
            Ok(_) => panic!("a connection over the cap was served"),
        }
        // One pending handshake completes: its slot serves the next peer.
        held[0]
            .set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        held[0].write_all(&[1]).expect("write");
        held[0].read_exact(&mut r).expect("answer");
        assert_eq!(r[0], 2);
        let mut next = TcpStream::connect(addr).expect("connect");
        next.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        next.write_all(&[5]).expect("write");
        next.read_exact(&mut r).expect("served after a slot freed");
        assert_eq!(r[0], 6);
        held.clear();
    }
}
