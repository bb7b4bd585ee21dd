//! The vSphere backend's disk transfer (`CopyDisk`) against vcsim, with real disk
//! images: `qemu-img`/`qemu-io` make a disk with a known pattern, the backend uploads
//! it through the datastore file interface, creates the VM on it (never cloning the
//! template), and exports it back, which must hold the same bytes at the same offsets.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use banlieue_backend_vsphere::{IMPORT_QEMU_IMG_OPTIONS, VSphereBackend, VSphereFactory};
use banlieue_integration_tests::vcsim::Vcsim;
use banlieue_sdk::api::common::{BootstrapFormat, PowerState, ProviderClass};
use banlieue_sdk::backend::{
    Backend, BackendError, BootstrapData, Connection, Deletion, DiskFormat, DiskTransfer,
    MachineIdentity, MachineObservation, MachineRequest, MachineSpec, OS_DISK, SecretValue,
    StagedDisk,
};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Value, json};

const MIB: u64 = 1024 * 1024;

fn connection(sim: &Vcsim) -> Connection {
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
        // The transfers are verified against the Provider's CA like the SOAP calls.
        ca_bundle: Some(sim.ready.ca_pem.clone()),
        insecure_skip_tls_verify: false,
        settings: [("taskPollInterval".to_string(), "50ms".to_string())].into(),
    }
}

/// A machine on the OS datastore LocalDS_0 with a data disk on LocalDS_1, copied from
/// another (`disks_imported`, keeping instance-id `old-id`).
fn request(uid: &str, template: &str, power: &str) -> MachineRequest {
    let spec = serde_json::from_value(json!({
        "template": template, "numCPUs": 2, "memoryMiB": 1024, "datastore": "LocalDS_0",
        "powerState": power,
        "additionalDisks": [{"name": "data", "sizeGiB": 1, "storage": "LocalDS_1"}],
        "network": [{"networkName": "VM Network", "macAddress": "00:50:56:3f:00:11"}],
    }))
    .unwrap();
    MachineRequest {
        identity: MachineIdentity::new(uid, "direct", format!("cp-{}", &uid[..8])),
        spec: MachineSpec::VSphere(spec),
        failure_domain: Some("DC0/DC0_C1".into()),
        bootstrap: Some(BootstrapData {
            format: BootstrapFormat::CloudConfig,
            user_data: SecretValue::new("#cloud-config\nruncmd: [echo copied]\n"),
            network_config: None,
        }),
        instance_id: Some("old-id".into()),
        disks_imported: true,
    }
}

fn with_power(mut req: MachineRequest, power: PowerState) -> MachineRequest {
    if let MachineSpec::VSphere(s) = &mut req.spec {
        s.power_state = power;
    }
    req
}

async fn backend(sim: &Vcsim) -> std::sync::Arc<VSphereBackend> {
    VSphereFactory::new()
        .connect_vsphere(&connection(sim))
        .unwrap()
}

fn transfer(backend: &VSphereBackend) -> &dyn DiskTransfer {
    backend.disk_transfer().expect("vsphere has disk transfer")
}

async fn settle(backend: &dyn Backend, req: &MachineRequest) -> MachineObservation {
    for _ in 0..400 {
        match backend.ensure(req).await {
            Ok(o) if o.settled_at(req.spec.power_state()) => return o,
            Ok(_) => {}
            Err(e) if e.is_transient() => {}
            Err(e) => panic!("{e}"),
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("machine did not settle")
}

fn run(command: &mut Command) -> String {
    let out = command
        .output()
        .unwrap_or_else(|e| panic!("{command:?}: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{command:?} failed: {text}");
    text
}

/// A raw disk of `size` bytes with `pattern` written over 64 KiB at `offset`, and its
/// conversion to what the vSphere import takes (the options the controller uses).
fn disk(dir: &Path, name: &str, size: u64, pattern: u8, offset: u64) -> (PathBuf, StagedDisk) {
    let raw = dir.join(format!("{name}.raw"));
    run(Command::new("qemu-img")
        .args(["create", "-f", "raw"])
        .arg(&raw)
        .arg(size.to_string()));
    run(Command::new("qemu-io")
        .args([
            "-f",
            "raw",
            "-c",
            &format!("write -P {pattern:#04x} {offset} 64k"),
        ])
        .arg(&raw));
    let import = dir.join("import");
    std::fs::create_dir_all(&import).unwrap();
    let vmdk = import.join(format!("{name}.vmdk"));
    run(Command::new("qemu-img")
        .args(["convert", "-f", "raw", "-O", "vmdk"])
        .args(IMPORT_QEMU_IMG_OPTIONS)
        .arg(&raw)
        .arg(&vmdk));
    (
        raw,
        StagedDisk {
            name: name.into(),
            path: vmdk,
            format: DiskFormat::Vmdk,
            virtual_bytes: size,
        },
    )
}

/// `qemu-io` read-back of the pattern: every byte of the 64 KiB matches.
fn has_pattern(file: &Path, format: &str, pattern: u8, offset: u64) {
    let out = run(Command::new("qemu-io")
        .args([
            "-f",
            format,
            "-r",
            "-c",
            &format!("read -P {pattern:#04x} {offset} 64k"),
        ])
        .arg(file));
    assert!(
        out.contains("read 65536/65536 bytes") && !out.contains("verification failed"),
        "{}: {out}",
        file.display()
    );
}

fn metadata(vm: &Value) -> Value {
    let v = vm["extraConfig"]["guestinfo.metadata"]
        .as_str()
        .unwrap_or_default();
    serde_json::from_slice(&STANDARD.decode(v).unwrap()).unwrap()
}

fn expect_error(result: Result<impl std::fmt::Debug, BackendError>, reason: &str) -> BackendError {
    match result {
        Err(e) if e.reason == reason => e,
        other => panic!("expected {reason}, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_machine_is_created_on_imported_disks_and_exported_back_byte_for_byte() {
    if !banlieue_integration_tests::qemu_utils() {
        return;
    }
    let Some(sim) = Vcsim::start() else { return };
    let backend = backend(&sim).await;
    let disks = transfer(&backend);
    assert_eq!(disks.import_format(), DiskFormat::Vmdk);
    let dir = tempfile::tempdir().unwrap();
    let (os_raw, os) = disk(dir.path(), OS_DISK, 8 * MIB, 0xab, MIB);
    let (data_raw, data) = disk(dir.path(), "data", 4 * MIB, 0xcd, 2 * MIB);
    let uid = "00000001-2222-4000-8000-000000000000";
    let req = request(uid, &sim.ready.template, "PoweredOn");

    disks
        .import(&req, &[os.clone(), data.clone()])
        .await
        .unwrap();
    // An interrupted or repeated import is overwritten.
    disks.import(&req, &[os, data]).await.unwrap();

    let observed = settle(backend.as_ref(), &req).await;
    let vm = sim.vm(&req.identity.name).expect("the VM");
    assert_eq!(sim.calls("CloneVM_Task"), 0, "never cloned");
    assert_eq!(sim.calls("CreateVM_Task"), 1, "created once");
    assert_eq!(
        vm["diskFiles"],
        json!([
            format!("[LocalDS_0] banlieue/{uid}/os.vmdk"),
            format!("[LocalDS_1] banlieue/{uid}/data.vmdk"),
        ]),
        "on the uploaded files: {vm}"
    );
    assert_eq!(vm["disksKB"], json!([8 * 1024, 4 * 1024]), "{vm}");
    // What it runs with names the imported data disk as the import did (its file),
    // and the OS disk is not among the data disks.
    let resources = observed.resources.clone().expect("resources read back");
    let names: Vec<&str> = resources
        .data_disks
        .iter()
        .map(|d| d.name.as_str())
        .collect();
    assert_eq!(names, ["data"], "{resources:?}");
    assert_eq!(resources.os_disk_gib, Some(0), "8 MiB: under a GiB");
    assert_eq!(vm["power"], "poweredOn");
    assert_eq!(
        (vm["cpus"].as_i64(), vm["memoryMB"].as_i64()),
        (Some(2), Some(1024))
    );
    assert_eq!(vm["instanceUUID"], uid);
    assert_eq!(
        vm["extraConfig"]["banlieue.uid"], uid,
        "the UID tag stays the UID"
    );
    assert_eq!(
        metadata(&vm)["instance-id"],
        "old-id",
        "the copy keeps its instance-id"
    );
    assert_eq!(vm["nics"][0]["network"], "VM Network", "{vm}");
    assert_eq!(vm["nics"][0]["mac"], "00:50:56:3f:00:11", "{vm}");
    assert_eq!(
        observed.provider_id.as_deref(),
        Some(format!("vsphere://{}", vm["biosUUID"].as_str().unwrap()).as_str())
    );
    // On the datastore: the descriptor banlieue wrote and the uploaded extent, which
    // qemu-img reads as the original bytes.
    let on_datastore = sim.disk_path(&vm);
    assert!(
        on_datastore.ends_with(format!("banlieue/{uid}/os.vmdk")),
        "{on_datastore:?}"
    );
    run(Command::new("qemu-img")
        .args(["compare", "-U", "-f", "raw", "-F", "vmdk"])
        .arg(&os_raw)
        .arg(&on_datastore));

    // A running machine's disks are never copied.
    let staging = dir.path().join("export");
    std::fs::create_dir_all(&staging).unwrap();
    let running = expect_error(
        disks.export(&req.identity, &staging).await,
        "MachineRunning",
    );
    assert!(running.is_transient());

    let off = with_power(req.clone(), PowerState::PoweredOff);
    settle(backend.as_ref(), &off).await;
    assert_eq!(sim.vm(&req.identity.name).unwrap()["power"], "poweredOff");
    assert_eq!(
        disks.export_size(&req.identity).await.unwrap(),
        Some(12 * MIB)
    );
    let exported = disks.export(&req.identity, &staging).await.unwrap();
    let names: Vec<&str> = exported.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(names, [OS_DISK, "data"], "the boot disk first");
    for (disk, raw, pattern, offset) in [
        (&exported[0], &os_raw, 0xab, MIB),
        (&exported[1], &data_raw, 0xcd, 2 * MIB),
    ] {
        assert_eq!(disk.format, DiskFormat::Raw);
        assert!(disk.path.starts_with(&staging), "{disk:?}");
        assert_eq!(
            disk.virtual_bytes,
            std::fs::metadata(raw).unwrap().len(),
            "{disk:?}"
        );
        run(Command::new("qemu-img")
            .args(["compare", "-f", "raw", "-F", "raw"])
            .arg(raw)
            .arg(&disk.path));
        has_pattern(&disk.path, "raw", pattern, offset);
    }
    // Exporting again overwrites what is there.
    let again = disks.export(&req.identity, &staging).await.unwrap();
    assert_eq!(again, exported);

    let mut gone = false;
    for _ in 0..200 {
        if backend.delete(&req.identity).await.unwrap() == Deletion::Gone {
            gone = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(gone);
    assert!(sim.vm(&req.identity.name).is_none());
    assert_eq!(disks.export_size(&req.identity).await.unwrap(), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn imported_disks_that_are_not_there_are_terminal_and_nothing_is_created() {
    if !banlieue_integration_tests::qemu_utils() {
        return;
    }
    let Some(sim) = Vcsim::start() else { return };
    let backend = backend(&sim).await;
    let disks = transfer(&backend);
    let req = request(
        "00000002-2222-4000-8000-000000000000",
        &sim.ready.template,
        "PoweredOn",
    );
    for _ in 0..3 {
        let e = expect_error(backend.ensure(&req).await, "ImportedDiskMissing");
        assert!(!e.is_transient());
        assert!(
            e.message
                .contains("banlieue/00000002-2222-4000-8000-000000000000/os.vmdk")
                && e.message.contains("data.vmdk"),
            "names what is missing: {e}"
        );
    }
    assert!(sim.vm(&req.identity.name).is_none(), "no VM");
    assert_eq!(
        (sim.calls("CloneVM_Task"), sim.calls("CreateVM_Task")),
        (0, 0),
        "neither cloned nor created"
    );

    // What ESXi cannot attach is refused before anything is uploaded, saying how to
    // convert: qemu-img's default subformat (monolithicSparse), a missing disk, a
    // disk the machine does not have.
    let dir = tempfile::tempdir().unwrap();
    let (os_raw, os) = disk(dir.path(), OS_DISK, 4 * MIB, 0xab, MIB);
    let (_, data) = disk(dir.path(), "data", 4 * MIB, 0xcd, MIB);
    let sparse_path = dir.path().join("sparse.vmdk");
    run(Command::new("qemu-img")
        .args(["convert", "-f", "raw", "-O", "vmdk"])
        .arg(&os_raw)
        .arg(&sparse_path));
    let sparse = StagedDisk {
        path: sparse_path,
        ..os.clone()
    };
    let e = expect_error(
        disks.import(&req, &[sparse, data.clone()]).await,
        "UnsupportedDiskFormat",
    );
    assert!(!e.is_transient());
    assert!(e.message.contains("subformat=monolithicFlat"), "{e}");
    let e = expect_error(
        disks.import(&req, std::slice::from_ref(&os)).await,
        "ImportedDiskMissing",
    );
    assert!(e.message.contains("data"), "{e}");
    let stray = StagedDisk {
        name: "logs".into(),
        ..data.clone()
    };
    let e = expect_error(disks.import(&req, &[os, data, stray]).await, "UnknownDisk");
    assert!(e.message.contains("logs"), "{e}");
    expect_error(backend.ensure(&req).await, "ImportedDiskMissing");
    assert!(sim.vm(&req.identity.name).is_none(), "still no VM");
}

/// A cloned machine's disk, as vcsim holds it (a `vmfs` descriptor and an empty flat
/// extent): exported as a raw file of the disk's full size that reads as zeros,
/// which is what the guest would read too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cloned_machines_disk_exports_as_vcsim_holds_it() {
    if !banlieue_integration_tests::qemu_utils() {
        return;
    }
    let Some(sim) = Vcsim::start() else { return };
    let backend = backend(&sim).await;
    let mut req = request(
        "00000003-2222-4000-8000-000000000000",
        &sim.ready.template,
        "PoweredOff",
    );
    req.disks_imported = false;
    req.instance_id = None;
    if let MachineSpec::VSphere(s) = &mut req.spec {
        s.additional_disks.clear();
    }
    settle(backend.as_ref(), &req).await;
    assert_eq!(sim.calls("CloneVM_Task"), 1);
    let vm = sim.vm(&req.identity.name).unwrap();
    let capacity = vm["diskKB"].as_u64().unwrap() * 1024;
    // A clone's instance-id is its UID.
    assert_eq!(metadata(&vm)["instance-id"], req.identity.uid.as_str());
    let disks = transfer(&backend);
    assert_eq!(
        disks.export_size(&req.identity).await.unwrap(),
        Some(capacity)
    );
    let staging = tempfile::tempdir().unwrap();
    let exported = disks.export(&req.identity, staging.path()).await.unwrap();
    assert_eq!(exported.len(), 1);
    let os = &exported[0];
    assert_eq!((os.name.as_str(), os.format), (OS_DISK, DiskFormat::Raw));
    assert_eq!(os.virtual_bytes, capacity);
    let meta = std::fs::metadata(&os.path).unwrap();
    assert_eq!(meta.len(), capacity);
    // Sparse: the zeros were never written.
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        assert!(
            meta.blocks() * 512 < MIB,
            "{} bytes allocated",
            meta.blocks() * 512
        );
    }
    let info: Value = serde_json::from_str(&run(Command::new("qemu-img")
        .args(["info", "--output=json", "-f", "raw"])
        .arg(&os.path)))
    .unwrap();
    assert_eq!(info["virtual-size"].as_u64(), Some(capacity));
}
