//! The libvirt connection URI, with credentials from the Provider's Secret written to
//! private files the URI points at (libvirt's transports read keys from files).
//!
//! - `qemu:///system` (optionally `?socket=/path`): the local daemon; no credentials.
//! - `qemu+ssh://user@host/system`: the Secret's `sshPrivateKey` becomes `keyfile=`;
//!   `knownHosts` becomes `known_hosts=` (libssh transports);
//!   `insecureSkipTLSVerify` adds `no_verify=1` (host key not checked).
//! - `qemu+tls://host/system`: the Secret's `tls.crt`/`tls.key` and the Provider's CA
//!   bundle become `clientcert.pem`/`clientkey.pem`/`cacert.pem` in a `pkipath=`
//!   directory; `insecureSkipTLSVerify` adds `no_verify=1`.

use std::io::Write;
use std::path::{Path, PathBuf};

use banlieue_sdk::backend::{BackendError, Connection};

/// A URI and the private directory holding the files it references (removed on drop).
#[derive(Debug)]
pub struct Endpoint {
    /// The URI to open.
    pub uri: String,
    /// True when the URI has no host: the daemon runs on this machine.
    pub local: bool,
    dir: Option<PathBuf>,
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        if let Some(dir) = &self.dir {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

fn private_dir() -> Result<PathBuf, BackendError> {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let dir = std::env::temp_dir().join(format!(
        "banlieue-libvirt-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    let mut builder = std::fs::DirBuilder::new();
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder.create(&dir).map_err(|e| {
        BackendError::transient(
            "CredentialFiles",
            format!("creating {}: {e}", dir.display()),
        )
    })?;
    Ok(dir)
}

fn write_private(path: &Path, content: &str) -> Result<(), BackendError> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    options
        .open(path)
        .and_then(|mut f| f.write_all(content.as_bytes()))
        .map_err(|e| {
            BackendError::transient(
                "CredentialFiles",
                format!("writing {}: {e}", path.display()),
            )
        })
}

/// Builds the endpoint for a Provider's connection.
pub fn endpoint(connection: &Connection) -> Result<Endpoint, BackendError> {
    let uri = connection.endpoint.trim();
    let Some((scheme, rest)) = uri.split_once("://") else {
        return Err(BackendError::terminal(
            "InvalidEndpoint",
            format!(
                "{uri:?} is not a libvirt URI such as qemu:///system or qemu+ssh://host/system"
            ),
        ));
    };
    let (driver, transport) = scheme.split_once('+').unwrap_or((scheme, ""));
    if driver != "qemu" {
        return Err(BackendError::terminal(
            "InvalidEndpoint",
            format!(
                "{uri:?}: only the qemu driver is supported (qemu:///system, qemu+ssh://, qemu+tls://)"
            ),
        ));
    }
    // Built first so that an error below drops it, and with it any files written.
    let mut ep = Endpoint {
        uri: uri.to_string(),
        local: rest.starts_with('/'),
        dir: None,
    };
    let mut params: Vec<String> = Vec::new();
    let secret = |key: &str| {
        connection
            .credentials
            .get(key)
            .map(|v| v.expose().to_string())
    };
    match transport {
        "ssh" | "libssh" | "libssh2" => {
            if let Some(key) = secret("sshPrivateKey") {
                let d = private(&mut ep)?;
                write_private(&d.join("id"), &key)?;
                params.push(format!("keyfile={}", d.join("id").display()));
            }
            if let Some(hosts) = secret("knownHosts") {
                let d = private(&mut ep)?;
                write_private(&d.join("known_hosts"), &hosts)?;
                params.push(format!("known_hosts={}", d.join("known_hosts").display()));
            }
        }
        "tls" => {
            let d = private(&mut ep)?;
            if let Some(ca) = &connection.ca_bundle {
                write_private(&d.join("cacert.pem"), ca)?;
            }
            match (secret("tls.crt"), secret("tls.key")) {
                (Some(crt), Some(key)) => {
                    write_private(&d.join("clientcert.pem"), &crt)?;
                    write_private(&d.join("clientkey.pem"), &key)?;
                }
                (None, None) => {}
                _ => {
                    return Err(BackendError::terminal(
                        "MissingCredential",
                        "qemu+tls needs both tls.crt and tls.key in the credentials Secret",
                    ));
                }
            }
            params.push(format!("pkipath={}", d.display()));
        }
        "" | "unix" => {}
        other => {
            return Err(BackendError::terminal(
                "InvalidEndpoint",
                format!("transport {other:?} is not supported (use ssh, libssh, tls or unix)"),
            ));
        }
    }
    if connection.insecure_skip_tls_verify && !transport.is_empty() && transport != "unix" {
        params.push("no_verify=1".into());
    }
    for p in params {
        ep.uri.push(if ep.uri.contains('?') { '&' } else { '?' });
        ep.uri.push_str(&p);
    }
    Ok(ep)
}

/// The endpoint's private directory, created on first use.
fn private(ep: &mut Endpoint) -> Result<PathBuf, BackendError> {
    if ep.dir.is_none() {
        ep.dir = Some(private_dir()?);
    }
    Ok(ep.dir.clone().unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use banlieue_sdk::api::common::ProviderClass;
    use banlieue_sdk::backend::SecretValue;

    use super::*;

    fn connection(endpoint: &str, creds: &[(&str, &str)]) -> Connection {
        Connection {
            class: ProviderClass::Libvirt,
            endpoint: endpoint.into(),
            credentials: creds
                .iter()
                .map(|(k, v)| (k.to_string(), SecretValue::new(*v)))
                .collect::<BTreeMap<_, _>>(),
            ca_bundle: None,
            insecure_skip_tls_verify: false,
            settings: BTreeMap::new(),
        }
    }

    /// Tests that create private directories run one at a time, so counting them is exact.
    static DIRS: std::sync::Mutex<()> = std::sync::Mutex::new(());

    fn leftover_dirs() -> usize {
        let prefix = format!("banlieue-libvirt-{}-", std::process::id());
        std::fs::read_dir(std::env::temp_dir())
            .map(|d| {
                d.filter_map(Result::ok)
                    .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
                    .count()
            })
            .unwrap_or(0)
    }

    #[test]
    fn local_socket_uris_pass_through() {
        let e = endpoint(&connection(
            "qemu:///system?socket=/tmp/x/libvirt-sock",
            &[],
        ))
        .unwrap();
        assert_eq!(e.uri, "qemu:///system?socket=/tmp/x/libvirt-sock");
        assert!(e.local);
    }

    #[test]
    fn ssh_keys_go_to_a_private_file() {
        let _one_at_a_time = DIRS.lock().unwrap_or_else(|e| e.into_inner());
        let e = endpoint(&connection(
            "qemu+ssh://root@h1/system",
            &[("sshPrivateKey", "KEY")],
        ))
        .unwrap();
        assert!(!e.local);
        let path = e.uri.split("keyfile=").nth(1).unwrap().to_string();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "KEY");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        drop(e);
        assert!(!Path::new(&path).exists(), "removed with the endpoint");
    }

    #[test]
    fn tls_needs_both_halves_and_other_drivers_are_refused() {
        let _one_at_a_time = DIRS.lock().unwrap_or_else(|e| e.into_inner());
        let before = leftover_dirs();
        let err = endpoint(&connection("qemu+tls://h1/system", &[("tls.crt", "C")])).unwrap_err();
        assert_eq!(
            leftover_dirs(),
            before,
            "a refused endpoint leaves no files behind"
        );
        assert_eq!(err.reason, "MissingCredential");
        let ok = endpoint(&connection("qemu+tls://h1/system", &[])).unwrap();
        assert!(ok.uri.contains("?pkipath="));
        assert_eq!(
            endpoint(&connection("xen:///", &[])).unwrap_err().reason,
            "InvalidEndpoint"
        );
        assert_eq!(
            endpoint(&connection("nonsense", &[])).unwrap_err().reason,
            "InvalidEndpoint"
        );
    }
}
