//! A tiny HTTP/1.1 client for one VMM's REST API on its unix socket
//! (`http://localhost/api/v1/<op>`), one connection per request: VMM APIs are local
//! and quiet, so connection reuse buys nothing and a fresh connection never sees a
//! half-closed one from a VMM that restarted.

use std::path::{Path, PathBuf};
use std::time::Duration;

use banlieue_sdk::backend::BackendError;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::{Method, Request};
use hyper_util::rt::TokioIo;
use serde::Deserialize;
use serde_json::Value;

/// Why a call failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ApiError {
    /// No VMM answered on the socket (absent, refused, timed out, hung up).
    Unreachable(String),
    /// The VMM answered with an error status; `message` is its error chain.
    Status {
        /// HTTP status.
        status: u16,
        /// CH's error chain joined with `: `, or the raw body.
        message: String,
    },
    /// The answer was not what the API document promises.
    Protocol(String),
}

impl ApiError {
    /// The status, for status errors.
    pub fn status(&self) -> Option<u16> {
        match self {
            Self::Status { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// Classified for the controller: no answer and server errors are transient,
    /// a config the VMM refused (400) is terminal, wrong-state answers (404, 405,
    /// 409) are transient because the next reconcile reads the state again.
    pub fn into_backend(self, op: &str) -> BackendError {
        match self {
            Self::Unreachable(m) => BackendError::transient("VMMUnreachable", format!("{op}: {m}")),
            Self::Protocol(m) => BackendError::transient("VMMProtocolError", format!("{op}: {m}")),
            Self::Status {
                status: 400,
                message,
            } => BackendError::terminal("InvalidVMConfig", format!("{op}: {message}")),
            Self::Status {
                status: 404 | 405 | 409,
                message,
            } => BackendError::transient("VMStateConflict", format!("{op}: {message}")),
            Self::Status { status, message } => {
                BackendError::transient("VMMError", format!("{op} ({status}): {message}"))
            }
        }
    }
}

/// `vmm.ping`'s answer.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct Ping {
    /// e.g. `v48.0.0`.
    pub version: String,
    /// Build version, when reported.
    #[serde(default)]
    pub build_version: Option<String>,
    /// The VMM's pid, when reported.
    #[serde(default)]
    pub pid: Option<i64>,
}

/// `vm.info`'s answer (the parts banlieue reads).
#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct VmInfo {
    /// `Created`, `Running`, `Shutdown`, `Paused` or `BreakPoint`.
    pub state: String,
    /// The VM's configuration as the VMM holds it.
    pub config: Value,
}

/// A client for the VMM listening on one socket.
#[derive(Clone, Debug)]
pub struct VmmClient {
    socket: PathBuf,
    timeout: Duration,
}

impl VmmClient {
    /// A client for `socket`; each request may take at most `timeout`.
    pub fn new(socket: impl Into<PathBuf>, timeout: Duration) -> Self {
        Self {
            socket: socket.into(),
            timeout,
        }
    }

    /// The socket.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// `GET /api/v1/vmm.ping`.
    pub async fn ping(&self) -> Result<Ping, ApiError> {
        let body = self.call(Method::GET, "vmm.ping", None).await?;
        serde_json::from_slice(&body).map_err(|e| ApiError::Protocol(format!("vmm.ping: {e}")))
    }

    /// `GET /api/v1/vm.info`; `None` when no VM is created (404).
    pub async fn info(&self) -> Result<Option<VmInfo>, ApiError> {
        match self.call(Method::GET, "vm.info", None).await {
            Ok(body) => serde_json::from_slice(&body)
                .map(Some)
                .map_err(|e| ApiError::Protocol(format!("vm.info: {e}"))),
            Err(e) if e.status() == Some(404) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// `PUT /api/v1/<op>` with an optional JSON body; success is 204 (or 200).
    pub async fn put(&self, op: &str, body: Option<&Value>) -> Result<(), ApiError> {
        self.call(Method::PUT, op, body).await.map(drop)
    }

    async fn call(
        &self,
        method: Method,
        op: &str,
        body: Option<&Value>,
    ) -> Result<Bytes, ApiError> {
        match tokio::time::timeout(self.timeout, self.exchange(method, op, body)).await {
            Ok(result) => result,
            Err(_) => Err(ApiError::Unreachable(format!(
                "no answer on {} within {:?}",
                self.socket.display(),
                self.timeout
            ))),
        }
    }

    async fn exchange(
        &self,
        method: Method,
        op: &str,
        body: Option<&Value>,
    ) -> Result<Bytes, ApiError> {
        let unreachable = |e: &dyn std::fmt::Display| {
            ApiError::Unreachable(format!("{}: {e}", self.socket.display()))
        };
        let stream = tokio::net::UnixStream::connect(&self.socket)
            .await
            .map_err(|e| unreachable(&e))?;
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| unreachable(&e))?;
        tokio::spawn(async move {
            // Ends when the exchange is over; errors show up on the request.
            let _ = connection.await;
        });
        let mut request = Request::builder()
            .method(method)
            .uri(format!("http://localhost/api/v1/{op}"))
            .header(hyper::header::HOST, "localhost")
            .header(hyper::header::ACCEPT, "application/json");
        let payload = match body {
            Some(value) => {
                request = request.header(hyper::header::CONTENT_TYPE, "application/json");
                Bytes::from(value.to_string())
            }
            None => Bytes::new(),
        };
        let request = request
            .body(Full::new(payload))
            .map_err(|e| ApiError::Protocol(e.to_string()))?;
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| unreachable(&e))?;
        let status = response.status().as_u16();
        let bytes = response
            .into_body()
            .collect()
            .await
            .map_err(|e| unreachable(&e))?
            .to_bytes();
        if (200..300).contains(&status) {
            Ok(bytes)
        } else {
            Err(ApiError::Status {
                status,
                message: error_message(&bytes),
            })
        }
    }
}

/// CH's error body: a JSON array of the error chain (v53), else whatever it sent.
fn error_message(body: &[u8]) -> String {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Array(chain)) => chain
            .iter()
            .map(|v| {
                v.as_str()
                    .map(str::to_owned)
                    .unwrap_or_else(|| v.to_string())
            })
            .collect::<Vec<_>>()
            .join(": "),
        _ => String::from_utf8_lossy(body).trim().to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_errors() {
        let e = |status| {
            ApiError::Status {
                status,
                message: "m".into(),
            }
            .into_backend("vm.create")
        };
        assert!(!e(400).is_transient());
        assert_eq!(e(400).reason, "InvalidVMConfig");
        assert!(e(409).is_transient() && e(404).is_transient() && e(500).is_transient());
        assert_eq!(
            ApiError::Unreachable("x".into())
                .into_backend("vm.info")
                .reason,
            "VMMUnreachable"
        );
        assert_eq!(
            error_message(br#"["Error booting the VM","no kernel"]"#),
            "Error booting the VM: no kernel"
        );
        assert_eq!(error_message(b"plain"), "plain");
    }
}
