//! `rest_client_requests_total{code, method, host}`: every request the client sends to
//! the apiserver, each retry included, by answer, as client-go counts them (dashboards
//! built for controller-runtime managers read this name).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::{Request, Response};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use tower::{Layer, Service};

/// The labels client-go uses.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RestLabels {
    /// The HTTP status, or `<error>` when no answer came.
    pub code: String,
    /// The HTTP method.
    pub method: String,
    /// The apiserver's `host:port`.
    pub host: String,
}

/// Counts requests into a registered family.
#[derive(Clone)]
pub struct RequestMetricsLayer {
    requests: Family<RestLabels, Counter>,
    host: String,
}

impl RequestMetricsLayer {
    /// Registers `rest_client_requests` (encoded `rest_client_requests_total`) in
    /// `registry`, for requests to `host`.
    pub fn new(registry: &mut Registry, host: String) -> Self {
        let requests = Family::<RestLabels, Counter>::default();
        registry.register(
            "rest_client_requests",
            "Number of HTTP requests, partitioned by status code, method, and host",
            requests.clone(),
        );
        Self { requests, host }
    }
}

impl<S> Layer<S> for RequestMetricsLayer {
    type Service = RequestMetrics<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RequestMetrics {
            inner,
            requests: self.requests.clone(),
            host: self.host.clone(),
        }
    }
}

/// The counting service.
#[derive(Clone)]
pub struct RequestMetrics<S> {
    inner: S,
    requests: Family<RestLabels, Counter>,
    host: String,
}

type Counted<R, E> = Pin<Box<dyn Future<Output = Result<R, E>> + Send>>;

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for RequestMetrics<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Counted<S::Response, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let method = request.method().as_str().to_owned();
        let answer = self.inner.call(request);
        let requests = self.requests.clone();
        let host = self.host.clone();
        Box::pin(async move {
            let result = answer.await;
            let code = match &result {
                Ok(response) => response.status().as_u16().to_string(),
                Err(_) => "<error>".to_owned(),
            };
            requests
                .get_or_create(&RestLabels { code, method, host })
                .inc();
            result
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn counts_each_answer_by_code_and_method() {
        let mut registry = Registry::default();
        let layer = RequestMetricsLayer::new(&mut registry, "127.0.0.1:6443".into());
        let mut service = layer.layer(tower::service_fn(|request: Request<()>| async move {
            let status = if request.uri().path() == "/missing" {
                404
            } else {
                200
            };
            Ok::<_, std::convert::Infallible>(Response::builder().status(status).body(()).unwrap())
        }));
        for path in ["/a", "/b", "/missing"] {
            let request = Request::get(path).body(()).unwrap();
            tower::ServiceExt::ready(&mut service)
                .await
                .unwrap()
                .call(request)
                .await
                .unwrap();
        }
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(
            text.contains(
                r#"rest_client_requests_total{code="200",method="GET",host="127.0.0.1:6443"} 2"#
            ),
            "{text}"
        );
        assert!(
            text.contains(
                r#"rest_client_requests_total{code="404",method="GET",host="127.0.0.1:6443"} 1"#
            ),
            "{text}"
        );
    }
}
