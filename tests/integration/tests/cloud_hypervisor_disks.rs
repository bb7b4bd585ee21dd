//! The Cloud Hypervisor backend's disk transfer (`migration.strategy: CopyDisk`): a
//! stopped machine's disk files (a qcow2 overlay on a qcow2 image, a raw data disk)
//! exported as flat raw files, the machine deleted, the files imported as the disks of
//! a machine with a new UID, which the VMM (the spec-checked fake) runs. `qemu-img` and
//! `qemu-io` judge every file.

mod disk_support;

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use banlieue_backend_cloud_hypervisor::{ChBackend, ChFactory};
use banlieue_integration_tests::cloud_hypervisor::{ChRig, Guest};
use banlieue_sdk::api::common::{PowerState, ProviderClass};
use banlieue_sdk::api::infra::cloud_hypervisor::CloudHypervisorMachineSpec;
use banlieue_sdk::backend::{
    Backend, BackendError, Connection, Deletion, DiskFormat, MachineIdentity, MachineRequest,
    MachineSpec, StagedDisk,
};
use disk_support::{assert_flat, assert_patterns, assert_same, qemu_utils, run, write_patterns};
use serde_json::{Value, json};

const FAKE: &str = env!("CARGO_BIN_EXE_fake-ch-vmm");
const WAIT: Duration = Duration::from_secs(60);
const GIB: u64 = 1 << 30;

fn backend(rig: &ChRig) -> Arc<ChBackend> {
    ChFactory::new()
        .connect_ch(&Connection {
            class: ProviderClass::CloudHypervisor,
            endpoint: rig.endpoint(),
            credentials: BTreeMap::new(),
            ca_bundle: None,
            insecure_skip_tls_verify: false,
            settings: rig.settings(),
        })
        .expect("connect")
}

/// A 1 GiB OS disk from `image` and (`with_data`) a 1 GiB additional disk `data`.
fn request(uid: &str, power: &str, image: &Value, with_data: bool) -> MachineRequest {
    let disks = if with_data {
        json!([{"name": "data", "sizeGiB": 1}])
    } else {
        json!([])
    };
    let spec: CloudHypervisorMachineSpec = serde_json::from_value(json!({
        "image": image, "cpus": 1, "memoryMiB": 256, "diskGiB": 1, "powerState": power,
        "additionalDisks": disks, "network": [{"macAddress": "52:54:00:d1:5c:01"}]
    }))
    .expect("spec");
    MachineRequest {
        identity: MachineIdentity::new(uid, "ns", format!("vm-{}", &uid[uid.len() - 2..])),
        spec: MachineSpec::CloudHypervisor(spec),
        failure_domain: None,
        bootstrap: None,
        instance_id: None,
        disks_imported: false,
    }
}

/// The same machine, made on imported disks and keeping `instance_id`.
fn imported(mut request: MachineRequest, instance_id: &str) -> MachineRequest {
    request.disks_imported = true;
    request.instance_id = Some(instance_id.into());
    request
}

async fn settle(backend: &ChBackend, req: &MachineRequest, want: PowerState) {
    let started = Instant::now();
    loop {
        let obs = backend.ensure(req).await.expect("ensure");
        if obs.settled_at(want) {
            return;
        }
        assert!(
            started.elapsed() < WAIT,
            "never settled at {want:?}: {obs:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn assert_error(
    result: Result<impl std::fmt::Debug, BackendError>,
    reason: &str,
    transient: bool,
) -> BackendError {
    let err = result.expect_err(reason);
    assert_eq!(
        (err.reason.as_str(), err.is_transient()),
        (reason, transient),
        "{err}"
    );
    err
}

fn files_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// Bytes a file takes on disk (a sparse copy takes far less than its length).
fn allocated(path: &Path) -> u64 {
    std::fs::metadata(path).expect("stat").blocks() * 512
}

/// The rig's qcow2 image with a pattern of its own at 4M, so the export must read
/// through the overlay into it.
fn qcow2_image(rig: &ChRig) -> Option<Value> {
    let base = rig.qcow2_image()?;
    run(
        "qemu-io",
        &["-f", "qcow2", "-c", "write -P 0x11 4M 64k", &base],
    );
    let mut image = rig.image.clone();
    image["disk"] = json!(base);
    image["format"] = json!("qcow2");
    Some(image)
}

fn assert_image_pattern(path: &Path) {
    let out = run(
        "qemu-io",
        &[
            "-f",
            "raw",
            "-c",
            "read -P 0x11 4M 64k",
            path.to_str().unwrap(),
        ],
    );
    assert!(!out.contains("Pattern verification failed"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_machine_is_exported_and_runs_again_on_imported_disks_under_a_new_uid() {
    let rig = ChRig::new(FAKE, Guest::Exit);
    if !qemu_utils() {
        return;
    }
    let Some(image) = qcow2_image(&rig) else {
        return;
    };
    let backend = backend(&rig);
    let transfer = backend
        .disk_transfer()
        .expect("Cloud Hypervisor transfers disks");
    assert_eq!(transfer.import_format(), DiskFormat::Raw);

    // The source: an overlay on the qcow2 image and a raw data disk, a pattern in each.
    let old = "0c0ffee0-0000-4000-8000-0000000000d1";
    let source = request(old, "PoweredOff", &image, true);
    settle(&backend, &source, PowerState::PoweredOff).await;
    let dir = rig.machine_dir(old);
    let os = dir.join("disk.qcow2");
    let data = dir.join("data-0.raw");
    let info = disk_support::info(&os, "qcow2");
    assert!(
        info.get("backing-filename").is_some(),
        "an overlay: {info:#}"
    );
    write_patterns(&os, "qcow2");
    write_patterns(&data, "raw");

    // Export: flat sparse raw files, the bytes the guest sees.
    assert_eq!(
        transfer.export_size(&source.identity).await.unwrap(),
        Some(2 * GIB),
        "the disks' virtual sizes"
    );
    let staging = tempfile::tempdir().expect("staging");
    let staged = transfer
        .export(&source.identity, staging.path())
        .await
        .expect("export");
    let names: Vec<&str> = staged.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(names, ["os", "data"], "the boot disk first");
    for disk in &staged {
        assert_eq!(disk.format, DiskFormat::Raw);
        assert_eq!(disk.virtual_bytes, GIB, "{disk:?}");
        assert_eq!(disk.path.parent(), Some(staging.path()));
        assert_flat(&disk.path, "raw");
        assert!(allocated(&disk.path) < 16 << 20, "a sparse copy: {disk:?}");
    }
    assert_eq!(files_in(staging.path()), ["data.raw", "os.raw"]);
    assert_same(&os, "qcow2", &staged[0].path, "raw");
    assert_same(&data, "raw", &staged[1].path, "raw");
    assert_image_pattern(&staged[0].path);
    let again = transfer
        .export(&source.identity, staging.path())
        .await
        .expect("export again");
    assert_eq!(again, staged, "an export again overwrites");

    // The source goes.
    assert_eq!(
        backend.delete(&source.identity).await.unwrap(),
        Deletion::Gone
    );
    assert!(!dir.exists());
    assert_eq!(transfer.export_size(&source.identity).await.unwrap(), None);

    // Import under a new UID, twice (the second overwrites the first); no machine yet.
    let new = "0c0ffee0-0000-4000-8000-0000000000d2";
    let target = imported(request(new, "PoweredOff", &image, true), old);
    transfer
        .import(&target, &fresh(&staged))
        .await
        .expect("import");
    transfer
        .import(&target, &fresh(&staged))
        .await
        .expect("import again");
    let waiting = rig.state_dir.join(format!("{new}.imported"));
    assert_eq!(files_in(&waiting), ["data-0.raw", "disk.raw"]);
    assert!(!rig.machine_dir(new).exists());

    // Made on the imported files: a raw OS disk, no overlay, the exported bytes.
    settle(&backend, &target, PowerState::PoweredOff).await;
    let new_dir = rig.machine_dir(new);
    assert!(!waiting.exists(), "the import is used up");
    assert!(
        !new_dir.join("disk.qcow2").exists(),
        "nothing from the image"
    );
    let new_os = new_dir.join("disk.raw");
    let new_data = new_dir.join("data-0.raw");
    assert_flat(&new_os, "raw");
    assert_same(&new_os, "raw", &staged[0].path, "raw");
    assert_same(&new_data, "raw", &staged[1].path, "raw");
    assert_patterns(&new_os, "raw");
    assert_patterns(&new_data, "raw");
    assert_image_pattern(&new_os);
    assert!(allocated(&new_os) < 16 << 20, "imported sparse");
    let config = &rig.state(new).expect("state.json")["config"];
    let os_disk = &config["disks"][0];
    assert_eq!(os_disk["path"], json!(new_os), "{config:#}");
    assert_eq!(os_disk["image_type"], "Raw");
    assert!(os_disk.get("backing_files").is_none(), "{config:#}");
    let (_, seed) =
        banlieue_backend_cloud_hypervisor::seed::read_image(&new_dir.join("seed.img")).unwrap();
    let meta = String::from_utf8_lossy(&seed["meta-data"]).into_owned();
    assert!(
        meta.contains(&format!("instance-id: {old}\n")) && !meta.contains(new),
        "the source's instance ID: {meta}"
    );

    // It runs; running, it is not exported.
    let on = imported(request(new, "PoweredOn", &image, true), old);
    settle(&backend, &on, PowerState::PoweredOn).await;
    let elsewhere = tempfile::tempdir().expect("staging");
    assert_error(
        transfer.export(&on.identity, elsewhere.path()).await,
        "MachineRunning",
        true,
    );
    assert!(files_in(elsewhere.path()).is_empty(), "nothing copied");
    assert_eq!(backend.delete(&on.identity).await.unwrap(), Deletion::Gone);
    assert!(!new_dir.exists());
    assert!(rig.all_vmm_pids().is_empty());
    rig.assert_conformant();
}

/// A raw file standing in for an exported disk.
fn staged_disk(dir: &Path, name: &str) -> StagedDisk {
    let path = dir.join(format!("{name}.raw"));
    std::fs::File::create(&path)
        .and_then(|f| f.set_len(GIB))
        .expect("a sparse raw file");
    StagedDisk {
        name: name.into(),
        path,
        format: DiskFormat::Raw,
        virtual_bytes: GIB,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_imports_are_terminal_and_never_copied_from_the_image() {
    let rig = ChRig::new(FAKE, Guest::Exit);
    if !qemu_utils() {
        return;
    }
    let backend = backend(&rig);
    let transfer = backend
        .disk_transfer()
        .expect("Cloud Hypervisor transfers disks");
    let uid = "0c0ffee0-0000-4000-8000-0000000000d3";
    let target = imported(request(uid, "PoweredOff", &rig.image, true), "old-id");

    // Nothing imported: terminal, naming the disk; nothing is written.
    let err = assert_error(backend.ensure(&target).await, "ImportedDiskMissing", false);
    assert!(err.message.contains("disk os ("), "{err}");
    assert!(
        files_in(&rig.state_dir).is_empty(),
        "{:?}",
        files_in(&rig.state_dir)
    );

    // Staged disks that do not match the spec: refused before anything is copied.
    let staging = tempfile::tempdir().expect("staging");
    let os_only = [staged_disk(staging.path(), "os")];
    let err = assert_error(
        transfer.import(&target, &fresh(&os_only)).await,
        "DiskNotStaged",
        false,
    );
    assert!(err.message.contains("disk data "), "{err}");
    assert!(files_in(&rig.state_dir).is_empty());

    // Only the OS disk imported, the spec asks for `data` too: no empty disk stands in.
    let without_data = imported(request(uid, "PoweredOff", &rig.image, false), "old-id");
    transfer
        .import(&without_data, &fresh(&os_only))
        .await
        .expect("import");
    let err = assert_error(backend.ensure(&target).await, "ImportedDiskMissing", false);
    assert!(err.message.contains("disk data ("), "{err}");
    assert_eq!(files_in(&rig.state_dir), [format!("{uid}.imported")]);

    // A machine deleted before it was made takes its import with it.
    assert_eq!(
        backend.delete(&target.identity).await.unwrap(),
        Deletion::Gone
    );
    assert!(files_in(&rig.state_dir).is_empty());

    // Nothing there: no size, and an export is terminal.
    assert_eq!(transfer.export_size(&target.identity).await.unwrap(), None);
    assert_error(
        transfer.export(&target.identity, staging.path()).await,
        "MachineNotFound",
        false,
    );

    // An import for a machine that exists is refused.
    transfer
        .import(&without_data, &fresh(&os_only))
        .await
        .expect("import");
    settle(&backend, &without_data, PowerState::PoweredOff).await;
    assert_error(
        transfer.import(&without_data, &fresh(&os_only)).await,
        "MachineExists",
        false,
    );
    assert_eq!(
        backend.delete(&without_data.identity).await.unwrap(),
        Deletion::Gone
    );
}

/// Copies of `staged` in a staging directory of their own: an import may move the
/// files it is given (the controller stages anew for every copy).
fn fresh(staged: &[StagedDisk]) -> Vec<StagedDisk> {
    let dir = tempfile::tempdir().unwrap().keep();
    staged
        .iter()
        .map(|d| {
            let path = dir.join(d.path.file_name().unwrap());
            // Sparse, as a staged export is.
            let copied = std::process::Command::new("cp")
                .arg("--sparse=always")
                .arg(&d.path)
                .arg(&path)
                .status()
                .unwrap();
            assert!(copied.success(), "cp {}", d.path.display());
            StagedDisk { path, ..d.clone() }
        })
        .collect()
}
