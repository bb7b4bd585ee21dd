//! Serving a small axum router in the background (probes and metrics).

use std::net::SocketAddr;

use anyhow::Context as _;
use axum::Router;
use tokio::net::TcpListener;

/// Binds `addr` now, so that a taken port fails startup, then serves `app` on a
/// background task for the life of the process. Returns the bound address.
pub async fn spawn(
    name: &'static str,
    addr: SocketAddr,
    app: Router,
) -> anyhow::Result<SocketAddr> {
    let listener = TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding the {name} server to {addr}"))?;
    let local = listener.local_addr()?;
    tracing::info!(server = name, address = %local, "serving");
    tokio::spawn(async move {
        if let Err(error) = axum::serve(listener, app).await {
            tracing::error!(server = name, %error, "server stopped");
        }
    });
    Ok(local)
}
