//! The connection side of a server loop, shared by the store's data server
//! and the engine's RPC server (their accept loops and admission rules are
//! `mooncake_common::limits`): each admitted connection is served on a
//! thread of its own, tracked while open so that stopping the server closes
//! it, and its end is logged only when it says more than "the peer went
//! away".

use mooncake_common::limits::{OpenConns, ShutdownBoth};
use std::io;
use std::sync::Arc;

/// Whether a served connection ended only because its peer went away
/// (closed or reset it) or it sat idle past the server's timeout: not
/// worth a log line.
pub fn peer_gone(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::UnexpectedEof
            | io::ErrorKind::WouldBlock
            | io::ErrorKind::TimedOut
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::BrokenPipe
    )
}

/// Serve `sock` with `serve` on a thread of its own named `name`, tracked
/// in `conns` while it is open (`serve` gets the shared handle, which a
/// reader on another thread may also hold). The socket is shut down when `serve`
/// returns: a server stopping meanwhile may still hold a reference, and the
/// peer must see the close now. A thread that cannot be started drops the
/// connection (the peer sees it closed).
pub fn spawn_conn<S: ShutdownBoth + Send + Sync + 'static>(
    name: &str,
    conns: &OpenConns<S>,
    sock: S,
    serve: impl FnOnce(&Arc<S>) + Send + 'static,
) {
    let sock = Arc::new(sock);
    conns.track(&sock);
    let _ = std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            serve(&sock);
            sock.shutdown_both();
        });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::net::tcp_pair;
    use std::io::{Read, Write};
    use std::net::TcpStream;

    #[test]
    fn a_served_connection_is_closed_when_its_handler_returns() {
        let (mut c, s) = tcp_pair();
        let conns = OpenConns::default();
        spawn_conn("test-conn", &conns, s, |s: &Arc<TcpStream>| {
            let _ = (&**s).write_all(b"hi");
        });
        let mut got = Vec::new();
        // EOF arrives after the handler's bytes: the handler's end closed it.
        c.read_to_end(&mut got)
            .unwrap_or_else(|e| panic!("read: {e}"));
        assert_eq!(got, b"hi");
    }

    #[test]
    fn stopping_the_server_closes_a_connection_still_being_served() {
        let (mut c, s) = tcp_pair();
        let conns = OpenConns::default();
        let (tx, rx) = std::sync::mpsc::channel();
        spawn_conn("test-conn", &conns, s, move |s: &Arc<TcpStream>| {
            // Blocks until the server shuts the socket down.
            let mut b = [0u8; 1];
            let _ = tx.send((&**s).read(&mut b).map(|n| n == 0).unwrap_or(true));
        });
        conns.shutdown_all();
        assert_eq!(
            rx.recv_timeout(std::time::Duration::from_secs(10)).ok(),
            Some(true)
        );
        let mut b = [0u8; 1];
        assert_eq!(c.read(&mut b).ok(), Some(0));
    }

    #[test]
    fn only_a_departed_or_idle_peer_is_quiet() {
        for k in [
            io::ErrorKind::UnexpectedEof,
            io::ErrorKind::ConnectionReset,
            io::ErrorKind::TimedOut,
        ] {
            assert!(peer_gone(&io::Error::from(k)));
        }
        for k in [
            io::ErrorKind::InvalidData,
            io::ErrorKind::PermissionDenied,
            io::ErrorKind::Other,
        ] {
            assert!(!peer_gone(&io::Error::from(k)));
        }
    }
}
