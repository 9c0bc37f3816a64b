//! The embedded HTTP metadata server (`--enable_http_metadata_server`):
//! `GET/PUT/DELETE /metadata?key=K` over a [`MetadataKv`], plus
//! `GET /health`. Every other method or path answers 404.
//!
//! With a cluster token (`--auth_token_file`) writes are signed
//! by challenge-response: `GET /auth/challenge` hands out a one-time nonce
//! (hex, valid [`NONCE_TTL`]); a `PUT` or `DELETE` then carries the header
//! `X-Mooncake-Auth: <nonce hex>:<MAC hex>` with the MAC over the method,
//! the key, the body and the nonce ([`mooncake_common::auth::DOMAIN_HTTP`]).
//! A write without a valid, unused nonce and MAC answers 401. Reads stay
//! open (upstream transfer engines read descriptors unauthenticated).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, RawQuery, State};
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use mooncake_common::auth::{self, from_hex, to_hex, AuthKey, Nonce, HTTP_AUTH_HEADER};
use mooncake_common::limits::ConnLimits;
use parking_lot::Mutex;

use crate::metadata_kv::{MetadataKv, PutOutcome};

/// Largest accepted PUT body (a segment descriptor is a few hundred bytes;
/// upstream's descriptors with many buffers stay far below this).
pub const MAX_METADATA_BODY: usize = 16 << 20;
/// How long a challenge nonce stays valid.
pub const NONCE_TTL: Duration = Duration::from_secs(30);
/// Most outstanding challenge nonces (the oldest give way beyond this).
pub const MAX_NONCES: usize = 4096;

/// Outstanding one-time challenge nonces.
#[derive(Debug, Default)]
struct Nonces {
    issued: HashMap<Nonce, Instant>,
}

impl Nonces {
    fn issue(&mut self, now: Instant) -> Nonce {
        if self.issued.len() >= MAX_NONCES {
            self.issued
                .retain(|_, at| now.duration_since(*at) < NONCE_TTL);
        }
        if self.issued.len() >= MAX_NONCES {
            if let Some(oldest) = self
                .issued
                .iter()
                .min_by_key(|(_, at)| **at)
                .map(|(n, _)| *n)
            {
                self.issued.remove(&oldest);
            }
        }
        let n = auth::nonce();
        self.issued.insert(n, now);
        n
    }

    /// Consume `n`: true when it was issued, unused and unexpired.
    fn take(&mut self, n: &Nonce, now: Instant) -> bool {
        self.issued
            .remove(n)
            .is_some_and(|at| now.duration_since(at) < NONCE_TTL)
    }
}

#[derive(Clone)]
struct MetaState {
    kv: Arc<MetadataKv>,
    auth: Option<AuthKey>,
    nonces: Arc<Mutex<Nonces>>,
}

type KeyQuery = RawQuery;

/// Why a request names no usable key.
#[derive(Debug, PartialEq, Eq)]
enum KeyError {
    /// No `key` parameter, or an empty one.
    Missing,
    /// A `key` that is not percent-encoded UTF-8.
    Malformed,
}

/// The value of the `key` query parameter (form-decoded: `%XX` escapes,
/// `+` for a space). A bad escape or bytes that are not UTF-8 make it
/// malformed rather than silently another key.
fn key_param(RawQuery(q): KeyQuery) -> Result<String, KeyError> {
    let q = q.unwrap_or_default();
    let raw = q
        .split('&')
        .find_map(|p| p.strip_prefix("key="))
        .ok_or(KeyError::Missing)?;
    let key = form_decode(raw).ok_or(KeyError::Malformed)?;
    if key.is_empty() {
        return Err(KeyError::Missing);
    }
    Ok(key)
}

/// `s` form-decoded, or `None` for a bad escape or non-UTF-8 bytes.
fn form_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' => {
                let hex = b.get(i + 1..i + 3)?;
                let hex = std::str::from_utf8(hex).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

fn bad_key(e: KeyError) -> Response {
    let msg = match e {
        KeyError::Missing => "Missing key parameter",
        KeyError::Malformed => "Malformed key parameter",
    };
    (StatusCode::BAD_REQUEST, msg).into_response()
}

async fn not_found() -> Response {
    (StatusCode::NOT_FOUND, "Not Found").into_response()
}

/// Check a write's signature; `Err` is the reason for a 401.
fn check_write(
    st: &MetaState,
    method: &Method,
    headers: &HeaderMap,
    key: &str,
    body: &[u8],
) -> Result<(), &'static str> {
    let Some(auth) = &st.auth else {
        return Ok(());
    };
    let unauthorized = |msg: &'static str| {
        tracing::warn!(key = %key, %method, "refused metadata write: {msg}");
        msg
    };
    let Some(value) = headers.get(HTTP_AUTH_HEADER).and_then(|v| v.to_str().ok()) else {
        return Err(unauthorized("authentication required"));
    };
    let parsed = value
        .split_once(':')
        .and_then(|(n, m)| Some((from_hex::<32>(n.trim())?, from_hex::<32>(m.trim())?)));
    let Some((nonce, mac)) = parsed else {
        return Err(unauthorized("malformed authentication header"));
    };
    if !st.nonces.lock().take(&nonce, Instant::now()) {
        return Err(unauthorized("unknown, used or expired challenge"));
    }
    let ok = auth.verify(
        auth::DOMAIN_HTTP,
        &[method.as_str().as_bytes(), key.as_bytes(), body, &nonce],
        &mac,
    );
    // (The same MAC as auth::http_write_proof, checked in constant time.)
    if !ok {
        return Err(unauthorized("authentication failed"));
    }
    Ok(())
}

async fn challenge(State(st): State<MetaState>) -> Response {
    if st.auth.is_none() {
        return (StatusCode::NOT_FOUND, "authentication is not configured").into_response();
    }
    let n = st.nonces.lock().issue(Instant::now());
    (StatusCode::OK, to_hex(&n)).into_response()
}

async fn get_metadata(State(st): State<MetaState>, q: KeyQuery) -> Response {
    let key = match key_param(q) {
        Ok(k) => k,
        Err(e) => return bad_key(e),
    };
    match st.kv.get(&key) {
        Some(v) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "application/json")],
            v,
        )
            .into_response(),
        None => (StatusCode::NOT_FOUND, "metadata not found").into_response(),
    }
}

/// The body of a PUT, at most [`MAX_METADATA_BODY`] bytes: 413 when it
/// is larger (at once when `Content-Length` says so, before reading it),
/// 400 when it cannot be read whole (a truncated or malformed body).
async fn put_body(headers: &HeaderMap, body: Body) -> Result<Bytes, Response> {
    let too_large = || {
        (
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("metadata body larger than {MAX_METADATA_BODY} bytes"),
        )
            .into_response()
    };
    let announced = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if announced.is_some_and(|n| n > MAX_METADATA_BODY as u64) {
        return Err(too_large());
    }
    axum::body::to_bytes(body, MAX_METADATA_BODY)
        .await
        .map_err(|e| {
            let limit = std::error::Error::source(&e)
                .is_some_and(|s| s.is::<http_body_util::LengthLimitError>());
            if limit {
                too_large()
            } else {
                (
                    StatusCode::BAD_REQUEST,
                    format!("cannot read the request body: {e}"),
                )
                    .into_response()
            }
        })
}

async fn put_metadata(
    State(st): State<MetaState>,
    headers: HeaderMap,
    q: KeyQuery,
    body: Body,
) -> Response {
    let key = match key_param(q) {
        Ok(k) => k,
        Err(e) => return bad_key(e),
    };
    let body = match put_body(&headers, body).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    if let Err(why) = check_write(&st, &Method::PUT, &headers, &key, &body) {
        return (StatusCode::UNAUTHORIZED, why).into_response();
    }
    match st.kv.put(&key, body.to_vec()) {
        PutOutcome::Updated => (StatusCode::OK, "metadata updated").into_response(),
        PutOutcome::Unchanged => (StatusCode::OK, "metadata unchanged").into_response(),
        PutOutcome::DuplicateRpcMeta => {
            tracing::warn!(key = %key, "rejected a different value for an existing rpc_meta key");
            (
                StatusCode::BAD_REQUEST,
                "Duplicate rpc_meta key not allowed",
            )
                .into_response()
        }
    }
}

async fn delete_metadata(State(st): State<MetaState>, headers: HeaderMap, q: KeyQuery) -> Response {
    let key = match key_param(q) {
        Ok(k) => k,
        Err(e) => return bad_key(e),
    };
    if let Err(why) = check_write(&st, &Method::DELETE, &headers, &key, b"") {
        return (StatusCode::UNAUTHORIZED, why).into_response();
    }
    if st.kv.delete(&key) {
        (StatusCode::OK, "metadata deleted").into_response()
    } else {
        (StatusCode::NOT_FOUND, "metadata not found").into_response()
    }
}

/// The metadata server's routes (exposed for embedding and tests); with
/// `auth`, writes must be signed (see the module documentation).
pub fn metadata_router(kv: Arc<MetadataKv>, auth: Option<AuthKey>) -> Router {
    Router::new()
        .route(
            "/metadata",
            get(get_metadata)
                .put(put_metadata)
                .delete(delete_metadata)
                .fallback(not_found),
        )
        .route("/auth/challenge", get(challenge).fallback(not_found))
        .route("/health", get(|| async { "OK" }).fallback(not_found))
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(MAX_METADATA_BODY))
        .with_state(MetaState {
            kv,
            auth,
            nonces: Arc::new(Mutex::new(Nonces::default())),
        })
}

/// Serve the metadata HTTP API on an already-bound listener, admitting
/// connections against `limits`, until the task is dropped (runtime
/// shutdown) or the listener fails.
pub async fn serve_metadata(
    listener: tokio::net::TcpListener,
    kv: Arc<MetadataKv>,
    auth: Option<AuthKey>,
    limits: ConnLimits,
) {
    crate::listener::serve(listener, limits, "metadata", metadata_router(kv, auth)).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_http::{call, Reply};

    async fn req(app: &Router, method: &str, uri: &str, body: &[u8]) -> Reply {
        call(app, method, uri, &[], body).await
    }

    #[tokio::test]
    async fn metadata_api() {
        let kv = Arc::new(MetadataKv::new());
        let app = metadata_router(kv.clone(), None);

        let r = req(&app, "GET", "/metadata?key=x", b"").await;
        assert_eq!((r.status, r.body_str()), (404, "metadata not found".into()));

        let r = req(&app, "PUT", "/metadata?key=k", br#"{"a":1}"#).await;
        assert_eq!((r.status, r.body_str()), (200, "metadata updated".into()));
        let r = req(&app, "GET", "/metadata?key=k", b"").await;
        assert_eq!((r.status, r.body_str()), (200, r#"{"a":1}"#.into()));
        assert_eq!(
            r.header("content-type").as_deref(),
            Some("application/json")
        );

        let r = req(&app, "DELETE", "/metadata?key=k", b"").await;
        assert_eq!((r.status, r.body_str()), (200, "metadata deleted".into()));
        let r = req(&app, "DELETE", "/metadata?key=k", b"").await;
        assert_eq!((r.status, r.body_str()), (404, "metadata not found".into()));

        for m in ["GET", "PUT", "DELETE"] {
            let r = req(&app, m, "/metadata", b"").await;
            assert_eq!(
                (r.status, r.body_str()),
                (400, "Missing key parameter".into()),
                "{m}"
            );
            let r = req(&app, m, "/metadata?key=", b"").await;
            assert_eq!(r.status, 400, "{m}");
        }

        let k = "/metadata?key=mooncake/rpc_meta/h";
        assert_eq!(req(&app, "PUT", k, b"one").await.status, 200);
        let r = req(&app, "PUT", k, b"one").await;
        assert_eq!((r.status, r.body_str()), (200, "metadata unchanged".into()));
        let r = req(&app, "PUT", k, b"two").await;
        assert_eq!(
            (r.status, r.body_str()),
            (400, "Duplicate rpc_meta key not allowed".into())
        );

        // Percent-encoded keys are decoded.
        assert_eq!(
            req(&app, "PUT", "/metadata?key=a%2Fb", b"v").await.status,
            200
        );
        assert_eq!(kv.get("a/b").as_deref(), Some(&b"v"[..]));
        assert_eq!(
            req(&app, "PUT", "/metadata?x=1&key=c+d%20e", b"w")
                .await
                .status,
            200
        );
        assert_eq!(kv.get("c d e").as_deref(), Some(&b"w"[..]));
        // A bad escape or non-UTF-8 bytes: 400, nothing stored.
        let before = kv.len();
        for uri in [
            "/metadata?key=%ff",
            "/metadata?key=a%zz",
            "/metadata?key=%4",
        ] {
            for m in ["GET", "PUT", "DELETE"] {
                let r = req(&app, m, uri, b"v").await;
                assert_eq!(
                    (r.status, r.body_str()),
                    (400, "Malformed key parameter".into()),
                    "{m} {uri}"
                );
            }
        }
        assert_eq!(kv.len(), before);

        let r = req(&app, "GET", "/health", b"").await;
        assert_eq!((r.status, r.body_str()), (200, "OK".into()));
        assert_eq!(req(&app, "POST", "/metadata?key=k", b"").await.status, 404);
        assert_eq!(req(&app, "GET", "/nope", b"").await.status, 404);
        assert_eq!(req(&app, "POST", "/health", b"").await.status, 404);
        // Without a token there is nothing to authenticate.
        assert_eq!(req(&app, "GET", "/auth/challenge", b"").await.status, 404);
    }

    #[tokio::test]
    async fn large_body() {
        let kv = Arc::new(MetadataKv::new());
        let app = metadata_router(kv.clone(), None);
        let body = vec![b'x'; 4 << 20];
        assert_eq!(
            req(&app, "PUT", "/metadata?key=big", &body).await.status,
            200
        );
        assert_eq!(kv.get("big").map(|v| v.len()), Some(4 << 20));
        let body = vec![b'x'; MAX_METADATA_BODY + 1];
        assert_eq!(
            req(&app, "PUT", "/metadata?key=huge", &body).await.status,
            413
        );
        assert_eq!(kv.get("huge"), None);
    }

    async fn signed(app: &Router, auth: &AuthKey, method: &str, key: &str, body: &[u8]) -> Reply {
        let r = req(app, "GET", "/auth/challenge", b"").await;
        assert_eq!(r.status, 200);
        let nonce = from_hex::<32>(&r.body_str()).expect("hex nonce");
        let mac = auth::http_write_proof(auth, method, key, body, &nonce);
        let value = format!("{}:{}", to_hex(&nonce), to_hex(&mac));
        let uri = format!("/metadata?key={key}");
        call(app, method, &uri, &[(HTTP_AUTH_HEADER, &value)], body).await
    }

    #[tokio::test]
    async fn writes_need_a_signed_challenge_with_a_token() {
        let kv = Arc::new(MetadataKv::new());
        let key = AuthKey::new("cluster").expect("key");
        let app = metadata_router(kv.clone(), Some(key.clone()));
        assert_eq!(req(&app, "PUT", "/metadata?key=k", b"v").await.status, 401);
        assert_eq!(
            req(&app, "DELETE", "/metadata?key=k", b"").await.status,
            401
        );
        assert_eq!(signed(&app, &key, "PUT", "k", b"v").await.status, 200);
        assert_eq!(req(&app, "GET", "/metadata?key=k", b"").await.body, b"v");
        // Wrong secret, wrong body, wrong method, garbage and replays: 401.
        let other = AuthKey::new("other").expect("key");
        assert_eq!(signed(&app, &other, "PUT", "k", b"x").await.status, 401);
        let r = req(&app, "GET", "/auth/challenge", b"").await;
        let nonce = from_hex::<32>(&r.body_str()).expect("nonce");
        let mac = auth::http_write_proof(&key, "PUT", "k", b"v", &nonce);
        let value = format!("{}:{}", to_hex(&nonce), to_hex(&mac));
        let h = [(HTTP_AUTH_HEADER, value.as_str())];
        assert_eq!(
            call(&app, "PUT", "/metadata?key=k", &h, b"evil")
                .await
                .status,
            401
        );
        // The nonce was consumed by the failed attempt.
        assert_eq!(
            call(&app, "PUT", "/metadata?key=k", &h, b"v").await.status,
            401
        );
        for bad in ["", "zz", "00:00", &"g".repeat(129)] {
            let h = [(HTTP_AUTH_HEADER, bad)];
            assert_eq!(
                call(&app, "PUT", "/metadata?key=k", &h, b"v").await.status,
                401
            );
        }
        assert_eq!(kv.get("k").as_deref(), Some(&b"v"[..]));
        assert_eq!(signed(&app, &key, "DELETE", "k", b"").await.status, 200);
        assert_eq!(kv.get("k"), None);
    }

    #[test]
    fn nonces_are_bounded_and_single_use() {
        let mut n = Nonces::default();
        let now = Instant::now();
        let first = n.issue(now);
        for _ in 0..MAX_NONCES {
            n.issue(now);
        }
        assert!(n.issued.len() <= MAX_NONCES);
        let fresh = n.issue(now);
        assert!(n.take(&fresh, now));
        assert!(!n.take(&fresh, now));
        let _ = first;
        let late = n.issue(now);
        assert!(!n.take(&late, now + NONCE_TTL + Duration::from_secs(1)));
    }
}
