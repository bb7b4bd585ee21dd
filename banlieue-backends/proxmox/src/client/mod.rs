//! A lean typed client for PVE's `/api2/json` REST API: authentication (API token, or
//! ticket + CSRF token renewed before PVE's 2-hour expiry), form encoding and the
//! response envelope.

mod envelope;
mod form;
mod multipart;

use std::time::{Duration, Instant};

use banlieue_sdk::backend::{BackendError, Connection, SecretValue};
use reqwest::Method;
use serde_json::Value;
use tokio::sync::Mutex;
use tracing::debug;

pub use envelope::{PveError, is_lock_message, parse};
pub use form::{Form, encode};

/// Tickets live 2 hours on PVE; renew well before.
pub const TICKET_RENEW_AFTER: Duration = Duration::from_secs(90 * 60);

/// Per-request timeout.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// How the client authenticates.
enum Auth {
    /// `Authorization: PVEAPIToken=<tokenID>=<tokenSecret>`.
    Token(SecretValue),
    /// `POST /access/ticket`, then the `PVEAuthCookie` cookie and `CSRFPreventionToken`.
    Ticket {
        username: String,
        password: SecretValue,
        session: Mutex<Option<Session>>,
    },
}

#[derive(Clone)]
struct Session {
    ticket: SecretValue,
    csrf: SecretValue,
    obtained: Instant,
    /// The ticket and CSRF token are scrubbed from every message while the session
    /// lives: an endpoint echoing a request's headers would otherwise put the ticket,
    /// as good as the password for two hours, into a condition or a log line.
    _scrubbed: std::sync::Arc<banlieue_sdk::scrub::Held>,
}

/// Which credentials a connection carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AuthKind {
    /// An API token (`tokenID` + `tokenSecret`).
    Token,
    /// A user and password (`username` + `password`), for tickets.
    Ticket,
}

/// One authenticated PVE API client (one per Provider). Cheap to share behind an `Arc`.
pub struct PveClient {
    http: reqwest::Client,
    endpoint: String,
    base: String,
    auth: Auth,
}

impl std::fmt::Debug for PveClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PveClient")
            .field("endpoint", &self.endpoint)
            .field("auth", &self.auth_kind())
            .finish_non_exhaustive()
    }
}

/// `https://host:8006`, `https://host:8006/`, `https://host:8006/api2/json` → `https://host:8006`.
pub fn normalize_endpoint(endpoint: &str) -> Result<String, BackendError> {
    banlieue_kit::endpoint::base_url(endpoint, "/api2/json", "https://pve.example:8006")
}

impl PveClient {
    /// A client for the connection. No network I/O happens until the first call.
    pub fn new(connection: &Connection) -> Result<Self, BackendError> {
        let endpoint = normalize_endpoint(&connection.endpoint)?;
        let auth = if connection.credentials.contains_key("tokenID") {
            let id = connection.credential("tokenID")?;
            let secret = connection.credential("tokenSecret")?;
            Auth::Token(SecretValue::new(format!(
                "PVEAPIToken={}={}",
                id.expose(),
                secret.expose()
            )))
        } else if connection.credentials.contains_key("username") {
            Auth::Ticket {
                username: connection.credential("username")?.expose().to_string(),
                password: connection.credential("password")?.clone(),
                session: Mutex::new(None),
            }
        } else {
            return Err(BackendError::terminal(
                "MissingCredential",
                "the credentials Secret needs tokenID and tokenSecret (an API token), \
                 or username and password",
            ));
        };
        let tls = banlieue_kit::tls::client_config(connection)?;
        let http = reqwest::Client::builder()
            .use_preconfigured_tls(tls)
            .timeout(REQUEST_TIMEOUT)
            .connect_timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| BackendError::terminal("InvalidTLSConfig", e.to_string()))?;
        Ok(Self {
            http,
            base: format!("{endpoint}/api2/json"),
            endpoint,
            auth,
        })
    }

    /// The endpoint, normalized (`https://host:port`).
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Token or ticket.
    pub fn auth_kind(&self) -> AuthKind {
        match self.auth {
            Auth::Token(_) => AuthKind::Token,
            Auth::Ticket { .. } => AuthKind::Ticket,
        }
    }

    /// `GET path?query`.
    pub async fn get(&self, path: &str, query: &Form) -> Result<Value, PveError> {
        self.call(Method::GET, path, query).await
    }

    /// `POST path` with a form body.
    pub async fn post(&self, path: &str, form: &Form) -> Result<Value, PveError> {
        self.call(Method::POST, path, form).await
    }

    /// `PUT path` with a form body.
    pub async fn put(&self, path: &str, form: &Form) -> Result<Value, PveError> {
        self.call(Method::PUT, path, form).await
    }

    /// `DELETE path?query`.
    pub async fn delete(&self, path: &str, query: &Form) -> Result<Value, PveError> {
        self.call(Method::DELETE, path, query).await
    }

    /// `POST path` as `multipart/form-data`: the `fields`, then `data` as the file
    /// field `file_field` named `filename` (PVE's storage upload). The body is never
    /// logged.
    pub async fn upload(
        &self,
        path: &str,
        fields: &Form,
        file_field: &str,
        filename: &str,
        data: &[u8],
    ) -> Result<Value, PveError> {
        let body = multipart::Body::new(fields, file_field, filename, data);
        self.call_with(Method::POST, path, &Form::new(), Some(&body))
            .await
    }

    async fn call(&self, method: Method, path: &str, form: &Form) -> Result<Value, PveError> {
        self.call_with(method, path, form, None).await
    }

    async fn call_with(
        &self,
        method: Method,
        path: &str,
        form: &Form,
        multipart: Option<&multipart::Body>,
    ) -> Result<Value, PveError> {
        let mut renewed = false;
        loop {
            let result = self.send(&method, path, form, multipart).await;
            match (&self.auth, &result) {
                // A revoked or expired ticket: log in again once.
                (Auth::Ticket { session, .. }, Err(PveError::Api { status: 401, .. }))
                    if !renewed =>
                {
                    *session.lock().await = None;
                    renewed = true;
                }
                _ => return result,
            }
        }
    }

    async fn send(
        &self,
        method: &Method,
        path: &str,
        form: &Form,
        multipart: Option<&multipart::Body>,
    ) -> Result<Value, PveError> {
        let mut url = format!("{}{path}", self.base);
        let body = matches!(*method, Method::POST | Method::PUT);
        if !body && !form.is_empty() {
            url.push('?');
            url.push_str(&form.encode());
        }
        let mut request = self.http.request(method.clone(), &url);
        if let Some(multipart) = multipart {
            // A known length: PVE (and fakepve) want Content-Length, not chunks.
            request = request
                .header("Content-Type", multipart.content_type())
                .body(multipart.bytes().to_vec());
        } else if body {
            request = request
                .header("Content-Type", "application/x-www-form-urlencoded")
                .body(form.encode());
        }
        match &self.auth {
            Auth::Token(header) => request = request.header("Authorization", header.expose()),
            Auth::Ticket { .. } => {
                let session = self.session().await?;
                request = request.header(
                    "Cookie",
                    format!("PVEAuthCookie={}", session.ticket.expose()),
                );
                if *method != Method::GET {
                    request = request.header("CSRFPreventionToken", session.csrf.expose());
                }
            }
        }
        let started = Instant::now();
        let response = request.send().await.map_err(transport)?;
        let status = response.status();
        let bytes = response.bytes().await.map_err(transport)?;
        debug!(%method, path, status = status.as_u16(), elapsed_ms = started.elapsed().as_millis() as u64, "proxmox: request");
        parse(
            status.as_u16(),
            status.canonical_reason().unwrap_or_default(),
            &bytes,
        )
    }

    /// The ticket session, logging in when there is none or it is due for renewal.
    async fn session(&self) -> Result<Session, PveError> {
        let Auth::Ticket {
            username,
            password,
            session,
        } = &self.auth
        else {
            unreachable!("session() is only called for ticket auth")
        };
        let mut guard = session.lock().await;
        if let Some(s) = guard.as_ref()
            && s.obtained.elapsed() < TICKET_RENEW_AFTER
        {
            return Ok(s.clone());
        }
        let form = Form::new()
            .set("username", username)
            .set("password", password.expose());
        let url = format!("{}/access/ticket", self.base);
        let response = self
            .http
            .post(&url)
            .header("Content-Type", "application/x-www-form-urlencoded")
            .body(form.encode())
            .send()
            .await
            .map_err(transport)?;
        let status = response.status();
        let bytes = response.bytes().await.map_err(transport)?;
        let data = parse(
            status.as_u16(),
            status.canonical_reason().unwrap_or_default(),
            &bytes,
        )?;
        if data.get("NeedTFA").is_some() {
            return Err(PveError::Api {
                status: 401,
                message: format!("user {username} needs a second factor; use an API token"),
                errors: Default::default(),
            });
        }
        let field = |name: &str| {
            data.get(name)
                .and_then(Value::as_str)
                .map(SecretValue::new)
                .ok_or_else(|| PveError::Decode(format!("/access/ticket answered without {name}")))
        };
        let ticket = field("ticket")?;
        let csrf = field("CSRFPreventionToken")?;
        let scrubbed = banlieue_sdk::scrub::global().hold([ticket.expose(), csrf.expose()]);
        let new = Session {
            ticket,
            csrf,
            obtained: Instant::now(),
            _scrubbed: std::sync::Arc::new(scrubbed),
        };
        debug!(endpoint = %self.endpoint, user = %username, "proxmox: logged in");
        *guard = Some(new.clone());
        Ok(new)
    }
}

fn transport(error: reqwest::Error) -> PveError {
    PveError::Transport(banlieue_kit::error_chain::with_causes(&error))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_are_normalized() {
        for e in [
            "https://10.0.0.1:8006",
            "https://10.0.0.1:8006/",
            "https://10.0.0.1:8006/api2/json",
            " https://10.0.0.1:8006/api2/json/ ",
        ] {
            assert_eq!(normalize_endpoint(e).unwrap(), "https://10.0.0.1:8006");
        }
        assert_eq!(
            normalize_endpoint("pve:8006").unwrap_err().reason,
            "InvalidEndpoint"
        );
    }
}
