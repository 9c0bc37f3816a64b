//! Optional cluster-secret authentication (beyond upstream, which has none).
//!
//! Owns the one primitive every listener of the stack uses to admit a peer:
//! an HMAC-SHA256 challenge-response over a shared secret (the "cluster
//! token"), so the secret itself never crosses the wire and every proof is
//! compared in constant time. The master reads the token from
//! `--auth_token_file`; clients and ranks from `MC_AUTH_TOKEN` or
//! `MC_AUTH_TOKEN_FILE`. Without a token every listener behaves as before
//! (for trusted networks only).
//!
//! Also owns [`WriteTicket`]: the master's signed grant that lets a put in
//! progress write one range of one segment, which the segment owner's data
//! server checks before accepting bytes (with a token, data-port
//! writes land only in ranges the master granted).
//!
//! Every MAC is computed over an unambiguous encoding: the domain label
//! (its length as one byte, then the label) followed by each part as a
//! `u32` little-endian length and the bytes. Distinct labels keep a proof
//! made for one purpose from being replayed for another.

use hmac::{Hmac, Mac};
use rand::RngCore;
use serde::{Deserialize, Serialize};
use sha2::Sha256;
use std::fmt;
use std::path::Path;
use std::sync::Arc;

/// Environment variable holding the cluster token itself.
pub const TOKEN_ENV: &str = "MC_AUTH_TOKEN";
/// Environment variable naming a file that holds the cluster token.
pub const TOKEN_FILE_ENV: &str = "MC_AUTH_TOKEN_FILE";

/// Length of a MAC tag and of a nonce, in bytes.
pub const TAG_LEN: usize = 32;

/// An HMAC-SHA256 tag.
pub type Tag = [u8; TAG_LEN];
/// A random challenge.
pub type Nonce = [u8; TAG_LEN];

/// Domain label of the proof a connecting peer sends.
pub const DOMAIN_CLIENT_PROOF: &[u8] = b"mooncake-auth-v1 client";
/// Domain label of the proof an accepting peer sends back.
pub const DOMAIN_SERVER_PROOF: &[u8] = b"mooncake-auth-v1 server";
/// Domain label of [`WriteTicket`] signatures.
pub const DOMAIN_TICKET: &[u8] = b"mooncake-ticket-v1";
/// Domain label of signed HTTP metadata writes.
pub const DOMAIN_HTTP: &[u8] = b"mooncake-http-v1";
/// Domain label of the proof a same-host reader sends to a segment owner.
pub const DOMAIN_MAP_READER: &[u8] = b"mooncake-map-v1 reader";
/// Domain label of the proof a segment owner sends back to a reader.
pub const DOMAIN_MAP_OWNER: &[u8] = b"mooncake-map-v1 owner";

/// Why a token could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    /// The token (after trimming whitespace) is empty.
    #[error("the auth token is empty")]
    Empty,
    /// The token file could not be read.
    #[error("cannot read the auth token file {path}: {source}")]
    File {
        /// The file named by the flag or variable.
        path: String,
        /// The underlying error.
        source: std::io::Error,
    },
    /// Both environment variables are set.
    #[error("both {TOKEN_ENV} and {TOKEN_FILE_ENV} are set; set only one")]
    Both,
}

/// The cluster secret. Cheap to clone; its `Debug` output never shows it.
#[derive(Clone)]
pub struct AuthKey {
    key: Arc<[u8]>,
    fingerprint: u64,
}

impl fmt::Debug for AuthKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "AuthKey(fingerprint {:016x})", self.fingerprint())
    }
}

impl AuthKey {
    /// A key from the token text; surrounding whitespace (a trailing
    /// newline in a file) is not part of the token.
    pub fn new(token: &str) -> Result<AuthKey, AuthError> {
        let t = token.trim();
        if t.is_empty() {
            return Err(AuthError::Empty);
        }
        let mut k = AuthKey {
            key: Arc::from(t.as_bytes()),
            fingerprint: 0,
        };
        let t = k.mac(b"mooncake-fingerprint-v1", &[]);
        let mut b = [0u8; 8];
        b.copy_from_slice(&t[..8]);
        k.fingerprint = u64::from_le_bytes(b);
        Ok(k)
    }

    /// A key from the contents of `path`.
    pub fn from_file(path: &Path) -> Result<AuthKey, AuthError> {
        let text = std::fs::read_to_string(path).map_err(|source| AuthError::File {
            path: path.display().to_string(),
            source,
        })?;
        AuthKey::new(&text)
    }

    /// The key configured for this process by `MC_AUTH_TOKEN` or
    /// `MC_AUTH_TOKEN_FILE`; `None` when neither is set (or both are empty).
    pub fn from_env() -> Result<Option<AuthKey>, AuthError> {
        let token = std::env::var(TOKEN_ENV)
            .ok()
            .filter(|v| !v.trim().is_empty());
        let file = std::env::var(TOKEN_FILE_ENV)
            .ok()
            .filter(|v| !v.trim().is_empty());
        match (token, file) {
            (Some(_), Some(_)) => Err(AuthError::Both),
            (Some(t), None) => AuthKey::new(&t).map(Some),
            (None, Some(f)) => AuthKey::from_file(Path::new(f.trim())).map(Some),
            (None, None) => Ok(None),
        }
    }

    fn hmac(&self, domain: &[u8], parts: &[&[u8]]) -> Hmac<Sha256> {
        // HMAC accepts keys of any length, so this cannot fail.
        let mut m = match <Hmac<Sha256> as Mac>::new_from_slice(&self.key) {
            Ok(m) => m,
            Err(_) => unreachable!("HMAC takes keys of any length"),
        };
        let dlen = u8::try_from(domain.len()).unwrap_or(u8::MAX);
        m.update(&[dlen]);
        m.update(&domain[..usize::from(dlen)]);
        for p in parts {
            let len = u32::try_from(p.len()).unwrap_or(u32::MAX);
            m.update(&len.to_le_bytes());
            m.update(p);
        }
        m
    }

    /// The MAC of `parts` under `domain`.
    pub fn mac(&self, domain: &[u8], parts: &[&[u8]]) -> Tag {
        self.hmac(domain, parts).finalize().into_bytes().into()
    }

    /// Whether `tag` is the MAC of `parts` under `domain` (constant time).
    pub fn verify(&self, domain: &[u8], parts: &[&[u8]], tag: &[u8]) -> bool {
        self.hmac(domain, parts).verify_slice(tag).is_ok()
    }

    /// A non-secret identifier of the key (to keep connections made with
    /// different keys apart); derived one-way from the key.
    pub fn fingerprint(&self) -> u64 {
        self.fingerprint
    }
}

/// Header carrying `<nonce hex>:<MAC hex>` on signed HTTP metadata writes.
pub const HTTP_AUTH_HEADER: &str = "x-mooncake-auth";

/// The MAC a signed HTTP metadata write (`method` of `body` to metadata
/// `key`) carries for the server's challenge `nonce`.
pub fn http_write_proof(
    auth: &AuthKey,
    method: &str,
    key: &str,
    body: &[u8],
    nonce: &Nonce,
) -> Tag {
    auth.mac(
        DOMAIN_HTTP,
        &[method.as_bytes(), key.as_bytes(), body, nonce],
    )
}

/// Lower-case hex of `b`.
pub fn to_hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Parse exactly `N` bytes of hex (either case).
pub fn from_hex<const N: usize>(s: &str) -> Option<[u8; N]> {
    let s = s.as_bytes();
    if s.len() != 2 * N {
        return None;
    }
    let digit = |c: u8| -> Option<u8> {
        match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            b'A'..=b'F' => Some(c - b'A' + 10),
            _ => None,
        }
    };
    let mut out = [0u8; N];
    for (i, o) in out.iter_mut().enumerate() {
        *o = digit(s[2 * i])? << 4 | digit(s[2 * i + 1])?;
    }
    Some(out)
}

/// A fresh random nonce from the operating system's generator.
pub fn nonce() -> Nonce {
    let mut n = [0u8; TAG_LEN];
    rand::rngs::OsRng.fill_bytes(&mut n);
    n
}

/// Milliseconds since the Unix epoch (0 if the clock is before it).
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The master's grant to write `[offset, offset+len)` of one segment until
/// `expires_ms` (Unix time), signed with the cluster secret.
#[derive(Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct WriteTicket {
    /// First byte of the granted range inside the segment.
    pub offset: u64,
    /// Length of the granted range.
    pub len: u64,
    /// Unix time in milliseconds after which the grant is void.
    pub expires_ms: u64,
    /// `MAC(DOMAIN_TICKET, segment uuid, offset, len, expires_ms)`.
    pub mac: Tag,
}

impl fmt::Debug for WriteTicket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WriteTicket")
            .field("offset", &self.offset)
            .field("len", &self.len)
            .field("expires_ms", &self.expires_ms)
            .finish_non_exhaustive()
    }
}

/// Why a data server refused a [`WriteTicket`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TicketError {
    /// The signature does not match (forged, or for another segment).
    #[error("write ticket signature does not match")]
    BadSignature,
    /// The grant ran out.
    #[error("write ticket expired")]
    Expired,
    /// A written range lies outside the granted range.
    #[error("write outside the ticket's range")]
    OutOfRange,
}

impl WriteTicket {
    /// Bytes of a ticket on the data wire: offset, len, expiry (`u64` LE each), MAC.
    pub const WIRE_LEN: usize = 24 + TAG_LEN;

    fn words(offset: u64, len: u64, expires_ms: u64) -> [[u8; 8]; 3] {
        [
            offset.to_le_bytes(),
            len.to_le_bytes(),
            expires_ms.to_le_bytes(),
        ]
    }

    /// Sign a grant for `[offset, offset+len)` of segment `uuid`.
    pub fn sign(key: &AuthKey, uuid: &str, offset: u64, len: u64, expires_ms: u64) -> WriteTicket {
        let [o, l, e] = Self::words(offset, len, expires_ms);
        WriteTicket {
            offset,
            len,
            expires_ms,
            mac: key.mac(DOMAIN_TICKET, &[uuid.as_bytes(), &o, &l, &e]),
        }
    }

    /// Check the signature (for segment `uuid`) and the expiry at `now_ms`.
    pub fn check(&self, key: &AuthKey, uuid: &str, now_ms: u64) -> Result<(), TicketError> {
        let [o, l, e] = Self::words(self.offset, self.len, self.expires_ms);
        if !key.verify(DOMAIN_TICKET, &[uuid.as_bytes(), &o, &l, &e], &self.mac) {
            return Err(TicketError::BadSignature);
        }
        if now_ms > self.expires_ms {
            return Err(TicketError::Expired);
        }
        Ok(())
    }

    /// Whether `[offset, offset+len)` lies inside the granted range.
    pub fn covers(&self, offset: u64, len: u64) -> bool {
        let (Some(end), Some(granted_end)) =
            (offset.checked_add(len), self.offset.checked_add(self.len))
        else {
            return false;
        };
        offset >= self.offset && end <= granted_end
    }

    /// The ticket's data-wire bytes.
    pub fn to_bytes(&self) -> [u8; Self::WIRE_LEN] {
        let mut b = [0u8; Self::WIRE_LEN];
        b[..8].copy_from_slice(&self.offset.to_le_bytes());
        b[8..16].copy_from_slice(&self.len.to_le_bytes());
        b[16..24].copy_from_slice(&self.expires_ms.to_le_bytes());
        b[24..].copy_from_slice(&self.mac);
        b
    }

    /// Parse the data-wire bytes of a ticket.
    pub fn from_bytes(b: &[u8; Self::WIRE_LEN]) -> WriteTicket {
        let word = |i: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&b[i..i + 8]);
            u64::from_le_bytes(w)
        };
        let mut mac = [0u8; TAG_LEN];
        mac.copy_from_slice(&b[24..]);
        WriteTicket {
            offset: word(0),
            len: word(8),
            expires_ms: word(16),
            mac,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_trimmed_and_must_not_be_empty() {
        assert!(matches!(AuthKey::new("  \n"), Err(AuthError::Empty)));
        let a = AuthKey::new("secret\n").expect("key");
        let b = AuthKey::new("secret").expect("key");
        assert_eq!(a.fingerprint(), b.fingerprint());
        assert_ne!(
            a.fingerprint(),
            AuthKey::new("other").expect("key").fingerprint()
        );
        assert!(!format!("{a:?}").contains("secret"));
        let missing = AuthKey::from_file(Path::new("/nonexistent/token"));
        assert!(matches!(missing, Err(AuthError::File { .. })));
    }

    #[test]
    fn macs_depend_on_key_domain_and_every_part() {
        let k = AuthKey::new("k").expect("key");
        let t = k.mac(b"d", &[b"ab", b"c"]);
        assert!(k.verify(b"d", &[b"ab", b"c"], &t));
        // Length prefixes make the split of the parts significant.
        assert!(!k.verify(b"d", &[b"a", b"bc"], &t));
        assert!(!k.verify(b"e", &[b"ab", b"c"], &t));
        assert!(!AuthKey::new("k2")
            .expect("key")
            .verify(b"d", &[b"ab", b"c"], &t));
        assert!(!k.verify(b"d", &[b"ab", b"c"], &t[..31]));
        let mut bad = t;
        bad[0] ^= 1;
        assert!(!k.verify(b"d", &[b"ab", b"c"], &bad));
    }

    #[test]
    fn tickets_bind_segment_range_and_time() {
        let k = AuthKey::new("k").expect("key");
        let t = WriteTicket::sign(&k, "seg", 4096, 100, 1_000);
        assert_eq!(t.check(&k, "seg", 999), Ok(()));
        assert_eq!(t.check(&k, "seg", 1_001), Err(TicketError::Expired));
        assert_eq!(t.check(&k, "other", 0), Err(TicketError::BadSignature));
        let other = AuthKey::new("k2").expect("key");
        assert_eq!(t.check(&other, "seg", 0), Err(TicketError::BadSignature));
        let mut moved = t;
        moved.offset = 0;
        assert_eq!(moved.check(&k, "seg", 0), Err(TicketError::BadSignature));
        assert!(t.covers(4096, 100) && t.covers(4100, 10) && t.covers(4196, 0));
        assert!(!t.covers(4095, 2) && !t.covers(4190, 7) && !t.covers(u64::MAX, 2));
        assert_eq!(WriteTicket::from_bytes(&t.to_bytes()), t);
    }

    #[test]
    fn hex_roundtrip() {
        let b = [0u8, 1, 0xab, 0xff];
        assert_eq!(to_hex(&b), "0001abff");
        assert_eq!(from_hex::<4>("0001ABff"), Some(b));
        assert_eq!(from_hex::<4>("0001abf"), None);
        assert_eq!(from_hex::<2>("zz00"), None);
        assert_eq!(from_hex::<1>("+1"), None);
    }

    #[test]
    fn nonces_differ() {
        assert_ne!(nonce(), nonce());
    }
}
