//! The manager's process and its credentials: serving certificate, impersonating
//! kubeconfig, spawning with `PR_SET_PDEATHSIG`, killing it at exit, readiness probes.

// `Command::pre_exec` (to set PR_SET_PDEATHSIG in the child), `kill`, `waitpid` and
// `atexit` are unsafe FFI with no safe wrapper in std; each use carries a SAFETY comment.
#![allow(unsafe_code)]

use std::fmt::Write as _;
use std::io::{Read as _, Write as _};
use std::net::{TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use kube::config::Kubeconfig;
use serde_json::{Value, json};

use super::{NAMESPACE, SERVICE_ACCOUNT, SERVICE_ACCOUNT_GROUPS};

/// Reserves distinct free loopback ports by binding them all at once.
pub fn free_ports<const N: usize>() -> Result<[u16; N], String> {
    let listeners = (0..N)
        .map(|_| TcpListener::bind("127.0.0.1:0"))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("capi rig: reserving a port: {e}"))?;
    let mut ports = [0; N];
    for (port, listener) in ports.iter_mut().zip(&listeners) {
        *port = listener.local_addr().map_err(|e| e.to_string())?.port();
    }
    Ok(ports)
}

/// A CA and a serving certificate for 127.0.0.1/localhost signed by it, written as
/// `tls.crt`/`tls.key` (the manager's defaults); returns the CA's PEM.
pub fn write_serving_cert(dir: &Path) -> Result<String, String> {
    use rcgen::{
        BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer,
        KeyPair, KeyUsagePurpose,
    };
    let err = |e: rcgen::Error| format!("capi rig: generating certificates: {e}");
    let ca_key = KeyPair::generate().map_err(err)?;
    let mut ca_params = CertificateParams::default();
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "banlieue-capi-rig-ca");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_cert = ca_params.self_signed(&ca_key).map_err(err)?;
    let ca = Issuer::new(ca_params, ca_key);
    let key = KeyPair::generate().map_err(err)?;
    let mut params =
        CertificateParams::new(["127.0.0.1".to_owned(), "localhost".to_owned()]).map_err(err)?;
    params
        .distinguished_name
        .push(DnType::CommonName, "capi-webhook-service");
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let cert = params.signed_by(&key, &ca).map_err(err)?;
    for (name, pem) in [("tls.crt", cert.pem()), ("tls.key", key.serialize_pem())] {
        std::fs::write(dir.join(name), pem).map_err(|e| format!("capi rig: {e}"))?;
    }
    Ok(ca_cert.pem())
}

/// Writes a kubeconfig with the admin's credentials that impersonates CAPI's
/// ServiceAccount (`as`/`as-groups`), so the manager has exactly that identity's rights.
pub(super) fn write_impersonating_kubeconfig(admin: &Path, out: &Path) -> Result<(), String> {
    let config = Kubeconfig::read_from(admin).map_err(|e| format!("capi rig: {e}"))?;
    let cluster = config
        .clusters
        .first()
        .and_then(|c| c.cluster.as_ref())
        .ok_or("capi rig: the admin kubeconfig has no cluster")?;
    let user = config
        .auth_infos
        .first()
        .and_then(|a| a.auth_info.as_ref())
        .ok_or("capi rig: the admin kubeconfig has no user")?;
    let quote = |s: Option<&str>| format!("{:?}", s.unwrap_or_default());
    let mut yaml = String::new();
    let _ = write!(
        yaml,
        "apiVersion: v1
kind: Config
clusters:
- name: banlieue-testenv
  cluster:
    server: {server}
    certificate-authority: {ca}
users:
- name: capi-manager
  user:
    client-certificate: {cert}
    client-key: {key}
    as: {sa}
    as-groups: [{groups}]
contexts:
- name: capi-manager
  context:
    cluster: banlieue-testenv
    user: capi-manager
current-context: capi-manager
",
        server = cluster.server.as_deref().unwrap_or_default(),
        ca = quote(cluster.certificate_authority.as_deref()),
        cert = quote(user.client_certificate.as_deref()),
        key = quote(user.client_key.as_deref()),
        sa = SERVICE_ACCOUNT,
        groups = SERVICE_ACCOUNT_GROUPS
            .iter()
            .map(|g| format!("{g:?}"))
            .collect::<Vec<_>>()
            .join(", "),
    );
    std::fs::write(out, yaml).map_err(|e| format!("capi rig: writing {}: {e}", out.display()))
}

/// Starts `<rig>/manager` with `args`, output to `log`, in its own process group, killed
/// by the kernel when the spawning thread dies (`PR_SET_PDEATHSIG`).
pub fn spawn_manager(rig: &Path, args: &[String], log: &Path) -> Result<Child, String> {
    let file = std::fs::File::create(log).map_err(|e| format!("capi rig: {e}"))?;
    let stderr = file.try_clone().map_err(|e| format!("capi rig: {e}"))?;
    let mut command = Command::new(rig.join("manager"));
    command
        .args(args)
        .env("POD_NAMESPACE", NAMESPACE)
        .env("POD_NAME", "capi-controller-manager-0")
        .stdin(Stdio::null())
        .stdout(file)
        .stderr(stderr)
        .process_group(0);
    let parent = std::process::id();
    // SAFETY: the closure runs in the forked child before exec and only makes
    // async-signal-safe system calls (prctl, getppid, kill).
    unsafe {
        command.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            if libc::getppid() != parent as libc::pid_t {
                libc::kill(libc::getpid(), libc::SIGKILL);
            }
            Ok(())
        });
    }
    command
        .spawn()
        .map_err(|e| format!("capi rig: starting {}: {e}", rig.join("manager").display()))
}

static MANAGER_PID: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// Kills the manager when the test binary exits, before the harness stops the apiserver
/// (`atexit` handlers run in reverse order of registration, and the control plane
/// registered its own first): its open watches would otherwise hold the apiserver's
/// graceful shutdown for the whole stop timeout.
pub(super) fn stop_at_exit(pid: u32) {
    extern "C" fn kill_manager() {
        let pid = MANAGER_PID.load(std::sync::atomic::Ordering::SeqCst);
        if pid != 0 {
            // SAFETY: plain system calls on our own child's pid; no memory is touched.
            unsafe {
                libc::kill(pid as libc::pid_t, libc::SIGKILL);
                libc::waitpid(pid as libc::pid_t, std::ptr::null_mut(), 0);
            }
        }
    }
    MANAGER_PID.store(pid, std::sync::atomic::Ordering::SeqCst);
    // SAFETY: registers a handler that is a plain `extern "C" fn` without captures.
    unsafe {
        libc::atexit(kill_manager);
    }
}

/// A plain-HTTP GET answering 200.
pub fn http_ok(addr: &str, path: &str) -> bool {
    let probe = || -> std::io::Result<String> {
        let mut stream = TcpStream::connect(addr)?;
        stream.set_read_timeout(Some(Duration::from_secs(2)))?;
        write!(
            stream,
            "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
        )?;
        let mut response = String::new();
        stream.read_to_string(&mut response)?;
        Ok(response)
    };
    probe().is_ok_and(|r| r.starts_with("HTTP/1.1 200"))
}

/// A dry-run create of a v1beta2 Cluster goes through CAPI's defaulting and validating
/// webhooks; any answer from them (accepted, or rejected by them) means they serve.
pub(super) async fn webhooks_answer(client: &kube::Client) -> Result<(), String> {
    let cluster = json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2",
        "kind": "Cluster",
        "metadata": {"name": "capi-rig-probe", "namespace": "default"},
        "spec": {},
    });
    let request = http::Request::post(
        "/apis/cluster.x-k8s.io/v1beta2/namespaces/default/clusters?dryRun=All",
    )
    .header(http::header::CONTENT_TYPE, "application/json")
    .body(serde_json::to_vec(&cluster).expect("JSON"))
    .expect("request");
    match client.request::<Value>(request).await {
        Ok(_) => Ok(()),
        Err(e) => {
            let text = e.to_string();
            if text.contains("failed calling webhook") || text.contains("connection refused") {
                Err(text)
            } else {
                Ok(())
            }
        }
    }
}
