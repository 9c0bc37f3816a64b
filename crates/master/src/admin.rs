//! The admin HTTP server on `metrics_host:metrics_port`:
//! `/metrics`, `/health`, `/query_key`, `/get_all_keys`, `/get_all_segments`,
//! and the tenant quota API `/api/v1/tenant_quotas` (GET, PUT, DELETE).
//! The master state is reached through the [`AdminView`] trait so this module
//! does not depend on the core's internals.

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use mooncake_common::ErrorCode;
use serde::Deserialize;
use serde::Serialize;

pub use crate::metrics::GaugeSnapshot;
use crate::metrics::{MasterMetrics, PROMETHEUS_CONTENT_TYPE};
pub use crate::tenants::{QuotaAdminError, TenantQuota};
use mooncake_common::limits::ConnLimits;

/// One COMPLETE memory replica as shown by `/query_key`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaView {
    /// Object size in bytes.
    pub size: u64,
    /// Address of the replica inside its segment's owner.
    pub buffer_address: u64,
    /// `host:port` of the segment owner's data server.
    pub transport_endpoint: String,
}

/// What the admin server needs from the master state.
pub trait AdminView: Send + Sync + 'static {
    /// COMPLETE memory replicas of `key` (grants a read lease), or the error code (OBJECT_NOT_FOUND when missing).
    fn query_key(&self, key: &str) -> Result<Vec<ReplicaView>, ErrorCode>;
    /// Every object key.
    fn all_keys(&self) -> Vec<String>;
    /// Every mounted segment name.
    fn all_segments(&self) -> Vec<String>;
    /// Current gauge values.
    fn gauges(&self) -> GaugeSnapshot;
    /// Body of `GET /health`.
    fn health(&self) -> String {
        HEALTH_BODY.to_string()
    }
    /// Quota views of every tenant, or of `only`.
    fn tenant_quotas(&self, _only: Option<&str>) -> Result<Vec<TenantQuota>, QuotaAdminError> {
        Err(QuotaAdminError::Disabled)
    }
    /// Set a tenant's requested quota; its view after.
    fn upsert_tenant_quota(
        &self,
        _tenant: &str,
        _bytes: u64,
    ) -> Result<TenantQuota, QuotaAdminError> {
        Err(QuotaAdminError::Disabled)
    }
    /// Remove a tenant's policy; its view before.
    fn delete_tenant_quota(&self, _tenant: &str) -> Result<TenantQuota, QuotaAdminError> {
        Err(QuotaAdminError::Disabled)
    }
}

/// Body of `GET /health` (upstream's shape; we are always the serving leader).
pub const HEALTH_BODY: &str = r#"{"status":"ok","role":"leader","ha_state":"serving","service_ready":true,"leader_address":null,"view_version":null}"#;

#[derive(Clone)]
struct AdminState {
    view: Arc<dyn AdminView>,
    metrics: Arc<MasterMetrics>,
}

#[derive(Serialize)]
struct ReplicaJson<'a> {
    size_: u64,
    buffer_address_: u64,
    protocol_: &'static str,
    transport_endpoint_: &'a str,
}

#[derive(Serialize)]
struct QueryOk<'a> {
    success: bool,
    data: Vec<ReplicaJson<'a>>,
}

#[derive(Serialize)]
struct QueryErr {
    success: bool,
    error_code: i32,
    error_message: String,
}

fn json(status: StatusCode, body: String) -> Response {
    (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

fn text_lines(items: Vec<String>) -> Response {
    let mut body = String::with_capacity(items.iter().map(|s| s.len() + 1).sum());
    for k in items {
        body.push_str(&k);
        body.push('\n');
    }
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        body,
    )
        .into_response()
}

fn query_error(code: ErrorCode) -> Response {
    let status = match code {
        ErrorCode::InvalidParams | ErrorCode::InvalidKey => StatusCode::BAD_REQUEST,
        _ => StatusCode::NOT_FOUND,
    };
    let body = QueryErr {
        success: false,
        error_code: code.code(),
        error_message: code.name(),
    };
    json(status, serde_json::to_string(&body).unwrap_or_default())
}

async fn metrics(State(s): State<AdminState>) -> Response {
    let text = s.metrics.encode(&s.view.gauges());
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, PROMETHEUS_CONTENT_TYPE)],
        text,
    )
        .into_response()
}

async fn health(State(s): State<AdminState>) -> Response {
    json(StatusCode::OK, s.view.health())
}

async fn query_key(
    State(s): State<AdminState>,
    q: Result<Query<HashMap<String, String>>, QueryRejection>,
) -> Response {
    let key = q.ok().and_then(|Query(mut m)| m.remove("key"));
    let Some(key) = key.filter(|k| !k.is_empty()) else {
        return query_error(ErrorCode::InvalidParams);
    };
    match s.view.query_key(&key) {
        Ok(replicas) => {
            let body = QueryOk {
                success: true,
                data: replicas
                    .iter()
                    .map(|r| ReplicaJson {
                        size_: r.size,
                        buffer_address_: r.buffer_address,
                        protocol_: "tcp",
                        transport_endpoint_: &r.transport_endpoint,
                    })
                    .collect(),
            };
            json(
                StatusCode::OK,
                serde_json::to_string(&body).unwrap_or_default(),
            )
        }
        Err(code) => query_error(code),
    }
}

async fn all_keys(State(s): State<AdminState>) -> Response {
    text_lines(s.view.all_keys())
}

async fn all_segments(State(s): State<AdminState>) -> Response {
    text_lines(s.view.all_segments())
}

/// Upstream's `UNAVAILABLE_IN_CURRENT_MODE`.
const UNAVAILABLE_IN_CURRENT_MODE: i32 = -1011;

fn quota_error(e: QuotaAdminError) -> Response {
    let (status, code, name, message) = match e {
        QuotaAdminError::Disabled => (
            StatusCode::CONFLICT,
            UNAVAILABLE_IN_CURRENT_MODE,
            "UNAVAILABLE_IN_CURRENT_MODE".to_string(),
            "tenant quotas need --enable_multi_tenants".to_string(),
        ),
        QuotaAdminError::Standby => (
            StatusCode::SERVICE_UNAVAILABLE,
            UNAVAILABLE_IN_CURRENT_MODE,
            "UNAVAILABLE_IN_CURRENT_MODE".to_string(),
            "this master is not the serving leader".to_string(),
        ),
        QuotaAdminError::Invalid(m) => (
            StatusCode::BAD_REQUEST,
            ErrorCode::InvalidParams.code(),
            ErrorCode::InvalidParams.name(),
            m,
        ),
        QuotaAdminError::NotFound => (
            StatusCode::NOT_FOUND,
            ErrorCode::ObjectNotFound.code(),
            ErrorCode::ObjectNotFound.name(),
            "no such tenant".to_string(),
        ),
        QuotaAdminError::NotEmpty => (
            StatusCode::CONFLICT,
            ErrorCode::TenantNotEmpty.code(),
            ErrorCode::TenantNotEmpty.name(),
            "the tenant still owns objects or charged memory".to_string(),
        ),
        QuotaAdminError::Store(m) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            ErrorCode::InternalError.code(),
            ErrorCode::InternalError.name(),
            m,
        ),
    };
    let body = serde_json::json!({
        "success": false,
        "error_code": code,
        "error_name": name,
        "error_message": message,
    });
    json(status, body.to_string())
}

fn tenant_param(q: Result<Query<HashMap<String, String>>, QueryRejection>) -> Option<String> {
    q.ok()
        .and_then(|Query(mut m)| m.remove("tenant_id"))
        .filter(|t| !t.is_empty())
}

async fn get_tenant_quotas(
    State(s): State<AdminState>,
    q: Result<Query<HashMap<String, String>>, QueryRejection>,
) -> Response {
    let only = tenant_param(q);
    match s.view.tenant_quotas(only.as_deref()) {
        Ok(mut v) if only.is_some() => {
            let one = v.pop();
            json(
                StatusCode::OK,
                serde_json::json!({"success": true, "data": one}).to_string(),
            )
        }
        Ok(v) => json(
            StatusCode::OK,
            serde_json::json!({"success": true, "data": v}).to_string(),
        ),
        Err(e) => quota_error(e),
    }
}

#[derive(Deserialize)]
struct QuotaBody {
    requested_quota_bytes: u64,
}

async fn put_tenant_quota(
    State(s): State<AdminState>,
    q: Result<Query<HashMap<String, String>>, QueryRejection>,
    body: axum::body::Bytes,
) -> Response {
    let Some(tenant) = tenant_param(q) else {
        return quota_error(QuotaAdminError::Invalid(
            "missing or invalid tenant_id".into(),
        ));
    };
    let bytes = match serde_json::from_slice::<QuotaBody>(&body) {
        Ok(b) => b.requested_quota_bytes,
        Err(e) => {
            return quota_error(QuotaAdminError::Invalid(format!(
                "the body must be {{\"requested_quota_bytes\": <bytes>}}: {e}"
            )))
        }
    };
    match s.view.upsert_tenant_quota(&tenant, bytes) {
        Ok(v) => json(
            StatusCode::OK,
            serde_json::json!({"success": true, "data": v}).to_string(),
        ),
        Err(e) => quota_error(e),
    }
}

async fn delete_tenant_quota(
    State(s): State<AdminState>,
    q: Result<Query<HashMap<String, String>>, QueryRejection>,
) -> Response {
    let Some(tenant) = tenant_param(q) else {
        return quota_error(QuotaAdminError::Invalid(
            "missing or invalid tenant_id".into(),
        ));
    };
    match s.view.delete_tenant_quota(&tenant) {
        Ok(v) => json(
            StatusCode::OK,
            serde_json::json!({"success": true, "data": v}).to_string(),
        ),
        Err(e) => quota_error(e),
    }
}

async fn not_found() -> Response {
    (StatusCode::NOT_FOUND, "Not Found").into_response()
}

/// The admin server's routes (exposed for embedding and tests).
pub fn admin_router(view: Arc<dyn AdminView>, metrics: Arc<MasterMetrics>) -> Router {
    Router::new()
        .route("/metrics", get(self::metrics).fallback(not_found))
        .route("/health", get(health).fallback(not_found))
        .route("/query_key", get(query_key).fallback(not_found))
        .route("/get_all_keys", get(all_keys).fallback(not_found))
        .route("/get_all_segments", get(all_segments).fallback(not_found))
        .route(
            "/api/v1/tenant_quotas",
            get(get_tenant_quotas)
                .put(put_tenant_quota)
                .delete(delete_tenant_quota)
                .fallback(not_found),
        )
        .fallback(not_found)
        .with_state(AdminState { view, metrics })
}

/// Serve the admin API on an already-bound listener, admitting connections
/// against `limits`, until the task is dropped (runtime shutdown) or the
/// listener fails.
pub async fn serve_admin(
    listener: tokio::net::TcpListener,
    view: Arc<dyn AdminView>,
    metrics: Arc<MasterMetrics>,
    limits: ConnLimits,
) {
    crate::listener::serve(listener, limits, "admin", admin_router(view, metrics)).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_http::{call, Reply};

    async fn request(app: &Router, method: &str, uri: &str) -> Reply {
        call(app, method, uri, &[], b"").await
    }

    struct Fake;

    impl AdminView for Fake {
        fn query_key(&self, key: &str) -> Result<Vec<ReplicaView>, ErrorCode> {
            match key {
                "k1" => Ok(vec![
                    ReplicaView {
                        size: 5,
                        buffer_address: 140_000_000_000_000,
                        transport_endpoint: "127.0.0.1:12345".into(),
                    },
                    ReplicaView {
                        size: 5,
                        buffer_address: 64,
                        transport_endpoint: "127.0.0.1:12346".into(),
                    },
                ]),
                "busy" => Err(ErrorCode::ReplicaIsNotReady),
                _ => Err(ErrorCode::ObjectNotFound),
            }
        }
        fn all_keys(&self) -> Vec<String> {
            vec!["k1".into(), "k2".into()]
        }
        fn all_segments(&self) -> Vec<String> {
            vec!["127.0.0.1:12345".into()]
        }
        fn gauges(&self) -> GaugeSnapshot {
            GaugeSnapshot {
                key_count: 2,
                active_clients: 1,
                ..Default::default()
            }
        }
    }

    struct Empty;

    impl AdminView for Empty {
        fn query_key(&self, _: &str) -> Result<Vec<ReplicaView>, ErrorCode> {
            Err(ErrorCode::ObjectNotFound)
        }
        fn all_keys(&self) -> Vec<String> {
            Vec::new()
        }
        fn all_segments(&self) -> Vec<String> {
            Vec::new()
        }
        fn gauges(&self) -> GaugeSnapshot {
            GaugeSnapshot::default()
        }
    }

    #[tokio::test]
    async fn admin_api() {
        let metrics = Arc::new(MasterMetrics::default());
        metrics.ping_requests.inc();
        let app = admin_router(Arc::new(Fake), metrics);

        let r = request(&app, "GET", "/metrics").await;
        assert_eq!(r.status, 200);
        assert_eq!(
            r.header("content-type").as_deref(),
            Some("text/plain; version=0.0.4")
        );
        let text = r.body_str();
        assert!(text.lines().any(|l| l == "master_key_count 2"), "{text}");
        assert!(text.lines().any(|l| l == "master_ping_requests_total 1"));
        assert!(text.contains("# HELP master_allocated_bytes"));

        let r = request(&app, "GET", "/health").await;
        assert_eq!((r.status, r.body_str()), (200, HEALTH_BODY.to_string()));
        assert_eq!(
            r.header("content-type").as_deref(),
            Some("application/json")
        );

        let r = request(&app, "GET", "/query_key?key=k1").await;
        assert_eq!(r.status, 200);
        assert_eq!(
            r.body_str(),
            r#"{"success":true,"data":[{"size_":5,"buffer_address_":140000000000000,"protocol_":"tcp","transport_endpoint_":"127.0.0.1:12345"},{"size_":5,"buffer_address_":64,"protocol_":"tcp","transport_endpoint_":"127.0.0.1:12346"}]}"#
        );
        let r = request(&app, "GET", "/query_key?key=missing").await;
        assert_eq!(r.status, 404);
        assert_eq!(
            r.body_str(),
            r#"{"success":false,"error_code":-704,"error_message":"OBJECT_NOT_FOUND"}"#
        );
        let r = request(&app, "GET", "/query_key?key=busy").await;
        assert_eq!(r.status, 404);
        assert!(r.body_str().contains("\"error_code\":-703"));
        let r = request(&app, "GET", "/query_key").await;
        assert_eq!(r.status, 400);
        assert!(r.body_str().contains("\"error_code\":-600"));

        let r = request(&app, "GET", "/get_all_keys").await;
        assert_eq!((r.status, r.body_str()), (200, "k1\nk2\n".into()));
        assert!(r
            .header("content-type")
            .is_some_and(|c| c.starts_with("text/plain")));
        let r = request(&app, "GET", "/get_all_segments").await;
        assert_eq!((r.status, r.body_str()), (200, "127.0.0.1:12345\n".into()));

        assert_eq!(request(&app, "GET", "/nope").await.status, 404);
        assert_eq!(request(&app, "POST", "/metrics").await.status, 404);
        assert_eq!(request(&app, "DELETE", "/get_all_keys").await.status, 404);
    }

    #[tokio::test]
    async fn empty_master() {
        let app = admin_router(Arc::new(Empty), Arc::new(MasterMetrics::default()));
        let r = request(&app, "GET", "/get_all_keys").await;
        assert_eq!((r.status, r.body_str()), (200, String::new()));
        let r = request(&app, "GET", "/metrics").await;
        assert!(r.body_str().lines().any(|l| l == "master_key_count 0"));
    }
}
