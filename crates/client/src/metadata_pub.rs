//! Publishing this client's segment descriptor to an HTTP metadata server
//! (`PUT <url>?key=mooncake/ram/<segment>`, removed on close), over `ureq`.
//!
//! With a cluster token, each write is signed by challenge-response with
//! the master's metadata server: fetch a one-time nonce from
//! `/auth/challenge`, then send the write with the `X-Mooncake-Auth` header
//! (see `mooncake_common::auth::http_write_proof`); the token itself never
//! crosses the wire.

use mooncake_common::auth::{from_hex, http_write_proof, to_hex, HTTP_AUTH_HEADER};
use mooncake_common::AuthKey;
use std::io;
use std::time::Duration;

/// Whole-request timeout of one metadata call.
const HTTP_TIMEOUT: Duration = Duration::from_secs(5);

/// A parsed `http://host:port/path` URL, and the token writes are signed with.
#[derive(Debug, Clone)]
pub(crate) struct MetadataUrl {
    host_port: String,
    path: String,
    key: Option<AuthKey>,
}

impl MetadataUrl {
    /// Parse an `http://` URL; None for anything else.
    pub(crate) fn parse(url: &str) -> Option<MetadataUrl> {
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
            key: None,
        })
    }

    /// Sign writes with the cluster token `key`.
    pub(crate) fn with_auth(mut self, key: Option<AuthKey>) -> MetadataUrl {
        self.key = key;
        self
    }

    fn agent() -> ureq::Agent {
        ureq::Agent::config_builder()
            .timeout_global(Some(HTTP_TIMEOUT))
            .http_status_as_error(false)
            .build()
            .into()
    }

    /// The `X-Mooncake-Auth` value for one write (a fresh challenge each).
    fn sign(
        &self,
        agent: &ureq::Agent,
        method: &str,
        key: &str,
        body: &[u8],
    ) -> io::Result<Option<String>> {
        let Some(auth) = &self.key else {
            return Ok(None);
        };
        let url = format!("http://{}/auth/challenge", self.host_port);
        let mut resp = agent.get(&url).call().map_err(io::Error::other)?;
        if resp.status().as_u16() != 200 {
            return Err(io::Error::other(format!(
                "metadata server gave no challenge (HTTP {})",
                resp.status().as_u16()
            )));
        }
        let text = resp
            .body_mut()
            .with_config()
            .limit(256)
            .read_to_string()
            .map_err(io::Error::other)?;
        let nonce = from_hex::<32>(text.trim())
            .ok_or_else(|| io::Error::other("malformed challenge from the metadata server"))?;
        let mac = http_write_proof(auth, method, key, body, &nonce);
        Ok(Some(format!("{}:{}", to_hex(&nonce), to_hex(&mac))))
    }

    fn request(&self, method: &str, key: &str, body: &[u8]) -> io::Result<u16> {
        let agent = Self::agent();
        let url = format!("http://{}{}", self.host_port, self.path);
        let auth = self.sign(&agent, method, key, body)?;
        let resp = if method == "PUT" {
            let mut req = agent
                .put(&url)
                .query("key", key)
                .header("Content-Type", "application/json");
            if let Some(a) = &auth {
                req = req.header(HTTP_AUTH_HEADER, a);
            }
            req.send(body)
        } else {
            let mut req = agent.delete(&url).query("key", key);
            if let Some(a) = &auth {
                req = req.header(HTTP_AUTH_HEADER, a);
            }
            req.call()
        };
        Ok(resp.map_err(io::Error::other)?.status().as_u16())
    }

    /// PUT a value; true on 2xx.
    pub(crate) fn put(&self, key: &str, body: &[u8]) -> bool {
        match self.request("PUT", key, body) {
            Ok(c) if (200..300).contains(&c) => true,
            Ok(c) => {
                tracing::warn!(key, status = c, "metadata server refused the descriptor");
                false
            }
            Err(e) => {
                tracing::warn!(key, error = %e, "metadata server unreachable");
                false
            }
        }
    }

    /// DELETE a key (best effort).
    pub(crate) fn delete(&self, key: &str) {
        let _ = self.request("DELETE", key, b"");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_http_urls_only() {
        let u = MetadataUrl::parse("http://127.0.0.1:8080/metadata").expect("url");
        assert_eq!(
            (u.host_port.as_str(), u.path.as_str()),
            ("127.0.0.1:8080", "/metadata")
        );
        let u = MetadataUrl::parse("http://meta").expect("url");
        assert_eq!(
            (u.host_port.as_str(), u.path.as_str()),
            ("meta:80", "/metadata")
        );
        assert!(MetadataUrl::parse("https://x/metadata").is_none());
        assert!(MetadataUrl::parse("etcd://x").is_none());
        assert!(MetadataUrl::parse("http:///metadata").is_none());
    }
}
