//! Credentials never reach status, Events or logs, even when the backend echoes them.
//!
//! Each test runs the operator against an ECHOING endpoint on 127.0.0.1, written
//! here: a vSphere that answers `Login` with a SOAP fault quoting the request, a
//! Proxmox that answers `/access/ticket` (password) and token-authenticated calls
//! with a 401 quoting the request's headers and body. Each echo carries the request
//! verbatim, base64 (standard and URL-safe) and URL-encoded (percent and form). Then
//! the Provider's conditions, every Event in the namespace and the operator's log
//! (written through the same scrubbing writer as `banlieue run`'s) must hold no form
//! of the secret, and must hold `[redacted]` and the rest of the message.
//!
//! libvirt cannot be made to echo a key: its private keys (`sshPrivateKey`,
//! `tls.key`) never leave the host (ssh and TLS send signatures, not keys), and
//! libvirt's errors name key files, not their content. So a fake libvirt backend,
//! registered for the `libvirt` class, echoes the keys it is given (whole, line by
//! line, base64) from `connect` and from its calls, through the same cache and
//! wrapper the real one goes through.

use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use banlieue_backend_proxmox::ProxmoxFactory;
use banlieue_backend_sim::SimFactory;
use banlieue_backend_vsphere::VSphereFactory;
use banlieue_integration_tests::apply;
use banlieue_integration_tests::operator::{Operator, wait_for};
use banlieue_sdk::api::Provider;
use banlieue_sdk::api::common::ProviderClass;
use banlieue_sdk::backend::{
    Backend, BackendError, BackendFactory, BackendRegistry, Connection, Deletion, ImageLookup,
    ImageSourceSet, Inventory, MachineIdentity, MachineObservation, MachineRequest,
};
use banlieue_sdk::conditions;
use banlieue_sdk::scrub::{REDACTED, ScrubbedWriter};
use banlieue_testenv::TestNamespace;
use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ListParams};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const WAIT: Duration = Duration::from_secs(60);

/// A value unique to this run.
fn unique(what: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("{what}-{nanos:x}")
}

// --- what the operator logs, through the scrubbing writer ---------------------------

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The operator's log (debug and up), written as `banlieue run` writes it: through
/// `ScrubbedWriter`.
fn logs() -> &'static Captured {
    static LOGS: OnceLock<Captured> = OnceLock::new();
    LOGS.get_or_init(|| {
        let captured = Captured::default();
        let sink = captured.clone();
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(
                "debug,hyper=info,hyper_util=info,h2=info,rustls=info,tower=info",
            ))
            .with_writer(move || ScrubbedWriter::new(sink.clone()))
            .try_init()
            .expect("the test's log subscriber");
        captured
    })
}

fn log_text() -> String {
    String::from_utf8_lossy(&logs().0.lock().unwrap()).into_owned()
}

// --- the forms a secret must not appear in ---------------------------------------

fn percent(s: &str, form: bool) -> String {
    let mut out = String::new();
    for &b in s.as_bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                out.push(char::from(b))
            }
            b' ' if form => out.push('+'),
            b => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

fn hex(s: &str) -> String {
    s.bytes().map(|b| format!("{b:02x}")).collect()
}

/// The secret raw, upper-cased, hex (either case), base64 (whole value: standard, URL-safe unpadded; and the part of
/// a larger blob that encodes only the secret, at each byte alignment, standard and
/// URL-safe) and URL-encoded.
fn forms(secret: &str) -> Vec<(String, String)> {
    let mut out = vec![
        ("raw".to_owned(), secret.to_owned()),
        ("base64".to_owned(), STANDARD.encode(secret)),
        ("base64url".to_owned(), URL_SAFE_NO_PAD.encode(secret)),
        ("percent".to_owned(), percent(secret, false)),
        (
            "percent (lowercase)".to_owned(),
            percent(secret, false).to_lowercase(),
        ),
        ("form".to_owned(), percent(secret, true)),
        ("hex".to_owned(), hex(secret)),
        ("HEX".to_owned(), hex(secret).to_uppercase()),
        ("UPPER".to_owned(), secret.to_uppercase()),
    ];
    for offset in 0..3 {
        let mut shifted = vec![0u8; offset];
        shifted.extend_from_slice(secret.as_bytes());
        let start = (8 * offset).div_ceil(6);
        let end = 8 * (offset + secret.len()) / 6;
        out.push((
            format!("base64 inside a blob at offset {offset}"),
            STANDARD.encode(&shifted)[start..end].to_owned(),
        ));
        out.push((
            format!("base64url inside a blob at offset {offset}"),
            URL_SAFE_NO_PAD.encode(&shifted)[start..end].to_owned(),
        ));
    }
    out
}

/// Panics naming the place and form where a secret appears in `text`.
fn assert_clean(place: &str, text: &str, secrets: &[(&str, &str)]) {
    for (what, secret) in secrets {
        for (form, value) in forms(secret) {
            assert!(
                !text.contains(&value),
                "{what} ({form}: {value:?}) leaked into {place}:\n{text}"
            );
        }
    }
}

/// Waits until the Provider's `Reachable` condition carries a scrubbed message, and
/// checks its conditions, the namespace's Events and the log; returns the Reachable
/// message.
async fn assert_scrubbed_everywhere(
    ns: &TestNamespace,
    provider: &str,
    secrets: &[(&str, &str)],
) -> String {
    let providers: Api<Provider> = ns.api();
    let p = wait_for(&providers, provider, WAIT, |p| {
        p.status.as_ref().is_some_and(|s| {
            conditions::get(&s.conditions, conditions::types::REACHABLE)
                .is_some_and(|c| c.message.contains(REDACTED))
        })
    })
    .await;
    let status = p.status.as_ref().unwrap();
    for c in &status.conditions {
        assert_clean(
            &format!("Provider {provider}'s {} condition", c.type_),
            &c.message,
            secrets,
        );
    }
    assert_clean(
        "the Provider's status",
        &serde_json::to_string(status).unwrap(),
        secrets,
    );
    let ready = conditions::get(&status.conditions, conditions::types::READY).unwrap();
    assert!(
        ready.message.contains(REDACTED),
        "Ready says: {}",
        ready.message
    );
    // The first check's Warning.
    let events: Api<Event> = ns.api();
    let started = std::time::Instant::now();
    let list = loop {
        let list = events.list(&ListParams::default()).await.unwrap();
        let about: Vec<&Event> = list
            .items
            .iter()
            .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(provider))
            .collect();
        if about
            .iter()
            .any(|e| e.note.as_deref().is_some_and(|n| n.contains(REDACTED)))
        {
            break list;
        }
        assert!(
            started.elapsed() < WAIT,
            "no scrubbed Event about {provider}: {:#?}\nevent errors in the log:\n{}",
            list.items,
            log_text()
                .lines()
                .filter(|l| l.contains("event"))
                .collect::<Vec<_>>()
                .join("\n")
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    for e in &list.items {
        assert_clean(
            "an Event's note",
            e.note.as_deref().unwrap_or_default(),
            secrets,
        );
    }
    assert_clean(
        "the Events",
        &serde_json::to_string(&list.items).unwrap(),
        secrets,
    );
    assert_clean("the operator's log", &log_text(), secrets);
    conditions::get(&status.conditions, conditions::types::REACHABLE)
        .unwrap()
        .message
        .clone()
}

// --- echoing endpoints -----------------------------------------------------------

/// A request as it came: its head and its body.
struct Request {
    text: String,
    body: String,
}

/// Everything the request said, and its encodings.
fn echo(request: &Request) -> String {
    let text = &request.text;
    format!(
        "rejected this request: {text} | base64 {} | base64url {} | urlencoded {} | form {} | hex {} | upper {}",
        STANDARD.encode(text),
        URL_SAFE_NO_PAD.encode(text),
        percent(text, false),
        percent(text, true),
        hex(text).to_uppercase(),
        text.to_uppercase(),
    )
}

async fn read_request(stream: &mut TcpStream) -> Option<Request> {
    let mut buffer = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buffer[..end]).into_owned();
            let length = head
                .lines()
                .find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.eq_ignore_ascii_case("content-length")
                        .then(|| v.trim().parse::<usize>().ok())?
                })
                .unwrap_or(0);
            while buffer.len() < end + 4 + length {
                let n = stream.read(&mut chunk).await.ok()?;
                if n == 0 {
                    return None;
                }
                buffer.extend_from_slice(&chunk[..n]);
            }
            let body = String::from_utf8_lossy(&buffer[end + 4..end + 4 + length]).into_owned();
            return Some(Request {
                text: format!("{head}\r\n\r\n{body}"),
                body,
            });
        }
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buffer.extend_from_slice(&chunk[..n]);
    }
}

/// Serves plain HTTP on a loopback port, one answer per connection; returns the port.
async fn serve(answer: fn(&Request) -> (u16, &'static str, String)) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let Some(request) = read_request(&mut stream).await else {
                    return;
                };
                let (status, content_type, body) = answer(&request);
                let head = format!(
                    "HTTP/1.1 {status} Echo\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    body.len()
                );
                let _ = stream.write_all(head.as_bytes()).await;
                let _ = stream.write_all(body.as_bytes()).await;
                let _ = stream.shutdown().await;
            });
        }
    });
    port
}

fn xml_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

const ENVELOPE: &str = r#"<?xml version="1.0" encoding="UTF-8"?><soapenv:Envelope xmlns:soapenv="http://schemas.xmlsoap.org/soap/envelope/" xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance"><soapenv:Body>"#;

/// vCenter's service content, then a `Login` fault quoting the login request.
fn vsphere(request: &Request) -> (u16, &'static str, String) {
    if request.body.contains("RetrieveServiceContent") {
        let content = r#"<RetrieveServiceContentResponse xmlns="urn:vim25"><returnval><rootFolder type="Folder">group-d1</rootFolder><propertyCollector type="PropertyCollector">propertyCollector</propertyCollector><viewManager type="ViewManager">ViewManager</viewManager><about><fullName>Echo vCenter</fullName><apiVersion>8.0.3.0</apiVersion><apiType>VirtualCenter</apiType></about><searchIndex type="SearchIndex">SearchIndex</searchIndex><sessionManager type="SessionManager">SessionManager</sessionManager></returnval></RetrieveServiceContentResponse>"#;
        return (
            200,
            "text/xml",
            format!("{ENVELOPE}{content}</soapenv:Body></soapenv:Envelope>"),
        );
    }
    let fault = format!(
        r#"<soapenv:Fault><faultcode>ServerFaultCode</faultcode><faultstring>Cannot complete login: {}</faultstring><detail><InvalidLoginFault xmlns="urn:vim25" xsi:type="InvalidLogin"></InvalidLoginFault></detail></soapenv:Fault>"#,
        xml_escape(&echo(request))
    );
    (
        500,
        "text/xml",
        format!("{ENVELOPE}{fault}</soapenv:Body></soapenv:Envelope>"),
    )
}

/// Proxmox refusing every request (`/access/ticket` and token calls alike), quoting it.
fn proxmox(request: &Request) -> (u16, &'static str, String) {
    let message = format!("authentication failure: {}", echo(request));
    (
        401,
        "application/json",
        json!({"data": null, "message": message}).to_string(),
    )
}

// --- worlds ------------------------------------------------------------------------

async fn world(prefix: &str, objects: &[Value]) -> (TestNamespace, Operator) {
    logs();
    let ns = banlieue_testenv::namespace(prefix).await;
    for object in objects {
        apply(&ns.client, &ns.name, object).await.expect("fixture");
    }
    let mut registry = BackendRegistry::default();
    registry.register(ProviderClass::Vsphere, Arc::new(VSphereFactory::new()));
    registry.register(ProviderClass::Proxmox, Arc::new(ProxmoxFactory::new()));
    registry.register(ProviderClass::Libvirt, Arc::new(EchoLibvirt));
    let operator = Operator::start_with_registry(
        ns.client.clone(),
        &ns.name,
        registry,
        Arc::new(SimFactory::new()),
        Duration::from_secs(5),
    );
    (ns, operator)
}

fn secret(name: &str, data: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, "stringData": data})
}

fn provider(name: &str, class: &str, endpoint: &str, targets: (Value, Value)) -> Value {
    json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "Provider", "metadata": {"name": name},
           "spec": {"class": class,
                    "connection": {"endpoint": endpoint, "credentialsRef": {"name": format!("{name}-credentials")}},
                    "capabilities": {
                        "storageClasses": [{"name": "fast", "target": targets.0}],
                        "networkClasses": [{"name": "lan", "target": targets.1}]}}})
}

/// A password with everything that escapes differently in XML, JSON and URLs.
fn hostile_password(what: &str) -> String {
    format!("{}+P@ss w0rd&<\"é/%~", unique(what))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vsphere_login_faults_echoing_the_password_are_scrubbed() {
    let port = serve(vsphere).await;
    let password = hostile_password("vc");
    let (ns, _operator) = world(
        "scrub-vsphere",
        &[
            secret(
                "vc-credentials",
                json!({"username": "scrub@vsphere.local", "password": password}),
            ),
            provider(
                "vc",
                "vsphere",
                &format!("http://127.0.0.1:{port}/sdk"),
                (
                    json!({"datastore": "LocalDS_0"}),
                    json!({"portGroup": "VM Network"}),
                ),
            ),
        ],
    )
    .await;
    let message = assert_scrubbed_everywhere(&ns, "vc", &[("the password", &password)]).await;
    // The rest of the echo survives: the method, the user, the encodings around it.
    for kept in [
        "vCenter rejected the credentials",
        "Cannot complete login: rejected this request: POST /sdk",
        "scrub@vsphere.local",
        "| base64 ",
        "| urlencoded ",
        "| hex ",
        "| upper ",
    ] {
        assert!(message.contains(kept), "{kept:?} missing from: {message}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxmox_ticket_logins_echoing_the_password_are_scrubbed() {
    let port = serve(proxmox).await;
    let password = hostile_password("pve");
    let (ns, _operator) = world(
        "scrub-pve-ticket",
        &[
            secret(
                "pve-credentials",
                json!({"username": "root@pam", "password": password}),
            ),
            provider(
                "pve",
                "proxmox",
                &format!("http://127.0.0.1:{port}"),
                (json!({"storage": "local-lvm"}), json!({"bridge": "vmbr0"})),
            ),
        ],
    )
    .await;
    let message = assert_scrubbed_everywhere(&ns, "pve", &[("the password", &password)]).await;
    for kept in [
        "POST /api2/json/access/ticket",
        "username=root%40pam&password=[redacted]",
        "| base64 ",
    ] {
        assert!(message.contains(kept), "{kept:?} missing from: {message}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxmox_token_calls_echoing_the_header_are_scrubbed() {
    let port = serve(proxmox).await;
    let token_secret = format!("{}-0b6e-4c3d-9e8f", unique("tok"));
    let (ns, _operator) = world(
        "scrub-pve-token",
        &[
            secret(
                "pve-credentials",
                json!({"tokenID": "root@pam!scrub", "tokenSecret": token_secret}),
            ),
            provider(
                "pve",
                "proxmox",
                &format!("http://127.0.0.1:{port}"),
                (json!({"storage": "local-lvm"}), json!({"bridge": "vmbr0"})),
            ),
        ],
    )
    .await;
    let message =
        assert_scrubbed_everywhere(&ns, "pve", &[("the token secret", &token_secret)]).await;
    // The header keeps its token ID (not secret), in every encoding.
    for kept in [
        "PVEAPIToken=root@pam!scrub=[redacted]",
        "PVEAPIToken%3Droot%40pam%21scrub%3D[redacted]",
    ] {
        assert!(
            message.to_lowercase().contains(&kept.to_lowercase()),
            "{kept:?} missing from: {message}"
        );
    }
}

// --- libvirt, through a fake backend ------------------------------------------------

/// A PEM-shaped key unique to this run (lines of base64, as a key's body).
fn fake_key(label: &str, what: &str) -> String {
    let body = STANDARD.encode(format!("{}{}", unique(what), "k".repeat(150)).repeat(2));
    let lines: Vec<&str> = body
        .as_bytes()
        .chunks(64)
        .map(|c| std::str::from_utf8(c).unwrap())
        .collect();
    format!(
        "-----BEGIN {label}-----\n{}\n-----END {label}-----\n",
        lines.join("\n")
    )
}

/// What a careless libvirt backend could say about its keys: each whole, one line of
/// each alone, and base64.
fn key_echo(connection: &Connection) -> String {
    let mut parts = Vec::new();
    for key in ["sshPrivateKey", "tls.key"] {
        if let Some(value) = connection.credentials.get(key) {
            let value = value.expose();
            parts.push(format!(
                "{key} was {value} | line 2 was {} | base64 {}",
                value.lines().nth(2).unwrap_or_default(),
                STANDARD.encode(value)
            ));
        }
    }
    format!("libvirt-echo: {}", parts.join(" || "))
}

struct EchoLibvirt;

impl BackendFactory for EchoLibvirt {
    fn connect(&self, connection: &Connection) -> Result<Arc<dyn Backend>, BackendError> {
        if connection.endpoint.contains(":16514") {
            return Err(BackendError::terminal(
                "InvalidEndpoint",
                key_echo(connection),
            ));
        }
        Ok(Arc::new(EchoBackend(key_echo(connection))))
    }
}

struct EchoBackend(String);

impl EchoBackend {
    fn fail(&self) -> BackendError {
        BackendError::terminal("AuthenticationFailed", self.0.clone())
    }
}

#[banlieue_sdk::async_trait]
impl Backend for EchoBackend {
    async fn check(&self) -> Result<Inventory, BackendError> {
        Err(self.fail())
    }

    async fn find_image(&self, _: &ImageSourceSet) -> Result<ImageLookup, BackendError> {
        Err(self.fail())
    }

    async fn ensure(&self, _: &MachineRequest) -> Result<MachineObservation, BackendError> {
        Err(self.fail())
    }

    async fn observe(
        &self,
        _: &MachineIdentity,
    ) -> Result<Option<MachineObservation>, BackendError> {
        Err(self.fail())
    }

    async fn delete(&self, _: &MachineIdentity) -> Result<Deletion, BackendError> {
        Err(self.fail())
    }
}

fn libvirt_provider(name: &str, endpoint: &str) -> Value {
    provider(
        name,
        "libvirt",
        endpoint,
        (json!({"pool": "default"}), json!({"network": "default"})),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn libvirt_keys_echoed_whole_or_line_by_line_are_scrubbed() {
    let ssh_key = fake_key("OPENSSH PRIVATE KEY", "ssh");
    let tls_key = fake_key("PRIVATE KEY", "tls");
    let credentials =
        json!({"sshPrivateKey": ssh_key, "tls.key": tls_key, "tls.crt": "not secret"});
    let (ns, _operator) = world(
        "scrub-libvirt",
        &[
            secret("lv-credentials", credentials.clone()),
            libvirt_provider("lv", "qemu+ssh://scrub@127.0.0.1/system"),
            secret("lv-refused-credentials", credentials),
            libvirt_provider("lv-refused", "qemu+tls://127.0.0.1:16514/system"),
        ],
    )
    .await;
    // Each key whole and each of its lines but the armor.
    let mut secrets: Vec<(String, String)> = Vec::new();
    for (what, key) in [("sshPrivateKey", &ssh_key), ("tls.key", &tls_key)] {
        secrets.push((what.to_owned(), key.clone()));
        for (i, line) in key.lines().enumerate() {
            if !line.starts_with("-----") {
                secrets.push((format!("{what} line {i}"), line.to_owned()));
            }
        }
    }
    let secrets: Vec<(&str, &str)> = secrets
        .iter()
        .map(|(w, s)| (w.as_str(), s.as_str()))
        .collect();
    for name in ["lv", "lv-refused"] {
        let message = assert_scrubbed_everywhere(&ns, name, &secrets).await;
        for kept in [
            "libvirt-echo: sshPrivateKey was [redacted] | line 2 was [redacted] | base64 [redacted]",
            "tls.key was [redacted]",
        ] {
            assert!(message.contains(kept), "{kept:?} missing from: {message}");
        }
    }
}

// --- session secrets: the vCenter session cookie ------------------------------------

/// The session cookie the echoing vCenter hands out, unique to this run.
fn session_cookie() -> &'static str {
    static COOKIE: OnceLock<String> = OnceLock::new();
    COOKIE.get_or_init(|| format!("\"{}-5e55-10n\"", unique("cookie")))
}

/// A vCenter that logs anyone in, handing out [`session_cookie`], then answers every
/// call in the session with a fault quoting the request (its `Cookie` header too).
fn vsphere_session(request: &Request) -> (u16, &'static str, String) {
    if request.body.contains("RetrieveServiceContent") {
        return vsphere(request);
    }
    if request.body.contains("<Login ") || request.body.contains("<Login>") {
        let body = r#"<LoginResponse xmlns="urn:vim25"><returnval><key>52ad</key><userName>scrub@vsphere.local</userName><fullName>scrub</fullName></returnval></LoginResponse>"#;
        return (
            200,
            "text/xml",
            format!("{ENVELOPE}{body}</soapenv:Body></soapenv:Envelope>"),
        );
    }
    let fault = format!(
        r#"<soapenv:Fault><faultcode>ServerFaultCode</faultcode><faultstring>broken: {}</faultstring><detail><SystemErrorFault xmlns="urn:vim25" xsi:type="SystemError"><reason>echo</reason></SystemErrorFault></detail></soapenv:Fault>"#,
        xml_escape(&echo(request))
    );
    (
        500,
        "text/xml",
        format!("{ENVELOPE}{fault}</soapenv:Body></soapenv:Envelope>"),
    )
}

/// Finding 6 of issue 37: the session secrets a backend derives from its credentials
/// were never registered. The vCenter session cookie is as good as the password
/// until the session ends; an endpoint echoing a call's headers put it into the
/// Provider's conditions, its Events and the log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vsphere_calls_echoing_the_session_cookie_are_scrubbed() {
    let port = serve_session(vsphere_session).await;
    let cookie = session_cookie();
    let value = cookie.trim_matches('"');
    let (ns, _operator) = world(
        "scrub-vsphere-cookie",
        &[
            secret(
                "vcs-credentials",
                json!({"username": "scrub@vsphere.local", "password": hostile_password("vcs")}),
            ),
            provider(
                "vcs",
                "vsphere",
                &format!("http://127.0.0.1:{port}/sdk"),
                (
                    json!({"datastore": "LocalDS_0"}),
                    json!({"portGroup": "VM Network"}),
                ),
            ),
        ],
    )
    .await;
    let message = assert_scrubbed_everywhere(&ns, "vcs", &[("the session cookie", value)]).await;
    assert!(
        message.contains("vmware_soap_session=[redacted]"),
        "the cookie header keeps its name: {message}"
    );
}

/// [`serve`], whose answers also set the session cookie on a `Login`.
async fn serve_session(answer: fn(&Request) -> (u16, &'static str, String)) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let Some(request) = read_request(&mut stream).await else {
                    return;
                };
                let (status, content_type, body) = answer(&request);
                let cookie = if request.body.contains("<Login") {
                    format!(
                        "Set-Cookie: vmware_soap_session={}; Path=/; HttpOnly\r\n",
                        session_cookie()
                    )
                } else {
                    String::new()
                };
                let head = format!(
                    "HTTP/1.1 {status} Echo\r\nContent-Type: {content_type}\r\n{cookie}Content-Length: {}\r\nConnection: close\r\n\r\n",
                    body.len()
                );
                let _ = stream.write_all(head.as_bytes()).await;
                let _ = stream.write_all(body.as_bytes()).await;
                let _ = stream.shutdown().await;
            });
        }
    });
    port
}

// --- bootstrap data: a kubeadm join token in user data --------------------------------

/// The sim backend, but its creates fail with a message that quotes the request's
/// user data (raw, base64, hex, upper-cased), as a backend echoing a create call could.
struct EchoingCreates(SimFactory);

impl BackendFactory for EchoingCreates {
    fn connect(&self, connection: &Connection) -> Result<Arc<dyn Backend>, BackendError> {
        Ok(Arc::new(EchoingCreatesBackend(self.0.connect(connection)?)))
    }
}

struct EchoingCreatesBackend(Arc<dyn Backend>);

#[banlieue_sdk::async_trait]
impl Backend for EchoingCreatesBackend {
    async fn check(&self) -> Result<Inventory, BackendError> {
        self.0.check().await
    }

    async fn find_image(&self, sources: &ImageSourceSet) -> Result<ImageLookup, BackendError> {
        self.0.find_image(sources).await
    }

    async fn ensure(&self, request: &MachineRequest) -> Result<MachineObservation, BackendError> {
        let user_data = request
            .bootstrap
            .as_ref()
            .map(|b| b.user_data.expose().to_owned())
            .unwrap_or_default();
        Err(BackendError::terminal(
            "CreateRefused",
            format!(
                "create-echo: the guest refused user data {user_data} | base64 {} | hex {} | upper {}",
                STANDARD.encode(&user_data),
                hex(&user_data),
                user_data.to_uppercase()
            ),
        ))
    }

    async fn observe(
        &self,
        identity: &MachineIdentity,
    ) -> Result<Option<MachineObservation>, BackendError> {
        self.0.observe(identity).await
    }

    async fn delete(&self, identity: &MachineIdentity) -> Result<Deletion, BackendError> {
        self.0.delete(identity).await
    }
}

/// Finding 6 of issue 37: bootstrap values were never registered with the scrubber.
/// A kubeadm join token in a VM's user data, echoed by a failing create, reached the
/// machine's and the VM's conditions, the Events and the log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kubeadm_token_in_user_data_echoed_by_a_create_is_scrubbed() {
    use banlieue_sdk::api::VirtualMachine;
    use banlieue_sdk::api::infra::libvirt::LibvirtMachine;

    logs();
    let ns = banlieue_testenv::namespace("scrub-bootstrap").await;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let token_secret = format!("{:016x}", nanos as u64);
    let token = format!("scrub1.{token_secret}");
    let user_data = format!(
        "#cloud-config\nruncmd:\n  - kubeadm join 10.0.0.1:6443 --token {token} --discovery-token-unsafe-skip-ca-verification\n"
    );
    for object in [
        banlieue_integration_tests::fixtures::sim_provider(
            "sim",
            &format!("sim://{}", ns.name),
            json!({}),
        ),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMClass", "metadata": {"name": format!("{}-small", ns.name)},
               "spec": {"cpus": 1, "memoryMiB": 512, "disk": {"sizeGiB": 5, "storageClass": "fast"}}}),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMImage", "metadata": {"name": format!("{}-debian", ns.name)},
               "spec": {"os": {"family": "linux", "distribution": "debian", "version": "13"}, "sources": {"sim": {"name": "debian"}}}}),
        secret("join", json!({"value": user_data})),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine", "metadata": {"name": "node-1"},
               "spec": {"classRef": {"name": format!("{}-small", ns.name)}, "imageRef": {"name": format!("{}-debian", ns.name)},
                        "networks": [{"name": "eth0", "networkClass": "lan"}],
                        "placement": {"providerRef": {"name": "sim"}},
                        "bootstrap": {"format": "cloud-config", "userData": {"name": "join"}}}}),
    ] {
        apply(&ns.client, &ns.name, &object).await.expect("fixture");
    }
    let mut registry = BackendRegistry::default();
    registry.register(
        ProviderClass::Sim,
        Arc::new(EchoingCreates(SimFactory::new())),
    );
    let _operator = Operator::start_with_registry(
        ns.client.clone(),
        &ns.name,
        registry,
        Arc::new(SimFactory::new()),
        Duration::from_secs(5),
    );
    let machines: Api<LibvirtMachine> = ns.api();
    let machine = wait_for(&machines, "node-1", WAIT, |m| {
        m.status.as_ref().is_some_and(|s| {
            s.conditions
                .iter()
                .any(|c| c.message.contains("create-echo"))
        })
    })
    .await;
    let secrets = [
        ("the join token", token.as_str()),
        ("its secret", token_secret.as_str()),
    ];
    let status = serde_json::to_string(&machine.status).unwrap();
    assert_clean("the machine's status", &status, &secrets);
    assert!(status.contains(REDACTED), "{status}");
    assert!(
        status.contains("kubeadm join 10.0.0.1:6443 --token [redacted]"),
        "the rest of the user data stays readable: {status}"
    );
    let vms: Api<VirtualMachine> = ns.api();
    let vm = vms.get("node-1").await.unwrap();
    assert_clean(
        "the VM's status",
        &serde_json::to_string(&vm.status).unwrap(),
        &secrets,
    );
    // Events are published asynchronously: give them the time a reconcile takes.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let events: Api<Event> = ns.api();
    let list = events.list(&ListParams::default()).await.unwrap();
    assert_clean(
        "the Events",
        &serde_json::to_string(&list.items).unwrap(),
        &secrets,
    );
    assert_clean("the operator's log", &log_text(), &secrets);
}
