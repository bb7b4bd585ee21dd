//! Capabilities as data, enforced before anything is created: Providers publish what
//! their backend can do (`status.backendCapabilities`, narrowed by `capabilities.*`
//! settings), the scheduler places a VM only where everything it asks can be done,
//! and what a backend declares it does for real (Secure Boot) it does, read back from
//! the simulator.
//!
//! Real apiserver + operator, fakepve (Proxmox) and the sim backend side by side;
//! vcsim for the vSphere Secure Boot path. A VMImage's architecture against the hosts'
//! (published per failure domain) on the sim and on the real libvirtd of the libvirt
//! rig.

use std::sync::Arc;
use std::time::Duration;

use banlieue_backend_libvirt::LibvirtFactory;
use banlieue_backend_proxmox::ProxmoxFactory;
use banlieue_backend_sim::SimFactory;
use banlieue_backend_vsphere::VSphereFactory;
use banlieue_integration_tests::apply;
use banlieue_integration_tests::fakepve::FakePve;
use banlieue_integration_tests::fixtures::sim_provider;
use banlieue_integration_tests::libvirt::{IMAGE_VOLUME, LibvirtRig, NETWORK, POOL};
use banlieue_integration_tests::operator::{Operator, wait_for, wait_gone};
use banlieue_integration_tests::vcsim::Vcsim;
use banlieue_sdk::api::common::{BootstrapFormat, Firmware, PowerState, ProviderClass};
use banlieue_sdk::api::infra::libvirt::LibvirtMachine;
use banlieue_sdk::api::infra::proxmox::ProxmoxMachine;
use banlieue_sdk::api::{Provider, VirtualMachine};
use banlieue_sdk::backend::{
    Architecture, Backend, BackendRegistry, Connection, MachineIdentity, MachineRequest,
    MachineSpec, SecretValue,
};
use banlieue_sdk::conditions;
use banlieue_sdk::scheduling::ARCHITECTURE_MISMATCH;
use banlieue_testenv::TestNamespace;
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(60);

/// fakepve's Provider `pve` and a sim Provider `sim-a`, both labelled `tier: lab`, a
/// class per firmware, an image with a source for both and both bootstrap formats,
/// an Ignition bootstrap Secret, and the operator.
async fn world(prefix: &str) -> Option<(TestNamespace, Operator, FakePve)> {
    let pve = FakePve::start()?;
    let ns = banlieue_testenv::namespace(prefix).await;
    let mut sim = sim_provider("sim-a", &format!("sim://{}-a", ns.name), json!({}));
    sim["metadata"]["labels"] = json!({"tier": "lab"});
    let class = |firmware: &str| {
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMClass",
               "metadata": {"name": format!("{}-{firmware}", ns.name)},
               "spec": {"cpus": 1, "memoryMiB": 512, "firmware": firmware,
                        "disk": {"sizeGiB": 8, "storageClass": "fast"}}})
    };
    let objects = [
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "pve-credentials"},
               "stringData": {"tokenID": pve.ready.token_id, "tokenSecret": pve.ready.token_secret}}),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "Provider",
               "metadata": {"name": "pve", "labels": {"tier": "lab"}},
        "spec": {
            "class": "proxmox",
            "connection": {"endpoint": pve.ready.endpoint,
                           "credentialsRef": {"name": "pve-credentials"},
                           "caBundle": {"inline": pve.ready.ca_pem}},
            "capabilities": {
                "storageClasses": [{"name": "fast", "target": {"storage": "local-lvm"}}],
                "networkClasses": [{"name": "lan", "target": {"bridge": "vmbr0"}}]
            },
            "settings": {"taskPollInterval": "200ms", "shutdownTimeout": "5"}
        }}),
        sim,
        class("efi"),
        class("efi-secure"),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMImage", "metadata": {"name": format!("{}-flatcar", ns.name)},
               "spec": {"os": {"family": "linux", "distribution": "flatcar", "version": "4230"},
                        "bootstrapFormats": ["ignition", "cloud-config"],
                        "sources": {"proxmox": {"templateID": pve.ready.template_id},
                                    "sim": {"name": "flatcar"}}}}),
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "ignition"},
               "stringData": {"value": "{\"ignition\":{\"version\":\"3.4.0\"}}"}}),
    ];
    for object in &objects {
        apply(&ns.client, &ns.name, object).await.expect("fixture");
    }
    let mut registry = BackendRegistry::default();
    let sim = Arc::new(SimFactory::new());
    registry.register(ProviderClass::Proxmox, Arc::new(ProxmoxFactory::new()));
    registry.register(ProviderClass::Sim, sim.clone());
    let operator = Operator::start_with_registry(
        ns.client.clone(),
        &ns.name,
        registry,
        sim,
        Duration::from_secs(5),
    );
    Some((ns, operator, pve))
}

fn vm(ns: &TestNamespace, name: &str, firmware: &str, placement: Value, ignition: bool) -> Value {
    let mut spec = json!({
        "classRef": {"name": format!("{}-{firmware}", ns.name)},
        "imageRef": {"name": format!("{}-flatcar", ns.name)},
        "placement": placement,
    });
    if ignition {
        spec["bootstrap"] = json!({"format": "ignition", "userData": {"name": "ignition"}});
    }
    json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine",
           "metadata": {"name": name}, "spec": spec})
}

fn condition(vm: &VirtualMachine, type_: &str) -> Option<(String, String, String)> {
    let c = conditions::get(&vm.status.as_ref()?.conditions, type_)?;
    Some((c.status.clone(), c.reason.clone(), c.message.clone()))
}

fn is_ready(vm: &VirtualMachine) -> bool {
    condition(vm, "Ready").is_some_and(|(s, _, _)| s == "True")
}

async fn ready_provider(ns: &TestNamespace, name: &str) -> Provider {
    let providers: Api<Provider> = ns.api();
    wait_for(&providers, name, WAIT, |p| {
        p.status.as_ref().is_some_and(|s| {
            conditions::is_true(&s.conditions, "Ready") && s.backend_capabilities.is_some()
        })
    })
    .await
}

/// An explicit `providerRef` to a Provider that cannot deliver Ignition is refused
/// before anything is made (no ProxmoxMachine, no VM on fakepve), naming the Provider
/// and what it lacks; the same VM by selector lands on the Provider that can.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_that_cannot_serve_is_refused_and_one_that_can_is_chosen() {
    let Some((ns, _operator, pve)) = world("caps-refuse").await else {
        return;
    };
    let published = ready_provider(&ns, "pve")
        .await
        .status
        .unwrap()
        .backend_capabilities
        .unwrap();
    assert_eq!(published.bootstrap_formats, [BootstrapFormat::CloudConfig]);
    assert!(published.firmware.contains(&Firmware::EfiSecure));
    assert!(!published.power_states.contains(&PowerState::Suspended));
    ready_provider(&ns, "sim-a").await;

    let vms: Api<VirtualMachine> = ns.api();
    apply(
        &ns.client,
        &ns.name,
        &vm(
            &ns,
            "pinned",
            "efi",
            json!({"providerRef": {"name": "pve"}}),
            true,
        ),
    )
    .await
    .unwrap();
    let refused = wait_for(&vms, "pinned", WAIT, |v| {
        condition(v, "Scheduled").is_some_and(|(s, _, _)| s == "False")
    })
    .await;
    let (_, reason, message) = condition(&refused, "Scheduled").unwrap();
    assert_eq!(reason, "CapabilitiesMissing", "{message}");
    assert!(
        message.contains("pve: cannot deliver ignition"),
        "{message}"
    );
    assert!(!is_ready(&refused));

    apply(
        &ns.client,
        &ns.name,
        &vm(
            &ns,
            "chosen",
            "efi",
            json!({"providerSelector": {"matchLabels": {"tier": "lab"}}}),
            true,
        ),
    )
    .await
    .unwrap();
    let placed = wait_for(&vms, "chosen", WAIT, is_ready).await;
    assert_eq!(
        placed
            .status
            .as_ref()
            .and_then(|s| s.placement.as_ref())
            .map(|p| p.provider.as_str()),
        Some("sim-a")
    );

    // Still refused a while later, and nothing was ever made for it on Proxmox.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let refused = vms.get("pinned").await.unwrap();
    assert_eq!(
        condition(&refused, "Scheduled").map(|(s, r, _)| (s, r)),
        Some(("False".into(), "CapabilitiesMissing".into()))
    );
    let machines: Api<ProxmoxMachine> = ns.api();
    assert!(
        machines
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty(),
        "no ProxmoxMachine for a VM its Provider cannot serve"
    );
    assert!(
        !pve.machines().iter().any(|m| m["name"] == "pinned"),
        "no VM on fakepve"
    );
}

/// A class asking hot-add headroom (`maxCPUs`, `maxMemoryMiB`) is refused before
/// anything is made where it cannot be honoured: on Proxmox (its change table grows
/// CPUs and memory `NextBoot`, not live), `Scheduled=False CapabilitiesMissing` naming
/// the field and the Provider; on a sim Provider that builds ProxmoxMachines (a kind
/// with no such field), `Scheduled=False HotAddUnsupported`. The same VM by selector
/// lands where it is honoured, its LibvirtMachine carrying the headroom.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hot_add_headroom_is_refused_where_it_cannot_be_honoured() {
    let Some((ns, _operator, pve)) = world("caps-hotadd").await else {
        return;
    };
    let roomy = format!("{}-roomy", ns.name);
    let objects = [
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMClass", "metadata": {"name": roomy},
               "spec": {"cpus": 1, "maxCPUs": 4, "memoryMiB": 512, "maxMemoryMiB": 2048,
                        "disk": {"sizeGiB": 8, "storageClass": "fast"}}}),
        sim_provider(
            "sim-pve",
            &format!("sim://{}-p", ns.name),
            json!({"machineKind": "ProxmoxMachine"}),
        ),
    ];
    for object in &objects {
        apply(&ns.client, &ns.name, object).await.unwrap();
    }
    ready_provider(&ns, "pve").await;
    ready_provider(&ns, "sim-a").await;
    ready_provider(&ns, "sim-pve").await;
    let roomy_vm = |name: &str, placement: Value| {
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine",
               "metadata": {"name": name},
               "spec": {"classRef": {"name": roomy},
                        "imageRef": {"name": format!("{}-flatcar", ns.name)},
                        "placement": placement}})
    };
    let vms: Api<VirtualMachine> = ns.api();
    for (name, provider) in [("on-pve", "pve"), ("on-sim-pve", "sim-pve")] {
        apply(
            &ns.client,
            &ns.name,
            &roomy_vm(name, json!({"providerRef": {"name": provider}})),
        )
        .await
        .unwrap();
    }
    let refused = wait_for(&vms, "on-pve", WAIT, |v| {
        condition(v, "Scheduled").is_some_and(|(s, _, _)| s == "False")
    })
    .await;
    let (_, reason, message) = condition(&refused, "Scheduled").unwrap();
    assert_eq!(reason, "CapabilitiesMissing", "{message}");
    for text in [
        "pve: cannot honour maxCPUs (its change table grows cpus NextBoot, not Live)",
        "cannot honour maxMemoryMiB (its change table grows memoryMiB NextBoot, not Live)",
    ] {
        assert!(message.contains(text), "{message}");
    }
    let refused = wait_for(&vms, "on-sim-pve", WAIT, |v| {
        condition(v, "Scheduled").is_some_and(|(s, _, _)| s == "False")
    })
    .await;
    let (_, reason, message) = condition(&refused, "Scheduled").unwrap();
    assert_eq!(reason, "HotAddUnsupported", "{message}");
    assert!(
        message.contains("asks maxCPUs and maxMemoryMiB")
            && message.contains("ProxmoxMachine on Provider sim-pve"),
        "{message}"
    );

    apply(
        &ns.client,
        &ns.name,
        &roomy_vm(
            "by-selector",
            json!({"providerSelector": {"matchLabels": {"tier": "lab"}}}),
        ),
    )
    .await
    .unwrap();
    let placed = wait_for(&vms, "by-selector", WAIT, is_ready).await;
    assert_eq!(
        placed
            .status
            .as_ref()
            .and_then(|s| s.placement.as_ref())
            .map(|p| p.provider.as_str()),
        Some("sim-a")
    );
    let libvirt: Api<banlieue_sdk::api::infra::libvirt::LibvirtMachine> = ns.api();
    let m = libvirt.get("by-selector").await.unwrap();
    assert_eq!(
        (m.spec.max_cpus, m.spec.max_memory_mib),
        (Some(4), Some(2048))
    );

    // Nothing was made for the refused ones, a while later either.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let machines: Api<ProxmoxMachine> = ns.api();
    assert!(
        machines
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty(),
        "no ProxmoxMachine for a class whose headroom it cannot honour"
    );
    assert!(!pve.machines().iter().any(|m| m["name"] == "on-pve"));
    for name in ["on-pve", "on-sim-pve"] {
        let v = vms.get(name).await.unwrap();
        assert_eq!(
            condition(&v, "Scheduled").map(|(s, _, _)| s).as_deref(),
            Some("False"),
            "{name}"
        );
    }
}

/// `efi-secure` on Proxmox is OVMF with an enrolled EFI vars disk (read back from
/// fakepve), and suspending it, which this backend does not claim, leaves it running
/// with a condition that says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secure_boot_on_proxmox_is_real_and_suspend_is_refused() {
    let Some((ns, _operator, pve)) = world("caps-pve").await else {
        return;
    };
    ready_provider(&ns, "pve").await;
    let vms: Api<VirtualMachine> = ns.api();
    apply(
        &ns.client,
        &ns.name,
        &vm(
            &ns,
            "secure",
            "efi-secure",
            json!({"providerRef": {"name": "pve"}}),
            false,
        ),
    )
    .await
    .unwrap();
    wait_for(&vms, "secure", WAIT, is_ready).await;
    let machine = pve
        .machines()
        .into_iter()
        .find(|m| m["name"] == "secure")
        .expect("a VM on fakepve");
    let config = &machine["config"];
    assert_eq!(config["bios"], "ovmf", "{config}");
    let efidisk = config["efidisk0"].as_str().unwrap_or_default();
    assert!(
        efidisk.contains("efitype=4m") && efidisk.contains("pre-enrolled-keys=1"),
        "{config}"
    );

    vms.patch(
        "secure",
        &PatchParams::default(),
        &Patch::Merge(&json!({"spec": {"powerState": "Suspended"}})),
    )
    .await
    .unwrap();
    let refused = wait_for(&vms, "secure", WAIT, |v| {
        condition(v, "Scheduled").is_some_and(|(s, _, _)| s == "False")
    })
    .await;
    let (_, reason, message) = condition(&refused, "Scheduled").unwrap();
    assert_eq!(reason, "CapabilitiesMissing");
    assert!(message.starts_with("pve: cannot be Suspended"), "{message}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let machine = pve
        .machines()
        .into_iter()
        .find(|m| m["name"] == "secure")
        .unwrap();
    assert_eq!(machine["status"], "running", "left as it was");
}

/// A Provider's `capabilities.*` settings narrow what it publishes; a bad value is a
/// Provider that is not Ready, saying which setting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settings_narrow_what_a_provider_publishes() {
    let ns = banlieue_testenv::namespace("caps-narrow").await;
    let narrowed = sim_provider(
        "narrow",
        &format!("sim://{}-n", ns.name),
        json!({"capabilities.secureBoot": "false", "capabilities.suspend": "false"}),
    );
    let bad = sim_provider(
        "bad",
        &format!("sim://{}-b", ns.name),
        json!({"capabilities.ignition": "maybe"}),
    );
    for object in [&narrowed, &bad] {
        apply(&ns.client, &ns.name, object).await.unwrap();
    }
    let _operator = Operator::start(ns.client.clone(), &ns.name);
    let published = ready_provider(&ns, "narrow")
        .await
        .status
        .unwrap()
        .backend_capabilities
        .unwrap();
    assert!(!published.firmware.contains(&Firmware::EfiSecure));
    assert!(!published.power_states.contains(&PowerState::Suspended));
    assert!(
        published
            .bootstrap_formats
            .contains(&BootstrapFormat::Ignition)
    );
    let providers: Api<Provider> = ns.api();
    let bad = wait_for(&providers, "bad", WAIT, |p| {
        p.status.as_ref().is_some_and(|s| {
            conditions::get(&s.conditions, "Ready").is_some_and(|c| c.reason == "InvalidSettings")
        })
    })
    .await;
    let ready = conditions::get(&bad.status.as_ref().unwrap().conditions, "Ready").unwrap();
    assert!(
        ready.message.contains("capabilities.ignition"),
        "{}",
        ready.message
    );
}

/// `efi-secure` on vSphere is firmware `efi` with `bootOptions.efiSecureBootEnabled`,
/// read back from vcsim; plain `efi` has it off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secure_boot_on_vsphere_is_real() {
    let Some(sim) = Vcsim::start() else { return };
    let connection = vsphere_connection(&sim);
    let backend = VSphereFactory::new().connect_vsphere(&connection).unwrap();
    assert!(
        backend
            .capabilities()
            .firmware
            .contains(&Firmware::EfiSecure),
        "declared"
    );
    for (i, firmware) in [(1, "efi-secure"), (2, "efi")] {
        let uid = format!("{i:08x}-2222-4000-8000-000000000000");
        let spec = serde_json::from_value(json!({
            "template": sim.ready.template, "numCPUs": 1, "memoryMiB": 1024,
            "firmware": firmware, "powerState": "PoweredOff",
        }))
        .unwrap();
        let request = MachineRequest {
            identity: MachineIdentity {
                uid: uid.clone(),
                namespace: "caps".into(),
                name: format!("fw-{i}"),
                provider_id: None,
            },
            spec: MachineSpec::VSphere(spec),
            failure_domain: Some("DC0/DC0_C0".into()),
            bootstrap: None,
            instance_id: None,
            disks_imported: false,
        };
        settle(backend.as_ref(), &request, PowerState::PoweredOff).await;
        let vm = sim.vm(&request.identity.name).expect("the clone");
        assert_eq!(vm["firmware"], "efi", "{firmware}: {vm}");
        assert_eq!(
            vm["secureBoot"],
            firmware == "efi-secure",
            "{firmware}: {vm}"
        );
    }
}

/// A Cluster API machine whose only candidate cannot serve it (Ignition bootstrap data
/// on Proxmox) waits with a condition naming what is missing, and nothing is created.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_capi_machine_its_only_provider_cannot_serve_waits_and_nothing_is_made() {
    use banlieue_integration_tests::capi::Capi;
    use kube::api::{ApiResource, DynamicObject};
    let Some(_capi) = Capi::start() else { return };
    let Some((ns, _operator, pve)) = world("caps-capi").await else {
        return;
    };
    ready_provider(&ns, "pve").await;
    let infra = "infrastructure.banlieue.io";
    for object in [
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "w1-bootstrap"},
               "stringData": {"value": "{\"ignition\":{\"version\":\"3.4.0\"}}", "format": "ignition"}}),
        json!({"apiVersion": format!("{infra}/v1alpha1"), "kind": "ProxmoxCluster", "metadata": {"name": "c1"},
               "spec": {"providerRefs": [{"name": "pve"}],
                        "controlPlaneEndpoint": {"host": "192.0.2.30", "port": 6443}}}),
        json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster", "metadata": {"name": "c1"},
               "spec": {"infrastructureRef": {"apiGroup": infra, "kind": "ProxmoxCluster", "name": "c1"}}}),
        json!({"apiVersion": format!("{infra}/v1alpha1"), "kind": "ProxmoxMachine", "metadata": {"name": "w1"},
               "spec": {"templateID": pve.ready.template_id, "cores": 1, "memoryMiB": 512}}),
        json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine", "metadata": {"name": "w1"},
               "spec": {"clusterName": "c1", "bootstrap": {"dataSecretName": "w1-bootstrap"},
                        "infrastructureRef": {"apiGroup": infra, "kind": "ProxmoxMachine", "name": "w1"}}}),
    ] {
        apply(&ns.client, &ns.name, &object).await.expect("fixture");
    }
    let machines: Api<ProxmoxMachine> = ns.api();
    let waiting = wait_for(&machines, "w1", Duration::from_secs(120), |m| {
        m.status.as_ref().is_some_and(|s| {
            s.conditions
                .iter()
                .any(|c| c.reason == "CapabilitiesMissing")
        })
    })
    .await;
    let condition = waiting
        .status
        .as_ref()
        .unwrap()
        .conditions
        .iter()
        .find(|c| c.reason == "CapabilitiesMissing")
        .unwrap();
    assert!(
        condition.message.contains("pve: cannot deliver ignition"),
        "{}",
        condition.message
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        !pve.machines().iter().any(|m| m["name"] == "w1"),
        "nothing made on fakepve"
    );
    assert!(machines.get("w1").await.unwrap().spec.provider_id.is_none());
    let resource = ApiResource::from_gvk(&kube::api::GroupVersionKind::gvk(
        "cluster.x-k8s.io",
        "v1beta2",
        "Cluster",
    ));
    let clusters: Api<DynamicObject> = Api::namespaced_with(ns.client.clone(), &ns.name, &resource);
    let _ = clusters.delete("c1", &Default::default()).await;
}

/// vSphere declares `Suspended` because this exercises it: on, suspended (read back
/// from vcsim), resumed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn suspend_on_vsphere_is_real() {
    let Some(sim) = Vcsim::start() else { return };
    let backend = VSphereFactory::new()
        .connect_vsphere(&vsphere_connection(&sim))
        .unwrap();
    assert!(
        backend
            .capabilities()
            .power_states
            .contains(&PowerState::Suspended),
        "declared"
    );
    let uid = "00000009-3333-4000-8000-000000000000";
    for (power, seen) in [
        ("PoweredOn", "poweredOn"),
        ("Suspended", "suspended"),
        ("PoweredOn", "poweredOn"),
    ] {
        let spec = serde_json::from_value(json!({
            "template": sim.ready.template, "numCPUs": 1, "memoryMiB": 1024,
            "network": [{"networkName": "VM Network"}], "powerState": power,
        }))
        .unwrap();
        let request = MachineRequest {
            identity: MachineIdentity {
                uid: uid.into(),
                namespace: "caps".into(),
                name: "sus-1".into(),
                provider_id: None,
            },
            spec: MachineSpec::VSphere(spec),
            failure_domain: Some("DC0/DC0_C0".into()),
            bootstrap: None,
            instance_id: None,
            disks_imported: false,
        };
        let want: PowerState = serde_json::from_value(json!(power)).unwrap();
        settle(backend.as_ref(), &request, want).await;
        assert_eq!(
            sim.vm("sus-1").expect("the clone")["power"],
            seen,
            "{power}"
        );
    }
}

fn vsphere_connection(sim: &Vcsim) -> Connection {
    Connection {
        class: ProviderClass::Vsphere,
        endpoint: format!("{}/sdk", sim.ready.endpoint),
        credentials: [
            (
                "username".to_string(),
                SecretValue::new(sim.ready.username.clone()),
            ),
            (
                "password".to_string(),
                SecretValue::new(sim.ready.password.clone()),
            ),
        ]
        .into(),
        ca_bundle: Some(sim.ready.ca_pem.clone()),
        insecure_skip_tls_verify: false,
        settings: [("taskPollInterval".to_string(), "50ms".to_string())].into(),
    }
}

async fn settle(backend: &dyn Backend, request: &MachineRequest, want: PowerState) {
    for _ in 0..400 {
        match backend.ensure(request).await {
            Ok(o) if o.settled_at(want) => return,
            Ok(_) => {}
            Err(e) if e.is_transient() => {}
            Err(e) => panic!("{want:?}: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("{want:?}: did not settle");
}

/// A class, and two images with a source for the sim and the libvirt rig: `<ns>-amd`
/// (no `architecture`: amd64 by default) and `<ns>-arm` (arm64).
fn arch_fixtures(ns: &TestNamespace) -> Vec<Value> {
    let image = |name: &str, arch: Option<&str>| {
        let mut spec = json!({"os": {"family": "linux", "distribution": "busybox", "version": "1"},
                              "sources": {"sim": {"name": "busybox"},
                                          "libvirt": {"volume": {"pool": POOL, "name": IMAGE_VOLUME}, "format": "qcow2"}}});
        if let Some(arch) = arch {
            spec["architecture"] = json!(arch);
        }
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMImage",
               "metadata": {"name": format!("{}-{name}", ns.name)}, "spec": spec})
    };
    vec![
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMClass", "metadata": {"name": format!("{}-tiny", ns.name)},
               "spec": {"cpus": 1, "memoryMiB": 256, "firmware": "bios",
                        "disk": {"sizeGiB": 1, "storageClass": "local"}}}),
        image("amd", None),
        image("arm", Some("arm64")),
    ]
}

fn arch_vm(ns: &TestNamespace, name: &str, image: &str, network: &str, placement: Value) -> Value {
    json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine", "metadata": {"name": name},
           "spec": {"classRef": {"name": format!("{}-tiny", ns.name)},
                    "imageRef": {"name": format!("{}-{image}", ns.name)},
                    "networks": [{"name": "eth0", "networkClass": network}],
                    "placement": placement}})
}

/// The Provider `name` once Ready, with each failure domain's `(name, architecture)`.
async fn architectures(ns: &TestNamespace, name: &str) -> Vec<(String, Option<Architecture>)> {
    ready_provider(ns, name)
        .await
        .status
        .unwrap()
        .failure_domains
        .into_iter()
        .map(|fd| (fd.name, fd.architecture))
        .collect()
}

/// Waits until `name`'s `Scheduled` is False for `ArchitectureMismatch` (it may first
/// wait for the image to be checked), and returns the message.
async fn refused_for_architecture(vms: &Api<VirtualMachine>, name: &str) -> String {
    let refused = wait_for(vms, name, WAIT, |v| {
        condition(v, "Scheduled")
            .is_some_and(|(s, r, _)| s == "False" && r == ARCHITECTURE_MISMATCH)
    })
    .await;
    assert!(!is_ready(&refused));
    condition(&refused, "Scheduled").unwrap().2
}

fn placed_on(vm: &VirtualMachine) -> Option<(String, Option<String>)> {
    let p = vm.status.as_ref()?.placement.as_ref()?;
    Some((p.provider.clone(), p.failure_domain.clone()))
}

/// A VMImage's architecture, on the real apiserver with the simulator: each sim
/// Provider publishes its hosts' architecture; an arm64 image on amd64 hosts (by
/// selector, or pinned by `providerRef`) and an amd64 image pinned to a Provider that
/// reports none are refused with `ArchitectureMismatch` naming the image's
/// architecture and each domain's, and nothing is made for them (machines counted on
/// the apiserver and in the simulator before and after); the amd64 image is placed;
/// and the arm64 VM is placed as soon as a Provider with arm64 hosts appears.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_is_placed_only_on_hosts_of_its_architecture_on_the_sim() {
    let ns = banlieue_testenv::namespace("arch-sim").await;
    let endpoint = |p: &str| format!("sim://{}-{p}", ns.name);
    let local = |mut p: Value| {
        p["spec"]["capabilities"]["storageClasses"] =
            json!([{"name": "local", "target": {"pool": "default"}}]);
        p
    };
    let mut objects = vec![
        local(sim_provider("sim-amd", &endpoint("amd"), json!({}))),
        local(sim_provider(
            "sim-none",
            &endpoint("none"),
            json!({"architecture": "none"}),
        )),
    ];
    objects.extend(arch_fixtures(&ns));
    for object in &objects {
        apply(&ns.client, &ns.name, object).await.expect("fixture");
    }
    let mut registry = BackendRegistry::default();
    let sim = Arc::new(SimFactory::new());
    registry.register(ProviderClass::Sim, sim.clone());
    let _operator = Operator::start_with_registry(
        ns.client.clone(),
        &ns.name,
        registry,
        sim.clone(),
        Duration::from_secs(5),
    );

    let amd64 = Some(Architecture::Amd64);
    assert_eq!(
        architectures(&ns, "sim-amd").await,
        [("sim-a".to_string(), amd64), ("sim-b".to_string(), amd64)],
        "the simulator's default, published on the Provider"
    );
    assert_eq!(
        architectures(&ns, "sim-none").await,
        [("sim-a".to_string(), None), ("sim-b".to_string(), None)]
    );

    // The amd64 image first: placed on the amd64 Provider, and made there.
    let vms: Api<VirtualMachine> = ns.api();
    apply(
        &ns.client,
        &ns.name,
        &arch_vm(&ns, "amd", "amd", "lan", json!({})),
    )
    .await
    .unwrap();
    let amd = wait_for(&vms, "amd", WAIT, is_ready).await;
    assert_eq!(placed_on(&amd).map(|p| p.0), Some("sim-amd".into()));
    let machines: Api<LibvirtMachine> = ns.api();
    let counts = || async {
        (
            machines
                .list(&ListParams::default())
                .await
                .unwrap()
                .items
                .len(),
            sim.machines(&endpoint("amd")).len(),
            sim.machines(&endpoint("none")).len(),
        )
    };
    let before = counts().await;
    assert_eq!(before, (1, 1, 0));

    // An arm64 image where no host is arm64: by selector, and pinned.
    let image = format!("VMImage {}-arm is arm64", ns.name);
    apply(
        &ns.client,
        &ns.name,
        &arch_vm(&ns, "arm", "arm", "lan", json!({})),
    )
    .await
    .unwrap();
    let message = refused_for_architecture(&vms, "arm").await;
    for phrase in [
        format!("sim-amd/sim-a: its hosts are amd64, {image}"),
        format!("sim-amd/sim-b: its hosts are amd64, {image}"),
        "sim-none/sim-a: Provider sim-none does not report its hosts' architecture".to_string(),
    ] {
        assert!(message.contains(&phrase), "{message:?} lacks {phrase:?}");
    }
    apply(
        &ns.client,
        &ns.name,
        &arch_vm(
            &ns,
            "arm-pinned",
            "arm",
            "lan",
            json!({"providerRef": {"name": "sim-amd"}}),
        ),
    )
    .await
    .unwrap();
    let message = refused_for_architecture(&vms, "arm-pinned").await;
    assert!(
        message.contains(&format!("sim-amd/sim-a: its hosts are amd64, {image}"))
            && !message.contains("sim-none"),
        "{message}"
    );
    // An unknown architecture never passes, not even for the default amd64.
    apply(
        &ns.client,
        &ns.name,
        &arch_vm(
            &ns,
            "amd-unknown",
            "amd",
            "lan",
            json!({"providerRef": {"name": "sim-none"}}),
        ),
    )
    .await
    .unwrap();
    let message = refused_for_architecture(&vms, "amd-unknown").await;
    assert!(
        message
            .contains("sim-none/sim-b: Provider sim-none does not report its hosts' architecture")
            && message.contains(&format!("VMImage {}-amd is amd64", ns.name)),
        "{message}"
    );

    // Still refused a while later, and nothing was made for any of them.
    tokio::time::sleep(Duration::from_secs(3)).await;
    for name in ["arm", "arm-pinned", "amd-unknown"] {
        let v = vms.get(name).await.unwrap();
        assert_eq!(
            condition(&v, "Scheduled").map(|(s, r, _)| (s, r)),
            Some(("False".into(), ARCHITECTURE_MISMATCH.into())),
            "{name}"
        );
        assert_eq!(placed_on(&v), None, "{name}");
    }
    assert_eq!(
        counts().await,
        before,
        "(LibvirtMachines, sim-amd's, sim-none's)"
    );

    // Hosts of its architecture appear: the arm64 VM goes there, the pinned one stays.
    apply(
        &ns.client,
        &ns.name,
        &local(sim_provider(
            "sim-arm",
            &endpoint("arm"),
            json!({"architecture": "arm64"}),
        )),
    )
    .await
    .unwrap();
    let arm = wait_for(&vms, "arm", WAIT, is_ready).await;
    assert_eq!(placed_on(&arm).map(|p| p.0), Some("sim-arm".into()));
    assert_eq!(sim.machines(&endpoint("arm")).len(), 1);
    let pinned = vms.get("arm-pinned").await.unwrap();
    assert_eq!(
        condition(&pinned, "Scheduled").map(|(_, r, _)| r),
        Some(ARCHITECTURE_MISMATCH.into())
    );
}

/// The same on libvirt, against the real libvirtd: the host's architecture comes from
/// its capabilities; an arm64 image is refused with `ArchitectureMismatch` and no
/// domain, volume or LibvirtMachine is made; the amd64 image boots there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_libvirt_an_arm64_image_is_refused_and_an_amd64_one_boots() {
    let Some(rig) = LibvirtRig::start() else {
        return;
    };
    let ns = banlieue_testenv::namespace("arch-lv").await;
    let mut objects = vec![
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "Provider", "metadata": {"name": "host"},
        "spec": {
            "class": "libvirt",
            "connection": {"endpoint": rig.uri},
            "capabilities": {
                "storageClasses": [{"name": "local", "target": {"pool": POOL}}],
                "networkClasses": [{"name": "isolated", "target": {"network": NETWORK}}]
            },
            "settings": {"domainType": "qemu", "pollInterval": "1s", "failureDomain": "rig-host"}
        }}),
    ];
    objects.extend(arch_fixtures(&ns));
    for object in &objects {
        apply(&ns.client, &ns.name, object).await.expect("fixture");
    }
    let mut registry = BackendRegistry::default();
    registry.register(ProviderClass::Libvirt, Arc::new(LibvirtFactory::new()));
    let _operator = Operator::start_with_registry(
        ns.client.clone(),
        &ns.name,
        registry,
        Arc::new(SimFactory::new()),
        Duration::from_secs(5),
    );

    // The rig's libvirtd runs on this machine: its capabilities' host/cpu/arch is ours.
    let ours = if cfg!(target_arch = "x86_64") {
        Some(Architecture::Amd64)
    } else {
        None // the backend's domains are x86_64 ones: other hosts report none
    };
    assert_eq!(
        architectures(&ns, "host").await,
        [("rig-host".to_string(), ours)]
    );
    assert_eq!(
        ours,
        Some(Architecture::Amd64),
        "this test places an amd64 image: run it on an x86_64 host"
    );

    let machines: Api<LibvirtMachine> = ns.api();
    let made = || async {
        (
            machines
                .list(&ListParams::default())
                .await
                .unwrap()
                .items
                .len(),
            rig.domains().len(),
            rig.volumes(),
        )
    };
    let before = made().await;
    assert_eq!((before.0, before.1), (0, 0));

    let vms: Api<VirtualMachine> = ns.api();
    apply(
        &ns.client,
        &ns.name,
        &arch_vm(
            &ns,
            "arm",
            "arm",
            "isolated",
            json!({"providerRef": {"name": "host"}}),
        ),
    )
    .await
    .unwrap();
    let message = refused_for_architecture(&vms, "arm").await;
    assert!(
        message.contains(&format!(
            "host/rig-host: its hosts are amd64, VMImage {}-arm is arm64",
            ns.name
        )),
        "{message}"
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        condition(&vms.get("arm").await.unwrap(), "Scheduled").map(|(_, r, _)| r),
        Some(ARCHITECTURE_MISMATCH.into())
    );
    assert_eq!(
        made().await,
        before,
        "no LibvirtMachine, domain or volume for the refused VM"
    );

    apply(
        &ns.client,
        &ns.name,
        &arch_vm(
            &ns,
            "amd",
            "amd",
            "isolated",
            json!({"providerRef": {"name": "host"}}),
        ),
    )
    .await
    .unwrap();
    let amd = wait_for(&vms, "amd", Duration::from_secs(240), is_ready).await;
    assert_eq!(
        placed_on(&amd),
        Some(("host".to_string(), Some("rig-host".to_string())))
    );
    let (machines_now, domains_now, _) = made().await;
    assert_eq!((machines_now, domains_now), (1, 1), "the amd64 VM's alone");

    vms.delete("amd", &Default::default()).await.unwrap();
    wait_gone(&vms, "amd", Duration::from_secs(120)).await;
}
