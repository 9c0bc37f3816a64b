//! Length-prefixed little-endian frames over a byte stream, plus the
//! protocol-version and authentication handshake that opens every
//! connection between our processes (client<->master, client<->client).
//!
//! Frame layout: `u32 LE body length` followed by the body. Every frame is
//! read against a limit that fits its kind ([`MAX_HANDSHAKE_FRAME`],
//! [`MAX_REQUEST_FRAME`], [`MAX_CONTROL_FRAME`]), and memory for a large
//! body is committed only as its bytes arrive, so a peer cannot make us
//! allocate what it does not send.
//!
//! Handshake (protocol 3):
//!
//! ```text
//! connecting side                          accepting side
//! Hello, ClientAuth{nonce_c, has_key}  ->
//!                                      <-  Hello, ServerAuth{nonce_s, required}
//! (only when both sides hold a token:)
//! proof_c = MAC(client, service, nonce_s, nonce_c) ->
//!                                      <-  AuthResult{ok, proof_s = MAC(server, service, nonce_c, nonce_s)}
//! ```
//!
//! A version or magic mismatch closes the connection after the hellos (both
//! sides log it). A token on one side only is refused by the side that
//! notices: the accepting side when the peer cannot prove the secret, the
//! connecting side when the peer does not ask for it (so a client with a
//! token never talks to an unauthenticated impostor). See [`crate::auth`].

use crate::auth::{self, AuthKey, Nonce, Tag};
use serde::{de::DeserializeOwned, Deserialize, Serialize};
use std::io::{self, Read, Write};

/// Magic bytes carried by every `Hello`.
pub const MAGIC: [u8; 4] = *b"MCRS";
/// Wire protocol version; bump on any incompatible change.
pub const PROTOCOL_VERSION: u32 = 4;
/// Largest handshake frame (hello, challenge, proof).
pub const MAX_HANDSHAKE_FRAME: usize = 256;
/// Largest request frame a master accepts from a client.
pub const MAX_REQUEST_FRAME: usize = 64 << 20;
/// Largest control frame accepted from the master (a response listing the
/// replicas of a large batch).
pub const MAX_CONTROL_FRAME: usize = 256 << 20;
/// Frames up to this size are read into a buffer of their full size at
/// once; larger ones grow as their bytes arrive.
const EAGER_FRAME: usize = 64 << 10;

/// Which service a connection is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Service {
    /// client -> master RPC
    Master,
    /// client -> client data server
    Data,
    /// torch.distributed rank -> rank link (crates/pg), for ranks that
    /// share the cluster token
    PgRank,
    /// transfer engine -> transfer engine RPC (`mooncake_transfer::engine`):
    /// descriptors, probes, notifications and data
    Engine,
    /// dummy client -> standalone `mooncake_client` daemon (crates/standalone)
    Standalone,
}

impl Service {
    fn byte(self) -> u8 {
        match self {
            Service::Master => 0,
            Service::Data => 1,
            Service::PgRank => 2,
            Service::Engine => 3,
            Service::Standalone => 4,
        }
    }
}

/// First frame on every connection.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    /// Always [`MAGIC`].
    pub magic: [u8; 4],
    /// The sender's [`PROTOCOL_VERSION`].
    pub version: u32,
    /// The service the connection is for.
    pub service: Service,
}

/// Second frame from the connecting side: its challenge.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct ClientAuth {
    nonce: Nonce,
    has_key: bool,
}

/// Second frame from the accepting side: its challenge, and whether it
/// requires a proof of the cluster secret.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct ServerAuth {
    nonce: Nonce,
    required: bool,
}

/// The accepting side's verdict on the proof, with its own proof.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct AuthResult {
    ok: bool,
    proof: Tag,
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

/// Deserialize a body (bincode), rejecting trailing garbage. No length
/// inside the body can make the decoder reserve more than the body holds.
pub fn decode<T: DeserializeOwned>(body: &[u8]) -> io::Result<T> {
    use bincode::Options;
    bincode::DefaultOptions::new()
        .with_fixint_encoding()
        .with_limit(body.len() as u64)
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

/// Read one frame body, refusing frames larger than `max`. A large body's
/// buffer grows only as its bytes arrive.
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
    if len <= EAGER_FRAME {
        let mut body = vec![0u8; len];
        r.read_exact(&mut body)?;
        return Ok(body);
    }
    let mut body = Vec::with_capacity(EAGER_FRAME);
    r.by_ref().take(len as u64).read_to_end(&mut body)?;
    if body.len() != len {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    Ok(body)
}

fn denied(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::PermissionDenied, msg.into())
}

fn frames(a: &[u8], b: &[u8]) -> io::Result<Vec<u8>> {
    let mut out = Vec::with_capacity(8 + a.len() + b.len());
    for body in [a, b] {
        let len = u32::try_from(body.len())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "frame too large"))?;
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(body);
    }
    Ok(out)
}

/// Connecting side of the handshake: hellos, then (when the peer requires
/// it) proof of the cluster secret `key`, checking the peer's proof in turn.
pub fn client_handshake<S: Read + Write>(
    s: &mut S,
    service: Service,
    key: Option<&AuthKey>,
) -> io::Result<()> {
    let nonce_c = auth::nonce();
    let ours = ClientAuth {
        nonce: nonce_c,
        has_key: key.is_some(),
    };
    s.write_all(&frames(&encode(&Hello::new(service))?, &encode(&ours)?)?)?;
    let hello: Hello = decode(&read_frame(s, MAX_HANDSHAKE_FRAME)?)?;
    hello
        .check(service)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    let theirs: ServerAuth = decode(&read_frame(s, MAX_HANDSHAKE_FRAME)?)?;
    let key = match (key, theirs.required) {
        (None, false) => return Ok(()),
        (None, true) => {
            return Err(denied(format!(
                "the {service:?} service requires the cluster token: set {} or {}",
                auth::TOKEN_ENV,
                auth::TOKEN_FILE_ENV
            )))
        }
        (Some(_), false) => {
            return Err(denied(format!(
                "the {service:?} peer has no cluster token configured but this process has one; refusing an unauthenticated peer"
            )))
        }
        (Some(k), true) => k,
    };
    let svc = [service.byte()];
    let proof = key.mac(auth::DOMAIN_CLIENT_PROOF, &[&svc, &theirs.nonce, &nonce_c]);
    write_frame(s, &encode(&proof)?)?;
    let result: AuthResult = decode(&read_frame(s, MAX_HANDSHAKE_FRAME)?)?;
    if !result.ok {
        return Err(denied(format!(
            "the {service:?} peer refused our cluster token (the tokens differ)"
        )));
    }
    if !key.verify(
        auth::DOMAIN_SERVER_PROOF,
        &[&svc, &nonce_c, &theirs.nonce],
        &result.proof,
    ) {
        return Err(denied(format!(
            "the {service:?} peer failed to prove the cluster token"
        )));
    }
    Ok(())
}

/// Accepting side of the handshake: check the peer's hello, answer with
/// ours and our challenge, and with a cluster secret `key`, admit the peer
/// only if it proves the secret. Errors say why the peer was refused.
pub fn server_handshake<S: Read + Write>(
    s: &mut S,
    service: Service,
    key: Option<&AuthKey>,
) -> io::Result<()> {
    let hello: Hello = decode(&read_frame(s, MAX_HANDSHAKE_FRAME)?)?;
    let ours = encode(&Hello::new(service))?;
    if let Err(e) = hello.check(service) {
        // Answer with our hello anyway so the peer can log the mismatch too.
        let _ = write_frame(s, &ours);
        return Err(io::Error::new(io::ErrorKind::InvalidData, e));
    }
    let theirs: ClientAuth = decode(&read_frame(s, MAX_HANDSHAKE_FRAME)?)?;
    let nonce_s = auth::nonce();
    let challenge = ServerAuth {
        nonce: nonce_s,
        required: key.is_some(),
    };
    s.write_all(&frames(&ours, &encode(&challenge)?)?)?;
    let Some(key) = key else {
        return Ok(());
    };
    let proof: Tag = match read_frame(s, MAX_HANDSHAKE_FRAME) {
        Ok(body) => decode(&body)?,
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof && !theirs.has_key => {
            return Err(denied("peer has no cluster token"));
        }
        Err(e) => return Err(e),
    };
    let svc = [service.byte()];
    if !key.verify(
        auth::DOMAIN_CLIENT_PROOF,
        &[&svc, &nonce_s, &theirs.nonce],
        &proof,
    ) {
        let refusal = AuthResult {
            ok: false,
            proof: [0u8; auth::TAG_LEN],
        };
        let _ = write_frame(s, &encode(&refusal)?);
        return Err(denied("peer failed to prove the cluster token"));
    }
    let result = AuthResult {
        ok: true,
        proof: key.mac(auth::DOMAIN_SERVER_PROOF, &[&svc, &theirs.nonce, &nonce_s]),
    };
    write_frame(s, &encode(&result)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixStream;

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
    fn large_frames_are_read_as_they_arrive() {
        let body: Vec<u8> = (0..(EAGER_FRAME * 3 + 17)).map(|i| i as u8).collect();
        let mut buf = Vec::new();
        write_frame(&mut buf, &body).unwrap();
        assert_eq!(
            read_frame(&mut std::io::Cursor::new(&buf), MAX_REQUEST_FRAME).unwrap(),
            body
        );
        // A length claim far beyond what is sent fails at the end of the
        // data, having held only what arrived.
        let mut claim = (MAX_REQUEST_FRAME as u32).to_le_bytes().to_vec();
        claim.extend_from_slice(&[1u8; 100]);
        let e = read_frame(&mut std::io::Cursor::new(claim), MAX_REQUEST_FRAME).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
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
        // A vector claiming 2^60 elements in a 12-byte body.
        let mut huge = (1u64 << 60).to_le_bytes().to_vec();
        huge.extend_from_slice(&[0u8; 4]);
        assert!(decode::<Vec<u64>>(&huge).is_err());
    }

    /// Run both sides of the handshake; (client result, server result).
    fn handshake(client: Option<&str>, server: Option<&str>) -> (io::Result<()>, io::Result<()>) {
        handshake_for(Service::Data, Service::Data, client, server)
    }

    /// [`handshake`] with each side's service.
    fn handshake_for(
        client_svc: Service,
        server_svc: Service,
        client: Option<&str>,
        server: Option<&str>,
    ) -> (io::Result<()>, io::Result<()>) {
        let (mut a, mut b) = UnixStream::pair().expect("pair");
        let ck = client.map(|t| AuthKey::new(t).expect("key"));
        let sk = server.map(|t| AuthKey::new(t).expect("key"));
        let srv = std::thread::spawn(move || {
            let r = server_handshake(&mut b, server_svc, sk.as_ref());
            drop(b);
            r
        });
        let c = client_handshake(&mut a, client_svc, ck.as_ref());
        drop(a);
        (c, srv.join().expect("server thread"))
    }

    #[test]
    fn handshake_with_and_without_tokens() {
        let (c, s) = handshake(None, None);
        assert!(c.is_ok() && s.is_ok());
        let (c, s) = handshake(Some("t"), Some("t"));
        assert!(c.is_ok(), "{c:?}");
        assert!(s.is_ok(), "{s:?}");
        for (client, server) in [(None, Some("t")), (Some("x"), Some("t")), (Some("t"), None)] {
            let (c, s) = handshake(client, server);
            let e = c.expect_err("client must fail");
            assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{e}");
            if server.is_some() {
                let e = s.expect_err("server must refuse");
                assert!(
                    matches!(
                        e.kind(),
                        io::ErrorKind::PermissionDenied | io::ErrorKind::UnexpectedEof
                    ),
                    "{e}"
                );
            }
        }
    }

    #[test]
    fn services_are_kept_apart() {
        let (c, s) = handshake_for(Service::PgRank, Service::PgRank, Some("t"), Some("t"));
        assert!(c.is_ok() && s.is_ok());
        let (c, s) = handshake_for(Service::PgRank, Service::Data, Some("t"), Some("t"));
        assert!(c.is_err() && s.is_err());
    }

    #[test]
    fn old_protocol_peer_is_refused_with_a_version_message() {
        let (mut a, mut b) = UnixStream::pair().expect("pair");
        let srv = std::thread::spawn(move || server_handshake(&mut b, Service::Master, None));
        let mut old = Hello::new(Service::Master);
        old.version = 2;
        write_frame(&mut a, &encode(&old).unwrap()).unwrap();
        let e = srv.join().expect("join").expect_err("refused");
        assert!(e.to_string().contains("version"), "{e}");
        let theirs: Hello = decode(&read_frame(&mut a, 64).unwrap()).unwrap();
        assert_eq!(theirs.version, PROTOCOL_VERSION);
    }
}
