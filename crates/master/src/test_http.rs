//! Test-only helper: drive an axum [`Router`] in memory (tower's
//! `ServiceExt::oneshot`), without sockets or an HTTP parser of our own.

use axum::body::Body;
use axum::http::{HeaderMap, Request};
use axum::Router;
use http_body_util::BodyExt;
use tower::ServiceExt;

/// A response, read to the end.
pub(crate) struct Reply {
    pub(crate) status: u16,
    pub(crate) headers: HeaderMap,
    pub(crate) body: Vec<u8>,
}

impl Reply {
    /// The body as (lossy) UTF-8.
    pub(crate) fn body_str(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// A header's value, if present and printable.
    pub(crate) fn header(&self, name: &str) -> Option<String> {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    }
}

/// Send one request with extra `headers` through `app`.
pub(crate) async fn call(
    app: &Router,
    method: &str,
    uri: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Reply {
    let mut req = Request::builder().method(method).uri(uri);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let req = req
        .body(Body::from(body.to_vec()))
        .expect("a well-formed test request");
    let resp = app.clone().oneshot(req).await.expect("infallible router");
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let body = resp
        .into_body()
        .collect()
        .await
        .expect("response body")
        .to_bytes()
        .to_vec();
    Reply {
        status,
        headers,
        body,
    }
}
