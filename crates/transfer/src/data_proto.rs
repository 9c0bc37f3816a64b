//! The data-server request format (after the `Service::Data` hello):
//!
//! ```text
//! request:  op u8 (1 read, 2 write) | uuid_len u8 | uuid | n u32 | n x (offset u64, len u32) | [write payload]
//! response: status i32 | [read payload, the ranges concatenated in order]
//! ```
//!
//! Descriptors are 12 bytes; a range longer than `u32::MAX` is sent as
//! several consecutive descriptors (the payload is the same concatenation).

use std::io::{self, Read};

/// Read the ranges.
pub const OP_READ: u8 = 1;
/// Write the ranges (payload follows the header).
pub const OP_WRITE: u8 = 2;
/// Most ranges in one request.
pub const MAX_RANGES: usize = 1 << 20;
/// Bytes per range descriptor on the wire.
pub const DESC_BYTES: usize = 12;
/// Longest range one descriptor carries.
const MAX_DESC_LEN: u64 = u32::MAX as u64;

/// A parsed request header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestHeader {
    /// [`OP_READ`] or [`OP_WRITE`].
    pub op: u8,
    /// Segment id the ranges refer to.
    pub uuid: String,
    /// `(offset, len)` pairs, in payload order.
    pub ranges: Vec<(u64, u64)>,
}

/// Encode a request header for `ranges` without building a [`RequestHeader`].
pub fn encode_header(
    op: u8,
    uuid: &str,
    ranges: impl Iterator<Item = (u64, u64)> + Clone,
) -> Vec<u8> {
    let n: usize = ranges
        .clone()
        .map(|(_, l)| (l.max(1)).div_ceil(MAX_DESC_LEN) as usize)
        .sum();
    let uuid = &uuid.as_bytes()[..uuid.len().min(255)];
    let mut b = Vec::with_capacity(6 + uuid.len() + DESC_BYTES * n);
    b.push(op);
    b.push(uuid.len() as u8);
    b.extend_from_slice(uuid);
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

impl RequestHeader {
    /// Serialize the header.
    pub fn encode(&self) -> Vec<u8> {
        encode_header(self.op, &self.uuid, self.ranges.iter().copied())
    }

    /// Parse a header from a stream; errors on anything malformed.
    pub fn read_from<R: Read>(r: &mut R) -> io::Result<RequestHeader> {
        let bad = |m: &str| io::Error::new(io::ErrorKind::InvalidData, m.to_string());
        let mut h = [0u8; 2];
        r.read_exact(&mut h)?;
        if h[0] != OP_READ && h[0] != OP_WRITE {
            return Err(bad("unknown data op"));
        }
        let mut uuid = vec![0u8; h[1] as usize];
        r.read_exact(&mut uuid)?;
        let uuid = String::from_utf8(uuid).map_err(|_| bad("uuid not utf-8"))?;
        let mut n = [0u8; 4];
        r.read_exact(&mut n)?;
        let n = u32::from_le_bytes(n) as usize;
        if n > MAX_RANGES {
            return Err(bad("too many ranges"));
        }
        let mut raw = vec![0u8; n * DESC_BYTES];
        r.read_exact(&mut raw)?;
        let mut ranges: Vec<(u64, u64)> = Vec::with_capacity(n);
        for c in raw.chunks_exact(DESC_BYTES) {
            let mut o = [0u8; 8];
            let mut l = [0u8; 4];
            o.copy_from_slice(&c[..8]);
            l.copy_from_slice(&c[8..]);
            let (o, l) = (u64::from_le_bytes(o), u32::from_le_bytes(l) as u64);
            // Re-join a long range that was split into several descriptors.
            match ranges.last_mut() {
                Some((po, pl)) if *pl >= MAX_DESC_LEN && po.checked_add(*pl) == Some(o) => {
                    *pl = pl.saturating_add(l)
                }
                _ => ranges.push((o, l)),
            }
        }
        Ok(RequestHeader {
            op: h[0],
            uuid,
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
    fn long_ranges_split_and_rejoin() {
        let big = (1u64 << 33) + 5;
        let h = RequestHeader {
            op: OP_READ,
            uuid: "u".into(),
            ranges: vec![(7, big), (1, 1)],
        };
        let enc = h.encode();
        assert_eq!(enc.len(), 6 + 1 + 4 * DESC_BYTES);
        assert_eq!(RequestHeader::read_from(&mut &enc[..]).unwrap(), h);
    }
}
