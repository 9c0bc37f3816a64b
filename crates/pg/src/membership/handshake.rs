//! Connection admission: the one place where a new TCP connection proves
//! what it is for before any frame flows. Two kinds exist:
//!
//! - a *data link* between two members of one group: the dialer sends
//!   `"MCPG"`, the protocol version, the group key, its slot and member id;
//!   the acceptor answers with a status byte and its own member id, and
//!   acknowledges only a member it currently expects (stale records are
//!   harmless: the receiver refuses unknown members and the dialer retries);
//! - a *control session* from a process's agent to a membership
//!   coordinator: `"MCPC"`, the version and the process's instance id,
//!   answered by one status byte.
//!
//! With a cluster token (`MC_AUTH_TOKEN` / `MC_AUTH_TOKEN_FILE`, the same
//! token the store's clients and masters use), both kinds then run the store's challenge-response
//! ([`mooncake_common::framing::client_handshake`] for
//! [`Service::PgRank`]): the secret never crosses the wire, proofs are
//! compared in constant time, and a link or session is used only after both
//! sides proved the same secret. The step always runs, token or not, so a
//! token on one side only is refused with a clear reason instead of a
//! silent mismatch; without a token on either side it admits as before.

use mooncake_common::framing::{client_handshake, server_handshake, Service};
use mooncake_common::AuthKey;
use std::io::{Read, Write};
use std::net::TcpStream;

/// Data-link preamble magic.
const LINK_MAGIC: &[u8; 4] = b"MCPG";
/// Control-session preamble magic.
const CONTROL_MAGIC: &[u8; 4] = b"MCPC";
/// Protocol version carried in both preambles.
const PROTO: u16 = 3;
/// Data-link preamble: magic, proto, pad, group key, slot, pad, member id.
const LINK_PREAMBLE_LEN: usize = 32;
/// Data-link reply: status u8, pad, member id u64.
const LINK_REPLY_LEN: usize = 16;
/// Control preamble: magic, proto, pad, instance id.
const CONTROL_PREAMBLE_LEN: usize = 16;

/// Who is dialing a data link.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct LinkHello {
    /// Hash of the group key.
    pub(crate) key: u64,
    /// The dialer's slot.
    pub(crate) slot: u32,
    /// The dialer's member id.
    pub(crate) member_id: u64,
}

fn encode_link(h: &LinkHello) -> [u8; LINK_PREAMBLE_LEN] {
    let mut b = [0u8; LINK_PREAMBLE_LEN];
    b[0..4].copy_from_slice(LINK_MAGIC);
    b[4..6].copy_from_slice(&PROTO.to_le_bytes());
    b[8..16].copy_from_slice(&h.key.to_le_bytes());
    b[16..20].copy_from_slice(&h.slot.to_le_bytes());
    b[24..32].copy_from_slice(&h.member_id.to_le_bytes());
    b
}

fn u64_at(b: &[u8], i: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[i..i + 8]);
    u64::from_le_bytes(a)
}

fn decode_link(b: &[u8; LINK_PREAMBLE_LEN]) -> Option<LinkHello> {
    if &b[0..4] != LINK_MAGIC || u16::from_le_bytes([b[4], b[5]]) != PROTO {
        return None;
    }
    Some(LinkHello {
        key: u64_at(b, 8),
        slot: u32::from_le_bytes([b[16], b[17], b[18], b[19]]),
        member_id: u64_at(b, 24),
    })
}

/// Whether `e` is an authentication refusal (as opposed to a transient
/// connection failure worth retrying).
pub(crate) fn is_auth_refusal(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::PermissionDenied
}

/// Dialer side of a data link: `Ok(true)` when the peer acknowledged, is
/// the member `expect_member` and (token or not) passed the authentication
/// step with `auth`; `Ok(false)` when it refused (not expecting us yet, or
/// another member holds that address) and the caller should retry. An
/// authentication refusal is an error of kind `PermissionDenied` whose
/// message says why (see [`is_auth_refusal`]).
pub(crate) fn link_dial(
    s: &mut TcpStream,
    hello: &LinkHello,
    expect_member: u64,
    auth: Option<&AuthKey>,
) -> std::io::Result<bool> {
    s.write_all(&encode_link(hello))?;
    let mut reply = [0u8; LINK_REPLY_LEN];
    s.read_exact(&mut reply)?;
    if reply[0] != 1 || u64_at(&reply, 8) != expect_member {
        return Ok(false);
    }
    client_handshake(s, Service::PgRank, auth)?;
    Ok(true)
}

/// What the acceptor of a data link learned.
#[derive(Debug)]
pub(crate) enum Accepted {
    /// Malformed preamble, or a member the group does not expect (told so).
    Refused,
    /// The dialer was expected but failed the authentication step.
    AuthFailed(LinkHello, std::io::Error),
    /// The dialer was expected and proved the cluster secret (if any).
    Admitted(LinkHello),
}

/// Acceptor side of a data link: reads the preamble and asks `admit`, which
/// answers with this member's id and the cluster secret of the group the
/// dialer names. An expected dialer gets an acknowledgement carrying the
/// member id and then has to pass the authentication step.
pub(crate) fn link_accept(
    s: &mut TcpStream,
    admit: impl FnOnce(&LinkHello) -> Option<(u64, Option<AuthKey>)>,
) -> std::io::Result<Accepted> {
    let mut pre = [0u8; LINK_PREAMBLE_LEN];
    s.read_exact(&mut pre)?;
    let Some(hello) = decode_link(&pre) else {
        return Ok(Accepted::Refused);
    };
    let mut reply = [0u8; LINK_REPLY_LEN];
    let admitted = admit(&hello);
    if let Some((me, _)) = &admitted {
        reply[0] = 1;
        reply[8..16].copy_from_slice(&me.to_le_bytes());
    }
    s.write_all(&reply)?;
    let Some((_, auth)) = admitted else {
        return Ok(Accepted::Refused);
    };
    match server_handshake(s, Service::PgRank, auth.as_ref()) {
        Ok(()) => Ok(Accepted::Admitted(hello)),
        Err(e) if is_auth_refusal(&e) => Ok(Accepted::AuthFailed(hello, e)),
        // The dialer went away or broke off mid-handshake (it found another
        // member at this address, or gave up): not an authentication
        // failure, so nothing is reported against its slot.
        Err(e) => Err(e),
    }
}

/// Dialer side of a control session, authenticated with `auth` (see the
/// module doc); an authentication refusal is a `PermissionDenied` error.
pub(crate) fn control_dial(
    s: &mut TcpStream,
    instance_id: u64,
    auth: Option<&AuthKey>,
) -> std::io::Result<()> {
    let mut b = [0u8; CONTROL_PREAMBLE_LEN];
    b[0..4].copy_from_slice(CONTROL_MAGIC);
    b[4..6].copy_from_slice(&PROTO.to_le_bytes());
    b[8..16].copy_from_slice(&instance_id.to_le_bytes());
    s.write_all(&b)?;
    let mut ok = [0u8; 1];
    s.read_exact(&mut ok)?;
    if ok[0] != 1 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::ConnectionRefused,
            "membership coordinator refused the session",
        ));
    }
    client_handshake(s, Service::PgRank, auth)
}

/// Acceptor side of a control session: the dialer's instance id once it
/// passed the authentication step with `auth`, or `None` for a malformed
/// preamble (refused). An authentication failure is an error saying why.
pub(crate) fn control_accept(
    s: &mut TcpStream,
    auth: Option<&AuthKey>,
) -> std::io::Result<Option<u64>> {
    let mut b = [0u8; CONTROL_PREAMBLE_LEN];
    s.read_exact(&mut b)?;
    if &b[0..4] != CONTROL_MAGIC || u16::from_le_bytes([b[4], b[5]]) != PROTO {
        let _ = s.write_all(&[0]);
        return Ok(None);
    }
    s.write_all(&[1])?;
    server_handshake(s, Service::PgRank, auth)?;
    Ok(Some(u64_at(&b, 8)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{SocketAddr, TcpListener};
    use std::thread::JoinHandle;

    /// A loopback listener handed to `serve` on its own thread, and its
    /// address.
    fn serve<T: Send + 'static>(
        serve: impl FnOnce(TcpListener) -> T + Send + 'static,
    ) -> (SocketAddr, JoinHandle<T>) {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = l.local_addr().expect("addr");
        (addr, std::thread::spawn(move || serve(l)))
    }

    /// The dialer's hello in the loopback tests.
    fn hello() -> LinkHello {
        LinkHello {
            key: 5,
            slot: 1,
            member_id: 8,
        }
    }

    #[test]
    fn link_preamble_round_trips_and_rejects_garbage() {
        let h = LinkHello {
            key: 7,
            slot: 3,
            member_id: 99,
        };
        assert_eq!(decode_link(&encode_link(&h)), Some(h));
        assert_eq!(decode_link(&[0u8; LINK_PREAMBLE_LEN]), None);
        let mut wrong = encode_link(&h);
        wrong[4] = 9;
        assert_eq!(decode_link(&wrong), None, "other protocol version");
    }

    #[test]
    fn handshakes_over_loopback() {
        let (addr, t) = serve(|l| {
            let (mut a, _) = l.accept().expect("accept");
            let got = link_accept(&mut a, |h| (h.slot == 1).then_some((42, None))).expect("io");
            let (mut b, _) = l.accept().expect("accept");
            let refused = link_accept(&mut b, |_| None).expect("io");
            let (mut c, _) = l.accept().expect("accept");
            let inst = control_accept(&mut c, None).expect("io");
            (got, refused, inst)
        });
        let hello = hello();
        let mut s = TcpStream::connect(addr).expect("dial");
        assert!(link_dial(&mut s, &hello, 42, None).expect("io"));
        let mut s = TcpStream::connect(addr).expect("dial");
        assert!(!link_dial(&mut s, &hello, 42, None).expect("io"));
        let mut s = TcpStream::connect(addr).expect("dial");
        control_dial(&mut s, 77, None).expect("control");
        let (got, refused, inst) = t.join().expect("join");
        assert!(matches!(got, Accepted::Admitted(h) if h == hello));
        assert!(matches!(refused, Accepted::Refused));
        assert_eq!(inst, Some(77));
    }

    fn key(t: &str) -> AuthKey {
        AuthKey::new(t).expect("key")
    }

    /// One data link between a dialer holding `dialer` and an acceptor
    /// holding `acceptor` (member 42): what each side concluded.
    fn link_with(
        dialer: Option<&str>,
        acceptor: Option<&str>,
    ) -> (std::io::Result<bool>, Accepted) {
        let (dialed, accepted) = link_expecting(42, dialer, acceptor);
        (dialed, accepted.expect("io"))
    }

    /// [`link_with`] with a dialer that expects member `expect` at the
    /// acceptor's address.
    fn link_expecting(
        expect: u64,
        dialer: Option<&str>,
        acceptor: Option<&str>,
    ) -> (std::io::Result<bool>, std::io::Result<Accepted>) {
        let acc = acceptor.map(key);
        let (addr, t) = serve(move |l| {
            let (mut a, _) = l.accept().expect("accept");
            link_accept(&mut a, |_| Some((42, acc)))
        });
        let hello = hello();
        let mut s = TcpStream::connect(addr).expect("dial");
        let dialed = link_dial(&mut s, &hello, expect, dialer.map(key).as_ref());
        drop(s);
        (dialed, t.join().expect("join"))
    }

    #[test]
    fn links_with_the_same_token_are_admitted() {
        let (dialed, accepted) = link_with(Some("cluster"), Some("cluster"));
        assert!(dialed.expect("dial"));
        assert!(matches!(accepted, Accepted::Admitted(h) if h.slot == 1 && h.member_id == 8));
    }

    #[test]
    fn links_with_different_tokens_are_refused_on_both_sides() {
        let (dialed, accepted) = link_with(Some("cluster"), Some("other"));
        let e = dialed.expect_err("dialer must be refused");
        assert!(is_auth_refusal(&e), "{e}");
        assert!(e.to_string().contains("tokens differ"), "{e}");
        match accepted {
            Accepted::AuthFailed(h, e) => {
                assert_eq!(h.slot, 1);
                assert!(is_auth_refusal(&e), "{e}");
                assert!(e.to_string().contains("failed to prove"), "{e}");
            }
            other => panic!("acceptor admitted a wrong token: {other:?}"),
        }
    }

    #[test]
    fn a_token_on_one_side_only_is_refused_with_its_reason() {
        // The dialer has no token; the acceptor requires one.
        let (dialed, accepted) = link_with(None, Some("cluster"));
        let e = dialed.expect_err("dialer must be refused");
        assert!(is_auth_refusal(&e), "{e}");
        assert!(e.to_string().contains("MC_AUTH_TOKEN"), "{e}");
        assert!(matches!(accepted, Accepted::AuthFailed(..)), "{accepted:?}");
        // The dialer has a token; the acceptor has none: the dialer refuses
        // an unauthenticated peer.
        let (dialed, _) = link_with(Some("cluster"), None);
        let e = dialed.expect_err("dialer must refuse");
        assert!(is_auth_refusal(&e), "{e}");
        assert!(e.to_string().contains("no cluster token"), "{e}");
    }

    /// A dialer that expected another member at this address drops the
    /// connection after the acknowledgement: the acceptor sees an I/O
    /// error, not an authentication failure of that slot.
    #[test]
    fn a_dialer_that_expected_another_member_is_no_auth_failure() {
        let (dialed, accepted) = link_expecting(43, Some("cluster"), Some("cluster"));
        assert!(
            !dialed.expect("io"),
            "the acceptor is not the member the dialer expects"
        );
        match accepted {
            Err(e) => assert!(!is_auth_refusal(&e), "{e}"),
            Ok(other) => panic!("expected an I/O error, got {other:?}"),
        }
    }

    #[test]
    fn the_secret_never_crosses_the_wire() {
        // Record every byte the dialer sends and receives on a link and a
        // control session with a token: the token's text is in neither.
        let token = "very-secret-cluster-token";
        let (addr, t) = serve(|l| {
            let (mut a, _) = l.accept().expect("accept");
            let mut seen = Vec::new();
            let mut tee = Tee(&mut a, &mut seen);
            let mut pre = [0u8; LINK_PREAMBLE_LEN];
            tee.read_exact(&mut pre).expect("preamble");
            let mut reply = [0u8; LINK_REPLY_LEN];
            reply[0] = 1;
            reply[8] = 42;
            tee.write_all(&reply).expect("reply");
            server_handshake(&mut tee, Service::PgRank, Some(&key(token))).expect("auth");
            seen
        });
        let hello = hello();
        let mut s = TcpStream::connect(addr).expect("dial");
        assert!(link_dial(&mut s, &hello, 42, Some(&key(token))).expect("dial"));
        let seen = t.join().expect("join");
        assert!(seen.len() > LINK_PREAMBLE_LEN + LINK_REPLY_LEN);
        assert!(!seen.windows(token.len()).any(|w| w == token.as_bytes()));
    }

    #[test]
    fn control_sessions_authenticate_too() {
        let run = |dialer: Option<&str>, acceptor: Option<&str>| {
            let acc = acceptor.map(key);
            let (addr, t) = serve(move |l| {
                let (mut a, _) = l.accept().expect("accept");
                control_accept(&mut a, acc.as_ref())
            });
            let mut s = TcpStream::connect(addr).expect("dial");
            let dialed = control_dial(&mut s, 77, dialer.map(key).as_ref());
            drop(s);
            (dialed, t.join().expect("join"))
        };
        let (d, a) = run(Some("k"), Some("k"));
        assert!(d.is_ok());
        assert_eq!(a.expect("accept"), Some(77));
        let (d, a) = run(Some("k"), Some("other"));
        assert!(is_auth_refusal(&d.expect_err("refused")));
        assert!(is_auth_refusal(&a.expect_err("refused")));
        let (d, a) = run(None, Some("k"));
        assert!(is_auth_refusal(&d.expect_err("refused")));
        assert!(a.is_err());
    }

    /// A stream that records every byte read from or written to it.
    struct Tee<'a>(&'a mut TcpStream, &'a mut Vec<u8>);

    impl Read for Tee<'_> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let n = self.0.read(buf)?;
            self.1.extend_from_slice(&buf[..n]);
            Ok(n)
        }
    }

    impl Write for Tee<'_> {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            let n = self.0.write(buf)?;
            self.1.extend_from_slice(&buf[..n]);
            Ok(n)
        }

        fn flush(&mut self) -> std::io::Result<()> {
            self.0.flush()
        }
    }
}
