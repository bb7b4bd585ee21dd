//! The diagnostics server (`--diagnostics-address`, `:8443`): `/metrics` in the
//! OpenMetrics text format, and CPU profiles at `/debug/pprof/profile` in Go's pprof
//! format (pprof.rs), as Cluster API providers serve them.
//!
//! By default over HTTPS (a self-signed certificate made at start, as controller-runtime
//! does without a cert dir), and only to callers the apiserver vouches for: a bearer
//! token that a TokenReview authenticates, whose user a SubjectAccessReview allows `get`
//! on the path (controller-runtime's `WithAuthenticationAndAuthorization`). No token or
//! an invalid one is 401, a denied user 403. `--insecure-diagnostics` opts out: plain
//! HTTP, no checks (for a loopback address or a trusted network).

mod access;
mod metrics;
mod pprof;
mod tls;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::routing::get;
use prometheus_client::registry::Registry;

use access::Access;

/// How `/metrics` is served.
#[derive(Clone)]
pub enum Security {
    /// HTTPS, TokenReview + SubjectAccessReview through this client.
    Secure(kube::Client),
    /// Plain HTTP, no checks (`--insecure-diagnostics`).
    Insecure,
}

/// Binds `addr` now and serves `/metrics` from `registry` in the background; returns
/// the bound address.
pub async fn serve(
    addr: SocketAddr,
    registry: Arc<Registry>,
    security: Security,
) -> crate::Result<SocketAddr> {
    let app = Router::new()
        .route("/metrics", get(metrics::metrics))
        .route("/debug/pprof/profile", get(pprof::profile))
        .with_state(registry);
    match security {
        Security::Insecure => {
            tracing::warn!(address = %addr, "diagnostics served over plain HTTP to anyone (--insecure-diagnostics)");
            crate::http::spawn("diagnostics", addr, app).await
        }
        Security::Secure(client) => {
            let app = app.layer(axum::middleware::from_fn_with_state(
                Arc::new(Access::new(client)),
                access::guard,
            ));
            tls::spawn("diagnostics", addr, app, tls::self_signed()?).await
        }
    }
}
