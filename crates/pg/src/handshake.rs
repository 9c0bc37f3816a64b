//! Connection admission: the one place where a new TCP connection proves
//! what it is for before any frame flows. Two kinds exist:
//!
//! - a *data link* between two members of one group: the dialer sends
//!   `"MCPG"`, the protocol version, the group key, its slot and member id;
//!   the acceptor answers with a status byte and its own member id, and
//!   acknowledges only a member it currently expects (pg spec, handshake:
//!   stale records are harmless because the receiver NACKs unknown members
//!   and the dialer retries);
//! - a *control session* from a process's agent to a membership
//!   coordinator: `"MCPC"`, the version and the process's instance id,
//!   answered by one status byte.
//!
//! An authentication step (e.g. a challenge-response over a cluster secret)
//! belongs here, after the preamble and before the acknowledgement, for
//! both kinds.

use std::io::{Read, Write};
use std::net::TcpStream;

/// Data-link preamble magic.
const LINK_MAGIC: &[u8; 4] = b"MCPG";
/// Control-session preamble magic.
const CONTROL_MAGIC: &[u8; 4] = b"MCPC";
/// Protocol version carried in both preambles.
const PROTO: u16 = 2;
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

/// Dialer side of a data link: `Ok(true)` when the peer acknowledged and is
/// the member `expect_member`; `Ok(false)` when it refused (not expecting us
/// yet, or another member holds that address) and the caller should retry.
pub(crate) fn link_dial(
    s: &mut TcpStream,
    hello: &LinkHello,
    expect_member: u64,
) -> std::io::Result<bool> {
    s.write_all(&encode_link(hello))?;
    let mut reply = [0u8; LINK_REPLY_LEN];
    s.read_exact(&mut reply)?;
    Ok(reply[0] == 1 && u64_at(&reply, 8) == expect_member)
}

/// Acceptor side of a data link: reads the preamble and asks `admit`; an
/// admitted dialer gets an acknowledgement carrying `admit`'s member id.
/// Returns who was admitted (`None`: refused or malformed).
pub(crate) fn link_accept(
    s: &mut TcpStream,
    admit: impl FnOnce(&LinkHello) -> Option<u64>,
) -> std::io::Result<Option<LinkHello>> {
    let mut pre = [0u8; LINK_PREAMBLE_LEN];
    s.read_exact(&mut pre)?;
    let Some(hello) = decode_link(&pre) else {
        return Ok(None);
    };
    let mut reply = [0u8; LINK_REPLY_LEN];
    let admitted = admit(&hello);
    if let Some(me) = admitted {
        reply[0] = 1;
        reply[8..16].copy_from_slice(&me.to_le_bytes());
    }
    s.write_all(&reply)?;
    Ok(admitted.map(|_| hello))
}

/// Dialer side of a control session.
pub(crate) fn control_dial(s: &mut TcpStream, instance_id: u64) -> std::io::Result<()> {
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
    Ok(())
}

/// Acceptor side of a control session: the dialer's instance id, or `None`
/// for a malformed preamble (refused).
pub(crate) fn control_accept(s: &mut TcpStream) -> std::io::Result<Option<u64>> {
    let mut b = [0u8; CONTROL_PREAMBLE_LEN];
    s.read_exact(&mut b)?;
    if &b[0..4] != CONTROL_MAGIC || u16::from_le_bytes([b[4], b[5]]) != PROTO {
        let _ = s.write_all(&[0]);
        return Ok(None);
    }
    s.write_all(&[1])?;
    Ok(Some(u64_at(&b, 8)))
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = l.local_addr().expect("addr");
        let t = std::thread::spawn(move || {
            let (mut a, _) = l.accept().expect("accept");
            let got = link_accept(&mut a, |h| (h.slot == 1).then_some(42)).expect("io");
            let (mut b, _) = l.accept().expect("accept");
            let refused = link_accept(&mut b, |_| None).expect("io");
            let (mut c, _) = l.accept().expect("accept");
            let inst = control_accept(&mut c).expect("io");
            (got, refused, inst)
        });
        let hello = LinkHello {
            key: 5,
            slot: 1,
            member_id: 8,
        };
        let mut s = TcpStream::connect(addr).expect("dial");
        assert!(link_dial(&mut s, &hello, 42).expect("io"));
        let mut s = TcpStream::connect(addr).expect("dial");
        assert!(!link_dial(&mut s, &hello, 42).expect("io"));
        let mut s = TcpStream::connect(addr).expect("dial");
        control_dial(&mut s, 77).expect("control");
        let (got, refused, inst) = t.join().expect("join");
        assert_eq!(got, Some(hello));
        assert_eq!(refused, None);
        assert_eq!(inst, Some(77));
    }
}
