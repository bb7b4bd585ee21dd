//! The Proxmox VE backend end to end: banlieue's controllers against a real apiserver,
//! the backend against fakepve (PyPI, a PVE 9 API simulator run as a separate process
//! on loopback with TLS). Each test starts its own fakepve.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use banlieue_backend_proxmox::ProxmoxFactory;
use banlieue_backend_sim::SimFactory;
use banlieue_integration_tests::apply;
use banlieue_integration_tests::fakepve::FakePve;
use banlieue_integration_tests::operator::{Operator, wait_for, wait_gone};
use banlieue_sdk::api::common::{Firmware, PowerState, ProviderClass};
use banlieue_sdk::api::infra::proxmox::ProxmoxMachine;
use banlieue_sdk::api::resources::{ChangeMode, MachineField, ResourcesStatus};
use banlieue_sdk::api::{Provider, VMClass, VirtualMachine};
use banlieue_sdk::backend::{
    BackendFactory, BackendRegistry, Connection, MachineIdentity, MachineRequest, MachineSpec,
    SecretValue,
};
use banlieue_sdk::conditions;
use banlieue_testenv::TestNamespace;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(60);

#[derive(Clone, Copy, PartialEq, Eq)]
enum Auth {
    Token,
    Ticket,
    BadToken,
}

fn credentials(pve: &FakePve, auth: Auth) -> Value {
    let r = &pve.ready;
    match auth {
        Auth::Token => json!({"tokenID": r.token_id, "tokenSecret": r.token_secret}),
        Auth::BadToken => json!({"tokenID": r.token_id, "tokenSecret": "not-the-secret"}),
        Auth::Ticket => json!({"username": r.username, "password": r.password}),
    }
}

/// A namespace with fakepve, a Provider `pve` on it, a class, an image and the operator.
async fn world(prefix: &str, auth: Auth) -> Option<(TestNamespace, Operator, FakePve)> {
    let pve = FakePve::start()?;
    let ns = banlieue_testenv::namespace(prefix).await;
    let objects = [
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "pve-credentials"},
               "stringData": credentials(&pve, auth)}),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "Provider", "metadata": {"name": "pve"},
        "spec": {
            "class": "proxmox",
            "connection": {"endpoint": pve.ready.endpoint,
                           "credentialsRef": {"name": "pve-credentials"},
                           "caBundle": {"inline": pve.ready.ca_pem}},
            "capabilities": {
                "storageClasses": [{"name": "fast", "target": {"storage": "local-lvm"}}],
                "networkClasses": [{"name": "lan", "target": {"bridge": "vmbr0"}}]
            },
            "settings": {"taskPollInterval": "200ms", "shutdownTimeout": "5", "failedCloneBackoff": "3s"}
        }}),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMClass", "metadata": {"name": format!("{}-small", ns.name)},
               "spec": {"cpus": 2, "memoryMiB": 1024, "firmware": "bios", "disk": {"sizeGiB": 8, "storageClass": "fast"}}}),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMImage", "metadata": {"name": format!("{}-debian", ns.name)},
               "spec": {"os": {"family": "linux", "distribution": "debian", "version": "13"},
                        "sources": {"proxmox": {"templateID": pve.ready.template_id}}}}),
    ];
    for object in &objects {
        apply(&ns.client, &ns.name, object).await.expect("fixture");
    }
    let mut registry = BackendRegistry::default();
    registry.register(ProviderClass::Proxmox, Arc::new(ProxmoxFactory::new()));
    let operator = Operator::start_with_registry(
        ns.client.clone(),
        &ns.name,
        registry,
        Arc::new(SimFactory::new()),
        Duration::from_secs(5),
    );
    Some((ns, operator, pve))
}

fn vm(ns: &TestNamespace, name: &str) -> Value {
    json!({
        "apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine", "metadata": {"name": name},
        "spec": {"classRef": {"name": format!("{}-small", ns.name)},
                 "imageRef": {"name": format!("{}-debian", ns.name)},
                 "networks": [{"name": "eth0", "networkClass": "lan"}]}
    })
}

fn condition<'a>(
    list: &'a [k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition],
    type_: &str,
) -> Option<&'a k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    conditions::get(list, type_)
}

fn vm_conditions(
    vm: &VirtualMachine,
) -> &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition] {
    vm.status
        .as_ref()
        .map(|s| s.conditions.as_slice())
        .unwrap_or_default()
}

fn is_ready(vm: &VirtualMachine) -> bool {
    condition(vm_conditions(vm), "Ready").is_some_and(|c| c.status == "True")
}

/// True when a condition of the ProxmoxMachine names `reason` (as its reason, or in
/// its message for terminal failures) and its message contains `text`.
fn has_condition(machine: &ProxmoxMachine, reason: &str, text: &str) -> bool {
    machine.status.as_ref().is_some_and(|s| {
        s.conditions.iter().any(|c| {
            (c.reason == reason || c.message.starts_with(&format!("{reason}: ")))
                && c.message.contains(text)
        })
    })
}

fn machine_of(pve: &FakePve, name: &str) -> Option<Value> {
    pve.machines().into_iter().find(|m| m["name"] == name)
}

async fn set_power(vms: &Api<VirtualMachine>, name: &str, state: &str) {
    vms.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(&json!({"spec": {"powerState": state}})),
    )
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_virtual_machine_is_cloned_configured_started_powered_and_deleted() {
    let Some((ns, _operator, pve)) = world("pve-life", Auth::Token).await else {
        return;
    };
    let providers: Api<Provider> = ns.api();
    let provider = wait_for(&providers, "pve", WAIT, |p| {
        p.status
            .as_ref()
            .is_some_and(|s| conditions::is_true(&s.conditions, "Ready"))
    })
    .await;
    let status = provider.status.unwrap();
    assert_eq!(
        status.version.as_deref(),
        Some("Proxmox VE 9.0.10 (release 9.0)")
    );
    let names: Vec<&str> = status
        .failure_domains
        .iter()
        .map(|f| f.name.as_str())
        .collect();
    assert_eq!(names, ["pve1", "pve2"]);
    let pve1 = &status.failure_domains[0];
    assert_eq!(pve1.labels["topology.kubernetes.io/zone"], "pve1");
    assert_eq!(pve1.labels["banlieue.io/proxmox-cluster"], "fakecluster");
    assert_eq!(pve1.storage_classes, ["fast"]);
    assert_eq!(pve1.network_classes, ["lan"]);

    apply(&ns.client, &ns.name, &vm(&ns, "web-1"))
        .await
        .unwrap();
    let vms: Api<VirtualMachine> = ns.api();
    let ready = wait_for(&vms, "web-1", WAIT, |v| {
        is_ready(v) && v.status.as_ref().is_some_and(|s| !s.addresses.is_empty())
    })
    .await;
    let status = ready.status.as_ref().unwrap();
    let machine = machine_of(&pve, "web-1").expect("a VM on fakepve");
    let config = &machine["config"];
    let uid = config["smbios1"]
        .as_str()
        .unwrap()
        .trim_start_matches("uuid=")
        .to_string();
    assert_eq!(
        status.provider_id.as_deref(),
        Some(format!("proxmox://{uid}").as_str())
    );
    assert!(
        status
            .addresses
            .iter()
            .any(|a| a.address.starts_with("10.99.")),
        "{:?}",
        status.addresses
    );
    assert_eq!(machine["status"], "running");
    assert_eq!(config["cores"], "2");
    assert_eq!(config["memory"], "1024");
    assert_eq!(config["bios"], "seabios");
    assert_eq!(config["agent"], "1");
    assert_eq!(config["ipconfig0"], "ip=dhcp");
    assert!(
        config["net0"].as_str().unwrap().ends_with(",bridge=vmbr0"),
        "{config}"
    );
    assert!(
        config["tags"]
            .as_str()
            .unwrap()
            .contains(&format!("banlieue-{uid}")),
        "{config}"
    );
    assert!(
        config["description"]
            .as_str()
            .unwrap()
            .contains(&format!("banlieue.io/uid: {uid}"))
    );
    assert_eq!(pve.machines().len(), 1, "exactly one clone");

    set_power(&vms, "web-1", "PoweredOff").await;
    wait_for(&vms, "web-1", WAIT, |v| {
        v.status.as_ref().and_then(|s| s.power_state) == Some(PowerState::PoweredOff)
    })
    .await;
    assert_eq!(machine_of(&pve, "web-1").unwrap()["status"], "stopped");
    set_power(&vms, "web-1", "PoweredOn").await;
    wait_for(&vms, "web-1", WAIT, |v| {
        is_ready(v) && v.status.as_ref().and_then(|s| s.power_state) == Some(PowerState::PoweredOn)
    })
    .await;
    assert_eq!(machine_of(&pve, "web-1").unwrap()["status"], "running");

    vms.delete("web-1", &DeleteParams::default()).await.unwrap();
    wait_gone(&vms, "web-1", WAIT).await;
    assert!(machine_of(&pve, "web-1").is_none(), "{:?}", pve.machines());
    assert_eq!(pve.vms().len(), 1, "only the template is left");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ticket_auth_works_and_logs_in_again_when_tickets_are_revoked() {
    let Some((ns, _operator, pve)) = world("pve-ticket", Auth::Ticket).await else {
        return;
    };
    // With bootstrap data: the seed's multipart upload carries the ticket and CSRF token too.
    apply(
        &ns.client,
        &ns.name,
        &json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "boot"},
                "stringData": {"value": "#cloud-config\n{}\n"}}),
    )
    .await
    .unwrap();
    let mut object = vm(&ns, "db-1");
    object["spec"]["bootstrap"] = json!({"userData": {"name": "boot"}});
    apply(&ns.client, &ns.name, &object).await.unwrap();
    let vms: Api<VirtualMachine> = ns.api();
    wait_for(&vms, "db-1", WAIT, is_ready).await;
    assert!(
        machine_of(&pve, "db-1").unwrap()["config"]["ide2"]
            .as_str()
            .unwrap()
            .starts_with("local:iso/banlieue-"),
        "the seed is attached"
    );
    pve.revoke_tickets();
    set_power(&vms, "db-1", "PoweredOff").await;
    wait_for(&vms, "db-1", WAIT, |v| {
        v.status.as_ref().and_then(|s| s.power_state) == Some(PowerState::PoweredOff)
    })
    .await;
    assert_eq!(machine_of(&pve, "db-1").unwrap()["status"], "stopped");
    let (requests, _) = pve.requests(0);
    let logins = requests
        .iter()
        .filter(|(m, p)| m == "POST" && p.ends_with("/access/ticket"))
        .count();
    assert!(
        logins >= 2,
        "one login, and one after the revocation: {logins}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_token_makes_the_provider_unreachable_with_pves_message() {
    let Some((ns, _operator, _pve)) = world("pve-badtoken", Auth::BadToken).await else {
        return;
    };
    let providers: Api<Provider> = ns.api();
    let provider = wait_for(&providers, "pve", WAIT, |p| {
        p.status.as_ref().is_some_and(|s| {
            condition(&s.conditions, "Reachable").is_some_and(|c| c.status == "False")
        })
    })
    .await;
    let status = provider.status.unwrap();
    let reachable = condition(&status.conditions, "Reachable").unwrap();
    assert_eq!(reachable.reason, "Unauthorized");
    assert!(
        reachable.message.contains("authentication failure"),
        "{}",
        reachable.message
    );
    assert!(!reachable.message.contains("not-the-secret"));
}

/// Machines reuse the Provider's connection rather than reading its Secret on every
/// reconcile; a change of the Secret (seen through the watch) must still reach them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_credentials_secret_reaches_the_machines() {
    let Some((ns, _operator, pve)) = world("pve-rotate", Auth::BadToken).await else {
        return;
    };
    let providers: Api<Provider> = ns.api();
    let vms: Api<VirtualMachine> = ns.api();
    let machines: Api<ProxmoxMachine> = ns.api();
    let reachable_is = |status: &'static str| {
        move |p: &Provider| {
            p.status.as_ref().is_some_and(|s| {
                condition(&s.conditions, "Reachable").is_some_and(|c| c.status == status)
            })
        }
    };
    wait_for(&providers, "pve", WAIT, reachable_is("False")).await;

    // Fixed: the Provider reconnects and a VM is made with the new token.
    let secret = |auth| {
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "pve-credentials"},
               "stringData": credentials(&pve, auth)})
    };
    apply(&ns.client, &ns.name, &secret(Auth::Token))
        .await
        .unwrap();
    wait_for(&providers, "pve", WAIT, reachable_is("True")).await;
    apply(&ns.client, &ns.name, &vm(&ns, "app-1"))
        .await
        .unwrap();
    wait_for(&vms, "app-1", WAIT, is_ready).await;

    // Broken again: the next machine reconcile uses the token now in the Secret, not
    // the connection it was first given.
    apply(&ns.client, &ns.name, &secret(Auth::BadToken))
        .await
        .unwrap();
    wait_for(&providers, "pve", WAIT, reachable_is("False")).await;
    set_power(&vms, "app-1", "PoweredOff").await;
    wait_for(&machines, "app-1", WAIT, |m| {
        has_condition(m, "Unauthorized", "authentication failure")
    })
    .await;
    assert_eq!(
        machine_of(&pve, "app-1").unwrap()["status"],
        "running",
        "nothing was done with the old token"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_clone_and_a_lock_timeout_become_conditions_and_recover() {
    let Some((ns, _operator, pve)) = world("pve-faults", Auth::Token).await else {
        return;
    };
    pve.fail_next_clone("clone failed: storage 'local-lvm' is full");
    apply(&ns.client, &ns.name, &vm(&ns, "app-1"))
        .await
        .unwrap();
    let vms: Api<VirtualMachine> = ns.api();
    let machines: Api<ProxmoxMachine> = ns.api();
    wait_for(&machines, "app-1", WAIT, |m| {
        has_condition(m, "CloneFailed", "is full")
    })
    .await;
    // Reported for failedCloneBackoff (3 s here), then retried; the fault was one-shot.
    let ready = wait_for(&vms, "app-1", WAIT, is_ready).await;
    assert!(ready.status.as_ref().unwrap().provider_id.is_some());
    assert_eq!(pve.machines().len(), 1);

    // Another task holds the config lock: the shutdown task times out on it.
    let vmid = machine_of(&pve, "app-1").unwrap()["vmid"].as_u64().unwrap();
    pve.hold_config_lock(vmid, None);
    set_power(&vms, "app-1", "PoweredOff").await;
    wait_for(&machines, "app-1", WAIT, |m| {
        has_condition(m, "VMLocked", "got timeout")
    })
    .await;
    pve.release_config_lock(vmid);
    wait_for(&vms, "app-1", WAIT, |v| {
        v.status.as_ref().and_then(|s| s.power_state) == Some(PowerState::PoweredOff)
    })
    .await;

    // A backup lock: the power-on waits for it.
    pve.lock(vmid, "backup");
    set_power(&vms, "app-1", "PoweredOn").await;
    wait_for(&machines, "app-1", WAIT, |m| {
        has_condition(m, "VMLocked", "locked (backup)")
    })
    .await;
    pve.unlock(vmid);
    wait_for(&vms, "app-1", WAIT, |v| {
        is_ready(v) && v.status.as_ref().and_then(|s| s.power_state) == Some(PowerState::PoweredOn)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transient_server_errors_are_retried_and_converge() {
    let Some((ns, _operator, pve)) = world("pve-500", Auth::Token).await else {
        return;
    };
    pve.fail(
        "GET",
        "/cluster/resources",
        500,
        "proxy: upstream unavailable",
        Some(4),
    );
    pve.fail("POST", "/status/start", 503, "service unavailable", Some(2));
    apply(&ns.client, &ns.name, &vm(&ns, "api-1"))
        .await
        .unwrap();
    let vms: Api<VirtualMachine> = ns.api();
    wait_for(&vms, "api-1", WAIT, is_ready).await;
    assert_eq!(pve.machines().len(), 1, "retries never clone twice");
    assert_eq!(machine_of(&pve, "api-1").unwrap()["status"], "running");
}

fn connection(pve: &FakePve) -> Connection {
    Connection {
        class: ProviderClass::Proxmox,
        endpoint: pve.ready.endpoint.clone(),
        credentials: [
            (
                "tokenID".to_string(),
                SecretValue::new(pve.ready.token_id.clone()),
            ),
            (
                "tokenSecret".to_string(),
                SecretValue::new(pve.ready.token_secret.clone()),
            ),
        ]
        .into(),
        ca_bundle: Some(pve.ready.ca_pem.clone()),
        insecure_skip_tls_verify: false,
        settings: [("taskPollInterval".to_string(), "100ms".to_string())].into(),
    }
}

fn request(uid: &str, template: u32) -> MachineRequest {
    let spec = serde_json::from_value(json!({
        "templateID": template, "cores": 1, "memoryMiB": 512, "network": [{"bridge": "vmbr0"}]
    }))
    .unwrap();
    MachineRequest {
        identity: MachineIdentity {
            uid: uid.into(),
            namespace: "race".into(),
            name: format!("m-{}", &uid[..8]),
            provider_id: None,
        },
        spec: MachineSpec::Proxmox(spec),
        failure_domain: Some("pve1".into()),
        bootstrap: None,
        instance_id: None,
        disks_imported: false,
    }
}

/// Two operators (two backends, no shared lock) and one operator with many machines
/// create at once: every VM gets its own VMID, and each UID exactly one VM.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn machines_created_at_once_never_share_a_vmid() {
    let Some(pve) = FakePve::start() else { return };
    let factory = ProxmoxFactory::new();
    let a = factory.connect(&connection(&pve)).unwrap();
    let b = factory.connect(&connection(&pve)).unwrap();
    let uids: Vec<String> = (0..6)
        .map(|i| format!("{i:08x}-0000-4000-8000-00000000000{i}"))
        .collect();
    let mut handles = Vec::new();
    for (i, uid) in uids.iter().enumerate() {
        let backend = if i % 2 == 0 { a.clone() } else { b.clone() };
        let req = request(uid, pve.ready.template_id);
        handles.push(tokio::spawn(async move {
            for _ in 0..200 {
                match backend.ensure(&req).await {
                    Ok(o) if o.settled_at(PowerState::PoweredOn) => return o,
                    Ok(_) => {}
                    Err(e) if e.is_transient() => {}
                    Err(e) => panic!("{e}"),
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            panic!("machine did not settle")
        }));
    }
    let mut refs = BTreeSet::new();
    for handle in handles {
        let observation = handle.await.unwrap();
        assert!(
            refs.insert(observation.backend_ref.clone().unwrap()),
            "{refs:?}"
        );
    }
    let machines = pve.machines();
    assert_eq!(machines.len(), uids.len(), "{machines:?}");
    let vmids: BTreeSet<u64> = machines
        .iter()
        .map(|m| m["vmid"].as_u64().unwrap())
        .collect();
    assert_eq!(vmids.len(), uids.len());
    for uid in &uids {
        let with_uid = machines
            .iter()
            .filter(|m| {
                m["config"]["tags"]
                    .as_str()
                    .unwrap_or_default()
                    .contains(uid.as_str())
            })
            .count();
        assert_eq!(with_uid, 1, "{uid}");
        let d = a.delete(&request(uid, 0).identity).await.unwrap();
        let _ = d;
    }
}

/// The bootstrap data travels whole on a NoCloud ISO uploaded to an `iso` storage of
/// the VM's node and attached as a CD-ROM in place of PVE's cloud-init drive; it is
/// deleted with the VM and never shows in the objects' status.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bootstrap_data_travels_on_a_nocloud_iso_deleted_with_the_vm() {
    let Some((ns, _operator, pve)) = world("pve-seed", Auth::Token).await else {
        return;
    };
    let user_data = "#cloud-config\nssh_authorized_keys: [\"ssh-ed25519 AAAA me@host\"]\nruncmd: [\"kubeadm join --token s3cr3t-join-token\"]\n";
    apply(
        &ns.client,
        &ns.name,
        &json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "boot"},
                "stringData": {"value": user_data}}),
    )
    .await
    .unwrap();
    let mut object = vm(&ns, "seeded-1");
    object["spec"]["bootstrap"] = json!({"userData": {"name": "boot"}});
    apply(&ns.client, &ns.name, &object).await.unwrap();
    let vms: Api<VirtualMachine> = ns.api();
    wait_for(&vms, "seeded-1", WAIT, is_ready).await;

    let machine = machine_of(&pve, "seeded-1").expect("a VM on fakepve");
    let config = &machine["config"];
    let uid = config["smbios1"]
        .as_str()
        .unwrap()
        .trim_start_matches("uuid=")
        .to_string();
    let name = format!("banlieue-{uid}-seed.iso");
    // The template's cloud-init drive (ide2) now holds the seed.
    assert_eq!(
        config["ide2"],
        format!("local:iso/{name},media=cdrom"),
        "{config}"
    );
    assert!(config.get("sshkeys").is_none(), "{config}");
    let uploads = pve.uploads();
    let (storage, content, image) = uploads.get(&name).expect("the seed was uploaded");
    assert_eq!((storage.as_str(), content.as_str()), ("local", "iso"));
    let seed = banlieue_backend_proxmox::seed::read(image).expect("an ISO 9660 image");
    assert_eq!(seed.label, "cidata");
    let file = |n: &str| {
        seed.files
            .iter()
            .find(|(f, _)| f == n)
            .map(|(_, d)| String::from_utf8(d.clone()).unwrap())
            .unwrap_or_else(|| panic!("{n} missing from {:?}", seed.files))
    };
    assert_eq!(file("user-data"), user_data);
    assert!(file("meta-data").contains(&format!("instance-id: \"{uid}\"")));
    let mac = config["net0"]
        .as_str()
        .unwrap()
        .split([',', '='])
        .nth(1)
        .unwrap();
    assert!(
        file("network-config").contains(&format!("macaddress: \"{}\"", mac.to_ascii_lowercase())),
        "{}",
        file("network-config")
    );
    assert!(pve.isos()["local"].contains(&name));

    // Bootstrap data never shows in status (nor, through it, in errors).
    let machines: Api<ProxmoxMachine> = ns.api();
    let status = serde_json::to_string(&machines.get("seeded-1").await.unwrap().status).unwrap();
    assert!(!status.contains("s3cr3t"), "{status}");

    vms.delete("seeded-1", &DeleteParams::default())
        .await
        .unwrap();
    wait_gone(&vms, "seeded-1", WAIT).await;
    assert!(machine_of(&pve, "seeded-1").is_none());
    assert!(!pve.isos()["local"].contains(&name), "{:?}", pve.isos());
}

async fn settle(
    backend: &dyn banlieue_sdk::backend::Backend,
    req: &MachineRequest,
    done: impl Fn(&banlieue_sdk::backend::MachineObservation) -> bool,
) -> banlieue_sdk::backend::MachineObservation {
    for _ in 0..300 {
        match backend.ensure(req).await {
            Ok(o) if done(&o) => return o,
            Ok(_) => {}
            Err(e) if e.is_transient() => {}
            Err(e) => panic!("{e}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the machine did not get there")
}

fn with_spec(mut req: MachineRequest, patch: Value) -> MachineRequest {
    let MachineSpec::Proxmox(spec) = &req.spec else {
        unreachable!()
    };
    let mut value = serde_json::to_value(spec).unwrap();
    for (k, v) in patch.as_object().unwrap() {
        value[k] = v.clone();
    }
    req.spec = MachineSpec::Proxmox(serde_json::from_value(value).unwrap());
    req
}

fn resources_of(vm: &VirtualMachine) -> ResourcesStatus {
    vm.status
        .as_ref()
        .and_then(|s| s.resources.clone())
        .unwrap_or_default()
}

/// The status and reason of a VM's condition `type_`.
fn said(vm: &VirtualMachine, type_: &str) -> Option<(String, String, String)> {
    condition(vm_conditions(vm), type_)
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

fn up_to_date(vm: &VirtualMachine) -> bool {
    said(vm, "UpToDate").is_some_and(|(s, _, _)| s == "True")
}

async fn patch_class(ns: &TestNamespace, mut spec: Value) {
    // A class edit reaches the VMs using it only when the class says so.
    spec["updatePolicy"] = json!("Apply");
    let classes: Api<VMClass> = Api::all(ns.client.clone());
    classes
        .patch(
            &format!("{}-small", ns.name),
            &PatchParams::default(),
            &Patch::Merge(&json!({ "spec": spec })),
        )
        .await
        .unwrap();
}

/// The requests that wrote something, as `METHOD path`, from index `since`.
fn writes(pve: &FakePve, since: usize) -> Vec<String> {
    pve.requests(since)
        .0
        .into_iter()
        .filter(|(m, _)| m != "GET")
        .map(|(m, p)| format!("{m} {}", p.split("/api2/json").last().unwrap_or_default()))
        .collect()
}

/// The VM on fakepve named `name`: (its vmid, config, pending config).
fn on_pve(pve: &FakePve, name: &str) -> (u64, Value, Value) {
    let vm = machine_of(pve, name).expect("the VM on fakepve");
    (
        vm["vmid"].as_u64().unwrap(),
        vm["config"].clone(),
        vm["pending"].clone(),
    )
}

/// A CPU and memory edit of a running VM (its class) and a data disk added to it:
/// PVE keeps them pending. The VM stays `Ready`, says `RestartRequired=True` naming
/// each field, lists each in `status.resources.pending` waiting for `NextBoot`, and
/// fakepve's pending config has the values, written once. A power cycle (spec
/// `powerState` PoweredOff, then PoweredOn) applies them: fakepve's config has them
/// and the VM is `UpToDate`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cpu_memory_and_disk_edit_waits_for_a_power_cycle_which_applies_it() {
    let Some((ns, _operator, pve)) = world("pve-change", Auth::Token).await else {
        return;
    };
    apply(&ns.client, &ns.name, &vm(&ns, "chg-1"))
        .await
        .unwrap();
    let vms: Api<VirtualMachine> = ns.api();
    let ready = wait_for(&vms, "chg-1", WAIT, |v| is_ready(v) && up_to_date(v)).await;
    let running = resources_of(&ready).running.expect("resources read back");
    assert_eq!(
        (running.cpus, running.cores_per_socket, running.memory_mib),
        (2, Some(2), 1024)
    );
    assert_eq!((running.os_disk_gib, running.networks), (Some(8), 1));
    assert_eq!(running.firmware, Some(Firmware::Bios));
    assert_eq!(
        said(&ready, "RestartRequired").map(|c| c.0).as_deref(),
        Some("False")
    );
    let (vmid, _, _) = on_pve(&pve, "chg-1");

    let (_, mark) = pve.requests(0);
    patch_class(&ns, json!({"cpus": 4, "memoryMiB": 2048})).await;
    vms.patch(
        "chg-1",
        &PatchParams::default(),
        &Patch::Merge(&json!({"spec": {"disks": [{"name": "extra", "sizeGiB": 1}]}})),
    )
    .await
    .unwrap();
    let waiting = wait_for(&vms, "chg-1", WAIT, |v| {
        said(v, "RestartRequired").is_some_and(|(s, _, m)| {
            s == "True"
                && m.contains("cpus 2 → 4")
                && m.contains("memoryMiB")
                && m.contains("dataDisks")
        })
    })
    .await;
    let (_, reason, message) = said(&waiting, "UpToDate").unwrap();
    assert_eq!(reason, "RestartRequired", "{message}");
    assert!(
        is_ready(&waiting),
        "still Ready: {:?}",
        vm_conditions(&waiting)
    );
    let pending: Vec<(MachineField, ChangeMode)> = resources_of(&waiting)
        .pending
        .iter()
        .map(|p| (p.field, p.waits_for))
        .collect();
    assert_eq!(
        pending,
        [
            (MachineField::Cpus, ChangeMode::NextBoot),
            (MachineField::CoresPerSocket, ChangeMode::NextBoot),
            (MachineField::MemoryMib, ChangeMode::NextBoot),
            (MachineField::DataDisks, ChangeMode::NextBoot),
        ]
    );
    let running = resources_of(&waiting).running.unwrap();
    assert_eq!(
        (running.cpus, running.memory_mib),
        (2, 1024),
        "runs as before"
    );
    let (_, config, pending) = on_pve(&pve, "chg-1");
    assert_eq!(
        (pending["cores"].as_str(), pending["memory"].as_str()),
        (Some("4"), Some("2048")),
        "{pending}"
    );
    assert!(
        pending["scsi1"]
            .as_str()
            .is_some_and(|d| d.contains("size=1G")),
        "the added disk is allocated and pending: {pending}"
    );
    assert_eq!(
        (config["cores"].as_str(), config["memory"].as_str()),
        (Some("2"), Some("1024"))
    );
    // Let several reconciles pass: what is pending counts as written.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let wrote = writes(&pve, mark);
    let configs = wrote
        .iter()
        .filter(|w| w.starts_with("PUT") && w.ends_with("/config"))
        .count();
    eprintln!("writes for the edit while running: {wrote:?}");
    assert!(
        (1..=2).contains(&configs) && wrote.iter().all(|w| w.ends_with("/config")),
        "one PUT config per edit (class, then disk), nothing else: {wrote:?}"
    );

    // The power cycle.
    let (_, mark) = pve.requests(0);
    set_power(&vms, "chg-1", "PoweredOff").await;
    wait_for(&vms, "chg-1", WAIT, |v| {
        v.status.as_ref().and_then(|s| s.power_state) == Some(PowerState::PoweredOff)
    })
    .await;
    set_power(&vms, "chg-1", "PoweredOn").await;
    let applied = wait_for(&vms, "chg-1", WAIT, |v| {
        is_ready(v)
            && up_to_date(v)
            && v.status.as_ref().and_then(|s| s.power_state) == Some(PowerState::PoweredOn)
    })
    .await;
    eprintln!("writes for the power cycle: {:?}", writes(&pve, mark));
    let running = resources_of(&applied).running.unwrap();
    assert_eq!(
        (running.cpus, running.cores_per_socket, running.memory_mib),
        (4, Some(4), 2048)
    );
    assert_eq!(
        running
            .data_disks
            .iter()
            .map(|d| (d.name.as_str(), d.size_gib))
            .collect::<Vec<_>>(),
        [("extra", 1)]
    );
    assert!(resources_of(&applied).pending.is_empty());
    assert_eq!(
        said(&applied, "RestartRequired").map(|c| c.0).as_deref(),
        Some("False")
    );
    let (same, config, pending) = on_pve(&pve, "chg-1");
    assert_eq!(same, vmid, "the same VM");
    assert_eq!(
        (config["cores"].as_str(), config["memory"].as_str()),
        (Some("4"), Some("2048")),
        "{config}"
    );
    assert!(
        config["scsi1"]
            .as_str()
            .is_some_and(|d| d.contains("size=1G")),
        "{config}"
    );
    assert!(pending.as_object().unwrap().is_empty(), "{pending}");
}

/// Disks grow live: the class's OS disk and the VM's data disk are grown with
/// `PUT …/resize` on the running VM, read back from fakepve, and the VM is
/// `UpToDate` without a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disks_grow_live_with_resize() {
    let Some((ns, _operator, pve)) = world("pve-grow", Auth::Token).await else {
        return;
    };
    let mut object = vm(&ns, "grow-1");
    object["spec"]["disks"] = json!([{"name": "data", "sizeGiB": 2}]);
    apply(&ns.client, &ns.name, &object).await.unwrap();
    let vms: Api<VirtualMachine> = ns.api();
    let ready = wait_for(&vms, "grow-1", WAIT, |v| is_ready(v) && up_to_date(v)).await;
    let running = resources_of(&ready).running.unwrap();
    assert_eq!(running.os_disk_gib, Some(8));
    assert_eq!(running.data_disks[0].size_gib, 2);
    let (vmid, _, _) = on_pve(&pve, "grow-1");

    let (_, mark) = pve.requests(0);
    patch_class(
        &ns,
        json!({"disk": {"sizeGiB": 12, "storageClass": "fast"}}),
    )
    .await;
    object["spec"]["disks"] = json!([{"name": "data", "sizeGiB": 4}]);
    apply(&ns.client, &ns.name, &object).await.unwrap();
    let grown = wait_for(&vms, "grow-1", WAIT, |v| {
        let running = resources_of(v).running.unwrap_or_default();
        up_to_date(v)
            && running.os_disk_gib == Some(12)
            && running.data_disks.first().map(|d| d.size_gib) == Some(4)
    })
    .await;
    assert!(is_ready(&grown));
    assert_eq!(
        said(&grown, "RestartRequired").map(|c| c.0).as_deref(),
        Some("False")
    );
    let (same, config, pending) = on_pve(&pve, "grow-1");
    assert_eq!(same, vmid);
    assert!(
        config["scsi0"].as_str().unwrap().contains("size=12G"),
        "{config}"
    );
    assert!(
        config["scsi1"].as_str().unwrap().contains("size=4G"),
        "{config}"
    );
    assert!(
        pending.as_object().unwrap().is_empty(),
        "nothing waits: {pending}"
    );
    assert_eq!(
        machine_of(&pve, "grow-1").unwrap()["status"],
        "running",
        "never restarted"
    );
    let wrote = writes(&pve, mark);
    eprintln!("writes for the grow: {wrote:?}");
    let resizes = wrote.iter().filter(|w| w.ends_with("/resize")).count();
    assert_eq!(resizes, 2, "one resize per disk: {wrote:?}");
    assert!(
        wrote.iter().all(|w| w.ends_with("/resize")),
        "nothing but the resizes: {wrote:?}"
    );
}

/// A hostile edit: the class's firmware changes (Never on Proxmox). The machine says
/// `UpToDate=False ChangeRefused` naming the field; nothing is written to PVE, the VM
/// keeps running as it was (same VMID, same firmware) and stays `Ready`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_firmware_change_is_refused_and_nothing_is_lost() {
    let Some((ns, _operator, pve)) = world("pve-never", Auth::Token).await else {
        return;
    };
    apply(&ns.client, &ns.name, &vm(&ns, "fw-1")).await.unwrap();
    let vms: Api<VirtualMachine> = ns.api();
    wait_for(&vms, "fw-1", WAIT, |v| is_ready(v) && up_to_date(v)).await;
    let (vmid, before, _) = on_pve(&pve, "fw-1");

    let (_, mark) = pve.requests(0);
    patch_class(&ns, json!({"firmware": "efi"})).await;
    let machines: Api<ProxmoxMachine> = ns.api();
    let refused = wait_for(&machines, "fw-1", WAIT, |m| {
        m.status.as_ref().is_some_and(|s| {
            conditions::get(&s.conditions, "UpToDate").is_some_and(|c| {
                c.status == "False"
                    && c.reason == "ChangeRefused"
                    && c.message.contains("firmware bios → efi")
            })
        })
    })
    .await;
    let pending = &refused
        .status
        .as_ref()
        .unwrap()
        .resources
        .as_ref()
        .unwrap()
        .pending;
    assert_eq!(pending.len(), 1, "{pending:?}");
    assert_eq!(
        (pending[0].field, pending[0].waits_for),
        (MachineField::Firmware, ChangeMode::Never)
    );
    let vm = wait_for(&vms, "fw-1", WAIT, |v| {
        said(v, "UpToDate").is_some_and(|(_, r, _)| r == "ChangeRefused")
    })
    .await;
    assert!(is_ready(&vm), "still Ready: {:?}", vm_conditions(&vm));
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(writes(&pve, mark), Vec::<String>::new(), "nothing written");
    let (same, after, pending) = on_pve(&pve, "fw-1");
    assert_eq!(same, vmid, "the same VM");
    assert_eq!(after, before, "its config is untouched");
    assert!(pending.as_object().unwrap().is_empty());
    assert_eq!(machine_of(&pve, "fw-1").unwrap()["status"], "running");

    // Asked back, the machine is up to date again.
    patch_class(&ns, json!({"firmware": "bios"})).await;
    wait_for(&vms, "fw-1", WAIT, up_to_date).await;
}

/// A change while PVE refuses writes (lost quorum): the machine says
/// `UpToDate=False ChangeFailed` naming the field and PVE's reason, stays `Ready`, and
/// nothing is changed; once quorate again the change is written and waits for the
/// next boot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_without_quorum_fails_clearly_and_is_written_once_healed() {
    let Some((ns, _operator, pve)) = world("pve-noquorum", Auth::Token).await else {
        return;
    };
    apply(&ns.client, &ns.name, &vm(&ns, "nq-1")).await.unwrap();
    let vms: Api<VirtualMachine> = ns.api();
    wait_for(&vms, "nq-1", WAIT, |v| is_ready(v) && up_to_date(v)).await;
    let (vmid, before, _) = on_pve(&pve, "nq-1");

    pve.quorum(false);
    patch_class(&ns, json!({"memoryMiB": 2048})).await;
    let failed = wait_for(&vms, "nq-1", WAIT, |v| {
        said(v, "UpToDate").is_some_and(|(s, r, m)| {
            s == "False" && r == "ChangeFailed" && m.starts_with("NoQuorum: changing memoryMiB")
        })
    })
    .await;
    assert!(
        is_ready(&failed),
        "still Ready: {:?}",
        vm_conditions(&failed)
    );
    let (same, after, pending) = on_pve(&pve, "nq-1");
    assert_eq!((same, &after), (vmid, &before), "nothing changed");
    assert!(pending.as_object().unwrap().is_empty(), "{pending}");

    pve.quorum(true);
    let waiting = wait_for(&vms, "nq-1", WAIT, |v| {
        said(v, "RestartRequired")
            .is_some_and(|(s, _, m)| s == "True" && m.contains("memoryMiB 1024 → 2048"))
    })
    .await;
    assert!(is_ready(&waiting));
    assert_eq!(on_pve(&pve, "nq-1").2["memory"], "2048");
}

/// What `apply_changes` costs in PVE requests, row by row, on the backend alone:
/// `ensure` no longer writes a spec change; CPUs, memory (a shrink too) and an added
/// disk are one `PUT …/config` (pending while it runs); disks grow with
/// `PUT …/resize`; asked again, nothing is written; a stopped VM takes what waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apply_changes_writes_each_row_once_and_reads_it_back() {
    use banlieue_sdk::changes::assess;
    let Some(pve) = FakePve::start() else { return };
    let backend = ProxmoxFactory::new().connect(&connection(&pve)).unwrap();
    let table = backend.capabilities().changes;
    let uid = "0d9a5c3e-1111-4000-8000-000000000001";
    let first = request(uid, pve.ready.template_id);
    let seen = settle(&*backend, &first, |o| o.settled_at(PowerState::PoweredOn)).await;
    let running = seen.resources.clone().expect("resources read back");
    assert_eq!(
        (running.cpus, running.memory_mib, running.os_disk_gib),
        (1, 512, Some(4))
    );
    assert!(seen.next_boot.is_none());

    let changed = with_spec(
        first.clone(),
        json!({"cores": 2, "memoryMiB": 1024, "diskGiB": 10,
               "additionalDisks": [{"name": "data", "sizeGiB": 5, "storage": "local-lvm"}]}),
    );
    // `ensure` reads, and writes nothing.
    let (_, mark) = pve.requests(0);
    let seen = backend.ensure(&changed).await.unwrap();
    assert!(writes(&pve, mark).is_empty(), "{:?}", writes(&pve, mark));
    let desired = changed.spec.resources();
    let a = assess(
        &desired,
        seen.resources.as_ref().unwrap(),
        seen.next_boot.as_ref(),
        &table,
        seen.power_state,
    );
    assert_eq!(
        a.apply,
        [
            MachineField::Cpus,
            MachineField::CoresPerSocket,
            MachineField::MemoryMib,
            MachineField::OsDiskSize,
            MachineField::DataDisks
        ]
    );

    let (_, mark) = pve.requests(0);
    let after = backend.apply_changes(&changed, &a.apply).await.unwrap();
    let (calls, _) = pve.requests(mark);
    eprintln!(
        "apply_changes (CPUs, memory, a disk added, the OS disk grown), {} PVE requests: {calls:?}",
        calls.len()
    );
    assert_eq!(
        writes(&pve, mark)
            .iter()
            .map(|w| w.rsplit('/').next().unwrap().to_string())
            .collect::<Vec<_>>(),
        ["config", "resize"]
    );
    assert!(after.pending.is_none());
    let running = after.resources.clone().unwrap();
    assert_eq!(running.os_disk_gib, Some(10), "grown live");
    assert_eq!(
        (running.cpus, running.memory_mib),
        (1, 512),
        "the rest waits"
    );
    let next = after.next_boot.clone().expect("the next start differs");
    assert_eq!(
        (next.cpus, next.memory_mib, next.data_disks.len()),
        (2, 1024, 1)
    );
    let (_, config, pending) = on_pve(&pve, "m-0d9a5c3e");
    assert!(
        config["scsi0"].as_str().unwrap().contains("size=10G"),
        "{config}"
    );
    assert_eq!(
        (pending["cores"].as_str(), pending["memory"].as_str()),
        (Some("2"), Some("1024"))
    );
    let a = assess(&desired, &running, Some(&next), &table, after.power_state);
    assert!(
        a.apply.is_empty(),
        "written: nothing to hand over again: {:?}",
        a.apply
    );
    assert!(a.restart_required());

    // Asked again: idempotent, nothing written.
    let (_, mark) = pve.requests(0);
    let fields = [
        MachineField::Cpus,
        MachineField::MemoryMib,
        MachineField::DataDisks,
        MachineField::OsDiskSize,
    ];
    backend.apply_changes(&changed, &fields).await.unwrap();
    let (calls, _) = pve.requests(mark);
    eprintln!(
        "apply_changes with nothing left to write, {} PVE requests: {calls:?}",
        calls.len()
    );
    assert!(writes(&pve, mark).is_empty(), "{:?}", writes(&pve, mark));

    // A memory shrink waits for the next boot too.
    let smaller = with_spec(changed.clone(), json!({"memoryMiB": 768}));
    let (_, mark) = pve.requests(0);
    let after = backend
        .apply_changes(&smaller, &[MachineField::MemoryMib])
        .await
        .unwrap();
    let (calls, _) = pve.requests(mark);
    eprintln!(
        "apply_changes (memory, NextBoot), {} PVE requests: {calls:?}",
        calls.len()
    );
    // Find it, its power, its config and pending config, the write, the read-back,
    // its addresses: one write, at most six requests.
    assert_eq!(writes(&pve, mark).len(), 1);
    assert!(calls.len() <= 6, "{calls:?}");
    assert_eq!(after.next_boot.unwrap().memory_mib, 768);
    assert_eq!(on_pve(&pve, "m-0d9a5c3e").2["memory"], "768");

    // Stopped (the power cycle's first half), it takes what waits at once.
    let off = with_spec(smaller.clone(), json!({"powerState": "PoweredOff"}));
    let stopped = settle(&*backend, &off, |o| o.settled_at(PowerState::PoweredOff)).await;
    let desired = off.spec.resources();
    let a = assess(
        &desired,
        stopped.resources.as_ref().unwrap(),
        stopped.next_boot.as_ref(),
        &table,
        stopped.power_state,
    );
    let after = backend.apply_changes(&off, &a.apply).await.unwrap();
    let running = after.resources.unwrap();
    assert_eq!(
        (running.cpus, running.memory_mib, running.data_disks.len()),
        (2, 768, 1),
        "{:?}",
        a.apply
    );
    assert!(after.next_boot.is_none());
    let (_, config, pending) = on_pve(&pve, "m-0d9a5c3e");
    assert!(pending.as_object().unwrap().is_empty(), "{pending}");
    let disk = config["scsi1"].as_str().unwrap().to_string();
    assert!(
        disk.contains("size=5G"),
        "the pending disk kept its volume: {disk}"
    );

    // Running again, the data disk grows live.
    let on = settle(&*backend, &smaller, |o| o.settled_at(PowerState::PoweredOn)).await;
    assert!(on.next_boot.is_none());
    let bigger = with_spec(
        smaller.clone(),
        json!({"additionalDisks": [{"name": "data", "sizeGiB": 7, "storage": "local-lvm"}]}),
    );
    let (_, mark) = pve.requests(0);
    let after = backend
        .apply_changes(&bigger, &[MachineField::DataDiskSize])
        .await
        .unwrap();
    let (calls, _) = pve.requests(mark);
    eprintln!(
        "apply_changes (a data disk grown), {} PVE requests: {calls:?}",
        calls.len()
    );
    assert_eq!(after.resources.unwrap().data_disks[0].size_gib, 7);
    assert!(
        on_pve(&pve, "m-0d9a5c3e").1["scsi1"]
            .as_str()
            .unwrap()
            .contains("size=7G")
    );
}

/// Lost quorum: PVE refuses writes; the machine says `NoQuorum` (transient), the
/// operator retries with a growing backoff, and the machine converges once the
/// cluster is quorate again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_quorum_is_a_transient_condition_retried_with_backoff_until_healed() {
    let Some((ns, _operator, pve)) = world("pve-quorum", Auth::Token).await else {
        return;
    };
    let providers: Api<Provider> = ns.api();
    wait_for(&providers, "pve", WAIT, |p| {
        p.status
            .as_ref()
            .is_some_and(|s| conditions::is_true(&s.conditions, "Ready"))
    })
    .await;
    pve.quorum(false);
    let (_, mark) = pve.requests(0);
    apply(&ns.client, &ns.name, &vm(&ns, "q-1")).await.unwrap();
    let machines: Api<ProxmoxMachine> = ns.api();
    wait_for(&machines, "q-1", WAIT, |m| {
        has_condition(m, "NoQuorum", "no quorum")
    })
    .await;
    tokio::time::sleep(Duration::from_secs(6)).await;
    let clones = |from: usize| {
        pve.requests(from)
            .0
            .iter()
            .filter(|(m, p)| m == "POST" && p.ends_with("/clone"))
            .count()
    };
    let attempts = clones(mark);
    // Backoff 1 s, 2 s, 4 s, ... (+ jitter): a handful in ~7 s, not a tight loop.
    assert!(
        (2..=8).contains(&attempts),
        "{attempts} clone attempts while without quorum"
    );
    assert!(pve.machines().is_empty());
    let machine = machines.get("q-1").await.unwrap();
    let ready = condition(&machine.status.as_ref().unwrap().conditions, "Ready").unwrap();
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("False", "NoQuorum")
    );

    pve.quorum(true);
    let vms: Api<VirtualMachine> = ns.api();
    wait_for(&vms, "q-1", WAIT, is_ready).await;
    assert_eq!(pve.machines().len(), 1, "one clone once healed");
}

/// An image with only `sources.proxmox.volume` is refused with a clear message: the
/// backend clones templates only (fakepve has no `import-from` to test an import).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_volume_image_is_refused_clearly() {
    let Some((ns, _operator, pve)) = world("pve-volume", Auth::Token).await else {
        return;
    };
    apply(
        &ns.client,
        &ns.name,
        &json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMImage",
                "metadata": {"name": format!("{}-volume", ns.name)},
                "spec": {"os": {"family": "linux", "distribution": "ubuntu", "version": "24.04"},
                         "sources": {"proxmox": {"volume": "local:import/noble.qcow2"}}}}),
    )
    .await
    .unwrap();
    let mut object = vm(&ns, "vol-1");
    object["spec"]["imageRef"]["name"] = json!(format!("{}-volume", ns.name));
    apply(&ns.client, &ns.name, &object).await.unwrap();
    let vms: Api<VirtualMachine> = ns.api();
    wait_for(&vms, "vol-1", WAIT, |v| {
        condition(vm_conditions(v), "Scheduled")
            .is_some_and(|c| c.status == "False" && c.message.contains("image not available"))
    })
    .await;
    let images: Api<banlieue_sdk::api::VMImage> = Api::all(ns.client.clone());
    let image = wait_for(&images, &format!("{}-volume", ns.name), WAIT, |i| {
        i.status
            .as_ref()
            .is_some_and(|s| s.providers.iter().any(|r| r.name == "pve"))
    })
    .await;
    let status = image.status.unwrap();
    let row = status.providers.iter().find(|r| r.name == "pve").unwrap();
    assert!(!row.available);
    assert_eq!(
        row.reason.as_deref(),
        Some(banlieue_backend_proxmox::IMAGE_SOURCE_UNSUPPORTED)
    );
    assert!(
        row.message
            .as_deref()
            .unwrap_or_default()
            .contains("templateID"),
        "{row:?}"
    );
    assert!(pve.machines().is_empty());
}

/// Creates the VMs `prefix0..prefix{n-1}` at once and waits until each has its
/// ProxmoxMachine created (a providerID), reporting the first `CreateQueued` seen.
async fn burst_until_created(
    ns: &TestNamespace,
    pve: &FakePve,
    prefix: &str,
    n: usize,
) -> Option<String> {
    let mut applying = tokio::task::JoinSet::new();
    for i in 0..n {
        let (client, namespace, object) = (
            ns.client.clone(),
            ns.name.clone(),
            vm(ns, &format!("{prefix}{i}")),
        );
        applying.spawn(async move { apply(&client, &namespace, &object).await });
    }
    while let Some(applied) = applying.join_next().await {
        applied.expect("join").expect("a VirtualMachine");
    }
    let machines: Api<ProxmoxMachine> = ns.api();
    let deadline = std::time::Instant::now() + Duration::from_secs(240);
    let mut queued = None;
    loop {
        let listed = machines.list(&Default::default()).await.expect("list");
        let ours = || {
            listed.items.iter().filter(|m| {
                m.metadata
                    .name
                    .as_deref()
                    .is_some_and(|n| n.starts_with(prefix))
            })
        };
        if queued.is_none() {
            queued = ours().find_map(|m| {
                let status = m.status.as_ref()?;
                condition(&status.conditions, "Ready")
                    .filter(|c| c.reason == "CreateQueued")
                    .map(|c| c.message.clone())
            });
        }
        let created = ours().filter(|m| m.spec.provider_id.is_some()).count();
        if created == n {
            return queued;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{created} of {n} machines created after 240 s; fakepve clones (running, peak): {:?}",
            pve.clones()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// A 200-VM burst on a Proxmox Provider with the shipped default cap (10 concurrent
/// creates): fakepve never copies more than 10 clones at once (its own count, inside
/// the clone task, each copy taking 1 s), the machines held back say why, and every
/// VM gets exactly one PVE VM. Lifting the cap (`"0"`), a second burst goes past 10 by
/// the same count, so the count can see a burst the cap does not hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_burst_of_clones_is_held_to_the_providers_cap() {
    let Some((ns, _operator, pve)) = world("pve-cap", Auth::Token).await else {
        return;
    };
    pve.clone_delay(1.0);
    let queued = burst_until_created(&ns, &pve, "b", 200).await;
    let (_, peak) = pve.clones();
    eprintln!("200 clones with the default cap: at most {peak} at once");
    assert!(
        (5..=10).contains(&peak),
        "at most 10 clones at once, and the cap was reached: {peak}"
    );
    let made = pve.machines();
    let mut by_name = std::collections::BTreeMap::<String, Vec<Value>>::new();
    for m in &made {
        by_name
            .entry(m["name"].as_str().unwrap_or_default().to_owned())
            .or_default()
            .push(json!({"vmid": m["vmid"], "lock": m["lock"], "tags": m["config"]["tags"], "status": m["status"]}));
    }
    let twice: Vec<_> = by_name.iter().filter(|(_, v)| v.len() > 1).collect();
    assert!(
        made.len() == 200 && twice.is_empty(),
        "one PVE VM per VirtualMachine: {} made, more than one for {twice:?}",
        made.len()
    );
    let queued = queued.expect("a machine held back by the cap reports CreateQueued");
    assert!(
        queued.contains("Provider pve, its cap (spec.settings.maxConcurrentCreates: 10)"),
        "{queued}"
    );

    let providers: Api<Provider> = ns.api();
    providers
        .patch(
            "pve",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"settings": {"maxConcurrentCreates": "0"}}})),
        )
        .await
        .expect("lift the cap");
    // Longer copies, so that the backend's one-at-a-time VMID allocation (a GET and a
    // POST per clone) starts more than 10 before the first ends.
    pve.clone_delay(3.0);
    let queued = burst_until_created(&ns, &pve, "u", 40).await;
    assert_eq!(
        queued, None,
        "no machine is held back once the cap is lifted"
    );
    let (_, uncapped) = pve.clones();
    eprintln!("then 40 without a cap: at most {uncapped} at once");
    assert!(
        uncapped > 10,
        "without a cap the clones go past 10 at once (else the capped check proves nothing): {uncapped}"
    );
}

/// `additionalDisks[].provisioning` (issue 38): PVE has no per-disk provisioning (a
/// drive has no such option; `preallocation` is a storage's), so a disk goes only to a
/// storage that gives what it asks, and any other is refused before anything is made.
/// Two storages are added as an admin would (`POST /storage`): an `lvm` (thick) and a
/// `dir` with `preallocation=full` (eager-zeroed). A machine asking thick there, eager-
/// zeroed there and thin on the template's `lvmthin` gets each disk allocated on its
/// storage; one asking thick on `lvmthin` is refused with nothing written (no clone);
/// a thick disk added later on `lvmthin` is refused with nothing written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_disks_go_only_to_storages_that_give_their_provisioning() {
    use banlieue_backend_proxmox::client::Form;
    use banlieue_backend_proxmox::provisioning::DISK_PROVISIONING_UNSUPPORTED;
    use banlieue_sdk::backend::Backend;
    let Some(pve) = FakePve::start() else { return };
    let backend = ProxmoxFactory::new()
        .connect_proxmox(&connection(&pve))
        .unwrap();
    for storage in [
        Form::new()
            .set("storage", "thick-lvm")
            .set("type", "lvm")
            .set("vgname", "thick")
            .set("content", "images"),
        Form::new()
            .set("storage", "zeroed")
            .set("type", "dir")
            .set("path", "/srv/zeroed")
            .set("content", "images")
            .set("preallocation", "full"),
    ] {
        backend.client().post("/storage", &storage).await.unwrap();
    }

    let uid = "0d9a5c3e-2222-4000-8000-000000000001";
    let req = with_spec(
        request(uid, pve.ready.template_id),
        json!({"additionalDisks": [
            {"name": "data", "sizeGiB": 1, "storage": "thick-lvm", "provisioning": "thick"},
            {"name": "scratch", "sizeGiB": 1, "storage": "zeroed", "provisioning": "eagerZeroed"},
            {"name": "cache", "sizeGiB": 1, "provisioning": "thin"}
        ]}),
    );
    settle(&*backend, &req, |o| o.settled_at(PowerState::PoweredOn)).await;
    let (_, config, _) = on_pve(&pve, "m-0d9a5c3e");
    let drive = |key: &str| config[key].as_str().unwrap_or_default().to_string();
    assert!(drive("scsi1").starts_with("thick-lvm:vm-"), "{config}");
    // A raw file (PVE's default format there), which the storage's preallocation
    // covers.
    let scratch = drive("scsi2");
    assert!(
        scratch.starts_with("zeroed:") && scratch.contains(".raw,"),
        "{config}"
    );
    // No storage of its own: the boot disk's (the template's lvmthin), thin.
    assert!(drive("scsi3").starts_with("local-lvm:vm-"), "{config}");

    // Thick on lvmthin: refused, terminal, before the clone.
    let (_, mark) = pve.requests(0);
    let before = pve.machines().len();
    let refused = with_spec(
        request(
            "0d9a5c3e-3333-4000-8000-000000000001",
            pve.ready.template_id,
        ),
        json!({"additionalDisks": [
            {"name": "logs", "sizeGiB": 1, "storage": "local-lvm", "provisioning": "thick"}]}),
    );
    let error = backend.ensure(&refused).await.unwrap_err();
    eprintln!("refused: {error}");
    assert_eq!(error.reason, DISK_PROVISIONING_UNSUPPORTED);
    assert!(!error.is_transient());
    for part in [
        "additionalDisks[0] (logs): provisioning thick",
        "storage local-lvm (type lvmthin) gives thin disks",
    ] {
        assert!(error.message.contains(part), "{error}");
    }
    assert!(writes(&pve, mark).is_empty(), "{:?}", writes(&pve, mark));
    assert_eq!(pve.machines().len(), before, "nothing cloned");

    // Added later, a thick disk on lvmthin: refused before the config write.
    let added = with_spec(
        req.clone(),
        json!({"additionalDisks": [
            {"name": "data", "sizeGiB": 1, "storage": "thick-lvm", "provisioning": "thick"},
            {"name": "scratch", "sizeGiB": 1, "storage": "zeroed", "provisioning": "eagerZeroed"},
            {"name": "cache", "sizeGiB": 1, "provisioning": "thin"},
            {"name": "more", "sizeGiB": 1, "storage": "local-lvm", "provisioning": "thick"}
        ]}),
    );
    let (_, mark) = pve.requests(0);
    let error = backend
        .apply_changes(&added, &[MachineField::DataDisks])
        .await
        .unwrap_err();
    assert_eq!(error.reason, DISK_PROVISIONING_UNSUPPORTED);
    assert!(
        error
            .message
            .contains("additionalDisks[3] (more): provisioning thick"),
        "{error}"
    );
    assert!(writes(&pve, mark).is_empty(), "{:?}", writes(&pve, mark));
    let (_, config, pending) = on_pve(&pve, "m-0d9a5c3e");
    assert!(config.get("scsi4").is_none() && pending.get("scsi4").is_none());
    backend.delete(&req.identity).await.unwrap();
}

/// Through the operator: a VirtualMachine whose data disk asks `thick` on a storage
/// class mapped to an `lvmthin` storage is never cloned; its ProxmoxMachine and the VM
/// say why, naming the field, the disk, the storage and its type.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disk_its_storage_cannot_provision_is_refused_before_the_clone() {
    let Some((ns, _operator, pve)) = world("pve-prov", Auth::Token).await else {
        return;
    };
    let mut object = vm(&ns, "thick-1");
    object["spec"]["disks"] =
        json!([{"name": "data", "sizeGiB": 1, "storageClass": "fast", "provisioning": "thick"}]);
    apply(&ns.client, &ns.name, &object).await.unwrap();
    let machines: Api<ProxmoxMachine> = ns.api();
    let want = "additionalDisks[0] (data): provisioning thick: storage local-lvm (type lvmthin) gives thin disks";
    let machine = wait_for(&machines, "thick-1", WAIT, |m| {
        has_condition(m, "DiskProvisioningUnsupported", want)
    })
    .await;
    eprintln!("{:?}", machine.status.as_ref().map(|s| &s.conditions));
    let vms: Api<VirtualMachine> = ns.api();
    let vm = wait_for(&vms, "thick-1", WAIT, |v| {
        vm_conditions(v).iter().any(|c| c.message.contains(want))
    })
    .await;
    assert!(!is_ready(&vm));
    assert!(pve.machines().is_empty(), "nothing cloned");
    let clones = pve
        .requests(0)
        .0
        .into_iter()
        .filter(|(m, p)| m == "POST" && p.ends_with("/clone"))
        .count();
    assert_eq!(clones, 0);
}
