//! The data-server request format (after the `Service::Data` handshake):
//!
//! ```text
//! request:  op u8 (1 read, 2 write, 3 write with ticket) | uuid_len u8 | uuid
//!           | [ticket: offset u64, len u64, expires_ms u64, mac [32] -- op 3 only]
//!           | n u32 | n x (offset u64, len u32) | [write payload]
//! response: status i32 | [read payload, the ranges concatenated in order]
//! ```
//!
//! A read of an owner's disk tier has a format of its own:
//!
//! ```text
//! request:  op u8 (4) | key_len u32 | key | version u64 | offset u64 | len u64
//! response: status i32 | [len bytes of the value from offset]
//! ```
//!
//! Descriptors are 12 bytes; a range longer than `u32::MAX` is sent as
//! several consecutive descriptors (the payload is the same concatenation).
//! A data server with a cluster token accepts writes only as op 3, every
//! range inside the master's signed grant ([`WriteTicket`]).
//!
//! Parsing is bounded: at most [`MAX_RANGES`] descriptors, read in chunks so
//! that memory is committed only for descriptors that actually arrive, and
//! every sum checked.

use mooncake_common::WriteTicket;
use std::io::{self, Read};

/// Read the ranges.
pub const OP_READ: u8 = 1;
/// Write the ranges (payload follows the header).
pub const OP_WRITE: u8 = 2;
/// Write the ranges under a master-signed [`WriteTicket`] (payload follows).
pub const OP_WRITE_TICKET: u8 = 3;
/// Read a range of an object in the owner's disk tier.
pub const OP_DISK_READ: u8 = 4;
/// Longest key a disk read names.
pub const MAX_DISK_KEY: usize = 1 << 16;
/// Most ranges in one request.
pub const MAX_RANGES: usize = 1 << 20;
/// Descriptors parsed per read while decoding.
const DESC_CHUNK: usize = 4096;
/// Bytes per range descriptor on the wire.
pub const DESC_BYTES: usize = 12;
/// Longest range one descriptor carries.
const MAX_DESC_LEN: u64 = u32::MAX as u64;

/// A parsed request header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestHeader {
    /// [`OP_READ`], [`OP_WRITE`] or [`OP_WRITE_TICKET`].
    pub op: u8,
    /// Segment id the ranges refer to.
    pub uuid: String,
    /// The write grant ([`OP_WRITE_TICKET`] only).
    pub ticket: Option<WriteTicket>,
    /// `(offset, len)` pairs, in payload order.
    pub ranges: Vec<(u64, u64)>,
}

/// Encode a request header for `ranges` without building a
/// [`RequestHeader`]. A write with a `ticket` is sent as
/// [`OP_WRITE_TICKET`].
pub fn encode_header(
    op: u8,
    uuid: &str,
    ticket: Option<&WriteTicket>,
    ranges: impl Iterator<Item = (u64, u64)> + Clone,
) -> Vec<u8> {
    let n: usize = ranges
        .clone()
        .map(|(_, l)| (l.max(1)).div_ceil(MAX_DESC_LEN) as usize)
        .sum();
    let uuid = &uuid.as_bytes()[..uuid.len().min(255)];
    let op = match (op, ticket) {
        (OP_WRITE | OP_WRITE_TICKET, Some(_)) => OP_WRITE_TICKET,
        (op, _) => op,
    };
    let mut b = Vec::with_capacity(6 + uuid.len() + WriteTicket::WIRE_LEN + DESC_BYTES * n);
    b.push(op);
    b.push(uuid.len() as u8);
    b.extend_from_slice(uuid);
    if op == OP_WRITE_TICKET {
        if let Some(t) = ticket {
            b.extend_from_slice(&t.to_bytes());
        }
    }
    b.extend_from_slice(&(n as u32).to_le_bytes());
    for (mut o, mut l) in ranges {
        loop {
            let take = l.min(MAX_DESC_LEN);
            b.extend_from_slice(&o.to_le_bytes());
            b.extend_from_slice(&(take as u32).to_le_bytes());
            o = o.wrapping_add(take);
            l -= take;
            if l == 0 {
                break;
            }
        }
    }
    b
}

/// A disk-tier read request ([`OP_DISK_READ`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskRead {
    /// The object's key.
    pub key: String,
    /// The version the copy must hold.
    pub version: u64,
    /// First byte of the value to read.
    pub offset: u64,
    /// Bytes to read.
    pub len: u64,
}

impl DiskRead {
    /// The request's bytes, op included.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(29 + self.key.len());
        b.push(OP_DISK_READ);
        b.extend_from_slice(&(self.key.len() as u32).to_le_bytes());
        b.extend_from_slice(self.key.as_bytes());
        b.extend_from_slice(&self.version.to_le_bytes());
        b.extend_from_slice(&self.offset.to_le_bytes());
        b.extend_from_slice(&self.len.to_le_bytes());
        b
    }

    /// Parse a request whose op byte was already read.
    pub fn read_body<R: Read>(r: &mut R) -> io::Result<DiskRead> {
        let bad = |m: &str| io::Error::new(io::ErrorKind::InvalidData, m.to_string());
        let mut n = [0u8; 4];
        r.read_exact(&mut n)?;
        let n = u32::from_le_bytes(n) as usize;
        if n > MAX_DISK_KEY {
            return Err(bad("disk read key too long"));
        }
        let mut key = vec![0u8; n];
        r.read_exact(&mut key)?;
        let key = String::from_utf8(key).map_err(|_| bad("key not utf-8"))?;
        let mut w = [0u8; 24];
        r.read_exact(&mut w)?;
        let word = |i: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&w[i * 8..i * 8 + 8]);
            u64::from_le_bytes(a)
        };
        Ok(DiskRead {
            key,
            version: word(0),
            offset: word(1),
            len: word(2),
        })
    }
}

impl RequestHeader {
    /// Serialize the header.
    pub fn encode(&self) -> Vec<u8> {
        encode_header(
            self.op,
            &self.uuid,
            self.ticket.as_ref(),
            self.ranges.iter().copied(),
        )
    }

    /// Whether the request writes (a payload follows the header).
    pub fn is_write(&self) -> bool {
        self.op != OP_READ
    }

    /// Parse a header from a stream; errors on anything malformed.
    pub fn read_from<R: Read>(r: &mut R) -> io::Result<RequestHeader> {
        let bad = |m: &str| io::Error::new(io::ErrorKind::InvalidData, m.to_string());
        let mut h = [0u8; 2];
        r.read_exact(&mut h)?;
        if !matches!(h[0], OP_READ | OP_WRITE | OP_WRITE_TICKET) {
            return Err(bad("unknown data op"));
        }
        let mut uuid = vec![0u8; h[1] as usize];
        r.read_exact(&mut uuid)?;
        let uuid = String::from_utf8(uuid).map_err(|_| bad("uuid not utf-8"))?;
        let ticket = if h[0] == OP_WRITE_TICKET {
            let mut t = [0u8; WriteTicket::WIRE_LEN];
            r.read_exact(&mut t)?;
            Some(WriteTicket::from_bytes(&t))
        } else {
            None
        };
        let mut n = [0u8; 4];
        r.read_exact(&mut n)?;
        let n = u32::from_le_bytes(n) as usize;
        if n > MAX_RANGES {
            return Err(bad("too many ranges"));
        }
        let mut ranges: Vec<(u64, u64)> = Vec::with_capacity(n.min(DESC_CHUNK));
        let mut raw = vec![0u8; n.min(DESC_CHUNK) * DESC_BYTES];
        let mut left = n;
        while left > 0 {
            let take = left.min(DESC_CHUNK);
            let chunk = &mut raw[..take * DESC_BYTES];
            r.read_exact(chunk)?;
            for c in chunk.chunks_exact(DESC_BYTES) {
                let mut o = [0u8; 8];
                let mut l = [0u8; 4];
                o.copy_from_slice(&c[..8]);
                l.copy_from_slice(&c[8..]);
                let (o, l) = (u64::from_le_bytes(o), u64::from(u32::from_le_bytes(l)));
                // Re-join a long range that was split into several descriptors.
                match ranges.last_mut() {
                    Some((po, pl)) if *pl >= MAX_DESC_LEN && po.checked_add(*pl) == Some(o) => {
                        *pl = pl
                            .checked_add(l)
                            .ok_or_else(|| bad("range length overflows"))?
                    }
                    _ => ranges.push((o, l)),
                }
            }
            left -= take;
        }
        Ok(RequestHeader {
            op: h[0],
            uuid,
            ticket,
            ranges,
        })
    }

    /// Sum of range lengths (None on overflow).
    pub fn total(&self) -> Option<u64> {
        self.ranges
            .iter()
            .try_fold(0u64, |a, (_, l)| a.checked_add(*l))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_and_garbage() {
        let h = RequestHeader {
            op: OP_READ,
            uuid: "abc".into(),
            ticket: None,
            ranges: vec![(0, 10), (64, 3)],
        };
        let enc = h.encode();
        assert_eq!(enc.len(), 6 + 3 + 2 * DESC_BYTES);
        assert_eq!(RequestHeader::read_from(&mut &enc[..]).unwrap(), h);
        assert_eq!(h.total(), Some(13));
        assert!(RequestHeader::read_from(&mut &enc[..enc.len() - 1]).is_err());
        let mut bad = enc.clone();
        bad[0] = 9;
        assert!(RequestHeader::read_from(&mut &bad[..]).is_err());
    }

    #[test]
    fn disk_reads_roundtrip_and_refuse_huge_keys() {
        let d = DiskRead {
            key: "k/1".into(),
            version: 9,
            offset: 100,
            len: 5,
        };
        let enc = d.encode();
        assert_eq!(enc[0], OP_DISK_READ);
        assert_eq!(DiskRead::read_body(&mut &enc[1..]).unwrap(), d);
        assert!(DiskRead::read_body(&mut &enc[1..enc.len() - 1]).is_err());
        let mut huge = vec![];
        huge.extend_from_slice(&u32::MAX.to_le_bytes());
        assert!(DiskRead::read_body(&mut &huge[..]).is_err());
    }

    #[test]
    fn long_ranges_split_and_rejoin() {
        let big = (1u64 << 33) + 5;
        let h = RequestHeader {
            op: OP_READ,
            uuid: "u".into(),
            ticket: None,
            ranges: vec![(7, big), (1, 1)],
        };
        let enc = h.encode();
        assert_eq!(enc.len(), 6 + 1 + 4 * DESC_BYTES);
        assert_eq!(RequestHeader::read_from(&mut &enc[..]).unwrap(), h);
    }

    #[test]
    fn tickets_travel_with_writes_only() {
        let key = mooncake_common::AuthKey::new("k").unwrap();
        let t = WriteTicket::sign(&key, "u", 64, 128, 99);
        let enc = encode_header(OP_WRITE, "u", Some(&t), [(64u64, 128u64)].into_iter());
        let h = RequestHeader::read_from(&mut &enc[..]).unwrap();
        assert_eq!((h.op, h.ticket), (OP_WRITE_TICKET, Some(t)));
        assert!(h.is_write());
        let enc = encode_header(OP_READ, "u", Some(&t), [(64u64, 128u64)].into_iter());
        let h = RequestHeader::read_from(&mut &enc[..]).unwrap();
        assert_eq!((h.op, h.ticket), (OP_READ, None));
        assert!(!h.is_write());
    }

    #[test]
    fn claimed_descriptors_must_arrive() {
        // A header claiming the maximum number of ranges but carrying two.
        let mut b = vec![OP_READ, 1, b'u'];
        b.extend_from_slice(&(MAX_RANGES as u32).to_le_bytes());
        b.extend_from_slice(&[0u8; 2 * DESC_BYTES]);
        assert!(RequestHeader::read_from(&mut &b[..]).is_err());
        let mut b = vec![OP_READ, 1, b'u'];
        b.extend_from_slice(&(MAX_RANGES as u32 + 1).to_le_bytes());
        assert!(RequestHeader::read_from(&mut &b[..]).is_err());
        // Joined lengths never wrap.
        let mut b = vec![OP_READ, 1, b'u'];
        b.extend_from_slice(&3u32.to_le_bytes());
        let mut at = u64::MAX - 2 * MAX_DESC_LEN;
        for _ in 0..3 {
            b.extend_from_slice(&at.to_le_bytes());
            b.extend_from_slice(&u32::MAX.to_le_bytes());
            at = at.wrapping_add(MAX_DESC_LEN);
        }
        let h = RequestHeader::read_from(&mut &b[..]);
        assert!(h.map_or(true, |h| h.total().is_some()));
    }
}
