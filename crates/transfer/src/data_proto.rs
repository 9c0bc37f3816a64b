//! The data-server request format (after the `Service::Data` hello):
//!
//! ```text
//! request:  op u8 (1 read, 2 write) | uuid_len u8 | uuid | n u32 | n x (offset u64, len u64) | [write payload]
//! response: status i32 | [read payload, the ranges concatenated in order]
//! ```

use std::io::{self, Read};

/// Read the ranges.
pub const OP_READ: u8 = 1;
/// Write the ranges (payload follows the header).
pub const OP_WRITE: u8 = 2;
/// Most ranges in one request.
pub const MAX_RANGES: usize = 1 << 20;

/// A parsed request header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestHeader {
    pub op: u8,
    pub uuid: String,
    pub ranges: Vec<(u64, u64)>,
}

impl RequestHeader {
    /// Serialize the header.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(6 + self.uuid.len() + 16 * self.ranges.len());
        b.push(self.op);
        b.push(self.uuid.len() as u8);
        b.extend_from_slice(self.uuid.as_bytes());
        b.extend_from_slice(&(self.ranges.len() as u32).to_le_bytes());
        for (o, l) in &self.ranges {
            b.extend_from_slice(&o.to_le_bytes());
            b.extend_from_slice(&l.to_le_bytes());
        }
        b
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
        let mut raw = vec![0u8; n * 16];
        r.read_exact(&mut raw)?;
        let ranges = raw
            .chunks_exact(16)
            .map(|c| {
                let mut o = [0u8; 8];
                let mut l = [0u8; 8];
                o.copy_from_slice(&c[..8]);
                l.copy_from_slice(&c[8..]);
                (u64::from_le_bytes(o), u64::from_le_bytes(l))
            })
            .collect();
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
        assert_eq!(RequestHeader::read_from(&mut &enc[..]).unwrap(), h);
        assert_eq!(h.total(), Some(13));
        assert!(RequestHeader::read_from(&mut &enc[..enc.len() - 1]).is_err());
        let mut bad = enc.clone();
        bad[0] = 9;
        assert!(RequestHeader::read_from(&mut &bad[..]).is_err());
    }
}
