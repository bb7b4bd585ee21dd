//! A lean typed client for the vSphere Web Services API (SOAP vim25 over `/sdk`) on
//! reqwest: one session per client, logged in on first use, reused by every call and
//! renewed once when vCenter answers `NotAuthenticated` (expired or terminated).
//! The same session reads and writes datastore files over HTTPS ([`files`]).

pub mod files;
pub mod methods;
pub mod soap;
pub mod xml;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use banlieue_sdk::backend::{BackendError, Connection, SecretValue};
use tokio::sync::{Mutex, OnceCell};
use tracing::{debug, info};

pub use files::{DatastorePath, TransferError};
pub use methods::{ObjectContent, Objects, PropertySpec, ServiceContent, TaskState};
pub use soap::{Answer, VimFault};
pub use xml::{Element, MoRef};

/// Per-request timeout.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// How long a datastore file transfer may go without a byte moving. A transfer as a
/// whole has no deadline: a disk takes as long as its size and the link need.
pub const TRANSFER_STALL_TIMEOUT: Duration = Duration::from_secs(120);

/// The `SOAPAction` vim25 release banlieue speaks: vSphere 7.0U3, served by 7.0U3 and
/// every 8.x vCenter. Nothing banlieue sends is newer.
pub const SOAP_ACTION: &str = "urn:vim25/7.0.3.0";

/// After vCenter rejected the credentials, how long the client answers with that
/// rejection instead of trying again (no login storm against a locked-out account).
pub const FAILED_LOGIN_HOLD: Duration = Duration::from_secs(60);

/// Why a call failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum VimError {
    /// No answer: connection refused, TLS, timeout.
    Transport(String),
    /// vCenter answered with a fault.
    Fault(VimFault),
    /// An answer banlieue cannot read.
    Decode(String),
    /// The datastore file interface answered with an HTTP error status.
    Http {
        /// The status code.
        status: u16,
        /// What was asked and what came back.
        message: String,
    },
}

impl std::fmt::Display for VimError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Transport(m) => write!(f, "{m}"),
            Self::Fault(fault) => write!(f, "{fault}"),
            Self::Decode(m) => write!(f, "unreadable answer: {m}"),
            Self::Http { message, .. } => write!(f, "{message}"),
        }
    }
}

impl VimError {
    /// The fault's type, when vCenter answered with one.
    pub fn fault_kind(&self) -> Option<&str> {
        match self {
            Self::Fault(f) => Some(&f.kind),
            _ => None,
        }
    }

    /// Classifies the error for controllers.
    pub fn into_backend(self) -> BackendError {
        match &self {
            Self::Transport(m) => BackendError::transient("Unreachable", m.clone()),
            Self::Decode(m) => BackendError::transient("InvalidResponse", m.clone()),
            Self::Http { status, message } => match status {
                401 | 403 => BackendError::terminal(
                    "Forbidden",
                    format!(
                        "{message} (the account needs the Datastore.Browse and Datastore.FileManagement privileges)"
                    ),
                ),
                404 => BackendError::terminal("DatastoreFileNotFound", message.clone()),
                408 | 429 | 500.. => {
                    BackendError::transient("DatastoreTransferFailed", message.clone())
                }
                _ => BackendError::terminal("DatastoreTransferFailed", message.clone()),
            },
            Self::Fault(f) => match f.kind.as_str() {
                "InvalidLogin" => BackendError::terminal(
                    "Unauthorized",
                    format!("vCenter rejected the credentials Secret's username and password: {f}"),
                ),
                "NoPermission" => BackendError::terminal("Forbidden", f.to_string()),
                "NotAuthenticated" => BackendError::transient("SessionExpired", f.to_string()),
                "InvalidArgument" | "InvalidRequest" | "InvalidType" | "MethodNotFound" => {
                    BackendError::terminal("InvalidRequest", f.to_string())
                }
                "ManagedObjectNotFound" => BackendError::transient("ObjectNotFound", f.to_string()),
                "InvalidState" | "TaskInProgress" | "ConcurrentAccess" | "ResourceInUse" => {
                    BackendError::transient("Busy", f.to_string())
                }
                _ => BackendError::transient("VSphereFault", f.to_string()),
            },
        }
    }
}

#[derive(Clone)]
struct Session {
    cookie: SecretValue,
    /// The session cookie is scrubbed from every message while the session lives: an
    /// endpoint echoing a request's headers would otherwise put it, as good as the
    /// password until the session ends, into a condition or a log line.
    _scrubbed: std::sync::Arc<banlieue_sdk::scrub::Held>,
}

enum LoginState {
    None,
    LoggedIn(Session),
    /// vCenter rejected the credentials at this time.
    Rejected(VimFault, Instant),
}

/// One vCenter client with one session (one per Provider). Cheap to share behind an `Arc`.
pub struct VimClient {
    http: reqwest::Client,
    /// For datastore files: no overall deadline, only a stall timeout.
    transfer: reqwest::Client,
    endpoint: String,
    url: String,
    username: String,
    password: SecretValue,
    content: OnceCell<ServiceContent>,
    session: Mutex<LoginState>,
    logins: AtomicU64,
}

impl std::fmt::Debug for VimClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VimClient")
            .field("endpoint", &self.endpoint)
            .field("username", &self.username)
            .finish_non_exhaustive()
    }
}

/// `https://vc`, `https://vc/`, `https://vc/sdk` → `https://vc`.
pub fn normalize_endpoint(endpoint: &str) -> Result<String, BackendError> {
    banlieue_kit::endpoint::base_url(endpoint, "/sdk", "https://vcenter.example.com/sdk")
}

impl VimClient {
    /// A client for the connection. No network I/O happens until the first call.
    pub fn new(connection: &Connection) -> Result<Self, BackendError> {
        let endpoint = normalize_endpoint(&connection.endpoint)?;
        let username = connection.credential("username")?.expose().to_string();
        let password = connection.credential("password")?.clone();
        let tls = banlieue_kit::tls::client_config(connection)?;
        let http = reqwest::Client::builder()
            .use_preconfigured_tls(tls.clone())
            .timeout(REQUEST_TIMEOUT)
            .connect_timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| BackendError::terminal("InvalidTLSConfig", e.to_string()))?;
        // Same trust (CA bundle or insecure) as the SOAP calls.
        let transfer = reqwest::Client::builder()
            .use_preconfigured_tls(tls)
            .read_timeout(TRANSFER_STALL_TIMEOUT)
            .connect_timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| BackendError::terminal("InvalidTLSConfig", e.to_string()))?;
        Ok(Self {
            http,
            transfer,
            url: format!("{endpoint}/sdk"),
            endpoint,
            username,
            password,
            content: OnceCell::new(),
            session: Mutex::new(LoginState::None),
            logins: AtomicU64::new(0),
        })
    }

    /// The endpoint, normalized (`https://host[:port]`).
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// How many times this client logged in (1 while its first session lives).
    pub fn logins(&self) -> u64 {
        self.logins.load(Ordering::Relaxed)
    }

    /// The service content (read once, anonymously).
    pub async fn content(&self) -> Result<&ServiceContent, VimError> {
        self.content
            .get_or_try_init(|| async {
                let response = self
                    .post(&methods::retrieve_service_content(), None)
                    .await?;
                methods::decode_service_content(&response).map_err(VimError::Decode)
            })
            .await
    }

    /// Calls a method (a body from [`methods`]) in the session, logging in first when
    /// there is none and once more when vCenter says the session is gone.
    pub async fn call(&self, body: &str) -> Result<Element, VimError> {
        let mut renewed = false;
        loop {
            let session = self.session().await?;
            match self.post(body, Some(&session)).await {
                Err(VimError::Fault(f)) if f.kind == "NotAuthenticated" && !renewed => {
                    self.forget_session(&session).await;
                    renewed = true;
                }
                other => return other,
            }
        }
    }

    /// Drops `session` so the next call logs in again, unless another call renewed
    /// it already.
    async fn forget_session(&self, session: &Session) {
        let mut state = self.session.lock().await;
        if let LoginState::LoggedIn(s) = &*state
            && s.cookie == session.cookie
        {
            info!(endpoint = %self.endpoint, "vsphere: session expired; logging in again");
            *state = LoginState::None;
        }
    }

    /// Ends the session (best effort), e.g. when the Provider goes away.
    pub async fn logout(&self) {
        let mut state = self.session.lock().await;
        if let LoginState::LoggedIn(s) = &*state
            && let Ok(content) = self.content().await
        {
            let _ = self
                .post(&methods::logout(&content.session_manager), Some(s))
                .await;
        }
        *state = LoginState::None;
    }

    async fn session(&self) -> Result<Session, VimError> {
        let mut state = self.session.lock().await;
        match &*state {
            LoginState::LoggedIn(s) => return Ok(s.clone()),
            LoginState::Rejected(f, at) if at.elapsed() < FAILED_LOGIN_HOLD => {
                return Err(VimError::Fault(f.clone()));
            }
            _ => {}
        }
        let content = self.content().await?;
        let body = methods::login(
            &content.session_manager,
            &self.username,
            self.password.expose(),
        );
        let response = self
            .http
            .post(&self.url)
            .header("Content-Type", "text/xml; charset=utf-8")
            .header("SOAPAction", SOAP_ACTION)
            .body(soap::envelope(&body))
            .send()
            .await
            .map_err(transport)?;
        let cookie = response
            .headers()
            .get_all("set-cookie")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .find(|v| v.starts_with("vmware_soap_session="))
            .map(|v| v.split(';').next().unwrap_or(v).to_string());
        match read(response).await {
            Ok(_) => {}
            Err(VimError::Fault(f)) if f.kind == "InvalidLogin" => {
                info!(endpoint = %self.endpoint, user = %self.username, "vsphere: login rejected");
                *state = LoginState::Rejected(f.clone(), Instant::now());
                return Err(VimError::Fault(f));
            }
            Err(e) => return Err(e),
        }
        let cookie = cookie.ok_or_else(|| {
            VimError::Decode("Login answered without a vmware_soap_session cookie".into())
        })?;
        // The cookie's value, with and without its quotes (an echo may drop them);
        // its name is not secret and stays readable.
        let value = cookie.split_once('=').map_or(cookie.as_str(), |(_, v)| v);
        let scrubbed = banlieue_sdk::scrub::global().hold([value, value.trim_matches('"')]);
        let session = Session {
            cookie: SecretValue::new(cookie),
            _scrubbed: std::sync::Arc::new(scrubbed),
        };
        self.logins.fetch_add(1, Ordering::Relaxed);
        debug!(endpoint = %self.endpoint, user = %self.username, "vsphere: logged in");
        *state = LoginState::LoggedIn(session.clone());
        Ok(session)
    }

    async fn post(&self, body: &str, session: Option<&Session>) -> Result<Element, VimError> {
        let mut request = self
            .http
            .post(&self.url)
            .header("Content-Type", "text/xml; charset=utf-8")
            .header("SOAPAction", SOAP_ACTION)
            .body(soap::envelope(body));
        if let Some(s) = session {
            request = request.header("Cookie", s.cookie.expose());
        }
        let started = Instant::now();
        let response = request.send().await.map_err(transport)?;
        let result = read(response).await;
        debug!(
            elapsed_ms = started.elapsed().as_millis() as u64,
            ok = result.is_ok(),
            "vsphere: call"
        );
        result
    }

    /// Reads properties of one object, or of everything in a container view, following
    /// continuation tokens.
    pub async fn retrieve(
        &self,
        props: &[PropertySpec<'_>],
        objects: Objects<'_>,
    ) -> Result<Vec<ObjectContent>, VimError> {
        let pc = self.content().await?.property_collector.clone();
        let response = self
            .call(&methods::retrieve_properties_ex(&pc, props, objects))
            .await?;
        let (mut all, mut token) = methods::decode_retrieve_result(&response);
        while let Some(t) = token {
            let response = self
                .call(&methods::continue_retrieve_properties_ex(&pc, &t))
                .await?;
            let (more, next) = methods::decode_retrieve_result(&response);
            all.extend(more);
            token = next;
        }
        Ok(all)
    }

    /// Reads the properties of every object of `types` below `container`, through a
    /// container view that is destroyed afterwards.
    pub async fn retrieve_all(
        &self,
        container: &MoRef,
        types: &[&str],
        props: &[PropertySpec<'_>],
    ) -> Result<Vec<ObjectContent>, VimError> {
        let vm = self.content().await?.view_manager.clone();
        let view = methods::decode_moref(
            &self
                .call(&methods::create_container_view(&vm, container, types, true))
                .await?,
        )
        .ok_or_else(|| VimError::Decode("CreateContainerView returned no view".into()))?;
        let result = self.retrieve(props, Objects::View(&view)).await;
        // Views live as long as the session; leaking one on error is harmless.
        let _ = self.call(&methods::destroy_view(&view)).await;
        result
    }

    /// One object's properties, `None` when it no longer exists.
    pub async fn properties(
        &self,
        obj: &MoRef,
        paths: &[&str],
    ) -> Result<Option<ObjectContent>, VimError> {
        match self
            .retrieve(
                &[PropertySpec {
                    kind: &obj.kind,
                    paths,
                }],
                Objects::One(obj),
            )
            .await
        {
            Ok(mut objects) => Ok(objects.pop()),
            Err(e) if e.fault_kind() == Some("ManagedObjectNotFound") => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The properties of several objects in one call (each kind's paths from `props`),
    /// in no particular order. A fault when one of them no longer exists.
    pub async fn properties_of(
        &self,
        objects: &[MoRef],
        props: &[PropertySpec<'_>],
    ) -> Result<Vec<ObjectContent>, VimError> {
        self.retrieve(props, Objects::Many(objects)).await
    }

    /// `FindByInventoryPath`.
    pub async fn find_by_path(&self, path: &str) -> Result<Option<MoRef>, VimError> {
        let si = self.content().await?.search_index.clone();
        let response = self
            .call(&methods::find_by_inventory_path(&si, path))
            .await?;
        Ok(methods::decode_moref(&response))
    }

    /// `FindByUuid` for a VM by instance UUID.
    pub async fn find_vm_by_instance_uuid(&self, uuid: &str) -> Result<Option<MoRef>, VimError> {
        let si = self.content().await?.search_index.clone();
        let response = self
            .call(&methods::find_vm_by_uuid(&si, uuid, true))
            .await?;
        Ok(methods::decode_moref(&response))
    }

    /// The VM whose BIOS UUID (`config.uuid`, what `vsphere://` provider IDs carry) is
    /// `uuid`.
    pub async fn find_vm_by_bios_uuid(&self, uuid: &str) -> Result<Option<MoRef>, VimError> {
        let si = self.content().await?.search_index.clone();
        let response = self
            .call(&methods::find_vm_by_uuid(&si, uuid, false))
            .await?;
        Ok(methods::decode_moref(&response))
    }

    /// Calls a `*_Task` method and returns the task.
    pub async fn start_task(&self, body: &str) -> Result<MoRef, VimError> {
        let response = self.call(body).await?;
        methods::decode_moref(&response)
            .ok_or_else(|| VimError::Decode("the task method returned no task".into()))
    }

    /// A task's state, without waiting. A task vCenter no longer knows is reported
    /// as `None`.
    pub async fn task_state(&self, task: &MoRef) -> Result<Option<TaskState>, VimError> {
        Ok(self
            .properties(task, methods::TASK_PATHS)
            .await?
            .map(|t| methods::decode_task(&t)))
    }
}

impl Drop for VimClient {
    /// Ends the session when the backend goes away (the Provider was deleted or its
    /// connection changed), instead of leaving it to vCenter's idle timeout. Best
    /// effort, in the background, only inside a Tokio runtime.
    fn drop(&mut self) {
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (Ok(state), Some(content)) = (self.session.try_lock(), self.content.get()) else {
            return;
        };
        let LoginState::LoggedIn(session) = &*state else {
            return;
        };
        let request = self
            .http
            .post(&self.url)
            .header("Content-Type", "text/xml; charset=utf-8")
            .header("SOAPAction", SOAP_ACTION)
            .header("Cookie", session.cookie.expose())
            .body(soap::envelope(&methods::logout(&content.session_manager)));
        handle.spawn(async move {
            let _ = request.send().await;
        });
    }
}

async fn read(response: reqwest::Response) -> Result<Element, VimError> {
    let status = response.status();
    let text = response.text().await.map_err(transport)?;
    match soap::parse_response(&text) {
        Ok(Answer::Response(e)) => Ok(e),
        Ok(Answer::Fault(f)) => Err(VimError::Fault(f)),
        Err(e) if status.is_success() => Err(VimError::Decode(e)),
        Err(_) => Err(VimError::Transport(format!(
            "HTTP {status} from vCenter: {}",
            text.chars().take(200).collect::<String>()
        ))),
    }
}

fn transport(error: reqwest::Error) -> VimError {
    VimError::Transport(banlieue_kit::error_chain::with_causes(&error))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_are_normalized() {
        for e in [
            "https://vc",
            "https://vc/",
            "https://vc/sdk",
            " https://vc/sdk/ ",
        ] {
            assert_eq!(normalize_endpoint(e).unwrap(), "https://vc");
        }
        assert_eq!(
            normalize_endpoint("vc:443").unwrap_err().reason,
            "InvalidEndpoint"
        );
    }

    #[test]
    fn faults_are_classified() {
        let f = |kind: &str| {
            VimError::Fault(VimFault {
                kind: kind.into(),
                message: "m".into(),
            })
            .into_backend()
        };
        assert_eq!(f("InvalidLogin").reason, "Unauthorized");
        assert!(!f("InvalidLogin").is_transient());
        assert!(f("NotAuthenticated").is_transient());
        assert!(f("SystemError").is_transient());
        assert!(!f("InvalidArgument").is_transient());
    }
}
