//! The test-only cert-manager stand-in (`banlieue_integration_tests::cert_stand_in`;
//! NOT cert-manager) against a real apiserver, fed the generated release components of
//! CAPI core and the kubeadm bootstrap and control-plane providers (`<capi
//! rig>/repository/<provider>/<v>/*-components.yaml`, from `tests/testbin/capi/build.sh`):
//! of those, the Namespaces, CRDs, Services, Issuers, Certificates and webhook
//! configurations are applied (no pod runs here, so Deployments and RBAC are left out).
//! The stand-in must write each Certificate's Secret with a certificate valid for the
//! webhook Service's DNS names under its CA, mark the Certificate Ready, and inject its
//! CA into every `caBundle` of the annotated objects: those that existed before it
//! started and those created after, and again after something overwrites one; a deleted
//! Secret is issued again, and a second stand-in on the cluster shares the CA.

use std::path::Path;
use std::time::Duration;

use banlieue_integration_tests::capi;
use banlieue_integration_tests::cert_stand_in::{CertStandIn, INJECT_CA_FROM};
use base64::Engine as _;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams};
use kube::core::GroupVersionKind;
use serde_json::{Value, json};

fn documents(path: &Path) -> Vec<Value> {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    let docs: Vec<Value> = serde_saphyr::from_multiple(&text)
        .unwrap_or_else(|e| panic!("parsing {}: {e}", path.display()));
    docs.into_iter().filter(|d| !d.is_null()).collect()
}

fn kind(object: &Value) -> &str {
    object["kind"].as_str().unwrap_or_default()
}

fn name(object: &Value) -> &str {
    object["metadata"]["name"].as_str().unwrap_or_default()
}

/// Polls `check` every 200 ms until it returns `Some`, for up to 30 s.
async fn eventually<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Option<T>, String>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let mut last = String::new();
    loop {
        match check().await {
            Ok(Some(value)) => return value,
            Ok(None) => {}
            Err(e) => last = e,
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: not within 30s (last: {last})"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Every `caBundle` of an object the stand-in injects: its webhooks' (webhook
/// configurations) or its conversion webhook's (CRDs).
fn ca_bundles(object: &Value) -> Vec<Option<String>> {
    let bundle = |client_config: &Value| client_config["caBundle"].as_str().map(str::to_owned);
    if kind(object) == "CustomResourceDefinition" {
        vec![bundle(
            &object["spec"]["conversion"]["webhook"]["clientConfig"],
        )]
    } else {
        object["webhooks"]
            .as_array()
            .expect("webhooks")
            .iter()
            .map(|w| bundle(&w["clientConfig"]))
            .collect()
    }
}

fn resource_of(object: &Value) -> ApiResource {
    let gvk = banlieue_integration_tests::gvk_of(object);
    let plural = match gvk.kind.as_str() {
        "CustomResourceDefinition" => "customresourcedefinitions",
        "ValidatingWebhookConfiguration" => "validatingwebhookconfigurations",
        "MutatingWebhookConfiguration" => "mutatingwebhookconfigurations",
        other => panic!("no caBundle in a {other}"),
    };
    ApiResource::from_gvk_with_plural(&gvk, plural)
}

/// Checks with openssl that `crt` chains to `ca`, is a TLS server certificate for
/// `host`, and matches `key`. `false` (skipped, saying so) when openssl is missing
/// outside CI and make.
fn openssl_verifies(dir: &Path, ca: &[u8], crt: &[u8], key: &[u8], host: &str) -> bool {
    let run = |args: &[&str]| std::process::Command::new("openssl").args(args).output();
    match run(&["version"]) {
        Ok(o) if o.status.success() => {}
        other if banlieue_testenv::rigs_required() => {
            panic!("openssl is required under CI and make: {other:?}")
        }
        other => {
            eprintln!("SKIPPED: openssl unavailable, certificate not verified: {other:?}");
            return false;
        }
    }
    for (file, bytes) in [("ca.crt", ca), ("tls.crt", crt), ("tls.key", key)] {
        std::fs::write(dir.join(file), bytes).unwrap();
    }
    let path = |file: &str| dir.join(file).to_str().unwrap().to_owned();
    let out = run(&[
        "verify",
        "-CAfile",
        &path("ca.crt"),
        "-purpose",
        "sslserver",
        "-verify_hostname",
        host,
        &path("tls.crt"),
    ])
    .unwrap();
    assert!(
        out.status.success(),
        "openssl verify (host {host}): {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let cert_key = run(&["x509", "-noout", "-pubkey", "-in", &path("tls.crt")]).unwrap();
    let key_pub = run(&["pkey", "-pubout", "-in", &path("tls.key")]).unwrap();
    assert!(cert_key.status.success() && key_pub.status.success());
    assert_eq!(
        cert_key.stdout, key_pub.stdout,
        "tls.key is not the key of tls.crt"
    );
    true
}

/// CAPI's providers in the rig's clusterctl repository: directory, components file.
const PROVIDERS: [(&str, &str); 3] = [
    ("cluster-api", "core-components.yaml"),
    ("bootstrap-kubeadm", "bootstrap-components.yaml"),
    ("control-plane-kubeadm", "control-plane-components.yaml"),
];

/// One provider's components, and what it asks cert-manager for.
struct Provider {
    label: &'static str,
    objects: Vec<Value>,
}

impl Provider {
    fn of_kind(&self, k: &str) -> Vec<&Value> {
        self.objects.iter().filter(|o| kind(o) == k).collect()
    }

    fn one(&self, k: &str) -> &Value {
        let found = self.of_kind(k);
        assert_eq!(found.len(), 1, "{}: one {k}", self.label);
        found[0]
    }

    fn namespace(&self) -> &str {
        self.one("Service")["metadata"]["namespace"]
            .as_str()
            .expect("namespace")
    }

    /// The webhook Service's DNS name.
    fn host(&self) -> String {
        format!("{}.{}.svc", name(self.one("Service")), self.namespace())
    }

    fn certificate(&self) -> &Value {
        self.one("Certificate")
    }

    fn injected(&self) -> Vec<&Value> {
        self.objects
            .iter()
            .filter(|o| o["metadata"]["annotations"][INJECT_CA_FROM].is_string())
            .collect()
    }

    async fn apply(&self, client: &kube::Client, kinds: &[&str]) {
        for object in self.objects.iter().filter(|o| kinds.contains(&kind(o))) {
            banlieue_integration_tests::apply(client, self.namespace(), object)
                .await
                .unwrap_or_else(|e| {
                    panic!(
                        "{}: applying {} {}: {e}",
                        self.label,
                        kind(object),
                        name(object)
                    )
                });
        }
    }
}

#[tokio::test]
async fn the_stand_in_issues_capis_certificates_and_injects_its_ca() {
    let Some(rig) = capi::rig_dir_or_skip() else {
        return;
    };
    let version = std::fs::read_to_string(rig.join("VERSION")).expect("the rig's VERSION");
    let providers: Vec<Provider> = PROVIDERS
        .iter()
        .map(|(label, file)| Provider {
            label,
            objects: documents(
                &rig.join("repository")
                    .join(label)
                    .join(version.trim())
                    .join(file),
            ),
        })
        .collect();
    let client = banlieue_testenv::client().await;

    // What each provider asks cert-manager for: a serving certificate for its webhook
    // Service, and its CA in both webhook configurations and the CRDs with conversion.
    for provider in &providers {
        let label = provider.label;
        let dns_names = provider.certificate()["spec"]["dnsNames"]
            .as_array()
            .expect("dnsNames");
        assert!(
            dns_names.iter().any(|n| n == &provider.host()),
            "{label}: {dns_names:?}"
        );
        let injected = provider.injected();
        for k in [
            "ValidatingWebhookConfiguration",
            "MutatingWebhookConfiguration",
            "CustomResourceDefinition",
        ] {
            assert!(
                injected.iter().any(|o| kind(o) == k),
                "{label}: no {k} asks for injection"
            );
        }
        let certificate_ref = format!("{}/{}", provider.namespace(), name(provider.certificate()));
        for object in &injected {
            assert_eq!(
                object["metadata"]["annotations"][INJECT_CA_FROM],
                certificate_ref,
                "{label}: {} {}",
                kind(object),
                name(object)
            );
        }
    }

    // Before the stand-in: the Namespaces, the CRDs (conversion webhooks included) and
    // the validating webhooks. After it: the rest (Issuers and Certificates need its CRDs).
    for provider in &providers {
        provider
            .apply(
                &client,
                &[
                    "Namespace",
                    "CustomResourceDefinition",
                    "ValidatingWebhookConfiguration",
                ],
            )
            .await;
    }
    let stand_in = CertStandIn::start(&client).await.expect("the stand-in");
    for provider in &providers {
        provider
            .apply(
                &client,
                &[
                    "Service",
                    "Issuer",
                    "Certificate",
                    "MutatingWebhookConfiguration",
                ],
            )
            .await;
    }

    let ca_pem = stand_in.ca_pem().to_owned();
    let bundle = &base64::engine::general_purpose::STANDARD.encode(&ca_pem);
    let client_ref = &client;
    let dir = tempfile::tempdir().unwrap();
    let mut core_secret = None;
    for provider in &providers {
        let label = provider.label;
        let certificate = provider.certificate();
        // The Secret: kubernetes.io/tls, the stand-in CA, a certificate for the Service.
        let secret_name = certificate["spec"]["secretName"]
            .as_str()
            .expect("secretName");
        let secrets: &Api<Secret> = &Api::namespaced(client.clone(), provider.namespace());
        let secret = eventually(
            &format!("{label}: the Certificate's Secret"),
            move || async move {
                secrets
                    .get_opt(secret_name)
                    .await
                    .map_err(|e| e.to_string())
            },
        )
        .await;
        assert_eq!(
            secret.type_.as_deref(),
            Some("kubernetes.io/tls"),
            "{label}"
        );
        let data = secret.data.clone().expect("Secret data");
        let field = |key: &str| {
            data.get(key)
                .unwrap_or_else(|| panic!("{label}: no {key} in the Secret"))
                .0
                .clone()
        };
        assert_eq!(field("ca.crt"), ca_pem.as_bytes(), "{label}");
        let (crt, key) = (field("tls.crt"), field("tls.key"));
        // Every name the provider asked for.
        for host in certificate["spec"]["dnsNames"]
            .as_array()
            .expect("dnsNames")
        {
            let host = host.as_str().expect("a DNS name");
            if !openssl_verifies(dir.path(), ca_pem.as_bytes(), &crt, &key, host) {
                break;
            }
        }

        // The Certificate is Ready.
        let certificates = &Api::<DynamicObject>::namespaced_with(
            client.clone(),
            provider.namespace(),
            &ApiResource::from_gvk_with_plural(
                &GroupVersionKind::gvk("cert-manager.io", "v1", "Certificate"),
                "certificates",
            ),
        );
        eventually(
            &format!("{label}: the Certificate's Ready condition"),
            move || async move {
                let live = certificates
                    .get(name(certificate))
                    .await
                    .map_err(|e| e.to_string())?;
                let ready = live.data["status"]["conditions"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True");
                Ok(ready.then_some(()))
            },
        )
        .await;
        if label == "cluster-api" {
            core_secret = Some((secrets.clone(), secret_name, secret, crt));
        }
    }

    // Every caBundle of every annotated object is the stand-in CA.
    let injected: &Vec<&Value> = &providers.iter().flat_map(Provider::injected).collect();
    let injected_everywhere = move || async move {
        for object in injected {
            let api = Api::<DynamicObject>::all_with(client_ref.clone(), &resource_of(object));
            let live = api.get(name(object)).await.map_err(|e| e.to_string())?;
            let live = serde_json::to_value(&live).unwrap();
            let bundles = ca_bundles(&live);
            if bundles.is_empty() || bundles.iter().any(|b| b.as_deref() != Some(bundle)) {
                return Ok(None);
            }
        }
        Ok(Some(()))
    };
    eventually("every caBundle injected", injected_everywhere).await;

    // Overwritten, it is injected again.
    let webhook = providers[0].one("ValidatingWebhookConfiguration");
    let first = webhook["webhooks"][0]["name"].as_str().expect("a webhook");
    let stale = base64::engine::general_purpose::STANDARD.encode("not a CA");
    Api::<DynamicObject>::all_with(client.clone(), &resource_of(webhook))
        .patch(
            name(webhook),
            &PatchParams::default(),
            &Patch::Strategic(
                json!({"webhooks": [{"name": first, "clientConfig": {"caBundle": stale}}]}),
            ),
        )
        .await
        .expect("overwriting a caBundle");
    eventually(
        "the overwritten caBundle injected again",
        injected_everywhere,
    )
    .await;

    // A deleted Secret is issued again, under the same CA.
    let (secrets, secret_name, secret, crt) = core_secret.expect("CAPI core's Secret");
    let secrets = &secrets;
    secrets
        .delete(secret_name, &Default::default())
        .await
        .expect("deleting the Secret");
    let old_uid = &secret.metadata.uid;
    let reissued = eventually("the Secret issued again", move || async move {
        let secret = secrets
            .get_opt(secret_name)
            .await
            .map_err(|e| e.to_string())?;
        Ok(secret.filter(|s| &s.metadata.uid != old_uid))
    })
    .await;
    let data = reissued.data.expect("Secret data");
    assert_eq!(data["ca.crt"].0, ca_pem.as_bytes());
    assert_ne!(data["tls.crt"].0, crt, "a new certificate");

    // A second stand-in on the same cluster shares the CA (they do not fight).
    drop(stand_in);
    let again = CertStandIn::start(&client)
        .await
        .expect("a second stand-in");
    assert_eq!(again.ca_pem(), ca_pem);
}
