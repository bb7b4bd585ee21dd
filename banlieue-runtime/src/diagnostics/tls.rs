//! HTTPS for the diagnostics server: a self-signed certificate made at start (Prometheus
//! and CAPI's ServiceMonitors scrape with `insecureSkipVerify` and the bearer token),
//! served with rustls over hyper.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::service::TowerToHyperService;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

/// A server config with a fresh self-signed certificate for `localhost`, the pod's host
/// name and `127.0.0.1`.
pub fn self_signed() -> crate::Result<Arc<rustls::ServerConfig>> {
    let mut names = vec!["localhost".to_owned(), "127.0.0.1".to_owned()];
    if let Ok(host) = std::env::var("HOSTNAME")
        && !host.is_empty()
    {
        names.push(host);
    }
    let certified = rcgen::generate_simple_self_signed(names).map_err(|e| crate::Error::Tls {
        what: "making the diagnostics server's self-signed certificate",
        message: e.to_string(),
    })?;
    let cert: CertificateDer<'static> = certified.cert.der().clone();
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(
        certified.signing_key.serialize_der(),
    ));
    let mut config = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(vec![cert], key)
        .map_err(|e| crate::Error::Tls {
            what: "the diagnostics server's TLS config",
            message: e.to_string(),
        })?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// Binds `addr` now, then serves `app` over TLS on a background task for the life of
/// the process. Returns the bound address.
pub async fn spawn(
    name: &'static str,
    addr: SocketAddr,
    app: Router,
    config: Arc<rustls::ServerConfig>,
) -> crate::Result<SocketAddr> {
    let listen = |source| crate::Error::Listen {
        server: name,
        addr,
        source,
    };
    let listener = TcpListener::bind(addr).await.map_err(listen)?;
    let local = listener.local_addr().map_err(listen)?;
    tracing::info!(server = name, address = %local, "serving over HTTPS");
    let acceptor = TlsAcceptor::from(config);
    tokio::spawn(async move {
        loop {
            let (stream, peer) = match listener.accept().await {
                Ok(accepted) => accepted,
                Err(error) => {
                    tracing::warn!(server = name, %error, "accepting a connection");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    continue;
                }
            };
            let acceptor = acceptor.clone();
            let app = app.clone();
            tokio::spawn(async move {
                let tls = match acceptor.accept(stream).await {
                    Ok(tls) => tls,
                    Err(error) => {
                        tracing::debug!(server = name, %peer, %error, "TLS handshake failed");
                        return;
                    }
                };
                let served = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .http1_only()
                    .serve_connection(TokioIo::new(tls), TowerToHyperService::new(app))
                    .await;
                if let Err(error) = served {
                    tracing::debug!(server = name, %peer, %error, "connection ended with an error");
                }
            });
        }
    });
    Ok(local)
}
