//! `migration.strategy: CopyDisk` with real bytes, around a ring of real backends:
//! libvirt (the rig's libvirtd + QEMU) → Cloud Hypervisor (the fake VMM, on host
//! files) → vSphere (vcsim, over its datastore HTTP interface) → libvirt.
//!
//! A known pattern is written into the VM's disk on libvirt with `qemu-io`; after
//! each hop the target's disk must hold the same logical content (`qemu-img compare`
//! against a raw reference), the source must be gone, the target must not have been
//! cloned from an image, and the guest keeps its cloud-init instance-id. The operator
//! is killed once mid-copy and must finish the move with one VM, not two.
//!
//! Proxmox's simulator has no disk upload/import: a CopyDisk move off Proxmox must be
//! refused before anything is touched, never recreated.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use banlieue_backend_cloud_hypervisor::ChFactory;
use banlieue_backend_libvirt::LibvirtFactory;
use banlieue_backend_proxmox::ProxmoxFactory;
use banlieue_backend_vsphere::VSphereFactory;
use banlieue_integration_tests::apply;
use banlieue_integration_tests::cloud_hypervisor::{ChRig, Guest};
use banlieue_integration_tests::crashable::CrashableOperator;
use banlieue_integration_tests::fakepve::FakePve;
use banlieue_integration_tests::libvirt::{IMAGE_VOLUME, LibvirtRig, NETWORK, POOL};
use banlieue_integration_tests::vcsim::Vcsim;
use banlieue_sdk::api::common::{PowerState, ProviderClass};
use banlieue_sdk::api::{Provider, VirtualMachine};
use banlieue_sdk::backend::BackendRegistry;
use banlieue_sdk::conditions;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams};
use kube::core::GroupVersionKind;
use serde_json::{Value, json};

const FAKE_VMM: &str = env!("CARGO_BIN_EXE_fake-ch-vmm");
const WAIT: Duration = Duration::from_secs(300);
const VM: &str = "ring";

/// Where the pattern goes: (offset, length, byte), all past the guest image's 19 MiB
/// (the guest must still boot from the migrated disk) and spread over the 1 GiB disk.
const PATTERN: [(u64, u64, u8); 3] = [
    (0x200_0000, 0x1_0000, 0xab),
    (0x2000_0000, 0x10_0000, 0x5a),
    (0x3c00_0000, 0x1000, 0xc3),
];

fn registry() -> BackendRegistry {
    let mut registry = BackendRegistry::default();
    registry.register(ProviderClass::Vsphere, Arc::new(VSphereFactory::new()));
    registry.register(ProviderClass::Proxmox, Arc::new(ProxmoxFactory::new()));
    registry.register(ProviderClass::Libvirt, Arc::new(LibvirtFactory::new()));
    registry.register(ProviderClass::CloudHypervisor, Arc::new(ChFactory::new()));
    registry
}

struct Rigs {
    lv: LibvirtRig,
    ch: ChRig,
    vc: Vcsim,
    pve: FakePve,
}

fn fixtures(r: &Rigs, ns: &str) -> Vec<Value> {
    vec![
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "Provider", "metadata": {"name": "host"},
               "spec": {"class": "libvirt", "connection": {"endpoint": r.lv.uri},
                        "capabilities": {
                            "storageClasses": [{"name": "local", "target": {"pool": POOL}}],
                            "networkClasses": [{"name": "lan", "target": {"network": NETWORK}}]},
                        "settings": {"domainType": "qemu", "pollInterval": "1s",
                                     "shutdownTimeout": "5s", "failureDomain": "rig-host"}}}),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "Provider", "metadata": {"name": "ch"},
               "spec": {"class": "cloud-hypervisor", "connection": {"endpoint": r.ch.endpoint()},
                        "capabilities": {
                            "storageClasses": [{"name": "local", "target": {"storage": "local"}}],
                            "networkClasses": [{"name": "lan", "target": {"network": "tap"}}]},
                        "settings": r.ch.settings()}}),
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "vc-credentials"},
               "stringData": {"username": r.vc.ready.username, "password": r.vc.ready.password}}),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "Provider", "metadata": {"name": "vc"},
               "spec": {"class": "vsphere",
                        "connection": {"endpoint": format!("{}/sdk", r.vc.ready.endpoint),
                                       "credentialsRef": {"name": "vc-credentials"},
                                       "caBundle": {"inline": r.vc.ready.ca_pem}},
                        "capabilities": {
                            "storageClasses": [{"name": "local", "target": {"datastore": "LocalDS_0"}}],
                            "networkClasses": [{"name": "lan", "target": {"portGroup": "VM Network"}}]},
                        "settings": {"taskPollInterval": "100ms", "shutdownTimeout": "2s"}}}),
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "pve-credentials"},
               "stringData": {"tokenID": r.pve.ready.token_id, "tokenSecret": r.pve.ready.token_secret}}),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "Provider", "metadata": {"name": "pve"},
               "spec": {"class": "proxmox",
                        "connection": {"endpoint": r.pve.ready.endpoint,
                                       "credentialsRef": {"name": "pve-credentials"},
                                       "caBundle": {"inline": r.pve.ready.ca_pem}},
                        "capabilities": {
                            "storageClasses": [{"name": "local", "target": {"storage": "local-lvm"}}],
                            "networkClasses": [{"name": "lan", "target": {"bridge": "vmbr0"}}]},
                        "settings": {"taskPollInterval": "200ms", "shutdownTimeout": "5"}}}),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMClass", "metadata": {"name": format!("{ns}-tiny")},
               "spec": {"cpus": 1, "memoryMiB": 256, "firmware": "bios",
                        "disk": {"sizeGiB": 1, "storageClass": "local"}}}),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMImage", "metadata": {"name": format!("{ns}-guest")},
               "spec": {"os": {"family": "linux", "distribution": "busybox", "version": "1"},
                        "sources": {
                            "libvirt": {"volume": {"pool": POOL, "name": IMAGE_VOLUME}, "format": "qcow2"},
                            "cloudHypervisor": r.ch.image,
                            "vsphere": {"template": r.vc.ready.template},
                            "proxmox": {"templateID": r.pve.ready.template_id}}}}),
    ]
}

/// Every rig, a namespace with the Providers, class and image on it, and an operator.
struct World {
    rigs: Rigs,
    ns: banlieue_testenv::TestNamespace,
    client: kube::Client,
    vms: Api<VirtualMachine>,
    operator: CrashableOperator,
}

async fn world(prefix: &str) -> Option<World> {
    let (Some(lv), Some(vc), Some(pve)) = (LibvirtRig::start(), Vcsim::start(), FakePve::start())
    else {
        return None;
    };
    let rigs = Rigs {
        lv,
        ch: ChRig::new(FAKE_VMM, Guest::Exit),
        vc,
        pve,
    };
    let ns = banlieue_testenv::namespace(prefix).await;
    let client = ns.client.clone();
    let operator = CrashableOperator::start(
        banlieue_testenv::shared().kube_config(),
        &ns.name,
        registry(),
        Duration::from_secs(5),
    );
    for object in fixtures(&rigs, &ns.name) {
        apply(&client, &ns.name, &object)
            .await
            .unwrap_or_else(|e| panic!("apply {}: {e}", object["metadata"]["name"]));
    }
    let vms = Api::namespaced(client.clone(), &ns.name);
    Some(World {
        rigs,
        ns,
        client,
        vms,
        operator,
    })
}

fn vm(ns: &str, name: &str, provider: &str, power: &str) -> Value {
    json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine", "metadata": {"name": name},
           "spec": {"classRef": {"name": format!("{ns}-tiny")}, "imageRef": {"name": format!("{ns}-guest")},
                    "powerState": power,
                    "placement": {"providerRef": {"name": provider}},
                    "migration": {"strategy": "CopyDisk"},
                    "networks": [{"name": "eth0", "networkClass": "lan"}]}})
}

fn infra(client: &kube::Client, ns: &str, kind: &str) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("infrastructure.banlieue.io", "v1alpha1", kind);
    let plural = format!("{}s", kind.to_lowercase());
    Api::namespaced_with(
        client.clone(),
        ns,
        &ApiResource::from_gvk_with_plural(&gvk, &plural),
    )
}

fn condition<'a>(vm: &'a VirtualMachine, kind: &str) -> Option<&'a Condition> {
    vm.status
        .as_ref()
        .and_then(|s| conditions::get(&s.conditions, kind))
}

/// Polls the VM until `done` holds, printing its Migrating condition as it changes.
async fn until(
    vms: &Api<VirtualMachine>,
    name: &str,
    what: &str,
    done: impl Fn(&VirtualMachine) -> bool,
) -> VirtualMachine {
    let deadline = Instant::now() + WAIT;
    let mut last = String::new();
    loop {
        if let Some(vm) = vms.get_opt(name).await.unwrap() {
            if let Some(c) = condition(&vm, "Migrating") {
                let now = format!("{} {}: {}", c.status, c.reason, c.message);
                if now != last {
                    eprintln!("[{name}] Migrating {now}");
                    last = now;
                }
            }
            if done(&vm) {
                return vm;
            }
            assert!(
                Instant::now() < deadline,
                "{name}: {what} did not happen in {WAIT:?}: {:#?}",
                vm.status
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

fn ready_on(vm: &VirtualMachine, provider: &str, power: PowerState) -> bool {
    let status = vm.status.as_ref();
    status
        .and_then(|s| s.placement.as_ref())
        .map(|p| p.provider.as_str())
        == Some(provider)
        && status.and_then(|s| s.power_state) == Some(power)
        && conditions::is_true(
            &status.map(|s| s.conditions.clone()).unwrap_or_default(),
            "Ready",
        )
        && condition(vm, "Migrating").is_none_or(|c| c.reason == "Completed")
}

fn run(command: &mut Command) -> String {
    let output = command
        .output()
        .unwrap_or_else(|e| panic!("{command:?}: {e}"));
    assert!(
        output.status.success(),
        "{command:?}: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// `qemu-img info` of a disk: its format and backing file.
fn info(path: &Path) -> Value {
    serde_json::from_str(&run(Command::new("qemu-img")
        .args(["info", "--output=json", "-U"])
        .arg(path)))
    .unwrap()
}

/// Whether `disk` holds the reference's bytes (and the pattern at its offsets).
fn assert_same_content(hop: &str, reference: &Path, disk: &Path) {
    let format = info(disk)["format"].as_str().unwrap_or_default().to_owned();
    let compared = Command::new("qemu-img")
        .args(["compare", "-U", "-f", "raw", "-F", &format])
        .arg(reference)
        .arg(disk)
        .output()
        .unwrap();
    assert!(
        compared.status.success(),
        "{hop}: {} differs from the reference: {}{}",
        disk.display(),
        String::from_utf8_lossy(&compared.stdout),
        String::from_utf8_lossy(&compared.stderr)
    );
    for (offset, len, byte) in PATTERN {
        run(Command::new("qemu-io")
            .args(["-U", "-r", "-f", &format, "-c"])
            .arg(format!("read -P 0x{byte:02x} {offset} {len}"))
            .arg(disk));
    }
    eprintln!(
        "{hop}: {} ({format}) has the reference's content",
        disk.display()
    );
}

/// The LibvirtMachine's OS volume on the rig, as libvirt reports its path.
fn libvirt_disk(rig: &LibvirtRig, machine_uid: &str) -> PathBuf {
    let conn = rig.connect();
    let pool = conn.lookup_storage_pool_by_name(POOL).unwrap();
    pool.refresh(0).unwrap();
    let name = banlieue_backend_libvirt::domain::os_volume_name(machine_uid);
    let volume = pool
        .lookup_storage_vol_by_name(&name)
        .unwrap_or_else(|e| panic!("no volume {name}: {e} (have {:?})", rig.volumes()));
    PathBuf::from(volume.path().unwrap())
}

/// The CloudHypervisorMachine's OS disk file (raw once imported).
fn ch_disk(rig: &ChRig, machine_uid: &str) -> PathBuf {
    let dir = rig.machine_dir(machine_uid);
    ["disk.raw", "disk.qcow2"]
        .into_iter()
        .map(|name| dir.join(name))
        .find(|p| p.exists())
        .unwrap_or_else(|| panic!("no OS disk in {}", dir.display()))
}

async fn uid_of(client: &kube::Client, ns: &str, kind: &str) -> String {
    infra(client, ns, kind)
        .get(VM)
        .await
        .unwrap_or_else(|e| panic!("{kind} {VM}: {e}"))
        .metadata
        .uid
        .unwrap()
}

async fn annotation(client: &kube::Client, ns: &str, kind: &str, key: &str) -> Option<String> {
    infra(client, ns, kind)
        .get(VM)
        .await
        .unwrap()
        .metadata
        .annotations
        .and_then(|a| a.get(key).cloned())
}

async fn move_to(vms: &Api<VirtualMachine>, provider: &str) {
    vms.patch(
        VM,
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"placement": {"providerRef": {"name": provider}}}})),
    )
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vm_keeps_its_bytes_around_libvirt_cloud_hypervisor_vsphere_and_back() {
    let Some(World {
        rigs,
        ns,
        client,
        vms,
        operator,
    }) = world("copy").await
    else {
        return;
    };
    let control_plane = banlieue_testenv::shared();
    let mut operator = Some(operator);

    // On libvirt, powered off: write the pattern into its disk, keep a raw reference.
    apply(&client, &ns.name, &vm(&ns.name, VM, "host", "PoweredOff"))
        .await
        .unwrap();
    until(&vms, VM, "Ready on libvirt", |v| {
        ready_on(v, "host", PowerState::PoweredOff)
    })
    .await;
    let first_uid = uid_of(&client, &ns.name, "LibvirtMachine").await;
    let disk = libvirt_disk(&rigs.lv, &first_uid);
    for (offset, len, byte) in PATTERN {
        run(Command::new("qemu-io")
            .args(["-f", "qcow2", "-c"])
            .arg(format!("write -P 0x{byte:02x} {offset} {len}"))
            .arg(&disk));
    }
    let work = tempfile::tempdir().unwrap();
    let reference = work.path().join("reference.raw");
    run(Command::new("qemu-img")
        .args(["convert", "-U", "-O", "raw"])
        .arg(&disk)
        .arg(&reference));
    assert_same_content("libvirt (source)", &reference, &disk);
    // Running, so the move has to stop it first.
    vms.patch(
        VM,
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"powerState": "PoweredOn"}})),
    )
    .await
    .unwrap();
    until(&vms, VM, "running on libvirt", |v| {
        ready_on(v, "host", PowerState::PoweredOn)
    })
    .await;

    // libvirt -> Cloud Hypervisor.
    let ch_creates = || {
        rigs.ch
            .exchanges()
            .into_iter()
            .filter(|e| e["path"].as_str() == Some("/api/v1/vm.create"))
            .count()
    };
    let creates_before = ch_creates();
    move_to(&vms, "ch").await;
    until(&vms, VM, "Ready on Cloud Hypervisor", |v| {
        ready_on(v, "ch", PowerState::PoweredOn)
    })
    .await;
    let ch_uid = uid_of(&client, &ns.name, "CloudHypervisorMachine").await;
    assert!(
        infra(&client, &ns.name, "LibvirtMachine")
            .get_opt(VM)
            .await
            .unwrap()
            .is_none(),
        "the libvirt machine is deleted once the target is Ready"
    );
    assert!(
        rigs.lv
            .domains()
            .iter()
            .all(|(name, _, _)| !name.contains(VM)),
        "no domain left on libvirt: {:?}",
        rigs.lv.domains()
    );
    assert_eq!(ch_creates() - creates_before, 1, "one VM created on CH");
    assert_eq!(
        annotation(
            &client,
            &ns.name,
            "CloudHypervisorMachine",
            "banlieue.io/instance-id"
        )
        .await
        .as_deref(),
        Some(first_uid.as_str()),
        "the guest keeps its instance-id"
    );
    assert_same_content("cloud-hypervisor", &reference, &ch_disk(&rigs.ch, &ch_uid));

    // Cloud Hypervisor -> vSphere, the operator killed mid-copy.
    let clones_before = rigs.vc.calls("CloneVM_Task");
    move_to(&vms, "vc").await;
    until(&vms, VM, "the copy to vSphere under way", |v| {
        condition(v, "Migrating")
            .is_some_and(|c| c.reason == "CopyingDisks" || c.reason == "StartingTarget")
    })
    .await;
    operator.take().unwrap().kill();
    eprintln!("operator killed mid-copy");
    tokio::time::sleep(Duration::from_secs(1)).await;
    operator = Some(CrashableOperator::start(
        control_plane.kube_config(),
        &ns.name,
        registry(),
        Duration::from_secs(5),
    ));
    until(&vms, VM, "Ready on vSphere", |v| {
        ready_on(v, "vc", PowerState::PoweredOn)
    })
    .await;
    let on_vsphere: Vec<Value> = rigs
        .vc
        .vms()
        .into_iter()
        .filter(|v| v["name"].as_str() == Some(VM))
        .collect();
    assert_eq!(on_vsphere.len(), 1, "one VM on vSphere: {on_vsphere:#?}");
    assert_eq!(
        rigs.vc.calls("CloneVM_Task") - clones_before,
        0,
        "made on the copied disk, not cloned from the template"
    );
    assert!(
        infra(&client, &ns.name, "CloudHypervisorMachine")
            .get_opt(VM)
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        !rigs.ch.machine_dir(&ch_uid).join("state.json").exists(),
        "the CH machine is gone"
    );
    assert_eq!(
        annotation(
            &client,
            &ns.name,
            "VSphereMachine",
            "banlieue.io/instance-id"
        )
        .await
        .as_deref(),
        Some(first_uid.as_str())
    );
    let vsphere_disk = vsphere_disk(&rigs.vc, &on_vsphere[0]);
    assert_same_content("vsphere", &reference, &vsphere_disk);

    // vSphere -> libvirt: home again, on the copied disk (no backing image); the
    // real guest boots from it (Ready waits for its DHCP lease) as the same instance.
    let domain = format!("{}.{VM}", ns.name);
    let console_before = rigs.lv.console(&domain).len();
    move_to(&vms, "host").await;
    until(&vms, VM, "Ready on libvirt again", |v| {
        ready_on(v, "host", PowerState::PoweredOn)
    })
    .await;
    let last_uid = uid_of(&client, &ns.name, "LibvirtMachine").await;
    assert_ne!(last_uid, first_uid);
    let home = libvirt_disk(&rigs.lv, &last_uid);
    assert!(
        info(&home).get("backing-filename").is_none(),
        "the imported volume stands alone: {}",
        info(&home)
    );
    assert!(
        rigs.vc.vms().iter().all(|v| v["name"].as_str() != Some(VM)),
        "the vSphere VM is gone"
    );
    assert_same_content("libvirt (home)", &reference, &home);
    let console = rigs.lv.console(&domain);
    let this_boot = console.get(console_before..).unwrap_or(&console);
    assert!(
        this_boot.contains(&format!("instance-id={first_uid} ")),
        "the guest booted from the migrated disk with its first instance-id: {this_boot}"
    );
    assert_eq!(
        rigs.lv
            .domains()
            .iter()
            .filter(|(name, _, _)| name.contains(VM))
            .count(),
        1
    );
    drop(operator);
}

/// The VM's disk file as vcsim keeps it on the host.
fn vsphere_disk(vc: &Vcsim, vm: &Value) -> PathBuf {
    vc.disk_path(vm)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_off_proxmox_is_refused_before_anything_is_touched() {
    let Some(World {
        rigs,
        ns,
        client,
        vms,
        operator: _operator,
    }) = world("copy-px").await
    else {
        return;
    };
    apply(&client, &ns.name, &vm(&ns.name, VM, "pve", "PoweredOn"))
        .await
        .unwrap();
    until(&vms, VM, "Ready on Proxmox", |v| {
        ready_on(v, "pve", PowerState::PoweredOn)
    })
    .await;
    let before = rigs.pve.machines().len();
    move_to(&vms, "host").await;
    let refused = until(&vms, VM, "the refusal", |v| {
        condition(v, "Migrating").is_some_and(|c| c.reason == "CopyDiskUnsupported")
    })
    .await;
    let c = condition(&refused, "Migrating").unwrap();
    assert_eq!(c.status, "False");
    assert!(
        c.message
            .contains("Provider pve (proxmox backend) cannot export disks"),
        "{}",
        c.message
    );
    // Nothing moved: still on Proxmox, running, one VM there, none on libvirt.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let vm = vms.get(VM).await.unwrap();
    let status = vm.status.as_ref().unwrap();
    assert_eq!(status.placement.as_ref().unwrap().provider, "pve");
    assert_eq!(status.power_state, Some(PowerState::PoweredOn));
    assert_eq!(rigs.pve.machines().len(), before);
    assert!(
        infra(&client, &ns.name, "LibvirtMachine")
            .get_opt(VM)
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        rigs.lv
            .domains()
            .iter()
            .all(|(name, _, _)| !name.contains(VM))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_import_removes_the_target_and_powers_the_source_back_on() {
    let Some(World {
        rigs,
        ns,
        client,
        vms,
        operator: _operator,
    }) = world("copy-fail").await
    else {
        return;
    };
    apply(&client, &ns.name, &vm(&ns.name, VM, "ch", "PoweredOn"))
        .await
        .unwrap();
    until(&vms, VM, "Ready on Cloud Hypervisor", |v| {
        ready_on(v, "ch", PowerState::PoweredOn)
    })
    .await;
    let ch_uid = uid_of(&client, &ns.name, "CloudHypervisorMachine").await;
    // The datastore refuses the import's folder, every time.
    rigs.vc.fail(
        "MakeDirectory",
        "Cannot complete the operation (injected)",
        1000,
    );
    move_to(&vms, "vc").await;
    let failed = until(&vms, VM, "the copy to fail", |v| {
        condition(v, "Migrating").is_some_and(|c| c.reason == "CopyFailed")
    })
    .await;
    let message = condition(&failed, "Migrating").unwrap().message.clone();
    assert!(
        message.contains("injected"),
        "the backend's own words: {message}"
    );
    // Undone: no VSphereMachine, no VM on vSphere, the source running again on CH.
    until(&vms, VM, "the source back on", |v| {
        v.status.as_ref().and_then(|s| s.power_state) == Some(PowerState::PoweredOn)
            && infra_gone_on_vsphere(&rigs.vc)
    })
    .await;
    wait_gone(&infra(&client, &ns.name, "VSphereMachine")).await;
    assert_eq!(
        uid_of(&client, &ns.name, "CloudHypervisorMachine").await,
        ch_uid
    );
    let machine = infra(&client, &ns.name, "CloudHypervisorMachine")
        .get(VM)
        .await
        .unwrap();
    assert_eq!(machine.data["spec"]["powerState"], "PoweredOn");
    // And it stays failed (no retry loop) until the spec changes.
    let calls = rigs.vc.calls("MakeDirectory");
    tokio::time::sleep(Duration::from_secs(8)).await;
    assert_eq!(rigs.vc.calls("MakeDirectory"), calls, "no retry loop");
    let still = vms.get(VM).await.unwrap();
    assert_eq!(
        condition(&still, "Migrating").map(|c| c.reason.as_str()),
        Some("CopyFailed")
    );
    let status = still.status.as_ref().unwrap();
    assert_eq!(
        status.placement.as_ref().map(|p| p.provider.as_str()),
        Some("ch"),
        "the status says where the VM runs"
    );
    assert!(conditions::is_true(
        &status.conditions,
        "InfrastructureReady"
    ));
}

fn infra_gone_on_vsphere(vc: &Vcsim) -> bool {
    vc.vms().iter().all(|v| v["name"].as_str() != Some(VM))
}

async fn wait_gone(api: &Api<DynamicObject>) {
    let deadline = Instant::now() + WAIT;
    while api.get_opt(VM).await.unwrap().is_some() {
        assert!(Instant::now() < deadline, "{VM} is still there");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vm_deleted_mid_copy_leaves_nothing_behind() {
    let Some(World {
        rigs,
        ns,
        client,
        vms,
        operator: _operator,
    }) = world("copy-del").await
    else {
        return;
    };
    apply(&client, &ns.name, &vm(&ns.name, VM, "host", "PoweredOff"))
        .await
        .unwrap();
    until(&vms, VM, "Ready on libvirt", |v| {
        ready_on(v, "host", PowerState::PoweredOff)
    })
    .await;
    move_to(&vms, "ch").await;
    until(&vms, VM, "the copy under way", |v| {
        condition(v, "Migrating").is_some_and(|c| c.reason == "CopyingDisks")
    })
    .await;
    vms.delete(VM, &Default::default()).await.unwrap();
    let deadline = Instant::now() + WAIT;
    while vms.get_opt(VM).await.unwrap().is_some() {
        assert!(Instant::now() < deadline, "the VM was not deleted");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // Nothing of it on either backend: no volume, no domain, no CH directory or import.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let volumes: Vec<String> = rigs
        .lv
        .volumes()
        .into_iter()
        .filter(|v| v.starts_with("bnl-"))
        .collect();
    assert!(volumes.is_empty(), "libvirt volumes left: {volumes:?}");
    assert!(
        rigs.lv
            .domains()
            .iter()
            .all(|(name, _, _)| !name.contains(VM))
    );
    let left: Vec<String> = std::fs::read_dir(&rigs.ch.state_dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    assert!(left.is_empty(), "Cloud Hypervisor state left: {left:?}");
}

/// The Provider's Ready condition, once it has one.
async fn provider_ready(client: &kube::Client, ns: &str, name: &str) -> Option<Condition> {
    let providers: Api<Provider> = Api::namespaced(client.clone(), ns);
    let provider = providers.get_opt(name).await.unwrap()?;
    provider
        .status
        .and_then(|s| conditions::get(&s.conditions, "Ready").cloned())
}

async fn until_provider_not_ready(client: &kube::Client, ns: &str, name: &str) -> Condition {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(c) = provider_ready(client, ns, name).await
            && c.status == "False"
        {
            eprintln!("[{name}] Ready=False {}: {}", c.reason, c.message);
            return c;
        }
        assert!(
            Instant::now() < deadline,
            "Provider {name} never went Ready=False"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Waits for the move to say `ProviderUnreachable`; any step of a move that started
/// (or a refusal as unsupported) on the way fails the test at once.
async fn until_unreachable(vms: &Api<VirtualMachine>) -> Condition {
    let said = until(vms, VM, "Migrating=False ProviderUnreachable", |v| {
        let Some(c) = condition(v, "Migrating") else {
            return false;
        };
        assert!(
            !matches!(
                c.reason.as_str(),
                "CopyDiskUnsupported"
                    | "StoppingSource"
                    | "CopyingDisks"
                    | "StartingTarget"
                    | "CopyFailed"
            ),
            "an unreachable Provider must neither refuse the move nor start it: {} {}: {}",
            c.status,
            c.reason,
            c.message
        );
        c.reason == "ProviderUnreachable"
    })
    .await;
    let c = condition(&said, "Migrating").unwrap().clone();
    assert_eq!(c.status, "False", "{c:?}");
    c
}

/// What a move that did not start must leave: the VM placed where it was and
/// reporting it, the source machine as it was (same UID, still asked to run), and
/// nothing of the VM on the target.
async fn assert_nothing_moved(
    client: &kube::Client,
    ns: &str,
    vms: &Api<VirtualMachine>,
    (from, source_kind, source_uid): (&str, &str, &str),
    target_kind: &str,
) {
    let vm = vms.get(VM).await.unwrap();
    let status = vm.status.as_ref().unwrap();
    assert_eq!(
        status.placement.as_ref().map(|p| p.provider.as_str()),
        Some(from),
        "the status says where the VM runs"
    );
    let source = infra(client, ns, source_kind).get(VM).await.unwrap();
    assert_eq!(
        source.metadata.uid.as_deref(),
        Some(source_uid),
        "the same source machine"
    );
    assert_eq!(
        source.data["spec"]["powerState"], "PoweredOn",
        "the source is not stopped"
    );
    assert!(
        source.metadata.deletion_timestamp.is_none(),
        "the source is not being deleted"
    );
    assert!(
        infra(client, ns, target_kind)
            .get_opt(VM)
            .await
            .unwrap()
            .is_none(),
        "no {target_kind} made"
    );
}

/// F9: a CopyDisk move whose *source* Provider cannot be reached (its credentials
/// Secret is gone, so its connection no longer resolves) is not refused as
/// unsupported: it says `ProviderUnreachable`, touches nothing (the vSphere VM keeps
/// running, nothing is made on Cloud Hypervisor) and is tried again with backoff, so
/// it happens once the Provider is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_from_an_unreachable_provider_waits_says_so_and_loses_nothing() {
    let Some(World {
        rigs,
        ns,
        client,
        vms,
        operator: _operator,
    }) = world("copy-unr").await
    else {
        return;
    };
    apply(&client, &ns.name, &vm(&ns.name, VM, "vc", "PoweredOn"))
        .await
        .unwrap();
    until(&vms, VM, "Ready on vSphere", |v| {
        ready_on(v, "vc", PowerState::PoweredOn)
    })
    .await;
    let source_uid = uid_of(&client, &ns.name, "VSphereMachine").await;
    let on_vsphere = rigs.vc.vm(VM).expect("the VM on vSphere");

    // The source becomes unreachable: its credentials go.
    let secrets: Api<k8s_openapi::api::core::v1::Secret> =
        Api::namespaced(client.clone(), &ns.name);
    let credentials = secrets.get("vc-credentials").await.unwrap();
    secrets
        .delete("vc-credentials", &Default::default())
        .await
        .unwrap();
    until_provider_not_ready(&client, &ns.name, "vc").await;
    let ch_creates = || {
        rigs.ch
            .exchanges()
            .into_iter()
            .filter(|e| e["path"].as_str() == Some("/api/v1/vm.create"))
            .count()
    };
    let (vc_calls, ch_before) = (rigs.vc.calls("PowerOffVM_Task"), ch_creates());

    move_to(&vms, "ch").await;
    let said = until_unreachable(&vms).await;
    assert!(
        said.message.contains("Provider vc (") && said.message.contains("is not reachable"),
        "names the unreachable Provider: {}",
        said.message
    );
    // A few backoff rounds: still nothing touched.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let still = vms.get(VM).await.unwrap();
    assert_eq!(
        condition(&still, "Migrating").map(|c| c.reason.as_str()),
        Some("ProviderUnreachable")
    );
    assert_nothing_moved(
        &client,
        &ns.name,
        &vms,
        ("vc", "VSphereMachine", &source_uid),
        "CloudHypervisorMachine",
    )
    .await;
    let now_on_vsphere = rigs.vc.vm(VM).expect("the VM still on vSphere");
    assert_eq!(now_on_vsphere["moref"], on_vsphere["moref"], "the same VM");
    assert_eq!(
        now_on_vsphere["power"], on_vsphere["power"],
        "still running"
    );
    assert_eq!(rigs.vc.calls("PowerOffVM_Task"), vc_calls, "never stopped");
    assert_eq!(
        ch_creates(),
        ch_before,
        "nothing created on Cloud Hypervisor"
    );
    let left: Vec<String> = std::fs::read_dir(&rigs.ch.state_dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    assert!(left.is_empty(), "Cloud Hypervisor state made: {left:?}");

    // Back: the move is tried again and happens (a refusal would have stayed).
    let mut restored = json!({"apiVersion": "v1", "kind": "Secret",
                              "metadata": {"name": "vc-credentials"}});
    restored["data"] = serde_json::to_value(&credentials.data).unwrap();
    apply(&client, &ns.name, &restored).await.unwrap();
    until(&vms, VM, "Ready on Cloud Hypervisor", |v| {
        ready_on(v, "ch", PowerState::PoweredOn)
    })
    .await;
    assert_eq!(ch_creates() - ch_before, 1, "one VM created on CH");
    assert!(
        rigs.vc.vm(VM).is_none(),
        "the vSphere VM is gone once moved"
    );
}

/// F9, the other end: a CopyDisk move to a Provider whose endpoint is a closed
/// loopback port. That Provider is `Ready=False Unreachable`, so the move is held at
/// scheduling: the VM says no Provider fits and why (the target is unreachable, not
/// "unsupported"), the source keeps running untouched and nothing is made on the
/// target. Once the Provider answers (its endpoint fixed), the move happens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_to_an_unreachable_provider_waits_for_it_and_loses_nothing() {
    let Some(World {
        rigs,
        ns,
        client,
        vms,
        operator: _operator,
    }) = world("copy-unr-to").await
    else {
        return;
    };
    // A port nothing listens on.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let down = |endpoint: String| {
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "Provider", "metadata": {"name": "down"},
               "spec": {"class": "vsphere",
                        "connection": {"endpoint": endpoint,
                                       "credentialsRef": {"name": "vc-credentials"},
                                       "caBundle": {"inline": rigs.vc.ready.ca_pem}},
                        "capabilities": {
                            "storageClasses": [{"name": "local", "target": {"datastore": "LocalDS_0"}}],
                            "networkClasses": [{"name": "lan", "target": {"portGroup": "VM Network"}}]},
                        "settings": {"taskPollInterval": "100ms", "shutdownTimeout": "2s"}}})
    };
    apply(
        &client,
        &ns.name,
        &down(format!("https://127.0.0.1:{closed}/sdk")),
    )
    .await
    .unwrap();
    apply(&client, &ns.name, &vm(&ns.name, VM, "ch", "PoweredOn"))
        .await
        .unwrap();
    until(&vms, VM, "Ready on Cloud Hypervisor", |v| {
        ready_on(v, "ch", PowerState::PoweredOn)
    })
    .await;
    let source_uid = uid_of(&client, &ns.name, "CloudHypervisorMachine").await;
    let pids = rigs.ch.vmm_pids(&source_uid);
    assert_eq!(pids.len(), 1);
    let not_ready = until_provider_not_ready(&client, &ns.name, "down").await;
    assert_eq!(not_ready.reason, "Unreachable", "{not_ready:?}");

    move_to(&vms, "down").await;
    let held = until(&vms, VM, "the move held at scheduling", |v| {
        if let Some(c) = condition(v, "Migrating").filter(|c| c.reason != "Completed") {
            panic!(
                "a move to an unreachable Provider must neither be refused nor start: {} {}: {}",
                c.status, c.reason, c.message
            );
        }
        condition(v, "Scheduled").is_some_and(|c| c.status == "False")
    })
    .await;
    let scheduled = condition(&held, "Scheduled").unwrap();
    assert_eq!(scheduled.reason, "NoFeasibleProvider", "{scheduled:?}");
    assert!(
        scheduled.message.contains("down: not Ready (Unreachable: ")
            && scheduled.message.contains("Connection refused"),
        "says the target is unreachable: {}",
        scheduled.message
    );
    tokio::time::sleep(Duration::from_secs(6)).await;
    let still = vms.get(VM).await.unwrap();
    assert!(
        condition(&still, "Migrating").is_none_or(|c| c.reason == "Completed"),
        "no move started: {:?}",
        condition(&still, "Migrating")
    );
    assert_nothing_moved(
        &client,
        &ns.name,
        &vms,
        ("ch", "CloudHypervisorMachine", &source_uid),
        "VSphereMachine",
    )
    .await;
    assert_eq!(rigs.ch.vmm_pids(&source_uid), pids, "the same VMM, running");
    let ops = rigs.ch.operations(&source_uid);
    assert!(
        !ops.iter()
            .any(|o| o == "vm.power-button" || o == "vm.shutdown" || o == "vm.delete"),
        "the source was never stopped: {ops:?}"
    );
    assert!(rigs.vc.vm(VM).is_none(), "nothing on vSphere");

    // The Provider answers again: the move happens.
    apply(
        &client,
        &ns.name,
        &down(format!("{}/sdk", rigs.vc.ready.endpoint)),
    )
    .await
    .unwrap();
    until(&vms, VM, "Ready on the Provider once it answers", |v| {
        ready_on(v, "down", PowerState::PoweredOn)
    })
    .await;
    assert_eq!(
        rigs.vc.vms().iter().filter(|v| v["name"] == VM).count(),
        1,
        "one VM on vSphere"
    );
    assert!(
        !rigs.ch.machine_dir(&source_uid).join("state.json").exists(),
        "the CH machine is gone once moved"
    );
}

/// F9 as it happens in an outage: the source's vCenter stops answering (vcsim
/// stopped with SIGSTOP), its Provider goes `Reachable=False`, and a CopyDisk move off
/// it is asked for. It says `ProviderUnreachable` and stops nothing: the backend cache
/// still holds the source's backend (backends connect lazily), so the planning heeds
/// the Provider's last check, not only whether its connection resolves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_from_a_provider_that_stopped_answering_says_unreachable_and_stops_nothing() {
    let Some(World {
        rigs,
        ns,
        client,
        vms,
        operator: _operator,
    }) = world("copy-silent").await
    else {
        return;
    };
    apply(&client, &ns.name, &vm(&ns.name, VM, "vc", "PoweredOn"))
        .await
        .unwrap();
    until(&vms, VM, "Ready on vSphere", |v| {
        ready_on(v, "vc", PowerState::PoweredOn)
    })
    .await;
    let source_uid = uid_of(&client, &ns.name, "VSphereMachine").await;
    let pid = rigs.vc.pid().to_string();
    run(Command::new("kill").args(["-STOP", &pid]));
    until_provider_not_ready(&client, &ns.name, "vc").await;
    move_to(&vms, "ch").await;
    let said = until_unreachable(&vms).await;
    assert!(said.message.contains("Provider vc ("), "{}", said.message);
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert_nothing_moved(
        &client,
        &ns.name,
        &vms,
        ("vc", "VSphereMachine", &source_uid),
        "CloudHypervisorMachine",
    )
    .await;
    run(Command::new("kill").args(["-CONT", &pid]));
    until(&vms, VM, "Ready on Cloud Hypervisor", |v| {
        ready_on(v, "ch", PowerState::PoweredOn)
    })
    .await;
    assert!(
        rigs.vc.vm(VM).is_none(),
        "the vSphere VM is gone once moved"
    );
}
