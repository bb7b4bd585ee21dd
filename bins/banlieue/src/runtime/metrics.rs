//! The diagnostics server (`--diagnostics-address`): `/metrics` in the OpenMetrics
//! text format.
//!
//! Plain HTTP for now. Cluster API providers serve it over HTTPS with
//! TokenReview/SubjectAccessReview authentication and authorization (and
//! `--insecure-diagnostics` to opt out); that comes later, until then restrict
//! access with a NetworkPolicy or bind it to `127.0.0.1`.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::registry::Registry;

/// The content type of the OpenMetrics text format.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Binds `addr` now and serves `/metrics` from `registry` in the background;
/// returns the bound address.
pub async fn serve(addr: SocketAddr, registry: Arc<Registry>) -> anyhow::Result<SocketAddr> {
    let app = Router::new()
        .route("/metrics", get(metrics))
        .with_state(registry);
    super::http::spawn("diagnostics", addr, app).await
}

async fn metrics(State(registry): State<Arc<Registry>>) -> impl IntoResponse {
    let mut body = String::new();
    match prometheus_client::encoding::text::encode(&mut body, &registry) {
        Ok(()) => (StatusCode::OK, [(header::CONTENT_TYPE, CONTENT_TYPE)], body),
        Err(error) => {
            tracing::error!(%error, "encoding metrics");
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                [(header::CONTENT_TYPE, "text/plain")],
                String::new(),
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use prometheus_client::metrics::counter::Counter;

    use super::*;

    #[tokio::test]
    async fn encodes_the_registry() {
        let mut registry = Registry::default();
        let counter = Counter::<u64>::default();
        registry.register("demo", "A demo counter", counter.clone());
        counter.inc();
        let response = metrics(State(Arc::new(registry))).await.into_response();
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(response.headers()[header::CONTENT_TYPE], CONTENT_TYPE);
        let body = axum::body::to_bytes(response.into_body(), 1 << 20)
            .await
            .unwrap();
        let body = String::from_utf8(body.to_vec()).unwrap();
        assert!(body.contains("demo_total 1"), "{body}");
        assert!(body.ends_with("# EOF\n"), "{body}");
    }
}
