//! Where engines find one another: the metadata server named at
//! `initialize`.
//!
//! - `P2PHANDSHAKE`: no server. A target is named `host:rpc_port` and its
//!   descriptor is asked of the target itself over its RPC port.
//! - `http://host:port/path`: an HTTP key-value server such as the master's
//!   embedded one (`GET/PUT/DELETE path?key=K`). Writes are signed with the
//!   cluster token when one is set (see [`HttpMetadata`]).
//! - `etcd://h1:2379;h2:2379` (or a bare `host:port`, which upstream reads
//!   as etcd): keys in etcd.
//!
//! An engine publishes its [`Descriptor`] under `mooncake/engine/<name>` at
//! `initialize` and removes it when it shuts down.

use crate::engine::error::{EngineError, ErrorKind, Result};
use crate::engine::wire::Descriptor;
use mooncake_common::auth::{from_hex, http_write_proof, to_hex, HTTP_AUTH_HEADER};
use mooncake_common::AuthKey;
use std::io;
use std::time::Duration;

/// The metadata server string that means "no server".
pub const P2PHANDSHAKE: &str = "P2PHANDSHAKE";
/// Whole-request timeout of one metadata call.
const META_TIMEOUT: Duration = Duration::from_secs(5);

/// The metadata key of engine `name`'s descriptor.
pub fn descriptor_key(name: &str) -> String {
    format!("mooncake/engine/{name}")
}

/// The connection string `initialize` gives, split as upstream splits it:
/// `scheme://rest` into its scheme, `P2PHANDSHAKE` as is, and anything else
/// as an etcd address. Returns `(metadata_type, server)`.
pub fn split_conn_string(s: &str) -> (String, String) {
    if let Some((scheme, rest)) = s.split_once("://") {
        (scheme.to_string(), rest.to_string())
    } else if s == P2PHANDSHAKE {
        (String::new(), s.to_string())
    } else {
        ("etcd".to_string(), s.to_string())
    }
}

/// `initialize_ext`'s rule: `P2PHANDSHAKE` stays, a server with a scheme is
/// used as is, else `metadata_type://server`.
pub fn build_conn_string(metadata_type: &str, server: &str) -> String {
    if server == P2PHANDSHAKE || server.contains("://") {
        server.to_string()
    } else {
        format!("{metadata_type}://{server}")
    }
}

/// A metadata server.
pub(crate) enum Metadata {
    /// No server: descriptors come from the targets themselves.
    P2p,
    /// An HTTP key-value server.
    Http(HttpMetadata),
    /// etcd.
    Etcd(Box<EtcdMetadata>),
}

impl Metadata {
    /// The server a connection string names (after [`build_conn_string`]).
    pub(crate) fn open(conn: &str, key: Option<AuthKey>) -> Result<Metadata> {
        if conn == P2PHANDSHAKE {
            return Ok(Metadata::P2p);
        }
        let bad = |why: &str| {
            EngineError::new(
                ErrorKind::InvalidArgument,
                format!("metadata server {conn:?}: {why}"),
            )
        };
        let (scheme, rest) = conn
            .split_once("://")
            .ok_or_else(|| bad("expected P2PHANDSHAKE, http://... or etcd://..."))?;
        match scheme {
            "http" => HttpMetadata::parse(conn)
                .map(|h| Metadata::Http(h.with_auth(key)))
                .ok_or_else(|| bad("not a valid http:// URL")),
            "etcd" => EtcdMetadata::new(rest).map(|e| Metadata::Etcd(Box::new(e))),
            "p2p" | "P2PHANDSHAKE" => Ok(Metadata::P2p),
            other => Err(bad(&format!(
                "the {other:?} metadata backend is not supported (use P2PHANDSHAKE, http:// or etcd://)"
            ))),
        }
    }

    /// Whether targets are named `host:rpc_port` and asked directly.
    pub(crate) fn is_p2p(&self) -> bool {
        matches!(self, Metadata::P2p)
    }

    /// Publish `desc` under its name.
    pub(crate) fn publish(&self, desc: &Descriptor) -> Result<()> {
        let body = serde_json::to_vec(desc).map_err(|e| {
            EngineError::new(
                ErrorKind::Internal,
                format!("cannot encode descriptor: {e}"),
            )
        })?;
        self.put(&descriptor_key(&desc.name), &body).map_err(|e| {
            EngineError::new(
                ErrorKind::Metadata,
                format!(
                    "cannot publish the descriptor of {:?} to the metadata server",
                    desc.name
                ),
            )
            .with_source(e)
        })
    }

    /// The descriptor published for `name`; `UnknownPeer` when there is none.
    pub(crate) fn lookup(&self, name: &str) -> Result<Descriptor> {
        let key = descriptor_key(name);
        let got = match self {
            Metadata::P2p => return Err(EngineError::new(ErrorKind::Internal, "no server")),
            Metadata::Http(h) => h.get(&key),
            Metadata::Etcd(e) => e.get(&key),
        }
        .map_err(|e| {
            EngineError::new(ErrorKind::Metadata, "metadata server lookup failed")
                .with_peer(name)
                .with_source(e)
        })?;
        let Some(body) = got else {
            return Err(EngineError::new(
                ErrorKind::UnknownPeer,
                "no engine of this name is registered with the metadata server",
            )
            .with_peer(name));
        };
        serde_json::from_slice(&body).map_err(|e| {
            EngineError::new(
                ErrorKind::Metadata,
                format!("malformed descriptor in the metadata server: {e}"),
            )
            .with_peer(name)
        })
    }

    /// Remove `name`'s descriptor (best effort).
    pub(crate) fn remove(&self, name: &str) {
        self.delete(&descriptor_key(name));
    }

    /// Store `body` under `key` (nothing to do without a server).
    fn put(&self, key: &str, body: &[u8]) -> io::Result<()> {
        match self {
            Metadata::P2p => Ok(()),
            Metadata::Http(h) => h.try_put(key, body),
            Metadata::Etcd(e) => e.put(key, body),
        }
    }

    /// Remove `key` (best effort).
    fn delete(&self, key: &str) {
        match self {
            Metadata::P2p => {}
            Metadata::Http(h) => h.delete(key),
            Metadata::Etcd(e) => {
                let _ = e.delete(key);
            }
        }
    }
}

/// A metadata server as a key-value store, for components that publish
/// records of their own under their own keys (the store's segments): every
/// form `initialize` accepts, an HTTP server or etcd.
pub struct MetadataServer(Metadata);

impl MetadataServer {
    /// The server `conn` names: `http://...`, `etcd://h1:port;h2:port`, or
    /// a bare `host:port`, which upstream reads as etcd. `None` for
    /// `P2PHANDSHAKE` (no server). Writes to an HTTP server are signed with
    /// `key` when one is given.
    pub fn open(conn: &str, key: Option<AuthKey>) -> Result<Option<MetadataServer>> {
        let (scheme, server) = split_conn_string(conn);
        match Metadata::open(&build_conn_string(&scheme, &server), key)? {
            Metadata::P2p => Ok(None),
            m => Ok(Some(MetadataServer(m))),
        }
    }

    /// Store `body` under `key`.
    pub fn put(&self, key: &str, body: &[u8]) -> io::Result<()> {
        self.0.put(key, body)
    }

    /// Remove `key` (best effort).
    pub fn delete(&self, key: &str) {
        self.0.delete(key)
    }
}

impl std::fmt::Debug for MetadataServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match &self.0 {
            Metadata::P2p => "p2p",
            Metadata::Http(_) => "http",
            Metadata::Etcd(_) => "etcd",
        };
        write!(f, "MetadataServer({kind})")
    }
}

/// An HTTP metadata server `http://host:port/path` (`GET/PUT/DELETE
/// path?key=K`), with the cluster token writes are signed with.
///
/// With a token, each write is signed by challenge-response with the
/// master's metadata server: fetch a one-time nonce from
/// `/auth/challenge`, then send the write with the `X-Mooncake-Auth` header
/// (see [`mooncake_common::auth::http_write_proof`]); the token itself never
/// crosses the wire. Reads are not signed.
#[derive(Debug, Clone)]
pub struct HttpMetadata {
    host_port: String,
    path: String,
    key: Option<AuthKey>,
}

impl HttpMetadata {
    /// Parse an `http://` URL (the path defaults to `/metadata`); `None` for
    /// anything else.
    pub fn parse(url: &str) -> Option<HttpMetadata> {
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
        Some(HttpMetadata {
            host_port,
            path: path.to_string(),
            key: None,
        })
    }

    /// Sign writes with the cluster token `key`.
    pub fn with_auth(mut self, key: Option<AuthKey>) -> HttpMetadata {
        self.key = key;
        self
    }

    fn agent() -> ureq::Agent {
        ureq::Agent::config_builder()
            .timeout_global(Some(META_TIMEOUT))
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

    fn write(&self, method: &str, key: &str, body: &[u8]) -> io::Result<u16> {
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

    /// PUT a value; an error says why it was not stored.
    pub fn try_put(&self, key: &str, body: &[u8]) -> io::Result<()> {
        match self.write("PUT", key, body)? {
            c if (200..300).contains(&c) => Ok(()),
            c => Err(io::Error::other(format!(
                "metadata server refused the write (HTTP {c})"
            ))),
        }
    }

    /// PUT a value; true on 2xx (a failure is logged).
    pub fn put(&self, key: &str, body: &[u8]) -> bool {
        match self.try_put(key, body) {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(key, error = %e, "metadata server refused the descriptor");
                false
            }
        }
    }

    /// GET a value; `None` when the server has no such key.
    pub fn get(&self, key: &str) -> io::Result<Option<Vec<u8>>> {
        let url = format!("http://{}{}", self.host_port, self.path);
        let mut resp = Self::agent()
            .get(&url)
            .query("key", key)
            .call()
            .map_err(io::Error::other)?;
        match resp.status().as_u16() {
            200 => resp
                .body_mut()
                .with_config()
                .limit(16 << 20)
                .read_to_vec()
                .map(Some)
                .map_err(io::Error::other),
            404 => Ok(None),
            c => Err(io::Error::other(format!(
                "metadata server answered HTTP {c}"
            ))),
        }
    }

    /// DELETE a key (best effort).
    pub fn delete(&self, key: &str) {
        let _ = self.write("DELETE", key, b"");
    }
}

/// Keys in etcd, through a small runtime of its own.
pub(crate) struct EtcdMetadata {
    endpoints: Vec<String>,
    rt: tokio::runtime::Runtime,
    client: parking_lot::Mutex<Option<etcd_client::Client>>,
}

impl EtcdMetadata {
    fn new(rest: &str) -> Result<EtcdMetadata> {
        let endpoints: Vec<String> = rest
            .split([';', ','])
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|s| {
                if s.starts_with("http://") {
                    s.to_string()
                } else {
                    format!("http://{s}")
                }
            })
            .collect();
        if endpoints.is_empty() {
            return Err(EngineError::new(
                ErrorKind::InvalidArgument,
                "etcd:// names no endpoint",
            ));
        }
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| {
                EngineError::new(ErrorKind::Internal, "cannot start a runtime for etcd")
                    .with_source(e)
            })?;
        Ok(EtcdMetadata {
            endpoints,
            rt,
            client: parking_lot::Mutex::new(None),
        })
    }

    fn run<T, F, Fut>(&self, f: F) -> io::Result<T>
    where
        F: FnOnce(etcd_client::Client) -> Fut,
        Fut: std::future::Future<Output = std::result::Result<T, etcd_client::Error>>,
    {
        let mut g = self.client.lock();
        let endpoints = self.endpoints.clone();
        let cached = g.clone();
        let r = self.rt.block_on(async move {
            let client = match cached {
                Some(c) => c,
                None => {
                    let opts =
                        etcd_client::ConnectOptions::new().with_connect_timeout(META_TIMEOUT);
                    tokio::time::timeout(
                        META_TIMEOUT,
                        etcd_client::Client::connect(endpoints, Some(opts)),
                    )
                    .await
                    .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "etcd connect timed out"))?
                    .map_err(io::Error::other)?
                }
            };
            let out = tokio::time::timeout(META_TIMEOUT, f(client.clone()))
                .await
                .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "etcd call timed out"))?
                .map_err(io::Error::other)?;
            Ok::<_, io::Error>((client, out))
        });
        match r {
            Ok((c, out)) => {
                *g = Some(c);
                Ok(out)
            }
            Err(e) => {
                *g = None;
                Err(e)
            }
        }
    }

    fn put(&self, key: &str, body: &[u8]) -> io::Result<()> {
        let (k, v) = (key.to_string(), body.to_vec());
        self.run(move |mut c| async move { c.put(k, v, None).await.map(|_| ()) })
    }

    fn get(&self, key: &str) -> io::Result<Option<Vec<u8>>> {
        let k = key.to_string();
        self.run(move |mut c| async move {
            c.get(k, None)
                .await
                .map(|r| r.kvs().first().map(|kv| kv.value().to_vec()))
        })
    }

    fn delete(&self, key: &str) -> io::Result<()> {
        let k = key.to_string();
        self.run(move |mut c| async move { c.delete(k, None).await.map(|_| ()) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conn_strings_split_and_build_as_upstream() {
        assert_eq!(
            split_conn_string("P2PHANDSHAKE"),
            ("".into(), "P2PHANDSHAKE".into())
        );
        assert_eq!(
            split_conn_string("http://h:1/metadata"),
            ("http".into(), "h:1/metadata".into())
        );
        assert_eq!(
            split_conn_string("10.0.0.1:2379"),
            ("etcd".into(), "10.0.0.1:2379".into())
        );
        assert_eq!(build_conn_string("", "P2PHANDSHAKE"), "P2PHANDSHAKE");
        assert_eq!(
            build_conn_string("http", "h:1/metadata"),
            "http://h:1/metadata"
        );
        assert_eq!(build_conn_string("etcd", "etcd://h:1"), "etcd://h:1");
    }

    #[test]
    fn parses_http_urls_only() {
        let u = HttpMetadata::parse("http://127.0.0.1:8080/metadata").expect("url");
        assert_eq!(
            (u.host_port.as_str(), u.path.as_str()),
            ("127.0.0.1:8080", "/metadata")
        );
        let u = HttpMetadata::parse("http://meta").expect("url");
        assert_eq!(
            (u.host_port.as_str(), u.path.as_str()),
            ("meta:80", "/metadata")
        );
        assert!(HttpMetadata::parse("https://x/metadata").is_none());
        assert!(HttpMetadata::parse("etcd://x").is_none());
        assert!(HttpMetadata::parse("http:///metadata").is_none());
        assert!(Metadata::open("redis://x", None).is_err());
        assert!(Metadata::open("nothing", None).is_err());
        assert!(Metadata::open("P2PHANDSHAKE", None).unwrap().is_p2p());
    }
}
