//! The embedded HTTP metadata server (`--enable_http_metadata_server`,
//! spec §6.1): `GET/PUT/DELETE /metadata?key=K` over a [`MetadataKv`], plus
//! `GET /health`. Every other method or path answers 404.

use std::collections::HashMap;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::QueryRejection;
use axum::extract::{DefaultBodyLimit, Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

use crate::metadata_kv::{MetadataKv, PutOutcome};

/// Largest accepted PUT body (segment descriptors can list many buffers).
pub const MAX_METADATA_BODY: usize = 64 << 20;

type KeyQuery = Result<Query<HashMap<String, String>>, QueryRejection>;

fn key_param(q: KeyQuery) -> Option<String> {
    q.ok()
        .and_then(|Query(mut m)| m.remove("key"))
        .filter(|k| !k.is_empty())
}

fn missing_key() -> Response {
    (StatusCode::BAD_REQUEST, "Missing key parameter").into_response()
}

async fn not_found() -> Response {
    (StatusCode::NOT_FOUND, "Not Found").into_response()
}

async fn get_metadata(State(kv): State<Arc<MetadataKv>>, q: KeyQuery) -> Response {
    let Some(key) = key_param(q) else {
        return missing_key();
    };
    match kv.get(&key) {
        Some(v) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "application/json")],
            v,
        )
            .into_response(),
        None => (StatusCode::NOT_FOUND, "metadata not found").into_response(),
    }
}

async fn put_metadata(State(kv): State<Arc<MetadataKv>>, q: KeyQuery, body: Bytes) -> Response {
    let Some(key) = key_param(q) else {
        return missing_key();
    };
    match kv.put(&key, body.to_vec()) {
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

async fn delete_metadata(State(kv): State<Arc<MetadataKv>>, q: KeyQuery) -> Response {
    let Some(key) = key_param(q) else {
        return missing_key();
    };
    if kv.delete(&key) {
        (StatusCode::OK, "metadata deleted").into_response()
    } else {
        (StatusCode::NOT_FOUND, "metadata not found").into_response()
    }
}

/// The metadata server's routes (exposed for embedding and tests).
pub fn metadata_router(kv: Arc<MetadataKv>) -> Router {
    Router::new()
        .route(
            "/metadata",
            get(get_metadata)
                .put(put_metadata)
                .delete(delete_metadata)
                .fallback(not_found),
        )
        .route("/health", get(|| async { "OK" }).fallback(not_found))
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(MAX_METADATA_BODY))
        .with_state(kv)
}

/// Serve the metadata HTTP API on an already-bound listener until the task is
/// dropped (runtime shutdown) or the listener fails.
pub async fn serve_metadata(listener: tokio::net::TcpListener, kv: Arc<MetadataKv>) {
    if let Err(e) = axum::serve(listener, metadata_router(kv)).await {
        tracing::error!("HTTP metadata server stopped: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_http::{request, spawn};

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn metadata_api() {
        let kv = Arc::new(MetadataKv::new());
        let addr = spawn(|l| serve_metadata(l, kv.clone())).await;

        let r = request(addr, "GET", "/metadata?key=x", b"").await;
        assert_eq!((r.status, r.body_str()), (404, "metadata not found".into()));

        let r = request(addr, "PUT", "/metadata?key=k", br#"{"a":1}"#).await;
        assert_eq!((r.status, r.body_str()), (200, "metadata updated".into()));
        let r = request(addr, "GET", "/metadata?key=k", b"").await;
        assert_eq!((r.status, r.body_str()), (200, r#"{"a":1}"#.into()));
        assert_eq!(
            r.header("content-type").as_deref(),
            Some("application/json")
        );

        let r = request(addr, "DELETE", "/metadata?key=k", b"").await;
        assert_eq!((r.status, r.body_str()), (200, "metadata deleted".into()));
        let r = request(addr, "DELETE", "/metadata?key=k", b"").await;
        assert_eq!((r.status, r.body_str()), (404, "metadata not found".into()));

        for m in ["GET", "PUT", "DELETE"] {
            let r = request(addr, m, "/metadata", b"").await;
            assert_eq!(
                (r.status, r.body_str()),
                (400, "Missing key parameter".into()),
                "{m}"
            );
            let r = request(addr, m, "/metadata?key=", b"").await;
            assert_eq!(r.status, 400, "{m}");
        }

        let k = "/metadata?key=mooncake/rpc_meta/h";
        assert_eq!(request(addr, "PUT", k, b"one").await.status, 200);
        let r = request(addr, "PUT", k, b"one").await;
        assert_eq!((r.status, r.body_str()), (200, "metadata unchanged".into()));
        let r = request(addr, "PUT", k, b"two").await;
        assert_eq!(
            (r.status, r.body_str()),
            (400, "Duplicate rpc_meta key not allowed".into())
        );

        // Percent-encoded keys are decoded.
        assert_eq!(
            request(addr, "PUT", "/metadata?key=a%2Fb", b"v")
                .await
                .status,
            200
        );
        assert_eq!(kv.get("a/b").as_deref(), Some(&b"v"[..]));

        let r = request(addr, "GET", "/health", b"").await;
        assert_eq!((r.status, r.body_str()), (200, "OK".into()));
        assert_eq!(
            request(addr, "POST", "/metadata?key=k", b"").await.status,
            404
        );
        assert_eq!(request(addr, "GET", "/nope", b"").await.status, 404);
        assert_eq!(request(addr, "POST", "/health", b"").await.status, 404);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn large_body() {
        let kv = Arc::new(MetadataKv::new());
        let addr = spawn(|l| serve_metadata(l, kv.clone())).await;
        let body = vec![b'x'; 4 << 20];
        assert_eq!(
            request(addr, "PUT", "/metadata?key=big", &body)
                .await
                .status,
            200
        );
        assert_eq!(kv.get("big").map(|v| v.len()), Some(4 << 20));
    }
}
