//! One libvirt connection per Provider, opened lazily, reopened when it dies, and
//! used from tokio's blocking pool (the C library blocks).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use banlieue_sdk::backend::{BackendError, Connection};
use virt::connect::Connect;

use crate::domain::DomainType;
use crate::error::classify;
use crate::settings::{DomainTypeSetting, LibvirtSettings};
use crate::uri::{Endpoint, endpoint};

/// Shared state of one Provider's backend.
pub struct Client {
    /// Where and how to connect.
    pub endpoint: Endpoint,
    /// Parsed settings.
    pub settings: LibvirtSettings,
    conn: Mutex<Option<Connect>>,
    domain_type: OnceLock<DomainType>,
    /// When a graceful shutdown was asked for, per UID (for `shutdownTimeout`).
    pub shutdowns: Mutex<HashMap<String, Instant>>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The URI may name credential files, never their content; still keep it short.
        f.debug_struct("Client")
            .field("local", &self.endpoint.local)
            .finish()
    }
}

impl Client {
    /// A client for the connection; no I/O yet.
    pub fn new(connection: &Connection) -> Result<Self, BackendError> {
        // libvirt's default handler prints every error (including the "not found"
        // answers lookups expect) to stderr; errors reach the operator as values.
        virt::error::clear_error_callback();
        Ok(Self {
            endpoint: endpoint(connection)?,
            settings: LibvirtSettings::parse(&connection.settings)?,
            conn: Mutex::new(None),
            domain_type: OnceLock::new(),
            shutdowns: Mutex::new(HashMap::new()),
        })
    }

    /// The open connection, opening (or reopening) it when needed.
    pub fn conn(&self) -> Result<Connect, BackendError> {
        let mut guard = self.conn.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(conn) = guard.as_ref()
            && conn.is_alive().unwrap_or(false)
        {
            return Ok(conn.clone());
        }
        let conn = Connect::open(Some(&self.endpoint.uri)).map_err(|e| {
            let mut err = classify("connecting to libvirt", &e);
            if err.reason == "LibvirtError" {
                err.reason = "Unreachable".into();
            }
            err
        })?;
        *guard = Some(conn.clone());
        Ok(conn)
    }

    /// Forgets the connection so the next call reconnects.
    pub fn reset(&self) {
        *self.conn.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }

    /// `kvm` or `qemu`: the `domainType` setting, or detected once per connection.
    pub fn domain_type(&self, conn: &Connect) -> Result<DomainType, BackendError> {
        match self.settings.domain_type {
            DomainTypeSetting::Kvm => return Ok(DomainType::Kvm),
            DomainTypeSetting::Qemu => return Ok(DomainType::Qemu),
            DomainTypeSetting::Auto => {}
        }
        if let Some(t) = self.domain_type.get() {
            return Ok(*t);
        }
        let caps = conn
            .capabilities()
            .map_err(|e| classify("reading the host's capabilities", &e))?;
        let t = detect_domain_type(&caps, self.endpoint.local, local_kvm_is_pvm());
        Ok(*self.domain_type.get_or_init(|| t))
    }
}

/// True when this machine's `/dev/kvm` is PVM (`kvm_pvm`), which advertises KVM but
/// cannot run stock guest kernels.
fn local_kvm_is_pvm() -> bool {
    std::path::Path::new("/sys/module/kvm_pvm").exists()
}

/// `kvm` when the host's capabilities offer it for x86_64 guests (and, for a local
/// daemon, KVM is not PVM), else `qemu`.
pub fn detect_domain_type(capabilities_xml: &str, local: bool, local_pvm: bool) -> DomainType {
    let offers_kvm = roxmltree::Document::parse(capabilities_xml)
        .map(|doc| {
            doc.descendants().any(|n| {
                n.has_tag_name("domain")
                    && n.attribute("type") == Some("kvm")
                    && n.ancestors().any(|g| {
                        g.has_tag_name("guest")
                            && g.descendants().any(|a| {
                                a.has_tag_name("arch") && a.attribute("name") == Some("x86_64")
                            })
                    })
            })
        })
        .unwrap_or(false);
    if offers_kvm && !(local && local_pvm) {
        DomainType::Kvm
    } else {
        DomainType::Qemu
    }
}

/// Runs blocking libvirt calls on tokio's blocking pool; a call that reports a lost
/// connection resets it so the next call reconnects.
pub async fn blocking<T, F>(client: &Arc<Client>, f: F) -> Result<T, BackendError>
where
    T: Send + 'static,
    F: FnOnce(&Client) -> Result<T, BackendError> + Send + 'static,
{
    let client = Arc::clone(client);
    tokio::task::spawn_blocking(move || {
        let out = f(&client);
        if let Err(e) = &out
            && e.reason == "Unreachable"
        {
            client.reset();
        }
        out
    })
    .await
    .map_err(|e| BackendError::transient("Internal", format!("libvirt worker failed: {e}")))?
}

#[cfg(test)]
mod tests {
    use super::*;

    const CAPS: &str = "<capabilities><guest><os_type>hvm</os_type><arch name='x86_64'><domain type='qemu'/><domain type='kvm'/></arch></guest></capabilities>";

    #[test]
    fn kvm_only_when_offered_and_not_pvm_locally() {
        assert_eq!(detect_domain_type(CAPS, false, false), DomainType::Kvm);
        assert_eq!(detect_domain_type(CAPS, true, true), DomainType::Qemu);
        assert_eq!(detect_domain_type(CAPS, false, true), DomainType::Kvm);
        let tcg_only = CAPS.replace("<domain type='kvm'/>", "");
        assert_eq!(
            detect_domain_type(&tcg_only, false, false),
            DomainType::Qemu
        );
    }
}
