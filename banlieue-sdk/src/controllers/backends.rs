//! One connected backend per Provider, reused across reconciles and replaced when the
//! Provider's connection, credentials or CA bundle change; and the resolution of a
//! Provider's Secret and CA bundle into a [`Connection`].

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
    Backend, BackendError, BackendRegistry, Connection, Deletion, ImageLookup, ImageSourceSet,
    Inventory, MachineIdentity, MachineObservation, MachineRequest, SecretValue,
};
use crate::status::provider::Unreachable;

/// Connected backends by Provider (`namespace/name`), with the fingerprint of the
/// connection they were made for.
pub(crate) struct BackendCache {
    registry: BackendRegistry,
    metrics: Arc<Metrics>,
    entries: Mutex<HashMap<String, Connected>>,
}

/// A connected backend and the fingerprint of the connection it was made for.
type Connected = (u64, Arc<dyn Backend>);

impl BackendCache {
    pub fn new(registry: BackendRegistry, metrics: Arc<Metrics>) -> Self {
        Self {
            registry,
            metrics,
            entries: Mutex::new(HashMap::new()),
        }
    }

    /// The backend for `provider`, connecting (or reconnecting after a change) as needed.
    pub async fn for_provider(
        &self,
        client: &Client,
        provider: &Provider,
    ) -> Result<Instrumented, Unreachable> {
        let connection = resolve(client, provider).await?;
        let key = format!(
            "{}/{}",
            provider.namespace().unwrap_or_default(),
            provider.name_any()
        );
        let fingerprint = fingerprint(&connection);
        let cached = {
            let entries = self.entries.lock().expect("backend cache");
            entries
                .get(&key)
                .filter(|(f, _)| *f == fingerprint)
                .map(|(_, b)| b.clone())
        };
        let backend = match cached {
            Some(backend) => backend,
            None => {
                let factory = self
                    .registry
                    .get(connection.class)
                    .ok_or_else(|| Unreachable {
                        reason: "BackendNotCompiledIn".into(),
                        message: format!("this banlieue build has no {} backend", connection.class),
                    })?;
                let backend = factory.connect(&connection).map_err(|e| Unreachable {
                    reason: e.reason.clone(),
                    message: e.message.clone(),
                })?;
                self.entries
                    .lock()
                    .expect("backend cache")
                    .insert(key, (fingerprint, backend.clone()));
                backend
            }
        };
        Ok(Instrumented {
            class: connection.class,
            backend,
            metrics: self.metrics.clone(),
        })
    }

    /// Drops the backend of a deleted Provider.
    pub fn forget(&self, namespace: &str, name: &str) {
        self.entries
            .lock()
            .expect("backend cache")
            .remove(&format!("{namespace}/{name}"));
    }
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
            secret_strings(&secret)
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
            secret_strings(&secret)
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
            message: format!("{what} {name:?} not found in namespace {namespace:?}"),
        }),
        Err(error) => Err(Unreachable {
            reason: "APIError".into(),
            message: format!("reading {what} {name:?}: {error}"),
        }),
    }
}

fn missing_key(name: &str, key: &str) -> Unreachable {
    Unreachable {
        reason: "CABundleNotFound".into(),
        message: format!("{name:?} has no key {key:?}"),
    }
}

fn secret_strings(secret: &Secret) -> BTreeMap<String, SecretValue> {
    let mut values: BTreeMap<String, SecretValue> = secret
        .data
        .iter()
        .flatten()
        .filter_map(|(k, v)| {
            Some((
                k.clone(),
                SecretValue::new(String::from_utf8(v.0.clone()).ok()?),
            ))
        })
        .collect();
    for (k, v) in secret.string_data.iter().flatten() {
        values.insert(k.clone(), SecretValue::new(v.clone()));
    }
    values
}

/// A backend whose calls are timed into the metrics.
#[derive(Clone)]
pub(crate) struct Instrumented {
    pub class: ProviderClass,
    backend: Arc<dyn Backend>,
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

    pub async fn check(&self) -> Result<Inventory, BackendError> {
        let started = Instant::now();
        let result = self.backend.check().await;
        self.record("check", started, &result);
        result
    }

    pub async fn find_image(&self, sources: &ImageSourceSet) -> Result<ImageLookup, BackendError> {
        let started = Instant::now();
        let result = self.backend.find_image(sources).await;
        self.record("find_image", started, &result);
        result
    }

    pub async fn ensure(
        &self,
        request: &MachineRequest,
    ) -> Result<MachineObservation, BackendError> {
        let started = Instant::now();
        let result = self.backend.ensure(request).await;
        self.record("ensure", started, &result);
        result
    }

    /// The backend's disk export and import, when it has them (`CopyDisk`).
    pub fn disk_transfer(&self) -> Option<&dyn crate::backend::DiskTransfer> {
        self.backend.disk_transfer()
    }

    pub async fn delete(&self, identity: &MachineIdentity) -> Result<Deletion, BackendError> {
        let started = Instant::now();
        let result = self.backend.delete(identity).await;
        self.record("delete", started, &result);
        result
    }
}
