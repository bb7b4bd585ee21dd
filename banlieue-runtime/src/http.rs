//! Serving a small axum router in the background (probes and metrics).

use std::net::SocketAddr;

use axum::Router;
use tokio::net::TcpListener;

/// Binds `addr` now, so that a taken port fails startup, then serves `app` on a
/// background task for the life of the process. Returns the bound address.
pub async fn spawn(name: &'static str, addr: SocketAddr, app: Router) -> crate::Result<SocketAddr> {
    let listen = |source| crate::Error::Listen {
        server: name,
        addr,
        source,
    };
    let listener = TcpListener::bind(addr).await.map_err(listen)?;
    let local = listener.local_addr().map_err(listen)?;
    tracing::info!(server = name, address = %local, "serving");
    tokio::spawn(async move {
        if let Err(error) = axum::serve(listener, app).await {
            tracing::error!(server = name, %error, "server stopped");
        }
    });
    Ok(local)
}
