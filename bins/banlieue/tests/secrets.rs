//! Secrets never leak: `banlieue run` (debug logging) provisions VMs on fakepve (API
//! token, then a ticket login after a failed one), on vcsim (password) and on the sim
//! (a credentials Secret it ignores), with bootstrap data, through a rejected
//! password and a deletion. Then every log line, every Event in the namespace and
//! every object in it but the Secrets is searched for each credential and the
//! bootstrap data: none may appear, raw or base64-encoded. The same search must find
//! them in the Secrets, or it proves nothing.

use std::time::Duration;

use banlieue_integration_tests::apply;
use banlieue_integration_tests::fakepve::FakePve;
use banlieue_integration_tests::operator::{wait_for, wait_gone};
use banlieue_integration_tests::vcsim::Vcsim;
use banlieue_sdk::api::{Provider, VirtualMachine};
use banlieue_sdk::conditions;
use kube::ResourceExt as _;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, ListParams};
use kube::discovery::Discovery;
use serde_json::{Value, json};

mod common;
mod operator_process;
use operator_process::OperatorProcess;

const WAIT: Duration = Duration::from_secs(90);

fn is_ready(vm: &VirtualMachine) -> bool {
    vm.status
        .as_ref()
        .is_some_and(|s| conditions::is_true(&s.conditions, "Ready"))
}

fn provider_ready(p: &Provider) -> bool {
    p.status
        .as_ref()
        .is_some_and(|s| conditions::is_true(&s.conditions, "Ready"))
}

/// A value unique to this run, so finding it means it came from here.
fn marker(what: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("LEAK-{what}-{nanos:x}")
}

/// Every secret and the forms it could leak in: raw, and base64 of the whole value
/// (how vSphere's guestinfo and Kubernetes' Secret data carry it).
fn forms(secrets: &[(String, String)]) -> Vec<(String, String)> {
    secrets
        .iter()
        .flat_map(|(what, value)| {
            [
                (what.clone(), value.clone()),
                (format!("{what} (base64)"), base64(value.as_bytes())),
            ]
        })
        .collect()
}

/// Standard base64 with padding (this package has no base64 dependency).
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | u32::from(*b) << (16 - 8 * i));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// The secrets found in `text`, by name.
fn found_in(text: &str, secrets: &[(String, String)]) -> Vec<String> {
    secrets
        .iter()
        .filter(|(_, value)| text.contains(value.as_str()))
        .map(|(what, _)| what.clone())
        .collect()
}

/// Every object of every namespaced kind in `namespace` and every banlieue
/// cluster-scoped object, as JSON text, with Secrets apart.
async fn everything(client: &kube::Client, namespace: &str) -> (String, String) {
    let discovery = Discovery::new(client.clone()).run().await.unwrap();
    let (mut objects, mut secrets) = (String::new(), String::new());
    for group in discovery.groups() {
        for (resource, capabilities) in group.recommended_resources() {
            if !capabilities.supports_operation(kube::discovery::verbs::LIST) {
                continue;
            }
            let namespaced = capabilities.scope == kube::discovery::Scope::Namespaced;
            if !namespaced && !resource.group.contains("banlieue") {
                continue;
            }
            let api: Api<DynamicObject> = if namespaced {
                Api::namespaced_with(client.clone(), namespace, &resource)
            } else {
                Api::all_with(client.clone(), &resource)
            };
            let Ok(list) = api.list(&ListParams::default()).await else {
                continue;
            };
            let text = serde_json::to_string(&list.items).unwrap();
            if is_secret(&resource) {
                secrets.push_str(&text);
            } else {
                objects.push_str(&text);
            }
        }
    }
    (objects, secrets)
}

fn is_secret(resource: &ApiResource) -> bool {
    resource.group.is_empty() && resource.kind == "Secret"
}

#[test]
fn base64_is_standard() {
    assert_eq!(base64(b""), "");
    assert_eq!(base64(b"f"), "Zg==");
    assert_eq!(base64(b"fo"), "Zm8=");
    assert_eq!(base64(b"foo"), "Zm9v");
    assert_eq!(base64(b"foobar"), "Zm9vYmFy");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_credential_or_bootstrap_data_reaches_logs_events_or_objects() {
    let Some(pve) = FakePve::start() else { return };
    let Some(vc) = Vcsim::start() else { return };
    let ns = banlieue_testenv::namespace("secrets").await;
    let bootstrap = format!("#cloud-config\npassword: {}\n", marker("BOOTSTRAP"));
    let sim_token = marker("SIMTOKEN");
    let wrong_password = marker("WRONGPASSWORD");
    let secrets = vec![
        (
            "fakepve token secret".to_string(),
            pve.ready.token_secret.clone(),
        ),
        ("fakepve password".to_string(), pve.ready.password.clone()),
        ("vcsim password".to_string(), vc.ready.password.clone()),
        ("wrong vcsim password".to_string(), wrong_password.clone()),
        ("sim token".to_string(), sim_token.clone()),
        ("bootstrap data".to_string(), bootstrap.clone()),
    ];
    for (what, value) in &secrets {
        assert!(value.len() >= 16, "{what} is too short to be a marker");
    }

    let class = format!("{}-c", ns.name);
    let image = format!("{}-i", ns.name);
    let objects = [
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "pve-token"},
               "stringData": {"tokenID": pve.ready.token_id, "tokenSecret": pve.ready.token_secret}}),
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "pve-ticket"},
               "stringData": {"username": pve.ready.username, "password": pve.ready.password}}),
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "vc"},
               "stringData": {"username": vc.ready.username, "password": wrong_password}}),
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "sim"},
               "stringData": {"token": sim_token}}),
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "user-data"},
               "stringData": {"value": bootstrap}}),
        pve_provider(&pve, "pve-token", "pve-token"),
        pve_provider(&pve, "pve-ticket", "pve-ticket"),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "Provider", "metadata": {"name": "vc"},
        "spec": {"class": "vsphere",
                 "connection": {"endpoint": format!("{}/sdk", vc.ready.endpoint), "credentialsRef": {"name": "vc"},
                                "caBundle": {"inline": vc.ready.ca_pem}},
                 "capabilities": {"storageClasses": [{"name": "fast", "target": {"datastore": "LocalDS_0"}}],
                                  "networkClasses": [{"name": "lan", "target": {"portGroup": "VM Network"}}]},
                 "settings": {"taskPollInterval": "100ms", "shutdownTimeout": "2s"}}}),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "Provider", "metadata": {"name": "sim"},
        "spec": {"class": "sim", "connection": {"endpoint": format!("sim://{}", ns.name), "credentialsRef": {"name": "sim"}},
                 "capabilities": {"storageClasses": [{"name": "fast", "target": {"pool": "default"}}],
                                  "networkClasses": [{"name": "lan", "target": {"network": "default"}}]}}}),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMClass", "metadata": {"name": class},
               "spec": {"cpus": 1, "memoryMiB": 512, "firmware": "bios", "disk": {"sizeGiB": 8, "storageClass": "fast"}}}),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMImage", "metadata": {"name": image},
               "spec": {"os": {"family": "linux", "distribution": "debian", "version": "13"},
                        "sources": {"proxmox": {"templateID": pve.ready.template_id},
                                    "vsphere": {"template": vc.ready.template},
                                    "sim": {"name": "debian"}}}}),
    ];
    let mut operator = OperatorProcess::start(&ns.name).await;
    // A failed ticket login first: the error path must not echo the password either.
    pve.fail("POST", "/access/ticket", 500, "auth backend down", Some(2));
    for object in &objects {
        apply(&ns.client, &ns.name, object).await.unwrap();
    }
    let providers: Api<Provider> = ns.api();
    // The wrong vCenter password is rejected, then fixed.
    wait_for(&providers, "vc", WAIT, |p| {
        p.status.as_ref().is_some_and(|s| {
            conditions::get(&s.conditions, "Reachable").is_some_and(|c| c.reason == "Unauthorized")
        })
    })
    .await;
    apply(
        &ns.client,
        &ns.name,
        &json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "vc"},
                "stringData": {"username": vc.ready.username, "password": vc.ready.password}}),
    )
    .await
    .unwrap();
    for name in ["pve-token", "pve-ticket", "vc", "sim"] {
        wait_for(&providers, name, WAIT, provider_ready).await;
    }
    let vms: Api<VirtualMachine> = ns.api();
    for provider in ["pve-token", "pve-ticket", "vc", "sim"] {
        let vm = json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine",
            "metadata": {"name": format!("on-{provider}")},
            "spec": {"classRef": {"name": class}, "imageRef": {"name": image},
                     "placement": {"providerRef": {"name": provider}},
                     "bootstrap": {"format": "cloud-config", "userData": {"name": "user-data"}},
                     "networks": [{"name": "eth0", "networkClass": "lan"}]}});
        apply(&ns.client, &ns.name, &vm).await.unwrap();
    }
    for provider in ["pve-token", "pve-ticket", "vc", "sim"] {
        wait_for(&vms, &format!("on-{provider}"), WAIT, is_ready).await;
    }
    // What the operator writes is attributed to it: the finalizer patches name no field
    // manager, so the apiserver records its User-Agent (`banlieue/<version>`), never
    // `unknown`.
    for vm in vms.list(&ListParams::default()).await.unwrap() {
        let managers: Vec<String> = vm
            .metadata
            .managed_fields
            .iter()
            .flatten()
            .filter_map(|m| m.manager.clone())
            .collect();
        assert!(
            managers.iter().any(|m| m == "banlieue") && !managers.iter().any(|m| m == "unknown"),
            "{}: managers {managers:?}",
            vm.name_any()
        );
    }
    // The bootstrap data did reach a backend (vSphere guestinfo, base64).
    let guest = vc.vm("on-vc").expect("the vCenter VM");
    let userdata = guest["extraConfig"]["guestinfo.userdata"]
        .as_str()
        .unwrap_or_default();
    assert!(
        !found_in(userdata, &forms(&secrets[5..6])).is_empty(),
        "the bootstrap data reached vSphere: {guest}"
    );
    for provider in ["pve-token", "vc"] {
        let name = format!("on-{provider}");
        vms.delete(&name, &DeleteParams::default()).await.unwrap();
        wait_gone(&vms, &name, WAIT).await;
    }
    operator.assert_healthy().await;

    let secrets = forms(&secrets);
    let log = operator.log_text();
    let events: Api<k8s_openapi::api::core::v1::Event> = ns.api();
    let events =
        serde_json::to_string(&events.list(&ListParams::default()).await.unwrap().items).unwrap();
    let new_events: Api<k8s_openapi::api::events::v1::Event> = ns.api();
    let new_events =
        serde_json::to_string(&new_events.list(&ListParams::default()).await.unwrap().items)
            .unwrap();
    let (objects, secret_objects) = everything(&ns.client, &ns.name).await;
    eprintln!(
        "searched {} log lines ({}), {} bytes of Events, {} bytes of objects for {} secret forms",
        log.lines().count(),
        operator.log_path().display(),
        events.len() + new_events.len(),
        objects.len(),
        secrets.len()
    );
    assert!(log.lines().count() > 100, "debug logging wrote little");
    assert!(events.contains("Scheduled"), "the operator recorded Events");
    let mut leaks = Vec::new();
    for (place, text) in [
        ("the operator's log", &log),
        ("core/v1 Events", &events),
        ("events.k8s.io Events", &new_events),
        ("objects (status included)", &objects),
    ] {
        for what in found_in(text, &secrets) {
            let at = text.find(secrets.iter().find(|(w, _)| *w == what).unwrap().1.as_str());
            let context: String = at
                .map(|i| text[i.saturating_sub(200)..].chars().take(400).collect())
                .unwrap_or_default();
            leaks.push(format!("{what} in {place}: …{context}…"));
        }
    }
    assert!(leaks.is_empty(), "secrets leaked:\n{}", leaks.join("\n"));
    // The search works: every secret is found where it belongs (base64 in Secret data).
    let in_secrets = found_in(&secret_objects, &secrets);
    for (what, value) in &secrets {
        if what.ends_with("(base64)") && what != "wrong vcsim password (base64)" {
            assert!(
                in_secrets.contains(what),
                "the search does not find {what} ({value}) in the Secrets"
            );
        }
    }
}

fn pve_provider(pve: &FakePve, name: &str, secret: &str) -> Value {
    json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "Provider", "metadata": {"name": name},
    "spec": {"class": "proxmox",
             "connection": {"endpoint": pve.ready.endpoint, "credentialsRef": {"name": secret},
                            "caBundle": {"inline": pve.ready.ca_pem}},
             "capabilities": {"storageClasses": [{"name": "fast", "target": {"storage": "local-lvm"}}],
                              "networkClasses": [{"name": "lan", "target": {"bridge": "vmbr0"}}]},
             "settings": {"taskPollInterval": "200ms", "shutdownTimeout": "5"}}})
}
