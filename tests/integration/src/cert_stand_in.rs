//! A TEST-ONLY stand-in for cert-manager: it is NOT cert-manager, implements a sliver of
//! its behaviour, and is never part of banlieue (no product code, manifest or image uses
//! it). It exists because the test rigs cannot pull images, and cert-manager cannot be
//! built here, while Cluster API's components (and `clusterctl init`) expect
//! cert-manager's API and its effects:
//!
//! - [`install_crds`] serves cert-manager's `cert-manager.io/v1` Issuer, ClusterIssuer and
//!   Certificate kinds as schemaless CRDs (with a status subresource): enough for
//!   `clusterctl init`, which only checks that the API accepts a test Issuer and
//!   Certificate, and for the components' own Issuer/Certificate objects;
//! - [`CertStandIn::start`] also runs a watch loop (a Tokio task, stopped when the
//!   [`CertStandIn`] is dropped) that
//!   - for every Certificate writes its `spec.secretName` Secret (type
//!     `kubernetes.io/tls`: `tls.crt`, `tls.key`, `ca.crt`) with a certificate for its
//!     `dnsNames`/`ipAddresses`/`commonName`, signed by the one stand-in CA whatever the
//!     `issuerRef` says, re-issues it when those names change or the Secret is deleted,
//!     and sets the Certificate's `Ready` condition to True;
//!   - injects the CA as cert-manager's cainjector does: every
//!     ValidatingWebhookConfiguration, MutatingWebhookConfiguration and
//!     CustomResourceDefinition annotated `cert-manager.io/inject-ca-from: <ns>/<name>`
//!     gets the CA's PEM as every webhook's `clientConfig.caBundle` (CRDs:
//!     `spec.conversion.webhook.clientConfig.caBundle`, when conversion is `Webhook`),
//!     existing objects and later ones, and again when something else overwrites it.
//!
//! Unlike cert-manager: issuers are not checked or used (all certificates come from the
//! stand-in CA, so injecting the CA without waiting for the named Certificate's Secret
//! gives the same bundle), no renewal, no private key options, no `inject-ca-from-secret`
//! or APIService injection, and certificates never expire (rcgen's default validity).
//!
//! The CA lives in the Secret `kube-system/banlieue-cert-stand-in-ca`, created by the first
//! stand-in on a cluster and reused by every later one (several tests of one binary, or a
//! restarted rig, share one CA instead of fighting over Secrets and bundles).

use std::future::poll_fn;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{
    Api, ApiResource, DynamicObject, Patch, PatchParams, PostParams, ResourceExt as _,
};
use kube::core::GroupVersionKind;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use serde_json::{Value, json};

/// The field manager of everything the stand-in writes.
pub const FIELD_MANAGER: &str = "banlieue-cert-stand-in";
/// cainjector's annotation: `<namespace>/<certificate name>`.
pub const INJECT_CA_FROM: &str = "cert-manager.io/inject-ca-from";
/// The namespace of the Secret holding the stand-in CA.
pub const CA_SECRET_NAMESPACE: &str = "kube-system";
/// The Secret holding the stand-in CA (`tls.crt`, `tls.key`).
pub const CA_SECRET_NAME: &str = "banlieue-cert-stand-in-ca";
/// The label cert-manager puts on the Secrets it writes (the stand-in watches them).
const SECRET_LABEL: &str = "controller.cert-manager.io/fao";
const CA_COMMON_NAME: &str = "banlieue-cert-stand-in-ca (test only, not cert-manager)";
const GROUP: &str = "cert-manager.io";

/// cert-manager's kinds the stand-in serves: kind, plural, scope.
const KINDS: [(&str, &str, &str); 3] = [
    ("Issuer", "issuers", "Namespaced"),
    ("ClusterIssuer", "clusterissuers", "Cluster"),
    ("Certificate", "certificates", "Namespaced"),
];

/// The CRDs of cert-manager's `cert-manager.io/v1` Issuer, ClusterIssuer and Certificate,
/// schemaless (any spec is accepted) with a status subresource.
pub fn crds() -> Vec<Value> {
    KINDS
        .iter()
        .map(|(kind, plural, scope)| {
            json!({
                "apiVersion": "apiextensions.k8s.io/v1",
                "kind": "CustomResourceDefinition",
                "metadata": {
                    "name": format!("{plural}.{GROUP}"),
                    "labels": {"banlieue.io/test-stand-in": "cert-manager"},
                },
                "spec": {
                    "group": GROUP,
                    "names": {
                        "kind": kind,
                        "listKind": format!("{kind}List"),
                        "plural": plural,
                        "singular": kind.to_lowercase(),
                        "categories": ["cert-manager"],
                    },
                    "scope": scope,
                    "versions": [{
                        "name": "v1", "served": true, "storage": true,
                        "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}},
                        "subresources": {"status": {}},
                    }],
                },
            })
        })
        .collect()
}

/// Installs [`crds`] (server-side apply) and waits until each is Established.
pub async fn install_crds(client: &kube::Client) -> Result<(), String> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let params = PatchParams::apply(FIELD_MANAGER).force();
    for crd in crds() {
        let name = crd["metadata"]["name"].as_str().expect("name").to_owned();
        api.patch(&name, &params, &Patch::Apply(&crd))
            .await
            .map_err(|e| format!("cert stand-in: installing CRD {name}: {e}"))?;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let live = api
                .get(&name)
                .await
                .map_err(|e| format!("cert stand-in: reading CRD {name}: {e}"))?;
            let established = live
                .status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True");
            if established {
                break;
            }
            if tokio::time::Instant::now() > deadline {
                return Err(format!("cert stand-in: CRD {name} not Established in 30s"));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    Ok(())
}

/// The stand-in CA: its PEM and what signs with it.
struct Ca {
    pem: String,
    issuer: Issuer<'static, KeyPair>,
}

/// The CA's parameters; the same every time, so a CA loaded from its Secret (key and
/// certificate) signs certificates whose issuer and authority key id match it.
fn ca_params() -> CertificateParams {
    let mut params = CertificateParams::default();
    params
        .distinguished_name
        .push(DnType::CommonName, CA_COMMON_NAME);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params
}

fn rcgen_err(e: rcgen::Error) -> String {
    format!("cert stand-in: {e}")
}

impl Ca {
    /// The CA of the cluster: from its Secret, else a new one written there.
    async fn load_or_create(client: &kube::Client) -> Result<Self, String> {
        let secrets: Api<Secret> = Api::namespaced(client.clone(), CA_SECRET_NAMESPACE);
        let read = |secret: &Secret| -> Option<(String, String)> {
            let data = secret.data.as_ref()?;
            let text = |key: &str| {
                data.get(key)
                    .and_then(|b| String::from_utf8(b.0.clone()).ok())
            };
            Some((text("tls.crt")?, text("tls.key")?))
        };
        let existing = secrets
            .get_opt(CA_SECRET_NAME)
            .await
            .map_err(|e| format!("cert stand-in: reading the CA Secret: {e}"))?;
        let (pem, key_pem) = match existing.as_ref().and_then(read) {
            Some(stored) => stored,
            None => {
                let key = KeyPair::generate().map_err(rcgen_err)?;
                let cert = ca_params().self_signed(&key).map_err(rcgen_err)?;
                let secret: Secret = serde_json::from_value(json!({
                    "metadata": {
                        "name": CA_SECRET_NAME,
                        "namespace": CA_SECRET_NAMESPACE,
                        "labels": {"banlieue.io/test-stand-in": "cert-manager"},
                    },
                    "type": "kubernetes.io/tls",
                    "stringData": {"tls.crt": cert.pem(), "tls.key": key.serialize_pem()},
                }))
                .expect("Secret");
                match secrets.create(&PostParams::default(), &secret).await {
                    Ok(_) => (cert.pem(), key.serialize_pem()),
                    // Another stand-in won the race: use its CA.
                    Err(kube::Error::Api(status)) if status.code == 409 => {
                        let theirs = secrets
                            .get(CA_SECRET_NAME)
                            .await
                            .map_err(|e| format!("cert stand-in: reading the CA Secret: {e}"))?;
                        read(&theirs).ok_or("cert stand-in: the CA Secret has no tls.crt/key")?
                    }
                    Err(e) => return Err(format!("cert stand-in: writing the CA Secret: {e}")),
                }
            }
        };
        let key = KeyPair::from_pem(&key_pem).map_err(rcgen_err)?;
        Ok(Self {
            pem,
            issuer: Issuer::new(ca_params(), key),
        })
    }

    /// A serving and client certificate for `names` (DNS names and IP addresses) and its
    /// key, as PEM.
    fn issue(
        &self,
        names: Vec<String>,
        common_name: Option<&str>,
    ) -> Result<(String, String), String> {
        let mut params = CertificateParams::new(names).map_err(rcgen_err)?;
        if let Some(cn) = common_name {
            params.distinguished_name.push(DnType::CommonName, cn);
        }
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let key = KeyPair::generate().map_err(rcgen_err)?;
        let cert = params.signed_by(&key, &self.issuer).map_err(rcgen_err)?;
        Ok((cert.pem(), key.serialize_pem()))
    }
}

/// The running stand-in (see the module docs). Dropping it stops its watch loop; what it
/// wrote stays.
pub struct CertStandIn {
    ca_pem: String,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for CertStandIn {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

impl std::fmt::Debug for CertStandIn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertStandIn").finish_non_exhaustive()
    }
}

impl CertStandIn {
    /// Installs the CRDs ([`install_crds`]), loads or creates the cluster's stand-in CA,
    /// and starts the watch loop on the calling Tokio runtime.
    pub async fn start(client: &kube::Client) -> Result<Self, String> {
        install_crds(client).await?;
        let ca = Arc::new(Ca::load_or_create(client).await?);
        let ca_pem = ca.pem.clone();
        let certificates = ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk(GROUP, "v1", "Certificate"),
            "certificates",
        );
        let mut tasks = Vec::new();
        {
            let (client, ca, resource) = (client.clone(), ca.clone(), certificates.clone());
            tasks.push(tokio::spawn(async move {
                let api = Api::<DynamicObject>::all_with(client.clone(), &resource);
                let mut events =
                    Box::pin(watcher::watcher(api, watcher::Config::default()).default_backoff());
                while let Some(event) = next_event(&mut events).await {
                    if let Event::Apply(cert) | Event::InitApply(cert) = event {
                        certificate_with_retries(&client, &resource, &ca, cert).await;
                    }
                }
            }));
        }
        {
            // A deleted Secret of a Certificate is issued again.
            let (client, ca, resource) = (client.clone(), ca.clone(), certificates.clone());
            tasks.push(tokio::spawn(async move {
                let api = Api::<Secret>::all(client.clone());
                let config = watcher::Config::default().labels(&format!("{SECRET_LABEL}=true"));
                let mut events = Box::pin(watcher::watcher(api, config).default_backoff());
                while let Some(event) = next_event(&mut events).await {
                    let Event::Delete(secret) = event else {
                        continue;
                    };
                    let namespace: Option<String> = secret.namespace();
                    let name: Option<String> = secret
                        .annotations()
                        .get("cert-manager.io/certificate-name")
                        .cloned();
                    let (Some(namespace), Some(name)) = (namespace, name) else {
                        continue;
                    };
                    let api = Api::<DynamicObject>::namespaced_with(
                        client.clone(),
                        &namespace,
                        &resource,
                    );
                    if let Ok(Some(cert)) = api.get_opt(&name).await {
                        certificate_with_retries(&client, &resource, &ca, cert).await;
                    }
                }
            }));
        }
        let bundle = base64::engine::general_purpose::STANDARD.encode(&ca_pem);
        for (resource, is_crd) in [
            (
                ApiResource::erase::<ValidatingWebhookConfiguration>(&()),
                false,
            ),
            (
                ApiResource::erase::<MutatingWebhookConfiguration>(&()),
                false,
            ),
            (ApiResource::erase::<CustomResourceDefinition>(&()), true),
        ] {
            let (client, bundle) = (client.clone(), bundle.clone());
            tasks.push(tokio::spawn(async move {
                let api = Api::<DynamicObject>::all_with(client, &resource);
                let mut events = Box::pin(
                    watcher::watcher(api.clone(), watcher::Config::default()).default_backoff(),
                );
                while let Some(event) = next_event(&mut events).await {
                    if let Event::Apply(object) | Event::InitApply(object) = event {
                        let injected = if is_crd {
                            inject_crd(&api, &object, &bundle).await
                        } else {
                            inject_webhooks(&api, &object, &bundle).await
                        };
                        if let Err(e) = injected {
                            eprintln!(
                                "cert stand-in: injecting the CA into {} {}: {e}",
                                resource.kind,
                                object.name_any()
                            );
                        }
                    }
                }
            }));
        }
        Ok(Self { ca_pem, tasks })
    }

    /// The stand-in CA's certificate (PEM): every `ca.crt` and injected `caBundle`.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }
}

/// The next item of a stream (kube's watch streams; this crate has no `futures`).
async fn next<S: WatchStreamExt + Unpin>(stream: &mut S) -> Option<S::Item> {
    poll_fn(|cx| Pin::new(&mut *stream).poll_next(cx)).await
}

/// The next event of a watch (which never ends: the watcher retries with backoff; its
/// errors are logged).
async fn next_event<K, S>(stream: &mut S) -> Option<Event<K>>
where
    S: WatchStreamExt<Item = Result<Event<K>, watcher::Error>> + Unpin,
{
    loop {
        match next(stream).await? {
            Ok(event) => return Some(event),
            Err(e) => eprintln!("cert stand-in: watch: {e}"),
        }
    }
}

/// [`certificate`], retried a few times while the Certificate still exists (e.g. its
/// namespace was just created and is not cached yet).
async fn certificate_with_retries(
    client: &kube::Client,
    resource: &ApiResource,
    ca: &Ca,
    mut cert: DynamicObject,
) {
    for attempt in 1..=5 {
        let Err(e) = certificate(client, resource, ca, &cert).await else {
            return;
        };
        let (namespace, name) = (cert.namespace().unwrap_or_default(), cert.name_any());
        eprintln!("cert stand-in: Certificate {namespace}/{name} (attempt {attempt}): {e}");
        tokio::time::sleep(Duration::from_millis(500 * attempt)).await;
        let api = Api::<DynamicObject>::namespaced_with(client.clone(), &namespace, resource);
        match api.get_opt(&name).await {
            Ok(Some(latest)) => cert = latest,
            _ => return,
        }
    }
}

fn strings(value: &Value) -> Vec<String> {
    value
        .as_array()
        .map(|items| {
            items
                .iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// Issues `cert`'s Secret unless it is up to date, then marks `cert` Ready.
async fn certificate(
    client: &kube::Client,
    resource: &ApiResource,
    ca: &Ca,
    cert: &DynamicObject,
) -> Result<(), String> {
    if cert.metadata.deletion_timestamp.is_some() {
        return Ok(());
    }
    let namespace = cert
        .namespace()
        .ok_or("a Certificate without a namespace")?;
    let name = cert.name_any();
    let spec = &cert.data["spec"];
    let secret_name = spec["secretName"]
        .as_str()
        .ok_or("no spec.secretName")?
        .to_owned();
    let dns_names = strings(&spec["dnsNames"]);
    let ip_addresses = strings(&spec["ipAddresses"]);
    let common_name = spec["commonName"].as_str();
    let issuer = &spec["issuerRef"];
    // cert-manager's annotations on the Secrets it writes.
    let annotations = json!({
        "cert-manager.io/certificate-name": name,
        "cert-manager.io/alt-names": dns_names.join(","),
        "cert-manager.io/ip-sans": ip_addresses.join(","),
        "cert-manager.io/uri-sans": "",
        "cert-manager.io/common-name": common_name.unwrap_or(""),
        "cert-manager.io/issuer-name": issuer["name"].as_str().unwrap_or(""),
        "cert-manager.io/issuer-kind": issuer["kind"].as_str().unwrap_or("Issuer"),
        "cert-manager.io/issuer-group": issuer["group"].as_str().unwrap_or(GROUP),
    });

    let secrets: Api<Secret> = Api::namespaced(client.clone(), &namespace);
    let current = secrets
        .get_opt(&secret_name)
        .await
        .map_err(|e| format!("reading Secret {secret_name}: {e}"))?;
    let up_to_date = current.as_ref().is_some_and(|secret| {
        let data = secret.data.clone().unwrap_or_default();
        let have = secret.annotations();
        secret.type_.as_deref() == Some("kubernetes.io/tls")
            && data.contains_key("tls.crt")
            && data.contains_key("tls.key")
            && data.get("ca.crt").map(|b| b.0.as_slice()) == Some(ca.pem.as_bytes())
            && annotations
                .as_object()
                .expect("object")
                .iter()
                .all(|(k, v)| have.get(k).map(String::as_str) == v.as_str())
    });
    if !up_to_date {
        let names = dns_names.iter().chain(&ip_addresses).cloned().collect();
        let (crt, key) = ca.issue(names, common_name)?;
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        let secret = json!({
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {
                "name": secret_name,
                "namespace": namespace,
                "labels": {SECRET_LABEL: "true"},
                "annotations": annotations,
            },
            "type": "kubernetes.io/tls",
            "data": {"tls.crt": b64(&crt), "tls.key": b64(&key), "ca.crt": b64(&ca.pem)},
        });
        secrets
            .patch(
                &secret_name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&secret),
            )
            .await
            .map_err(|e| format!("writing Secret {secret_name}: {e}"))?;
    }

    let generation = cert.metadata.generation;
    let ready = cert.data["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| {
            c["type"] == "Ready"
                && c["status"] == "True"
                && c["observedGeneration"].as_i64() == generation
        });
    if up_to_date && ready {
        return Ok(());
    }
    let now =
        k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now());
    let status = json!({"status": {
        "conditions": [{
            "type": "Ready",
            "status": "True",
            "reason": "Ready",
            "message": "Certificate is up to date and has not expired (banlieue's test-only cert-manager stand-in)",
            "lastTransitionTime": now,
            "observedGeneration": generation,
        }],
        "revision": 1,
    }});
    Api::<DynamicObject>::namespaced_with(client.clone(), &namespace, resource)
        .patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .map_err(|e| format!("setting Ready: {e}"))?;
    Ok(())
}

fn wants_injection(object: &DynamicObject) -> bool {
    object.metadata.deletion_timestamp.is_none()
        && object
            .annotations()
            .get(INJECT_CA_FROM)
            .is_some_and(|v| v.contains('/'))
}

fn patch_params() -> PatchParams {
    PatchParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..PatchParams::default()
    }
}

/// Sets `bundle` as every webhook's `clientConfig.caBundle` (a strategic merge patch:
/// `webhooks` merge by name).
async fn inject_webhooks(
    api: &Api<DynamicObject>,
    object: &DynamicObject,
    bundle: &str,
) -> Result<(), kube::Error> {
    if !wants_injection(object) {
        return Ok(());
    }
    let stale: Vec<Value> = object.data["webhooks"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|w| w["clientConfig"]["caBundle"].as_str() != Some(bundle))
        .filter_map(|w| w["name"].as_str())
        .map(|name| json!({"name": name, "clientConfig": {"caBundle": bundle}}))
        .collect();
    if stale.is_empty() {
        return Ok(());
    }
    let patch = json!({"webhooks": stale});
    api.patch(
        &object.name_any(),
        &patch_params(),
        &Patch::Strategic(&patch),
    )
    .await
    .map(drop)
}

/// Sets `bundle` as a CRD's conversion webhook's `clientConfig.caBundle`.
async fn inject_crd(
    api: &Api<DynamicObject>,
    object: &DynamicObject,
    bundle: &str,
) -> Result<(), kube::Error> {
    let conversion = &object.data["spec"]["conversion"];
    if !wants_injection(object)
        || conversion["strategy"] != "Webhook"
        || !conversion["webhook"]["clientConfig"].is_object()
        || conversion["webhook"]["clientConfig"]["caBundle"].as_str() == Some(bundle)
    {
        return Ok(());
    }
    let patch =
        json!({"spec": {"conversion": {"webhook": {"clientConfig": {"caBundle": bundle}}}}});
    api.patch(&object.name_any(), &patch_params(), &Patch::Merge(&patch))
        .await
        .map(drop)
}
