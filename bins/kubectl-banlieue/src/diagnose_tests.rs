//! The diagnosis over hand-made objects, one broken link at a time.

use serde_json::{Value, json};

use super::*;

fn condition(type_: &str, status: &str, reason: &str, message: &str) -> Value {
    json!({"type": type_, "status": status, "reason": reason, "message": message,
           "lastTransitionTime": "2026-01-01T00:00:00Z"})
}

fn vm(spec_extra: Value, status: Value) -> VirtualMachine {
    let mut spec = json!({"classRef": {"name": "small"}, "imageRef": {"name": "debian"}});
    if let (Some(spec), Some(extra)) = (spec.as_object_mut(), spec_extra.as_object()) {
        spec.extend(extra.clone());
    }
    serde_json::from_value(json!({
        "apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine",
        "metadata": {"name": "web-1", "namespace": "lab", "uid": "u-1"},
        "spec": spec, "status": status,
    }))
    .unwrap()
}

fn class() -> VMClass {
    serde_json::from_value(json!({
        "apiVersion": "banlieue.io/v1alpha1", "kind": "VMClass", "metadata": {"name": "small"},
        "spec": {"cpus": 2, "memoryMiB": 2048, "disk": {"sizeGiB": 20}},
    }))
    .unwrap()
}

fn image(sources: Value) -> VMImage {
    serde_json::from_value(json!({
        "apiVersion": "banlieue.io/v1alpha1", "kind": "VMImage", "metadata": {"name": "debian"},
        "spec": {"os": {"family": "linux", "distribution": "debian", "version": "13"}, "sources": sources},
    }))
    .unwrap()
}

fn provider(name: &str, conditions: Value, credentials: Option<&str>) -> Provider {
    let mut connection = json!({"endpoint": "https://pve.example.com:8006"});
    if let Some(secret) = credentials {
        connection["credentialsRef"] = json!({"name": secret});
    }
    serde_json::from_value(json!({
        "apiVersion": "banlieue.io/v1alpha1", "kind": "Provider",
        "metadata": {"name": name, "namespace": "lab"},
        "spec": {"class": "proxmox", "connection": connection},
        "status": {"conditions": conditions},
    }))
    .unwrap()
}

fn ready_provider(name: &str) -> Provider {
    provider(
        name,
        json!([
            condition("Reachable", "True", "Connected", ""),
            condition("Ready", "True", "Ready", "")
        ]),
        Some("pve-token"),
    )
}

fn placed_status(extra: Value) -> Value {
    let mut status = json!({
        "phase": "Provisioning",
        "placement": {"provider": "pve", "providerClass": "proxmox", "failureDomain": "node-1"},
        "infrastructureRef": {"apiGroup": "infrastructure.banlieue.io", "kind": "ProxmoxMachine", "name": "web-1"},
    });
    if let (Some(status), Some(extra)) = (status.as_object_mut(), extra.as_object()) {
        status.extend(extra.clone());
    }
    status
}

fn machine(conditions: Value) -> Machine {
    Machine {
        kind: "ProxmoxMachine".into(),
        name: "web-1".into(),
        status: Some(
            serde_json::from_value(json!({"conditions": conditions, "backendRef": "node-1/104"}))
                .unwrap(),
        ),
        deleting: false,
    }
}

fn culprit(facts: &Facts<'_>) -> Link {
    diagnose(facts).culprit().cloned().expect("a culprit")
}

#[test]
fn a_missing_class_is_the_first_failing_link() {
    let vm = vm(
        json!({}),
        json!({"phase": "Pending", "conditions": [
            condition("Scheduled", "False", "ClassNotFound", "VMClass \"small\" not found"),
            condition("Ready", "False", "NotScheduled", ""),
        ]}),
    );
    let image = image(json!({"proxmox": {"templateID": 9000}}));
    let link = culprit(&Facts {
        vm: &vm,
        class: None,
        image: Some(&image),
        provider: None,
        providers: &[],
        machine: None,
    });
    assert_eq!(
        (
            link.subject.as_str(),
            link.reason.as_str(),
            link.message.as_str()
        ),
        (
            "VMClass \"small\"",
            "ClassNotFound",
            "VMClass \"small\" not found"
        )
    );
    assert!(link.hint.unwrap().contains("create VMClass \"small\""));
}

#[test]
fn an_unreachable_provider_points_at_its_secret() {
    let vm = vm(
        json!({"placement": {"providerRef": {"name": "pve"}}}),
        json!({"phase": "Pending", "conditions": [
            condition("Scheduled", "False", "NoFeasibleProvider", "Provider pve is not Ready"),
            condition("Ready", "False", "NotScheduled", ""),
        ]}),
    );
    let (class, image) = (class(), image(json!({"proxmox": {"templateID": 9000}})));
    let cases = [
        (
            "CredentialsNotFound",
            "Secret \"pve-token\" not found",
            "create the Secret \"pve-token\"",
        ),
        (
            "Unauthorized",
            "401 authentication failure",
            "check the credentials in the Secret \"pve-token\"",
        ),
        (
            "Unreachable",
            "connection refused",
            "check that https://pve.example.com:8006 is reachable",
        ),
    ];
    for (reason, message, hint) in cases {
        let broken = provider(
            "pve",
            json!([
                condition("Reachable", "False", reason, message),
                condition("Ready", "False", reason, message)
            ]),
            Some("pve-token"),
        );
        let providers = [broken.clone()];
        let link = culprit(&Facts {
            vm: &vm,
            class: Some(&class),
            image: Some(&image),
            provider: Some(&broken),
            providers: &providers,
            machine: None,
        });
        assert_eq!(
            (
                link.subject.as_str(),
                link.reason.as_str(),
                link.message.as_str()
            ),
            ("Provider \"pve\"", reason, message)
        );
        let got = link.hint.unwrap();
        assert!(got.contains(hint), "{reason}: {got}");
    }
}

#[test]
fn a_missing_or_unchecked_provider_says_so() {
    let vm = vm(
        json!({"placement": {"providerRef": {"name": "pve"}}}),
        json!({"phase": "Pending"}),
    );
    let (class, image) = (class(), image(json!({"proxmox": {"templateID": 9000}})));
    let facts = Facts {
        vm: &vm,
        class: Some(&class),
        image: Some(&image),
        provider: None,
        providers: &[],
        machine: None,
    };
    assert_eq!(culprit(&facts).reason, "ProviderNotFound");
    let fresh = provider("pve", json!([]), None);
    let link = culprit(&Facts {
        provider: Some(&fresh),
        ..facts
    });
    assert_eq!(link.reason, "NotChecked");
    assert!(link.hint.unwrap().contains("operator running"));
}

#[test]
fn no_feasible_provider_lists_the_providers_that_are_not_ready() {
    let vm = vm(
        json!({}),
        json!({"phase": "Pending", "conditions": [
            condition("Scheduled", "False", "NoFeasibleProvider", "no Ready Provider offers VMImage debian"),
            condition("Ready", "False", "NotScheduled", ""),
        ]}),
    );
    let (class, image) = (class(), image(json!({"proxmox": {"templateID": 9000}})));
    let providers = [
        ready_provider("good"),
        provider(
            "bad",
            json!([condition("Reachable", "False", "Unreachable", "timeout")]),
            None,
        ),
    ];
    let link = culprit(&Facts {
        vm: &vm,
        class: Some(&class),
        image: Some(&image),
        provider: None,
        providers: &providers,
        machine: None,
    });
    assert_eq!(
        (link.subject.as_str(), link.reason.as_str()),
        ("Scheduling", "NoFeasibleProvider")
    );
    let hint = link.hint.unwrap();
    assert!(
        hint.contains("bad (Unreachable)") && !hint.contains("good"),
        "{hint}"
    );
}

#[test]
fn an_image_without_a_source_for_the_backend_class_is_named() {
    let vm = vm(
        json!({"placement": {"providerRef": {"name": "pve"}}}),
        json!({"phase": "Pending"}),
    );
    let (class, image) = (
        class(),
        image(json!({"libvirt": {"path": "/img/debian.qcow2"}})),
    );
    let pve = ready_provider("pve");
    let link = culprit(&Facts {
        vm: &vm,
        class: Some(&class),
        image: Some(&image),
        provider: Some(&pve),
        providers: std::slice::from_ref(&pve),
        machine: None,
    });
    assert_eq!(link.reason, "ImageHasNoSource");
    assert!(link.hint.unwrap().contains("spec.sources.proxmox"));
}

#[test]
fn a_backend_failure_on_the_machine_is_reported_with_its_message() {
    let vm = vm(
        json!({}),
        placed_status(json!({"conditions": [
            condition("Scheduled", "True", "Scheduled", "on Provider pve"),
            condition("InfrastructureReady", "False", "TerminalFailure", "TemplateNotFound: VMID 9000 is not a template"),
            condition("PowerState", "False", "Converging", "want PoweredOn, observed None"),
            condition("Ready", "False", "InfrastructureNotReady", ""),
        ]})),
    );
    let (class, image) = (class(), image(json!({"proxmox": {"templateID": 9000}})));
    let pve = ready_provider("pve");
    let broken = machine(json!([condition(
        "Ready",
        "False",
        "TerminalFailure",
        "TemplateNotFound: VMID 9000 is not a template"
    )]));
    let diagnosis = diagnose(&Facts {
        vm: &vm,
        class: Some(&class),
        image: Some(&image),
        provider: Some(&pve),
        providers: std::slice::from_ref(&pve),
        machine: Some(&broken),
    });
    assert!(!diagnosis.ready);
    assert_eq!(diagnosis.ready_reason, "InfrastructureNotReady");
    let link = diagnosis.culprit().unwrap();
    assert_eq!(
        (link.subject.as_str(), link.reason.as_str()),
        ("ProxmoxMachine \"web-1\"", "TerminalFailure")
    );
    assert!(link.message.contains("VMID 9000"));
    assert!(link.hint.as_ref().unwrap().contains("retrying cannot help"));
    let states: Vec<State> = diagnosis.links.iter().map(|l| l.state).collect();
    assert_eq!(
        states,
        [
            State::Ok,
            State::Ok,
            State::Ok,
            State::Ok,
            State::Ok,
            State::NotOk,
            State::NotOk
        ],
        "{:#?}",
        diagnosis.links
    );
}

#[test]
fn a_missing_bootstrap_secret_is_named() {
    let vm = vm(
        json!({"bootstrap": {"userData": {"name": "web-1-cloud-init"}}}),
        placed_status(json!({"infrastructureRef": null, "conditions": [
            condition("Scheduled", "True", "Scheduled", "on Provider pve"),
            condition("InfrastructureReady", "False", "BootstrapDataNotFound", "Secret web-1-cloud-init not found"),
            condition("Ready", "False", "InfrastructureNotReady", ""),
        ]})),
    );
    let (class, image) = (class(), image(json!({"proxmox": {"templateID": 9000}})));
    let pve = ready_provider("pve");
    let link = culprit(&Facts {
        vm: &vm,
        class: Some(&class),
        image: Some(&image),
        provider: Some(&pve),
        providers: std::slice::from_ref(&pve),
        machine: None,
    });
    assert_eq!(
        (link.subject.as_str(), link.reason.as_str()),
        ("Infrastructure machine", "BootstrapDataNotFound")
    );
    assert!(link.hint.unwrap().contains("Secret \"web-1-cloud-init\""));
}

#[test]
fn a_ready_vm_has_no_culprit_and_an_unreconciled_one_blames_the_operator() {
    let ready = vm(
        json!({}),
        placed_status(json!({"phase": "Running", "conditions": [
            condition("Scheduled", "True", "Scheduled", "on Provider pve"),
            condition("InfrastructureReady", "True", "Ready", ""),
            condition("PowerState", "True", "Matches", ""),
            condition("Ready", "True", "Ready", ""),
        ]})),
    );
    let (class, image) = (class(), image(json!({"proxmox": {"templateID": 9000}})));
    let pve = ready_provider("pve");
    let good = machine(json!([condition("Ready", "True", "Ready", "")]));
    let facts = Facts {
        vm: &ready,
        class: Some(&class),
        image: Some(&image),
        provider: Some(&pve),
        providers: std::slice::from_ref(&pve),
        machine: Some(&good),
    };
    let diagnosis = diagnose(&facts);
    assert!(diagnosis.ready);
    assert_eq!(diagnosis.culprit(), None, "{:#?}", diagnosis.links);
    let report = crate::describe::render(&facts);
    assert!(report.contains("Ready: True"), "{report}");
    assert!(
        report.contains(
            "console: https://pve.example.com:8006/?console=kvm&novnc=1&vmid=104&node=node-1"
        ),
        "{report}"
    );

    let fresh = vm(json!({}), json!(null));
    let link = culprit(&Facts {
        vm: &fresh,
        machine: None,
        ..facts
    });
    assert_eq!(
        (link.subject.as_str(), link.reason.as_str()),
        ("VirtualMachine \"web-1\"", "NotReconciled")
    );
}

#[test]
fn describe_leads_with_the_culprit_and_its_hint() {
    let vm = vm(
        json!({}),
        json!({"phase": "Pending", "conditions": [
            condition("Scheduled", "False", "ClassNotFound", "VMClass \"small\" not found"),
            condition("Ready", "False", "NotScheduled", ""),
        ]}),
    );
    let image = image(json!({"proxmox": {"templateID": 9000}}));
    let report = crate::describe::render(&Facts {
        vm: &vm,
        class: None,
        image: Some(&image),
        provider: None,
        providers: &[],
        machine: None,
    });
    let lines: Vec<&str> = report.lines().collect();
    let why = lines
        .iter()
        .position(|l| l.starts_with("Why: "))
        .expect(&report);
    assert_eq!(lines[why - 1], "Ready: False (NotScheduled)");
    assert_eq!(
        lines[why],
        "Why: VMClass \"small\" is not OK: ClassNotFound: VMClass \"small\" not found"
    );
    assert!(
        lines[why + 1].starts_with("Hint: create VMClass \"small\""),
        "{report}"
    );
    assert!(report.contains("  NOT  VMClass \"small\""), "{report}");
    assert!(report.contains("Access:\n  none known"), "{report}");
}
