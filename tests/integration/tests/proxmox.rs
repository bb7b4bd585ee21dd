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
use banlieue_sdk::api::common::{PowerState, ProviderClass};
use banlieue_sdk::api::infra::proxmox::ProxmoxMachine;
use banlieue_sdk::api::{Provider, VirtualMachine};
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

/// CPUs, memory, an added disk and a grown disk of a configured, running VM are
/// written to PVE; what PVE keeps pending until a restart is reported as
/// `RestartPending` (not Ready), and a power cycle applies it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spec_changes_after_configure_are_applied_and_a_pending_restart_is_reported() {
    let Some(pve) = FakePve::start() else { return };
    let backend = ProxmoxFactory::new().connect(&connection(&pve)).unwrap();
    let uid = "0d9a5c3e-1111-4000-8000-000000000001";
    let first = request(uid, pve.ready.template_id);
    settle(&*backend, &first, |o| o.settled_at(PowerState::PoweredOn)).await;
    let vm = || machine_of(&pve, "m-0d9a5c3e").expect("the VM");
    assert_eq!(vm()["config"]["cores"], "1");

    let changed = with_spec(
        first.clone(),
        json!({"cores": 2, "memoryMiB": 1024, "diskGiB": 10,
               "additionalDisks": [{"name": "data", "sizeGiB": 5, "storage": "local-lvm"}]}),
    );
    let observed = settle(&*backend, &changed, |o| {
        o.pending.is_some()
            && o.provider_id.is_some()
            && o.pending.as_ref().unwrap().operation == banlieue_backend_proxmox::RESTART_PENDING
    })
    .await;
    assert_eq!(observed.power_state, Some(PowerState::PoweredOn));
    let running = vm();
    // The boot disk grew at once; CPUs, memory and the new disk wait for a restart.
    assert!(
        running["config"]["scsi0"]
            .as_str()
            .unwrap()
            .contains("size=10G"),
        "{running}"
    );
    assert_eq!(running["pending"]["cores"], "2", "{running}");
    assert_eq!(running["pending"]["memory"], "1024", "{running}");
    assert_eq!(running["pending"]["scsi1"], "local-lvm:5", "{running}");
    assert_eq!(running["config"]["cores"], "1");
    // Asking again changes nothing more: the pending values count as written.
    let (_, mark) = pve.requests(0);
    let again = backend.ensure(&changed).await.unwrap();
    assert_eq!(
        again.pending.map(|p| p.operation).as_deref(),
        Some(banlieue_backend_proxmox::RESTART_PENDING)
    );
    let (since, _) = pve.requests(mark);
    assert!(
        since.iter().all(|(m, _)| m == "GET"),
        "no writes while only a restart is missing: {since:?}"
    );

    // A power cycle applies the pending config; then the machine is settled.
    let off = with_spec(changed.clone(), json!({"powerState": "PoweredOff"}));
    settle(&*backend, &off, |o| o.settled_at(PowerState::PoweredOff)).await;
    let on = settle(&*backend, &changed, |o| o.settled_at(PowerState::PoweredOn)).await;
    assert!(on.pending.is_none());
    let applied = vm();
    assert_eq!(applied["config"]["cores"], "2", "{applied}");
    assert_eq!(applied["config"]["memory"], "1024");
    assert_eq!(applied["config"]["scsi1"], "local-lvm:5");
    assert!(
        applied["pending"].as_object().unwrap().is_empty(),
        "{applied}"
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
