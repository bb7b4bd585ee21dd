//! `/metrics`: the registry in the OpenMetrics text format.

use std::sync::Arc;

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use prometheus_client::registry::Registry;

/// The content type of the OpenMetrics text format.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// `GET /metrics`.
pub(super) async fn metrics(State(registry): State<Arc<Registry>>) -> impl IntoResponse {
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
