//! The health probe server (`--health-addr`): `/healthz` and `/readyz`.

use std::net::SocketAddr;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use banlieue_sdk::controllers::Readiness;

use crate::leader::LeaderStatus;

/// What `/readyz` looks at.
#[derive(Clone)]
struct Probes {
    readiness: Readiness,
    /// `None` when leader election is off.
    leader: Option<LeaderStatus>,
}

/// The answer of `/readyz`: ready when the controllers' caches have synced, and a
/// standby replica (leader election on, the Lease held by another) is ready too, as
/// Cluster API's managers are. Were it not, a rolling update of one replica would
/// never finish: the new Pod could not become Ready before the old one released the
/// Lease, and the old one is only stopped once the new one is Ready.
pub fn readyz(ready: bool, leader: Option<bool>) -> (StatusCode, &'static str) {
    match (leader, ready) {
        (Some(false), _) => (StatusCode::OK, "standby: another replica holds the Lease"),
        (_, false) => (StatusCode::SERVICE_UNAVAILABLE, "caches not synced"),
        (_, true) => (StatusCode::OK, "ok"),
    }
}

/// Binds `addr` now (so a taken port fails startup) and serves the probes in the
/// background for the life of the process; returns the bound address.
pub async fn serve(
    addr: SocketAddr,
    readiness: Readiness,
    leader: Option<LeaderStatus>,
) -> crate::Result<SocketAddr> {
    let app = Router::new()
        .route("/healthz", get(|| async { (StatusCode::OK, "ok") }))
        .route(
            "/readyz",
            get(|State(probes): State<Probes>| async move {
                readyz(
                    probes.readiness.is_ready(),
                    probes.leader.as_ref().map(LeaderStatus::is_leader),
                )
            }),
        )
        .with_state(Probes { readiness, leader });
    crate::http::spawn("health", addr, app).await
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    /// The status line and body of `GET path` (HTTP/1.0, so the server closes).
    async fn get(addr: SocketAddr, path: &str) -> (String, String) {
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        stream
            .write_all(format!("GET {path} HTTP/1.0\r\n\r\n").as_bytes())
            .await
            .unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).await.unwrap();
        let status = response.lines().next().unwrap_or_default().to_string();
        let body = response
            .split("\r\n\r\n")
            .nth(1)
            .unwrap_or_default()
            .to_string();
        (status, body)
    }

    #[tokio::test]
    async fn serves_the_probes() {
        let leader = LeaderStatus::default();
        let addr = serve(
            "127.0.0.1:0".parse().unwrap(),
            Readiness::default(),
            Some(leader),
        )
        .await
        .unwrap();
        assert_eq!(
            get(addr, "/healthz").await,
            ("HTTP/1.0 200 OK".into(), "ok".into())
        );
        let (status, body) = get(addr, "/readyz").await;
        assert_eq!(
            (status.as_str(), body.as_str()),
            (
                "HTTP/1.0 200 OK",
                "standby: another replica holds the Lease"
            )
        );
        assert!(get(addr, "/nope").await.0.contains("404"));
    }

    #[test]
    fn ready_needs_synced_caches() {
        assert_eq!(readyz(true, None), (StatusCode::OK, "ok"));
        assert_eq!(
            readyz(false, None),
            (StatusCode::SERVICE_UNAVAILABLE, "caches not synced")
        );
    }

    #[test]
    fn a_standby_is_ready_and_says_so() {
        assert_eq!(readyz(true, Some(true)), (StatusCode::OK, "ok"));
        assert_eq!(
            readyz(false, Some(true)),
            (StatusCode::SERVICE_UNAVAILABLE, "caches not synced")
        );
        for synced in [true, false] {
            assert_eq!(
                readyz(synced, Some(false)),
                (StatusCode::OK, "standby: another replica holds the Lease")
            );
        }
    }
}
