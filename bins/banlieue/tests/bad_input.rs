//! Hostile input against the real apiserver with banlieue's CRDs and `banlieue run`
//! watching: huge strings, unicode and control characters, numbers out of range,
//! unknown enum values, wrong types, dangling references, a class deleted under a
//! running VM, Providers whose Secret is missing or incomplete. Each object is either
//! rejected at admission with a message that says what to fix, or accepted and
//! surfaced as a condition with a reason; the operator never panics and keeps
//! serving `/readyz`. (`tests/integration/tests/admission.rs` covers the schema rule
//! by rule; this suite is about abuse.)

use std::time::Duration;

use banlieue_integration_tests::operator::{wait_for, wait_gone};
use banlieue_integration_tests::{apply, post};
use banlieue_sdk::api::{Provider, VirtualMachine};
use banlieue_sdk::conditions;
use banlieue_testenv::TestNamespace;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{Api, DeleteParams};
use serde_json::{Value, json};

mod common;
mod operator_process;
use operator_process::OperatorProcess;

const WAIT: Duration = Duration::from_secs(60);

fn class(name: &str) -> Value {
    json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMClass", "metadata": {"name": name},
           "spec": {"cpus": 1, "memoryMiB": 256, "disk": {"sizeGiB": 1}}})
}

fn image(name: &str) -> Value {
    json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMImage", "metadata": {"name": name},
           "spec": {"os": {"family": "linux", "distribution": "d", "version": "1"}, "sources": {"sim": {"name": "d"}}}})
}

fn sim_provider(name: &str, endpoint: &str) -> Value {
    json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "Provider", "metadata": {"name": name},
           "spec": {"class": "sim", "connection": {"endpoint": endpoint}}})
}

fn vm(name: &str, class: &str, image: &str, provider: &str) -> Value {
    json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine", "metadata": {"name": name},
           "spec": {"classRef": {"name": class}, "imageRef": {"name": image},
                    "placement": {"providerRef": {"name": provider}}}})
}

fn condition<'a>(list: Option<&'a [Condition]>, type_: &str) -> Option<&'a Condition> {
    list.and_then(|l| conditions::get(l, type_))
}

fn vm_condition<'a>(vm: &'a VirtualMachine, type_: &str) -> Option<&'a Condition> {
    condition(vm.status.as_ref().map(|s| &s.conditions[..]), type_)
}

fn is_ready(vm: &VirtualMachine) -> bool {
    vm_condition(vm, "Ready").is_some_and(|c| c.status == "True")
}

/// Hostile objects the apiserver must refuse, each with what its message must say.
fn rejected(ns: &str) -> Vec<(&'static str, Value, &'static str)> {
    let (c, i) = (format!("{ns}-c"), format!("{ns}-i"));
    let base = vm("v", &c, &i, "sim");
    let with = banlieue_integration_tests::with;
    let mib = "x".repeat(1 << 20);
    vec![
        (
            "name of 254 characters",
            with(base.clone(), "/metadata/name", json!("a".repeat(254))),
            "must be no more than 253 characters",
        ),
        (
            "unicode name",
            with(base.clone(), "/metadata/name", json!("vm-é-🚀")),
            "a lowercase RFC 1123 subdomain must consist of",
        ),
        (
            "name with a control character",
            with(base.clone(), "/metadata/name", json!("vm\u{7}bell")),
            "a lowercase RFC 1123 subdomain must consist of",
        ),
        (
            "label value with a newline",
            with(base.clone(), "/metadata/labels/app", json!("web\nserver")),
            "a valid label must be an empty string or consist of alphanumeric characters",
        ),
        (
            "unicode label key",
            with(base.clone(), "/metadata/labels/ключ", json!("v")),
            "name part must consist of alphanumeric characters",
        ),
        (
            "1 MiB label value",
            with(base.clone(), "/metadata/labels/app", json!(mib.clone())),
            "must be no more than 63 bytes",
        ),
        (
            "1 MiB class reference",
            with(base.clone(), "/spec/classRef/name", json!(mib.clone())),
            "spec.classRef.name: Too long",
        ),
        (
            "unknown power state",
            with(base.clone(), "/spec/powerState", json!("Exploded")),
            "spec.powerState: Unsupported value: \"Exploded\"",
        ),
        (
            "power state of the wrong type",
            with(base.clone(), "/spec/powerState", json!(1)),
            "spec.powerState: Invalid value: \"integer\": spec.powerState in body must be of type string",
        ),
        (
            "spec that is a string",
            with(base.clone(), "/spec", json!("run it")),
            "spec in body must be of type object",
        ),
        (
            "negative CPUs",
            with(class(&c), "/spec/cpus", json!(-4)),
            "spec.cpus in body should be greater than or equal to 1",
        ),
        (
            "a billion CPUs",
            with(class(&c), "/spec/cpus", json!(1_000_000_000u64)),
            "spec.cpus in body should be less than or equal to 768",
        ),
        (
            "fractional CPUs",
            with(class(&c), "/spec/cpus", json!(1.5)),
            "spec.cpus in body must be of type integer",
        ),
        (
            "zero memory",
            with(class(&c), "/spec/memoryMiB", json!(0)),
            "spec.memoryMiB in body should be greater than or equal to 128",
        ),
        (
            "negative memory",
            with(class(&c), "/spec/memoryMiB", json!(-1)),
            "spec.memoryMiB in body should be greater than or equal to 128",
        ),
        (
            "memory beyond int64",
            with(class(&c), "/spec/memoryMiB", json!(1e30)),
            "spec.memoryMiB in body must be of type integer",
        ),
        (
            "negative disk",
            with(class(&c), "/spec/disk/sizeGiB", json!(-10)),
            "spec.disk.sizeGiB",
        ),
        (
            // The class is open (an out-of-tree backend brings its own); a name that
            // is not a DNS label is not one.
            "provider class that is not a DNS label",
            with(
                sim_provider("p", "sim://x"),
                "/spec/class",
                json!("Hyper_V"),
            ),
            "banlieue's own classes are vsphere, proxmox, libvirt, cloud-hypervisor and sim",
        ),
        (
            "endpoint with control characters",
            with(
                sim_provider("p", "sim://x"),
                "/spec/connection/endpoint",
                json!("https://127.0.0.1:9/\u{7}\u{0}"),
            ),
            "connection.endpoint must be a URL",
        ),
        (
            "endpoint with a tab",
            with(
                sim_provider("p", "sim://x"),
                "/spec/connection/endpoint",
                json!("https://pve.example.com:8006/\tx"),
            ),
            "connection.endpoint must be a URL",
        ),
        (
            "unknown field",
            with(base.clone(), "/spec/turbo", json!(true)),
            "unknown field \"spec.turbo\"",
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_objects_are_rejected_or_surface_as_conditions_and_the_operator_survives() {
    let ns = banlieue_testenv::namespace("bad-input").await;
    let mut operator = OperatorProcess::start(&ns.name).await;
    let (c, i) = (format!("{}-c", ns.name), format!("{}-i", ns.name));
    for object in [
        class(&c),
        image(&i),
        sim_provider("sim", &format!("sim://{}", ns.name)),
    ] {
        apply(&ns.client, &ns.name, &object).await.unwrap();
    }

    // Rejected at admission, saying what to fix.
    let mut wrong = Vec::new();
    for (what, object, expect) in rejected(&ns.name) {
        match post(&ns.client, &ns.name, &object).await {
            Ok(_) => wrong.push(format!("{what}: accepted")),
            Err(kube::Error::Api(status)) if status.message.contains(expect) => {}
            Err(error) => {
                // Long values are echoed back: show the start and the end.
                let text = error.to_string();
                let chars: Vec<char> = text.chars().collect();
                let shown: String = if chars.len() > 600 {
                    let head: String = chars[..200].iter().collect();
                    let tail: String = chars[chars.len() - 400..].iter().collect();
                    format!("{head} … {tail}")
                } else {
                    text
                };
                wrong.push(format!("{what}: want {expect:?}, got {shown}"));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "hostile objects not rejected as expected:\n{}",
        wrong.join("\n")
    );

    // Accepted, and surfaced as conditions with a reason.
    accepted_become_conditions(&ns, &c, &i).await;
    class_deleted_mid_flight(&ns, &i).await;
    broken_credentials(&ns, &c, &i).await;

    operator.assert_healthy().await;
}

async fn accepted_become_conditions(ns: &TestNamespace, c: &str, i: &str) {
    let vms: Api<VirtualMachine> = ns.api();
    let cases = [
        (
            vm("no-class", "no-such-class", i, "sim"),
            "ClassNotFound",
            "no-such-class",
        ),
        (
            vm("no-image", c, "no-such-image", "sim"),
            "ImageNotFound",
            "no-such-image",
        ),
        (
            vm("no-provider", c, i, "no-such-provider"),
            "",
            "no-such-provider",
        ),
    ];
    for (object, _, _) in &cases {
        apply(&ns.client, &ns.name, object).await.unwrap();
    }
    for (object, reason, text) in &cases {
        let name = object["metadata"]["name"].as_str().unwrap();
        let seen = wait_for(&vms, name, WAIT, |vm| {
            vm_condition(vm, "Scheduled").is_some_and(|c| c.status == "False")
        })
        .await;
        let scheduled = vm_condition(&seen, "Scheduled").unwrap();
        assert!(
            !scheduled.reason.is_empty() && (reason.is_empty() || scheduled.reason == *reason),
            "{name}: reason {:?}, want {reason:?}",
            scheduled.reason
        );
        assert!(
            scheduled.message.contains(text),
            "{name}: the message names the missing object: {scheduled:?}"
        );
    }

    // Unicode, control characters and a big value where they are allowed (annotations,
    // sim settings): the VM still converges, bad settings become a Provider condition.
    let mut odd = vm("odd", c, i, "sim");
    odd["metadata"]["annotations"] = json!({
        "example.com/note": "ünïcödé 🚀 \u{1}\u{7}\u{1b}[31m red \r\n tab\t",
        "example.com/big": "y".repeat(200 * 1024),
    });
    apply(&ns.client, &ns.name, &odd).await.unwrap();
    wait_for(&vms, "odd", WAIT, is_ready).await;
    let mut weird = sim_provider("weird", &format!("sim://{}-weird", ns.name));
    weird["spec"]["settings"] =
        json!({"latency": "1\u{7}s", "ключ": "значение", "failureRate": "NaN"});
    apply(&ns.client, &ns.name, &weird).await.unwrap();
    let providers: Api<Provider> = ns.api();
    let seen = wait_for(&providers, "weird", WAIT, |p| {
        condition(p.status.as_ref().map(|s| &s.conditions[..]), "Ready")
            .is_some_and(|c| c.reason == "InvalidSettings")
    })
    .await;
    let ready = condition(seen.status.as_ref().map(|s| &s.conditions[..]), "Ready").unwrap();
    for key in ["settings.latency", "settings.ключ", "settings.failureRate"] {
        assert!(ready.message.contains(key), "{key} named in {ready:?}");
    }
    for (object, _, _) in &cases {
        let name = object["metadata"]["name"].as_str().unwrap();
        vms.delete(name, &DeleteParams::default()).await.unwrap();
        wait_gone(&vms, name, WAIT).await;
    }
}

/// A class deleted under a running VM: the VM says so and keeps its machine; the class
/// coming back heals it; deleting the VM meanwhile is never stuck.
async fn class_deleted_mid_flight(ns: &TestNamespace, i: &str) {
    let vms: Api<VirtualMachine> = ns.api();
    let classes: Api<banlieue_sdk::api::VMClass> = Api::all(ns.client.clone());
    let doomed = format!("{}-doomed", ns.name);
    apply(&ns.client, &ns.name, &class(&doomed)).await.unwrap();
    for name in ["orphan-a", "orphan-b"] {
        apply(&ns.client, &ns.name, &vm(name, &doomed, i, "sim"))
            .await
            .unwrap();
        wait_for(&vms, name, WAIT, is_ready).await;
    }
    classes
        .delete(&doomed, &DeleteParams::default())
        .await
        .unwrap();
    for name in ["orphan-a", "orphan-b"] {
        // Still placed (nothing moves it); InfrastructureReady says what is missing.
        let seen = wait_for(&vms, name, WAIT, |vm| {
            vm_condition(vm, "InfrastructureReady").is_some_and(|c| c.reason == "ClassNotFound")
                && vm_condition(vm, "Scheduled").is_some_and(|c| c.status == "True")
        })
        .await;
        assert!(
            seen.status.as_ref().unwrap().provider_id.is_some(),
            "{name} keeps its machine while its class is gone"
        );
    }
    vms.delete("orphan-a", &DeleteParams::default())
        .await
        .unwrap();
    wait_gone(&vms, "orphan-a", WAIT).await;
    apply(&ns.client, &ns.name, &class(&doomed)).await.unwrap();
    wait_for(&vms, "orphan-b", WAIT, |vm| {
        is_ready(vm) && vm_condition(vm, "Scheduled").is_some_and(|c| c.status == "True")
    })
    .await;
    classes
        .delete(&doomed, &DeleteParams::default())
        .await
        .unwrap();
    vms.delete("orphan-b", &DeleteParams::default())
        .await
        .unwrap();
    wait_gone(&vms, "orphan-b", WAIT).await;
}

/// Providers whose credentials Secret is missing, or lacks the keys the backend needs.
async fn broken_credentials(ns: &TestNamespace, c: &str, i: &str) {
    let providers: Api<Provider> = ns.api();
    let proxmox = |name: &str, secret: &str| {
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "Provider", "metadata": {"name": name},
               "spec": {"class": "proxmox",
                        // Port 9 (discard) on loopback: nothing is ever sent there, the
                        // Secret problems stop the connection first.
                        "connection": {"endpoint": "https://127.0.0.1:9", "credentialsRef": {"name": secret},
                                       "insecureSkipTLSVerify": true}}})
    };
    apply(
        &ns.client,
        &ns.name,
        &json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "half"},
                "stringData": {"tokenID": "root@pam!x", "unrelated": "z"}}),
    )
    .await
    .unwrap();
    for object in [
        proxmox("no-secret", "absent"),
        proxmox("half-secret", "half"),
    ] {
        apply(&ns.client, &ns.name, &object).await.unwrap();
    }
    let reason_of =
        |p: &Provider| condition(p.status.as_ref().map(|s| &s.conditions[..]), "Ready").cloned();
    let missing = wait_for(&providers, "no-secret", WAIT, |p| {
        reason_of(p).is_some_and(|c| c.status == "False")
    })
    .await;
    let ready = reason_of(&missing).unwrap();
    assert_eq!(ready.reason, "CredentialsNotFound", "{ready:?}");
    assert!(ready.message.contains("absent not found"), "{ready:?}");
    let half = wait_for(&providers, "half-secret", WAIT, |p| {
        reason_of(p).is_some_and(|c| c.status == "False")
    })
    .await;
    let ready = reason_of(&half).unwrap();
    assert!(!ready.reason.is_empty(), "{ready:?}");
    assert!(
        ready.message.contains("tokenSecret") || ready.message.contains("password"),
        "the message names the missing key: {ready:?}"
    );
    // A VM aimed at it is not placed, and says why.
    let vms: Api<VirtualMachine> = ns.api();
    apply(&ns.client, &ns.name, &vm("stranded", c, i, "half-secret"))
        .await
        .unwrap();
    let seen = wait_for(&vms, "stranded", WAIT, |vm| {
        vm_condition(vm, "Scheduled").is_some_and(|c| c.status == "False")
    })
    .await;
    let scheduled = vm_condition(&seen, "Scheduled").unwrap();
    assert!(scheduled.message.contains("half-secret"), "{scheduled:?}");
    vms.delete("stranded", &DeleteParams::default())
        .await
        .unwrap();
    wait_gone(&vms, "stranded", WAIT).await;
}
