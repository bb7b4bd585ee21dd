//! The libvirt backend's disk transfer (`migration.strategy: CopyDisk`) against a real
//! libvirtd + QEMU (TCG) in namespaces this run creates: a shut-off machine's disks
//! exported over libvirt streams as flat qcow2 files, the machine deleted, the files
//! imported as the disks of a machine with a new UID, which boots on them with the
//! old instance ID. `qemu-img` and `qemu-io` judge every file.

mod disk_support;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use banlieue_backend_libvirt::{LibvirtFactory, seed};
use banlieue_integration_tests::libvirt::{IMAGE_VOLUME, LibvirtRig, NETWORK, POOL};
use banlieue_sdk::api::common::{Firmware, PowerState, ProviderClass};
use banlieue_sdk::api::infra::MachineDisk;
use banlieue_sdk::api::infra::libvirt::{LibvirtMachineSpec, LibvirtNetworkInterface};
use banlieue_sdk::api::vm_image::{LibvirtImageSource, PoolVolume};
use banlieue_sdk::backend::{
    Backend, BackendError, BackendFactory, Connection, Deletion, DiskFormat, MachineIdentity,
    MachineRequest, MachineSpec, StagedDisk,
};
use disk_support::{assert_flat, assert_patterns, assert_same, qemu_utils, write_patterns};

/// TCG boots the guest in ~20 s on 2 cores; leave room for a loaded CI machine.
const WAIT: Duration = Duration::from_secs(240);
const GIB: u64 = 1 << 30;

fn connection(uri: &str) -> Connection {
    Connection {
        class: ProviderClass::Libvirt,
        endpoint: uri.into(),
        credentials: Default::default(),
        ca_bundle: None,
        insecure_skip_tls_verify: false,
        settings: [
            ("domainType".to_string(), "qemu".to_string()),
            ("pollInterval".to_string(), "1s".to_string()),
        ]
        .into(),
    }
}

fn backend(rig: &LibvirtRig) -> std::sync::Arc<dyn Backend> {
    LibvirtFactory::new()
        .connect(&connection(&rig.uri))
        .expect("connect")
}

/// A 1 GiB OS disk on the rig's guest image, and (`with_data`) a 1 GiB disk `data`.
fn request(uid: &str, name: &str, power: PowerState, with_data: bool) -> MachineRequest {
    let additional_disks = if with_data {
        vec![MachineDisk {
            name: "data".into(),
            size_gib: 1,
            storage: None,
            provisioning: Default::default(),
        }]
    } else {
        vec![]
    };
    MachineRequest {
        identity: MachineIdentity::new(uid, "direct", name),
        spec: MachineSpec::Libvirt(LibvirtMachineSpec {
            change_policy: Default::default(),
            provider_ref: None,
            provider_id: None,
            power_state: power,
            bootstrap: None,
            image: LibvirtImageSource {
                volume: Some(PoolVolume {
                    pool: POOL.into(),
                    name: IMAGE_VOLUME.into(),
                }),
                path: None,
                format: Default::default(),
            },
            storage_pool: POOL.into(),
            cpus: 1,
            max_cpus: None,
            cores_per_socket: None,
            max_memory_mib: None,
            memory_mib: 256,
            disk_gib: Some(1),
            firmware: Firmware::Bios,
            cpu_mode: Default::default(),
            additional_disks,
            network: vec![LibvirtNetworkInterface {
                network: Some(NETWORK.into()),
                ..Default::default()
            }],
        }),
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

/// A volume's file, as libvirt names it (the test shares the daemons' file system).
fn volume_path(rig: &LibvirtRig, name: &str) -> PathBuf {
    let conn = rig.connect();
    let pool = conn.lookup_storage_pool_by_name(POOL).expect("pool");
    pool.refresh(0).expect("refresh");
    let vol = pool
        .lookup_storage_vol_by_name(name)
        .unwrap_or_else(|e| panic!("volume {name}: {e}"));
    PathBuf::from(vol.path().expect("volume path"))
}

fn volume_xml(rig: &LibvirtRig, name: &str) -> String {
    let conn = rig.connect();
    let pool = conn.lookup_storage_pool_by_name(POOL).expect("pool");
    let vol = pool.lookup_storage_vol_by_name(name).expect("volume");
    vol.xml_desc(0).expect("volume XML")
}

fn os_volume(uid: &str) -> String {
    format!("bnl-{uid}-os.qcow2")
}

fn data_volume(uid: &str) -> String {
    format!("bnl-{uid}-disk-data.qcow2")
}

fn sorted(mut names: Vec<String>) -> Vec<String> {
    names.sort();
    names
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

fn staged_files(dir: &Path) -> Vec<String> {
    sorted(
        std::fs::read_dir(dir)
            .expect("staging dir")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect(),
    )
}

/// Waits until the domain's console shows what the guest read from its seed.
async fn wait_for_console(rig: &LibvirtRig, domain: &str, needle: &str) {
    let started = Instant::now();
    while !rig.console(domain).contains(needle) {
        assert!(
            started.elapsed() < WAIT,
            "{needle:?} never on the console:\n{}",
            rig.console(domain)
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_machine_is_exported_and_boots_again_on_imported_disks_under_a_new_uid() {
    let Some(rig) = LibvirtRig::start() else {
        return;
    };
    if !qemu_utils() {
        return;
    }
    let backend = backend(&rig);
    let transfer = backend.disk_transfer().expect("libvirt transfers disks");
    assert_eq!(transfer.import_format(), DiskFormat::Qcow2);

    // The source: powered off, a pattern in both disks.
    let old = "5e1f0000-aaaa-4bbb-8ccc-000000000001";
    let source = request(old, "src", PowerState::PoweredOff, true);
    let observed = backend.ensure(&source).await.expect("source created");
    assert!(observed.settled_at(PowerState::PoweredOff), "{observed:?}");
    let os_path = volume_path(&rig, &os_volume(old));
    let data_path = volume_path(&rig, &data_volume(old));
    assert!(
        volume_xml(&rig, &os_volume(old)).contains(IMAGE_VOLUME),
        "the source's OS disk is an overlay on the image"
    );
    write_patterns(&os_path, "qcow2");
    write_patterns(&data_path, "qcow2");

    // Export: flat qcow2 files, the same bytes as the disks the guest sees.
    let bound = transfer
        .export_size(&source.identity)
        .await
        .unwrap()
        .expect("the source exists");
    let staging = tempfile::tempdir().expect("staging");
    let started = Instant::now();
    let staged = transfer
        .export(&source.identity, staging.path())
        .await
        .expect("export");
    eprintln!("libvirt: export of 2 disks in {:.1?}", started.elapsed());
    let names: Vec<&str> = staged.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(names, ["os", "data"], "the boot disk first");
    for disk in &staged {
        assert_eq!(disk.format, DiskFormat::Qcow2);
        assert_eq!(disk.virtual_bytes, GIB, "{disk:?}");
        assert_eq!(disk.path.parent(), Some(staging.path()));
        let info = assert_flat(&disk.path, "qcow2");
        assert_eq!(info["virtual-size"], GIB);
    }
    assert_eq!(
        staged_files(staging.path()),
        ["data.qcow2", "os.qcow2"],
        "no intermediate layer is left"
    );
    let written: u64 = staged
        .iter()
        .map(|d| std::fs::metadata(&d.path).unwrap().len())
        .sum();
    assert!(written <= bound, "export_size {bound} < {written} written");
    assert_same(&os_path, "qcow2", &staged[0].path, "qcow2");
    assert_same(&data_path, "qcow2", &staged[1].path, "qcow2");
    assert_patterns(&staged[0].path, "qcow2");
    // An export again (an interrupted one retried) overwrites.
    let again = transfer
        .export(&source.identity, staging.path())
        .await
        .expect("export again");
    assert_eq!(again, staged);
    assert_same(&os_path, "qcow2", &staged[0].path, "qcow2");

    // The source goes; only the image is left.
    assert_eq!(
        backend.delete(&source.identity).await.unwrap(),
        Deletion::Gone
    );
    assert_eq!(rig.volumes(), [IMAGE_VOLUME]);
    assert_eq!(transfer.export_size(&source.identity).await.unwrap(), None);

    // Import under a new UID, twice (the second overwrites the first).
    let new = "5e1f0000-aaaa-4bbb-8ccc-000000000002";
    let target = imported(request(new, "dst", PowerState::PoweredOff, true), old);
    transfer.import(&target, &staged).await.expect("import");
    transfer
        .import(&target, &staged)
        .await
        .expect("import again");
    assert_eq!(
        rig.volumes(),
        sorted(vec![data_volume(new), os_volume(new), IMAGE_VOLUME.into()])
    );

    // Created on the imported volumes: no backing file, the exported bytes.
    let observed = backend
        .ensure(&target)
        .await
        .expect("created on imported disks");
    assert_eq!(
        observed.provider_id.as_deref(),
        Some(format!("libvirt://{new}").as_str())
    );
    assert!(observed.settled_at(PowerState::PoweredOff), "{observed:?}");
    let seed_volume = format!("bnl-{new}-seed.img");
    assert_eq!(
        rig.volumes(),
        sorted(vec![
            data_volume(new),
            os_volume(new),
            seed_volume.clone(),
            IMAGE_VOLUME.into()
        ])
    );
    let new_os = volume_path(&rig, &os_volume(new));
    let new_data = volume_path(&rig, &data_volume(new));
    assert!(
        !volume_xml(&rig, &os_volume(new)).contains(IMAGE_VOLUME),
        "the imported OS disk is not an overlay on the image"
    );
    assert_flat(&new_os, "qcow2");
    for path in [&new_os, &new_data] {
        // No leaked or corrupt clusters from uploading over a fresh volume.
        disk_support::run(
            "qemu-img",
            &["check", "-f", "qcow2", path.to_str().unwrap()],
        );
    }
    assert_same(&new_os, "qcow2", &staged[0].path, "qcow2");
    assert_same(&new_data, "qcow2", &staged[1].path, "qcow2");
    assert_patterns(&new_os, "qcow2");
    assert_patterns(&new_data, "qcow2");
    let dom = rig.connect().lookup_domain_by_uuid_string(new).unwrap();
    let xml = dom.xml_desc(0).unwrap();
    assert!(
        xml.contains(&os_volume(new)) && xml.contains(&data_volume(new)),
        "{xml}"
    );

    // The seed keeps the source's instance ID.
    let seed_image = std::fs::read(volume_path(&rig, &seed_volume)).unwrap();
    let (_, files) = seed::read_image(&seed_image).unwrap();
    let meta = &files.iter().find(|(n, _)| n == "meta-data").unwrap().1;
    assert!(
        meta.contains(&format!("instance-id: \"{old}\"")) && !meta.contains(new),
        "{meta}"
    );

    // It boots on them, and its guest reads the old instance ID.
    let on = imported(request(new, "dst", PowerState::PoweredOn, true), old);
    backend.ensure(&on).await.expect("power on");
    wait_for_console(
        &rig,
        "direct.dst",
        &format!("instance-id={old} hostname=dst"),
    )
    .await;
    assert!(
        backend.ensure(&on).await.is_ok(),
        "ensure stays idempotent on imported disks"
    );

    assert_eq!(backend.delete(&on.identity).await.unwrap(), Deletion::Gone);
    assert_eq!(rig.volumes(), [IMAGE_VOLUME]);
    assert!(rig.domains().is_empty(), "{:?}", rig.domains());
}

/// A qcow2 file standing in for an exported disk.
fn staged_disk(dir: &Path, name: &str) -> StagedDisk {
    let path = dir.join(format!("{name}.qcow2"));
    disk_support::run(
        "qemu-img",
        &["create", "-q", "-f", "qcow2", path.to_str().unwrap(), "1G"],
    );
    StagedDisk {
        name: name.into(),
        path,
        format: DiskFormat::Qcow2,
        virtual_bytes: GIB,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_machine_is_not_exported_and_missing_imports_never_fall_back_to_the_image() {
    let Some(rig) = LibvirtRig::start() else {
        return;
    };
    if !qemu_utils() {
        return;
    }
    let backend = backend(&rig);
    let transfer = backend.disk_transfer().expect("libvirt transfers disks");

    // Running: never copied while its disks change.
    let running = request(
        "5e1f0000-aaaa-4bbb-8ccc-000000000003",
        "run",
        PowerState::PoweredOn,
        false,
    );
    backend.ensure(&running).await.expect("started");
    assert!(rig.domains()[0].2, "running");
    let staging = tempfile::tempdir().expect("staging");
    assert_error(
        transfer.export(&running.identity, staging.path()).await,
        "MachineRunning",
        true,
    );
    assert!(
        staged_files(staging.path()).is_empty(),
        "nothing is copied from a running machine"
    );
    assert_eq!(
        backend.delete(&running.identity).await.unwrap(),
        Deletion::Gone
    );

    // Nothing there: no size, and an export is terminal.
    let nobody = MachineIdentity::new("5e1f0000-aaaa-4bbb-8ccc-00000000ffff", "direct", "x");
    assert_eq!(transfer.export_size(&nobody).await.unwrap(), None);
    assert_error(
        transfer.export(&nobody, staging.path()).await,
        "MachineNotFound",
        false,
    );

    // Imported disks that are not there: terminal, naming the disk; nothing is made.
    let uid = "5e1f0000-aaaa-4bbb-8ccc-000000000004";
    let target = imported(request(uid, "dst", PowerState::PoweredOff, true), "old-id");
    let err = assert_error(backend.ensure(&target).await, "ImportedDiskMissing", false);
    assert!(err.message.contains(&os_volume(uid)), "{err}");
    assert_eq!(rig.volumes(), [IMAGE_VOLUME], "nothing made from the image");
    assert!(rig.domains().is_empty());

    // Staged disks that do not match the spec: refused before any upload.
    let os_only = [staged_disk(staging.path(), "os")];
    let err = assert_error(
        transfer.import(&target, &os_only).await,
        "DiskNotStaged",
        false,
    );
    assert!(err.message.contains("disk data"), "{err}");
    assert_eq!(rig.volumes(), [IMAGE_VOLUME]);

    // Only the OS disk imported, the spec asks for `data` too: no empty disk stands in.
    let without_data = imported(request(uid, "dst", PowerState::PoweredOff, false), "old-id");
    transfer
        .import(&without_data, &os_only)
        .await
        .expect("import");
    let err = assert_error(backend.ensure(&target).await, "ImportedDiskMissing", false);
    assert!(err.message.contains(&data_volume(uid)), "{err}");
    assert_eq!(
        rig.volumes(),
        sorted(vec![os_volume(uid), IMAGE_VOLUME.into()])
    );
    assert!(rig.domains().is_empty());

    // An import for a machine that exists is refused.
    backend.ensure(&without_data).await.expect("created");
    assert_error(
        transfer.import(&without_data, &os_only).await,
        "MachineExists",
        false,
    );
    assert_eq!(
        backend.delete(&without_data.identity).await.unwrap(),
        Deletion::Gone
    );
    assert_eq!(rig.volumes(), [IMAGE_VOLUME]);
}
