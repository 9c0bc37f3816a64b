//! Publishing this client's segment descriptor to an HTTP metadata server
//! (`PUT <url>?key=mooncake/ram/<segment>`, removed on close).

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

/// A parsed `http://host:port/path` URL.
#[derive(Debug, Clone)]
pub struct MetadataUrl {
    host_port: String,
    path: String,
}

impl MetadataUrl {
    /// Parse an `http://` URL; None for anything else.
    pub fn parse(url: &str) -> Option<MetadataUrl> {
        let rest = url.strip_prefix("http://")?;
        let (hp, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, "/metadata"),
        };
        if hp.is_empty() {
            return None;
        }
        let host_port = if hp.contains(':') {
            hp.to_string()
        } else {
            format!("{hp}:80")
        };
        Some(MetadataUrl {
            host_port,
            path: path.to_string(),
        })
    }

    fn request(&self, method: &str, key: &str, body: &[u8]) -> std::io::Result<u16> {
        let addr = self
            .host_port
            .to_socket_addrs()?
            .next()
            .ok_or_else(|| std::io::Error::other("cannot resolve metadata server"))?;
        let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(3))?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        let sep = if self.path.contains('?') { '&' } else { '?' };
        let head = format!(
            "{method} {}{sep}key={} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            self.path,
            encode_query(key),
            self.host_port,
            body.len()
        );
        s.write_all(head.as_bytes())?;
        s.write_all(body)?;
        let mut resp = Vec::new();
        let _ = s.read_to_end(&mut resp);
        let text = String::from_utf8_lossy(&resp);
        let code = text
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .ok_or_else(|| std::io::Error::other("bad HTTP response"))?;
        Ok(code)
    }

    /// PUT a value; true on 2xx.
    pub fn put(&self, key: &str, body: &[u8]) -> bool {
        matches!(self.request("PUT", key, body), Ok(c) if (200..300).contains(&c))
    }

    /// DELETE a key (best effort).
    pub fn delete(&self, key: &str) {
        let _ = self.request("DELETE", key, b"");
    }
}

fn encode_query(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' | b'/' | b':' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}
