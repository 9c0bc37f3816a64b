//! Length-prefixed little-endian frames over a byte stream, plus the
//! protocol-version handshake that opens every connection between our
//! processes (client<->master, client<->client).
//!
//! Frame layout: `u32 LE body length` followed by the body. The first frame a
//! connecting side sends is a [`Hello`]; the accepting side answers with its
//! own `Hello`. A version or magic mismatch closes the connection.

use serde::{de::DeserializeOwned, Deserialize, Serialize};
use std::io::{self, Read, Write};

/// Magic bytes carried by every `Hello`.
pub const MAGIC: [u8; 4] = *b"MCRS";
/// Wire protocol version; bump on any incompatible change.
pub const PROTOCOL_VERSION: u32 = 2;
/// Largest control frame accepted (guards against corrupt length prefixes).
pub const MAX_CONTROL_FRAME: usize = 256 << 20;

/// Which service a connection is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Service {
    /// client -> master RPC
    Master,
    /// client -> client data server
    Data,
}

/// First frame on every connection.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    pub magic: [u8; 4],
    pub version: u32,
    pub service: Service,
}

impl Hello {
    /// A hello for this build's protocol version.
    pub fn new(service: Service) -> Self {
        Hello {
            magic: MAGIC,
            version: PROTOCOL_VERSION,
            service,
        }
    }

    /// Check that a peer's hello is compatible with ours.
    pub fn check(&self, service: Service) -> Result<(), String> {
        if self.magic != MAGIC {
            return Err("bad magic: peer does not speak the mooncake-rs protocol".into());
        }
        if self.version != PROTOCOL_VERSION {
            return Err(format!(
                "protocol version mismatch: peer {} vs ours {}",
                self.version, PROTOCOL_VERSION
            ));
        }
        if self.service != service {
            return Err(format!(
                "wrong service: expected {service:?}, got {:?}",
                self.service
            ));
        }
        Ok(())
    }
}

/// Serialize a value to a body (bincode).
pub fn encode<T: Serialize>(value: &T) -> io::Result<Vec<u8>> {
    bincode::serialize(value).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// A whole frame (length prefix + bincode body) for `value`, built in one buffer.
pub fn encode_frame<T: Serialize>(value: &T) -> io::Result<Vec<u8>> {
    let mut buf: Vec<u8> = Vec::with_capacity(256);
    buf.extend_from_slice(&[0u8; 4]);
    bincode::serialize_into(&mut buf, value)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    let len = u32::try_from(buf.len() - 4)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "frame too large"))?;
    buf[..4].copy_from_slice(&len.to_le_bytes());
    Ok(buf)
}

/// Deserialize a body (bincode), rejecting trailing garbage.
pub fn decode<T: DeserializeOwned>(body: &[u8]) -> io::Result<T> {
    use bincode::Options;
    bincode::DefaultOptions::new()
        .with_fixint_encoding()
        .with_limit(MAX_CONTROL_FRAME as u64)
        .reject_trailing_bytes()
        .deserialize(body)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// Write one frame (length prefix + body).
pub fn write_frame<W: Write>(w: &mut W, body: &[u8]) -> io::Result<()> {
    let len = u32::try_from(body.len())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "frame too large"))?;
    let mut buf = Vec::with_capacity(4 + body.len());
    buf.extend_from_slice(&len.to_le_bytes());
    buf.extend_from_slice(body);
    w.write_all(&buf)
}

/// Read one frame body, refusing frames larger than `max`.
pub fn read_frame<R: Read>(r: &mut R, max: usize) -> io::Result<Vec<u8>> {
    let mut len = [0u8; 4];
    r.read_exact(&mut len)?;
    let len = u32::from_le_bytes(len) as usize;
    if len > max {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("frame of {len} bytes exceeds limit {max}"),
        ));
    }
    let mut body = vec![0u8; len];
    r.read_exact(&mut body)?;
    Ok(body)
}

/// Client side of the handshake: send our hello, check theirs.
pub fn client_handshake<S: Read + Write>(s: &mut S, service: Service) -> io::Result<()> {
    write_frame(s, &encode(&Hello::new(service))?)?;
    let body = read_frame(s, 1024)?;
    let hello: Hello = decode(&body)?;
    hello
        .check(service)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// Server side of the handshake: check the peer's hello, answer with ours.
pub fn server_handshake<S: Read + Write>(s: &mut S, service: Service) -> io::Result<()> {
    let body = read_frame(s, 1024)?;
    let hello: Hello = decode(&body)?;
    if let Err(e) = hello.check(service) {
        // Answer with our hello anyway so the peer can log the mismatch too.
        let _ = write_frame(s, &encode(&Hello::new(service))?);
        return Err(io::Error::new(io::ErrorKind::InvalidData, e));
    }
    write_frame(s, &encode(&Hello::new(service))?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_and_limits() {
        let mut buf = Vec::new();
        write_frame(&mut buf, b"abc").unwrap();
        let mut cur = std::io::Cursor::new(buf.clone());
        assert_eq!(read_frame(&mut cur, 10).unwrap(), b"abc");
        let mut cur = std::io::Cursor::new(buf);
        assert!(read_frame(&mut cur, 2).is_err());
        let mut trunc = std::io::Cursor::new(vec![10u8, 0, 0, 0, 1, 2]);
        assert!(read_frame(&mut trunc, 100).is_err());
    }

    #[test]
    fn hello_mismatch() {
        let mut h = Hello::new(Service::Master);
        assert!(h.check(Service::Master).is_ok());
        assert!(h.check(Service::Data).is_err());
        h.version = 99;
        assert!(h.check(Service::Master).unwrap_err().contains("version"));
    }

    #[test]
    fn decode_rejects_garbage() {
        let body = encode(&Hello::new(Service::Data)).unwrap();
        let mut bad = body.clone();
        bad.push(7);
        assert!(decode::<Hello>(&bad).is_err());
        assert!(decode::<Hello>(&body[..3]).is_err());
    }
}
