//! One connected backend per Provider, reused across reconciles and replaced when the
//! Provider's connection, credentials or CA bundle change; and the resolution of a
//! Provider's Secret and CA bundle into a [`Connection`].
//!
//! The credentials resolved for a Provider are registered with the process-wide
//! [`scrub::global`] scrubber (replaced when they change, dropped when the Provider is
//! forgotten), and every message the backends hand out ([`BackendError`]s of every
//! call, disk transfers included, and [`Unreachable`]s) is scrubbed here, so no
//! controller can put a credential into a condition.

use std::collections::{BTreeMap, HashMap};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::Api;
use kube::{Client, ResourceExt};

use super::Metrics;
use crate::api::Provider;
use crate::api::common::{DEFAULT_CA_BUNDLE_KEY, ProviderClass};
use crate::backend::{
    Backend, BackendError, BackendRegistry, Connection, Deletion, DiskFormat, DiskTransfer,
    ImageLookup, ImageSourceSet, Inventory, MachineIdentity, MachineObservation, MachineRequest,
    SecretValue, StagedDisk,
};
use crate::scrub;
use crate::status::provider::Unreachable;

/// Credentials Secret keys whose values are not secret (user names, token IDs,
/// certificates, known hosts): every other key's value is scrubbed.
const PUBLIC_KEYS: &[&str] = &[
    "username",
    "user",
    "tokenID",
    "tls.crt",
    "ca.crt",
    "knownHosts",
];

/// Reason of a backend error whose reason carried a credential.
const REDACTED_REASON: &str = "Redacted";

/// Connected backends by Provider (`namespace/name`), with the fingerprint of the
/// connection they were made for.
///
/// The Provider controller [`refresh`](Self::refresh)es an entry on every Provider
/// reconcile: it reads the credentials Secret and CA bundle, and it runs whenever the
/// watched Secret or ConfigMap changes. Every other controller takes the entry as it
/// is ([`for_provider`](Self::for_provider)) while it was made for the same Provider
/// object (UID and generation), so a machine reconcile reads no Secret.
pub(crate) struct BackendCache {
    registry: BackendRegistry,
    metrics: Arc<Metrics>,
    entries: Mutex<HashMap<String, Connected>>,
}

/// A connected backend, the fingerprint of the connection it was made for, and the
/// Provider object (UID, generation) that connection was resolved from.
#[derive(Clone)]
struct Connected {
    fingerprint: u64,
    provider: (String, Option<i64>),
    backend: Arc<dyn Backend>,
}

impl BackendCache {
    pub fn new(registry: BackendRegistry, metrics: Arc<Metrics>) -> Self {
        Self {
            registry,
            metrics,
            entries: Mutex::new(HashMap::new()),
        }
    }

    /// The backend for `provider`: the one connected for this very Provider object,
    /// or (first use, or the Provider changed since) a fresh [`refresh`](Self::refresh).
    pub async fn for_provider(
        &self,
        client: &Client,
        provider: &Provider,
    ) -> Result<Instrumented, Unreachable> {
        let cached = {
            let entries = self.entries.lock().expect("backend cache");
            entries
                .get(&key_of(provider))
                .filter(|entry| entry.provider == version_of(provider))
                .map(|entry| entry.backend.clone())
        };
        match cached {
            Some(backend) => Ok(self.instrumented(provider.spec.class, backend)),
            None => self.refresh(client, provider).await,
        }
    }

    /// Reads `provider`'s credentials Secret and CA bundle and returns its backend,
    /// connecting (or reconnecting after a change) as needed. A Provider whose
    /// connection no longer resolves loses its entry, so that no controller keeps
    /// using credentials that are gone.
    pub async fn refresh(
        &self,
        client: &Client,
        provider: &Provider,
    ) -> Result<Instrumented, Unreachable> {
        let key = key_of(provider);
        let connection = match resolve(client, provider).await {
            Ok(connection) => connection,
            Err(unreachable) => {
                self.entries.lock().expect("backend cache").remove(&key);
                return Err(scrub_unreachable(unreachable));
            }
        };
        register(&key, &connection);
        let fingerprint = fingerprint(&connection);
        let version = version_of(provider);
        let cached = {
            let mut entries = self.entries.lock().expect("backend cache");
            entries
                .get_mut(&key)
                .filter(|entry| entry.fingerprint == fingerprint)
                .map(|entry| {
                    // Same connection, newer Provider object (e.g. a label changed).
                    entry.provider = version.clone();
                    entry.backend.clone()
                })
        };
        let backend = match cached {
            Some(backend) => backend,
            None => {
                warn_unscrubbable(&key, &connection);
                let factory = self
                    .registry
                    .get(connection.class)
                    .ok_or_else(|| not_compiled_in(&self.registry, connection.class))?;
                let backend = factory.connect(&connection).map_err(|e| {
                    let e = scrub_error(e);
                    Unreachable {
                        reason: e.reason,
                        message: e.message,
                    }
                })?;
                self.entries.lock().expect("backend cache").insert(
                    key,
                    Connected {
                        fingerprint,
                        provider: version,
                        backend: backend.clone(),
                    },
                );
                backend
            }
        };
        Ok(self.instrumented(connection.class, backend))
    }

    fn instrumented(&self, class: ProviderClass, backend: Arc<dyn Backend>) -> Instrumented {
        Instrumented {
            class,
            transfer: backend
                .disk_transfer()
                .is_some()
                .then(|| ScrubbedTransfer(backend.clone())),
            backend,
            metrics: self.metrics.clone(),
        }
    }

    /// Drops the backend of a deleted Provider, and its credentials from the scrubber.
    pub fn forget(&self, namespace: &str, name: &str) {
        let key = key(namespace, name);
        self.entries.lock().expect("backend cache").remove(&key);
        scrub::global().forget(&key);
    }
}

/// The credentials of `connection` that are secret, by key.
fn secrets(connection: &Connection) -> impl Iterator<Item = (&str, &str)> {
    connection
        .credentials
        .iter()
        .filter(|(key, _)| !PUBLIC_KEYS.contains(&key.as_str()))
        .map(|(key, value)| (key.as_str(), value.expose()))
}

/// Registers the secret values of `connection`'s credentials as `source`'s.
fn register(source: &str, connection: &Connection) {
    scrub::global().register(source, secrets(connection).map(|(_, value)| value));
}

/// Warns about the secret values of `connection` too short to be scrubbed (once per
/// connection made).
fn warn_unscrubbable(source: &str, connection: &Connection) {
    for (key, value) in secrets(connection) {
        if !value.trim().is_empty() && !scrub::is_scrubbable(value) {
            tracing::warn!(
                provider = source,
                key,
                "a credential shorter than {} characters cannot be redacted from messages; use a longer one",
                scrub::MIN_SECRET_LEN
            );
        }
    }
}

/// `reason` unless it carries a credential.
fn scrub_reason(reason: String) -> String {
    let scrubbed = scrub::global().scrub_owned(reason.clone());
    if scrubbed == reason {
        reason
    } else {
        REDACTED_REASON.to_owned()
    }
}

/// `error` with its reason and message scrubbed.
fn scrub_error(mut error: BackendError) -> BackendError {
    error.reason = scrub_reason(error.reason);
    error.message = scrub::global().scrub_owned(error.message);
    error
}

fn scrub_unreachable(unreachable: Unreachable) -> Unreachable {
    Unreachable {
        reason: scrub_reason(unreachable.reason),
        message: scrub::global().scrub_owned(unreachable.message),
    }
}

/// The cache key (and scrubber source) of a Provider: `namespace/name`.
fn key(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
}

fn key_of(provider: &Provider) -> String {
    key(
        &provider.namespace().unwrap_or_default(),
        &provider.name_any(),
    )
}

/// Which Provider object a connection was resolved from: a recreated Provider (new
/// UID) or a changed spec (new generation) is resolved again.
fn version_of(provider: &Provider) -> (String, Option<i64>) {
    (
        provider.uid().unwrap_or_default(),
        provider.metadata.generation,
    )
}

fn fingerprint(connection: &Connection) -> u64 {
    let mut hasher = DefaultHasher::new();
    connection.class.hash(&mut hasher);
    connection.endpoint.hash(&mut hasher);
    for (k, v) in &connection.credentials {
        k.hash(&mut hasher);
        v.expose().hash(&mut hasher);
    }
    connection.ca_bundle.hash(&mut hasher);
    connection.insecure_skip_tls_verify.hash(&mut hasher);
    connection.settings.hash(&mut hasher);
    hasher.finish()
}

/// `BackendNotCompiledIn`, naming the classes this operator serves and the nearest
/// one, so `vsphre` is told it meant `vsphere`.
fn not_compiled_in(registry: &BackendRegistry, class: ProviderClass) -> Unreachable {
    let served: Vec<&str> = registry.classes().map(ProviderClass::as_str).collect();
    let hint = crate::backend::settings::closest(class.as_str(), &served)
        .map(|c| format!(" (did you mean {c}?)"))
        .unwrap_or_default();
    Unreachable {
        reason: "BackendNotCompiledIn".into(),
        message: format!(
            "no backend serves class {class} in this operator{hint}: it serves {}; banlieue builds register theirs by feature, an embedding operator registers its own in its BackendRegistry",
            if served.is_empty() {
                "none".to_owned()
            } else {
                served.join(", ")
            }
        ),
    }
}

/// Reads the Provider's credentials Secret and CA bundle.
pub(crate) async fn resolve(
    client: &Client,
    provider: &Provider,
) -> Result<Connection, Unreachable> {
    let namespace = provider.namespace().unwrap_or_default();
    let spec = &provider.spec;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &namespace);
    let credentials = match &spec.connection.credentials_ref {
        None => BTreeMap::new(),
        Some(reference) => {
            let secret = get(
                &secrets,
                &reference.name,
                "CredentialsNotFound",
                "credentials Secret",
                &namespace,
            )
            .await?;
            let (values, not_text) = secret_strings(&secret);
            if !not_text.is_empty() {
                return Err(not_text_error(
                    "CredentialsInvalid",
                    "credentials Secret",
                    &reference.name,
                    &not_text,
                ));
            }
            values
        }
    };
    let ca_bundle = match &spec.connection.ca_bundle {
        None => None,
        Some(source) => Some(if let Some(pem) = &source.inline {
            pem.clone()
        } else if let Some(selector) = &source.config_map_ref {
            let maps: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace);
            let map = get(
                &maps,
                &selector.name,
                "CABundleNotFound",
                "CA bundle ConfigMap",
                &namespace,
            )
            .await?;
            let key = selector.key_or(DEFAULT_CA_BUNDLE_KEY);
            map.data
                .and_then(|d| d.get(key).cloned())
                .ok_or_else(|| missing_key(&selector.name, key))?
        } else if let Some(selector) = &source.secret_ref {
            let secret = get(
                &secrets,
                &selector.name,
                "CABundleNotFound",
                "CA bundle Secret",
                &namespace,
            )
            .await?;
            let key = selector.key_or(DEFAULT_CA_BUNDLE_KEY);
            let (values, not_text) = secret_strings(&secret);
            if not_text.iter().any(|k| k == key) {
                return Err(not_text_error(
                    "CABundleInvalid",
                    "CA bundle Secret",
                    &selector.name,
                    &not_text,
                ));
            }
            values
                .get(key)
                .map(|v| v.expose().to_owned())
                .ok_or_else(|| missing_key(&selector.name, key))?
        } else {
            return Err(Unreachable {
                reason: "CABundleNotFound".into(),
                message: "caBundle names no source".into(),
            });
        }),
    };
    Ok(Connection {
        class: spec.class,
        endpoint: spec.connection.endpoint.clone(),
        credentials,
        ca_bundle,
        insecure_skip_tls_verify: spec.connection.insecure_skip_tls_verify,
        settings: spec.settings.clone(),
    })
}

async fn get<K>(
    api: &Api<K>,
    name: &str,
    reason: &str,
    what: &str,
    namespace: &str,
) -> Result<K, Unreachable>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api.get_opt(name).await {
        Ok(Some(object)) => Ok(object),
        Ok(None) => Err(Unreachable {
            reason: reason.into(),
            message: format!("{what} {name} not found in namespace {namespace}"),
        }),
        Err(error) => Err(Unreachable {
            reason: "APIError".into(),
            message: format!("reading {what} {name}: {error}"),
        }),
    }
}

fn missing_key(name: &str, key: &str) -> Unreachable {
    Unreachable {
        reason: "CABundleNotFound".into(),
        message: format!("{name} has no key {key}"),
    }
}

/// A Secret's values as text, and the keys whose values are not UTF-8 (reported as
/// such: dropping them made a present key read as "missing").
fn secret_strings(secret: &Secret) -> (BTreeMap<String, SecretValue>, Vec<String>) {
    let mut values = BTreeMap::new();
    let mut not_text = Vec::new();
    for (k, v) in secret.data.iter().flatten() {
        match String::from_utf8(v.0.clone()) {
            Ok(text) => {
                values.insert(k.clone(), SecretValue::new(text));
            }
            Err(_) => not_text.push(k.clone()),
        }
    }
    for (k, v) in secret.string_data.iter().flatten() {
        not_text.retain(|n| n != k);
        values.insert(k.clone(), SecretValue::new(v.clone()));
    }
    (values, not_text)
}

/// `reason`: the Secret's keys in `keys` hold bytes that are not UTF-8 text.
fn not_text_error(reason: &str, what: &str, name: &str, keys: &[String]) -> Unreachable {
    Unreachable {
        reason: reason.into(),
        message: format!(
            "{what} {name}: the value of {} is not UTF-8 text; banlieue reads these values as text (write them with stringData, or base64-encode the text itself)",
            keys.join(", ")
        ),
    }
}

/// A backend whose calls are timed into the metrics, and whose errors are scrubbed.
#[derive(Clone)]
pub(crate) struct Instrumented {
    pub class: ProviderClass,
    backend: Arc<dyn Backend>,
    transfer: Option<ScrubbedTransfer>,
    metrics: Arc<Metrics>,
}

impl Instrumented {
    fn record<T>(&self, operation: &str, started: Instant, result: &Result<T, BackendError>) {
        let outcome = match result {
            Ok(_) => "ok",
            Err(e) if e.is_transient() => "transient",
            Err(_) => "terminal",
        };
        self.metrics
            .backend_call(self.class.as_str(), operation, outcome, started.elapsed());
    }

    /// Records the call and scrubs its error.
    fn finish<T>(
        &self,
        operation: &str,
        started: Instant,
        result: Result<T, BackendError>,
    ) -> Result<T, BackendError> {
        self.record(operation, started, &result);
        result.map_err(scrub_error)
    }

    pub async fn check(&self) -> Result<Inventory, BackendError> {
        let started = Instant::now();
        let result = self.backend.check().await;
        self.finish("check", started, result)
    }

    pub async fn find_image(&self, sources: &ImageSourceSet) -> Result<ImageLookup, BackendError> {
        let started = Instant::now();
        let result = self.backend.find_image(sources).await;
        // A missing image's message is the backend's words too.
        self.finish("find_image", started, result)
            .map(|lookup| match lookup {
                ImageLookup::Missing { message } => ImageLookup::Missing {
                    message: scrub::global().scrub_owned(message),
                },
                available => available,
            })
    }

    pub async fn ensure(
        &self,
        request: &MachineRequest,
    ) -> Result<MachineObservation, BackendError> {
        let started = Instant::now();
        let result = self.backend.ensure(request).await;
        self.finish("ensure", started, result)
    }

    /// Applies the named fields of a made machine's spec (see
    /// [`Backend::apply_changes`](crate::backend::Backend::apply_changes)).
    pub async fn apply_changes(
        &self,
        request: &MachineRequest,
        fields: &[crate::backend::MachineField],
    ) -> Result<MachineObservation, BackendError> {
        let started = Instant::now();
        let result = self.backend.apply_changes(request, fields).await;
        self.finish("apply_changes", started, result)
    }

    /// Reads a machine's state without changing it (`None`: this backend has no VM
    /// for it): where a VM is, when nothing recorded says so.
    pub async fn observe(
        &self,
        identity: &MachineIdentity,
    ) -> Result<Option<MachineObservation>, BackendError> {
        let started = Instant::now();
        let result = self.backend.observe(identity).await;
        self.finish("observe", started, result)
    }

    /// The backend machines made for `identity`'s namespace and name as a `kind`.
    pub async fn made_for(
        &self,
        kind: &str,
        identity: &MachineIdentity,
    ) -> Result<Vec<crate::backend::MadeFor>, BackendError> {
        let started = Instant::now();
        let result = self.backend.made_for(kind, identity).await;
        self.finish("made_for", started, result)
    }

    /// What the backend declares it can do.
    pub fn capabilities(&self) -> crate::backend::BackendCapabilities {
        self.backend.capabilities()
    }

    /// The backend's cap on concurrent creates when the Provider sets none.
    pub fn default_max_concurrent_creates(&self) -> Option<usize> {
        self.backend.default_max_concurrent_creates()
    }

    /// The backend's disk export and import, when it has them (`CopyDisk`), with
    /// their errors scrubbed.
    pub fn disk_transfer(&self) -> Option<&dyn DiskTransfer> {
        self.transfer.as_ref().map(|t| t as &dyn DiskTransfer)
    }

    pub async fn delete(&self, identity: &MachineIdentity) -> Result<Deletion, BackendError> {
        let started = Instant::now();
        let result = self.backend.delete(identity).await;
        self.finish("delete", started, result)
    }
}

/// A backend's [`DiskTransfer`], its errors scrubbed. Made only for a backend that has
/// one.
#[derive(Clone)]
struct ScrubbedTransfer(Arc<dyn Backend>);

impl ScrubbedTransfer {
    fn inner(&self) -> &dyn DiskTransfer {
        self.0
            .disk_transfer()
            .expect("made only for a backend with a disk transfer")
    }
}

#[async_trait::async_trait]
impl DiskTransfer for ScrubbedTransfer {
    fn import_format(&self) -> DiskFormat {
        self.inner().import_format()
    }

    async fn export_size(&self, identity: &MachineIdentity) -> Result<Option<u64>, BackendError> {
        self.inner()
            .export_size(identity)
            .await
            .map_err(scrub_error)
    }

    async fn export(
        &self,
        identity: &MachineIdentity,
        staging: &std::path::Path,
    ) -> Result<Vec<StagedDisk>, BackendError> {
        self.inner()
            .export(identity, staging)
            .await
            .map_err(scrub_error)
    }

    async fn import(
        &self,
        request: &MachineRequest,
        disks: &[StagedDisk],
    ) -> Result<(), BackendError> {
        self.inner()
            .import(request, disks)
            .await
            .map_err(scrub_error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_that_is_not_text_is_named_not_reported_missing() {
        use k8s_openapi::ByteString;
        let secret = Secret {
            data: Some(BTreeMap::from([
                ("username".to_owned(), ByteString(b"root@pam".to_vec())),
                ("password".to_owned(), ByteString(vec![0xff, 0xfe, 0x00])),
            ])),
            ..Default::default()
        };
        let (values, not_text) = secret_strings(&secret);
        assert_eq!(values["username"].expose(), "root@pam");
        assert_eq!(not_text, ["password"]);
        let error = not_text_error("CredentialsInvalid", "credentials Secret", "pve", &not_text);
        assert_eq!(error.reason, "CredentialsInvalid");
        assert!(
            error
                .message
                .starts_with("credentials Secret pve: the value of password is not UTF-8 text"),
            "{}",
            error.message
        );
        assert!(
            !error.message.contains('\u{fffd}'),
            "the bytes are never echoed"
        );
    }

    #[test]
    fn a_class_no_backend_serves_is_told_what_is_served_and_the_nearest() {
        use crate::backend::BackendFactory;
        struct Nothing;
        impl BackendFactory for Nothing {
            fn connect(&self, _: &Connection) -> Result<Arc<dyn Backend>, BackendError> {
                Err(BackendError::terminal("Nothing", "nothing"))
            }
        }
        let mut registry = BackendRegistry::default();
        registry.register(ProviderClass::Vsphere, Arc::new(Nothing));
        registry.register(ProviderClass::Sim, Arc::new(Nothing));
        let typo = not_compiled_in(&registry, ProviderClass::new("vsphre").unwrap());
        assert_eq!(typo.reason, "BackendNotCompiledIn");
        assert!(
            typo.message.starts_with(
                "no backend serves class vsphre in this operator (did you mean vsphere?): it serves vsphere, sim;"
            ),
            "{}",
            typo.message
        );
        let other = not_compiled_in(&registry, ProviderClass::Proxmox);
        assert!(
            other.message.starts_with(
                "no backend serves class proxmox in this operator: it serves vsphere, sim;"
            ),
            "{}",
            other.message
        );
    }

    #[test]
    fn secret_keys_are_scrubbed_from_errors_and_public_ones_kept() {
        let connection = Connection {
            class: ProviderClass::Proxmox,
            endpoint: "https://pve.example:8006".into(),
            credentials: [
                ("username", "root@pam"),
                ("password", "backends-unit-pa55"),
                ("tokenID", "root@pam!ci"),
                ("tokenSecret", "backends-unit-t0ken"),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), SecretValue::new(v)))
            .collect(),
            ca_bundle: None,
            insecure_skip_tls_verify: false,
            settings: BTreeMap::new(),
        };
        register("test/backends-unit", &connection);
        let error = scrub_error(BackendError::terminal(
            "Bad-backends-unit-t0ken",
            "root@pam with backends-unit-pa55; PVEAPIToken=root@pam!ci=backends-unit-t0ken",
        ));
        scrub::global().forget("test/backends-unit");
        assert_eq!(error.reason, REDACTED_REASON);
        assert_eq!(
            error.message,
            "root@pam with [redacted]; PVEAPIToken=root@pam!ci=[redacted]"
        );
        let after = scrub_error(BackendError::terminal("X", "backends-unit-pa55"));
        assert_eq!(after.message, "backends-unit-pa55", "forgotten");
    }
}
