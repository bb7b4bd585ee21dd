//! Golden files: every request body the client sends (`tests/golden/requests/`), and
//! decoding of responses captured from vcsim (`tests/golden/responses/`, recorded by
//! `tests/golden/capture.sh` from these very requests).
//!
//! `UPDATE_GOLDEN=1 cargo test -p banlieue-backend-vsphere golden` rewrites the request
//! files; `@NAME@` placeholders stand for values only a live vcsim knows (the
//! password, a view, a task, the clone).

use std::path::PathBuf;

use banlieue_sdk::api::common::{BootstrapFormat, DiskProvisioning, PowerState};
use banlieue_sdk::backend::{BootstrapData, MachineIdentity, SecretValue};

use crate::backend::{VM_PATHS, Vm};
use crate::client::methods::{self, CloneSpec, ConfigSpec, RelocateSpec, TASK_PATHS, TaskState};
use crate::client::soap::{self, Answer};
use crate::client::{DatastorePath, Element, MoRef, Objects, PropertySpec};
use crate::{devices, guestinfo, inventory};

fn dir(kind: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("tests/golden/{kind}"))
}

fn pc() -> MoRef {
    MoRef::new("PropertyCollector", "propertyCollector")
}

fn si() -> MoRef {
    MoRef::new("SearchIndex", "SearchIndex")
}

fn template() -> MoRef {
    MoRef::new("VirtualMachine", "vm-44")
}

fn clone() -> MoRef {
    MoRef::new("VirtualMachine", "@VM@")
}

fn identity() -> MachineIdentity {
    MachineIdentity {
        uid: "5b2e6c1a-0d3f-4c8e-9a7b-1f2e3d4c5b6a".into(),
        namespace: "golden".into(),
        name: "golden-1".into(),
        provider_id: None,
    }
}

fn clone_spec(snapshot: bool) -> CloneSpec {
    CloneSpec {
        location: RelocateSpec {
            datastore: Some(MoRef::new("Datastore", "datastore-39")),
            disk_move_type: snapshot.then(|| "createNewChildDiskBacking".into()),
            pool: Some(MoRef::new("ResourcePool", "resgroup-27")),
            ..Default::default()
        },
        template: false,
        config: Some(ConfigSpec {
            instance_uuid: Some(identity().uid),
            annotation: Some("Managed by banlieue: golden/golden-1 <&>".into()),
            num_cpus: Some(2),
            num_cores_per_socket: Some(1),
            memory_mib: Some(2048),
            // maxCPUs asked, maxMemoryMiB not: the WSDL puts them after memoryMB.
            memory_hot_add: Some(false),
            cpu_hot_add: Some(true),
            extra_config: guestinfo::clone_keys(&identity(), "DC0/DC0_C1"),
            device_change: Vec::new(),
            firmware: Some("efi".into()),
            // efi-secure: the WSDL puts bootOptions between extraConfig and firmware.
            efi_secure_boot: Some(true),
            ..Default::default()
        }),
        power_on: false,
        snapshot: snapshot.then(|| MoRef::new("VirtualMachineSnapshot", "@SNAPSHOT@")),
    }
}

/// A full clone whose OS disk copy is provisioned as `provisioning` asks, from the
/// template's devices as vcsim reports them.
fn full_clone_with(provisioning: DiskProvisioning) -> CloneSpec {
    let Answer::Response(r) = response("template_devices") else {
        panic!("fault")
    };
    let (objects, _) = methods::decode_retrieve_result(&r);
    let devices = devices::devices(objects[0].prop("config.hardware.device").unwrap());
    let mut spec = clone_spec(false);
    spec.location.disks =
        devices::os_disk_locator(&devices, provisioning, spec.location.datastore.as_ref())
            .unwrap()
            .into_iter()
            .collect();
    spec
}

#[test]
fn the_os_disk_locator_carries_the_provisioning_asked() {
    for (asked, thin, eager) in [
        (DiskProvisioning::Thin, true, false),
        (DiskProvisioning::Thick, false, false),
        (DiskProvisioning::EagerZeroed, false, true),
    ] {
        let disks = full_clone_with(asked).location.disks;
        assert_eq!(disks.len(), 1, "{asked:?}: the OS disk");
        let d = &disks[0];
        assert_eq!(
            (d.thin_provisioned, d.eagerly_scrub),
            (thin, eager),
            "{asked:?}"
        );
        assert_eq!(d.datastore, MoRef::new("Datastore", "datastore-39"));
        assert!(!d.disk_id.is_empty());
    }
    // No datastore known for the copy: refused, not sent without the ask.
    let e = devices::os_disk_locator(
        &devices::devices(&crate::client::Element::default()),
        DiskProvisioning::Thick,
        None,
    );
    assert!(matches!(e, Ok(None)), "no disk, nothing to provision");
}

/// A reconfigure with every device change banlieue makes, from the template's
/// devices as vcsim reports them: NIC onto a standard port group with a fixed MAC,
/// disk grown, a data disk added.
fn reconfig_devices() -> String {
    let Answer::Response(r) = response("template_devices") else {
        panic!("fault")
    };
    let (objects, _) = methods::decode_retrieve_result(&r);
    let devices = devices::devices(objects[0].prop("config.hardware.device").unwrap());
    let mut changes = devices::nic_edits(
        &devices,
        &[devices::WantedNic {
            backing: devices::NetworkBacking::Standard {
                name: "VM Network".into(),
                network: MoRef::new("Network", "network-7"),
            },
            mac_address: Some("00:50:56:3f:00:01".into()),
        }],
    )
    .unwrap();
    changes.extend(devices::disk_grow(&devices, 20));
    let disks: Vec<banlieue_sdk::api::infra::MachineDisk> = serde_json::from_value(
        serde_json::json!([{"name": "data", "sizeGiB": 30, "storage": "LocalDS_1"}]),
    )
    .unwrap();
    changes.extend(devices::disk_adds(&devices, &disks).unwrap());
    methods::reconfig_vm_task(
        &clone(),
        &ConfigSpec {
            device_change: changes,
            ..Default::default()
        },
    )
}

/// A machine created on imported disks: CreateVM_Task with the template's hardware
/// types (vcsim's: pvscsi, e1000), the uploaded boot disk, a NIC on a standard port
/// group, the clone's extraConfig keys.
fn create_vm() -> String {
    let uid = identity().uid;
    let disk = devices::ExistingDisk {
        file: DatastorePath::new("LocalDS_0", format!("banlieue/{uid}/os.vmdk")),
        datastore: Some(MoRef::new("Datastore", "datastore-39")),
        capacity_bytes: 8 << 20,
    };
    let nic = devices::WantedNic {
        backing: devices::NetworkBacking::Standard {
            name: "VM Network".into(),
            network: MoRef::new("Network", "network-7"),
        },
        mac_address: None,
    };
    methods::create_vm_task(
        &MoRef::new("Folder", "group-2"),
        &ConfigSpec {
            name: Some("golden-2".into()),
            version: Some("vmx-13".into()),
            instance_uuid: Some(uid.clone()),
            guest_id: Some("otherGuest".into()),
            annotation: Some("Managed by banlieue: golden/golden-2".into()),
            vm_path_name: Some(format!("[LocalDS_0] banlieue/{uid}/golden-2.vmx")),
            num_cpus: Some(1),
            num_cores_per_socket: None,
            memory_mib: Some(512),
            memory_hot_add: Some(false),
            cpu_hot_add: Some(false),
            device_change: devices::create_devices(
                "ParaVirtualSCSIController",
                &[disk],
                "VirtualE1000",
                &[nic],
            )
            .unwrap(),
            extra_config: guestinfo::clone_keys(&identity(), "DC0/DC0_C1"),
            firmware: Some("bios".into()),
            efi_secure_boot: None,
        },
        &MoRef::new("ResourcePool", "resgroup-27"),
    )
}

/// Every request, in the order capture.sh sends them.
fn requests() -> Vec<(&'static str, String)> {
    let view = MoRef::new("ContainerView", "@VIEW@");
    let bootstrap = BootstrapData {
        format: BootstrapFormat::CloudConfig,
        user_data: SecretValue::new("#cloud-config\nruncmd: [echo golden]\n"),
        network_config: None,
    };
    vec![
        (
            "01_retrieve_service_content",
            methods::retrieve_service_content(),
        ),
        (
            "02_login",
            methods::login(
                &MoRef::new("SessionManager", "SessionManager"),
                "banlieue@vsphere.local",
                "@PASSWORD@",
            ),
        ),
        (
            "03_create_container_view",
            methods::create_container_view(
                &MoRef::new("ViewManager", "ViewManager"),
                &MoRef::new("Folder", "group-d1"),
                &[
                    "Datacenter",
                    "Folder",
                    "ClusterComputeResource",
                    "Datastore",
                    "Network",
                    "HostSystem",
                ],
                true,
            ),
        ),
        (
            "04_retrieve_inventory",
            methods::retrieve_properties_ex(&pc(), inventory::PROPS, Objects::View(&view)),
        ),
        ("05_destroy_view", methods::destroy_view(&view)),
        (
            "06_find_by_inventory_path",
            methods::find_by_inventory_path(&si(), "/DC0/vm/ubuntu-2404"),
        ),
        (
            "07_retrieve_template_snapshot",
            methods::retrieve_properties_ex(
                &pc(),
                &[PropertySpec {
                    kind: "VirtualMachine",
                    paths: &["snapshot.currentSnapshot"],
                }],
                Objects::One(&template()),
            ),
        ),
        (
            "08_clone_vm_task",
            methods::clone_vm_task(
                &template(),
                &MoRef::new("Folder", "group-2"),
                "golden-1",
                &clone_spec(true),
            ),
        ),
        (
            "08b_clone_full_eager_zeroed",
            methods::clone_vm_task(
                &template(),
                &MoRef::new("Folder", "group-2"),
                "golden-1",
                &full_clone_with(DiskProvisioning::EagerZeroed),
            ),
        ),
        (
            "09_retrieve_task",
            methods::retrieve_properties_ex(
                &pc(),
                &[PropertySpec {
                    kind: "Task",
                    paths: TASK_PATHS,
                }],
                Objects::One(&MoRef::new("Task", "@TASK@")),
            ),
        ),
        (
            "10_find_vm_by_uuid",
            methods::find_vm_by_uuid(&si(), &identity().uid, true),
        ),
        (
            "11_reconfig_vm_task",
            methods::reconfig_vm_task(
                &clone(),
                &ConfigSpec {
                    extra_config: guestinfo::bootstrap_keys(
                        &identity().uid,
                        "golden-1",
                        Some(&bootstrap),
                        None,
                    ),
                    ..Default::default()
                },
            ),
        ),
        ("11b_reconfig_devices", reconfig_devices()),
        (
            // A device MTU travels in the metadata's network config (base64).
            "11c_reconfig_network_mtu",
            methods::reconfig_vm_task(
                &clone(),
                &ConfigSpec {
                    extra_config: guestinfo::bootstrap_keys(
                        &identity().uid,
                        "golden-1",
                        Some(&bootstrap),
                        crate::netconfig::network_config(&[crate::netconfig::GuestNic {
                            mac: Some("00:50:56:3f:00:01"),
                            mtu: Some(9000),
                            ipam: &Default::default(),
                        }])
                        .unwrap()
                        .as_deref(),
                    ),
                    ..Default::default()
                },
            ),
        ),
        (
            "12_power_on_vm_task",
            methods::vm_call("PowerOnVM_Task", &clone()),
        ),
        (
            "13_retrieve_vm",
            methods::retrieve_properties_ex(
                &pc(),
                &[PropertySpec {
                    kind: "VirtualMachine",
                    paths: VM_PATHS,
                }],
                Objects::One(&clone()),
            ),
        ),
        (
            "13b_retrieve_vm_and_task",
            methods::retrieve_properties_ex(
                &pc(),
                &[
                    PropertySpec {
                        kind: "VirtualMachine",
                        paths: VM_PATHS,
                    },
                    PropertySpec {
                        kind: "Task",
                        paths: TASK_PATHS,
                    },
                ],
                Objects::Many(&[clone(), MoRef::new("Task", "@TASK@")]),
            ),
        ),
        (
            "14_shutdown_guest",
            methods::vm_call("ShutdownGuest", &clone()),
        ),
        (
            "15_suspend_vm_task",
            methods::vm_call("SuspendVM_Task", &clone()),
        ),
        (
            "16_power_off_vm_task",
            methods::vm_call("PowerOffVM_Task", &clone()),
        ),
        (
            "17_destroy_task",
            methods::vm_call("Destroy_Task", &clone()),
        ),
        (
            "18_clone_duplicate_name",
            methods::clone_vm_task(
                &template(),
                &MoRef::new("Folder", "group-2"),
                "DC0_C1_RP0_VM0",
                &clone_spec(false),
            ),
        ),
        (
            "19_continue_retrieve",
            methods::continue_retrieve_properties_ex(&pc(), "1"),
        ),
        (
            "21_make_directory",
            methods::make_directory(
                &MoRef::new("FileManager", "FileManager"),
                &format!("[LocalDS_0] banlieue/{}", identity().uid),
                &MoRef::new("Datacenter", "datacenter-1"),
                true,
            ),
        ),
        ("22_create_vm_task", create_vm()),
        (
            "20_logout",
            methods::logout(&MoRef::new("SessionManager", "SessionManager")),
        ),
    ]
}

#[test]
fn golden_requests() {
    let update = std::env::var("UPDATE_GOLDEN").is_ok_and(|v| v == "1");
    for (name, body) in requests() {
        let xml = soap::envelope(&body);
        // Every request is well-formed XML.
        Element::parse(&xml).unwrap_or_else(|e| panic!("{name}: {e}"));
        let path = dir("requests").join(format!("{name}.xml"));
        if update {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, format!("{xml}\n")).unwrap();
            continue;
        }
        let golden = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{}: {e} (UPDATE_GOLDEN=1 writes it)", path.display()));
        assert_eq!(
            xml,
            golden.trim_end(),
            "{name} differs from {}",
            path.display()
        );
    }
}

fn response(name: &str) -> Answer {
    let path = dir("responses").join(format!("{name}.xml"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    soap::parse_response(&text).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn ok(name: &str) -> Element {
    match response(name) {
        Answer::Response(e) => e,
        Answer::Fault(f) => panic!("{name}: unexpected fault {f}"),
    }
}

fn fault(name: &str) -> soap::VimFault {
    match response(name) {
        Answer::Fault(f) => f,
        Answer::Response(e) => panic!("{name}: expected a fault, got {e:?}"),
    }
}

#[test]
fn golden_service_content_and_login() {
    let content = methods::decode_service_content(&ok("01_retrieve_service_content")).unwrap();
    assert_eq!(content.root_folder, MoRef::new("Folder", "group-d1"));
    assert_eq!(content.property_collector, pc());
    assert_eq!(content.search_index, si());
    assert_eq!(
        content.view_manager,
        MoRef::new("ViewManager", "ViewManager")
    );
    assert_eq!(
        content.full_name,
        "VMware vCenter Server 6.5.0 build-5973321"
    );
    assert_eq!(content.api_type, "VirtualCenter");
    assert_eq!(
        content.file_manager,
        Some(MoRef::new("FileManager", "FileManager"))
    );
    let login = ok("02_login");
    assert_eq!(
        login.text_at(&["returnval", "userName"]),
        Some("banlieue@vsphere.local")
    );
    let rejected = fault("02_login_wrong_password");
    assert_eq!(rejected.kind, "InvalidLogin");
    assert_eq!(rejected.message, "Login failure");
    let expired = fault("not_authenticated");
    assert_eq!(expired.kind, "NotAuthenticated");
}

#[test]
fn golden_inventory() {
    let view = methods::decode_moref(&ok("03_create_container_view")).unwrap();
    assert_eq!(view.kind, "ContainerView");
    let (objects, token) = methods::decode_retrieve_result(&ok("04_retrieve_inventory"));
    assert!(token.is_none());
    let topology = inventory::build(&objects);
    assert_eq!(
        topology.datacenters["DC0"].vm_folder,
        Some(MoRef::new("Folder", "group-2"))
    );
    // At the root: its path, the file interface's dcPath, is its name.
    assert_eq!(topology.datacenters["DC0"].path, "DC0");
    assert_eq!(
        topology
            .datacenter_of_datastore(&MoRef::new("Datastore", "datastore-39"))
            .map(|d| d.name.as_str()),
        Some("DC0")
    );
    let inv = topology.inventory("vc");
    let names: Vec<&str> = inv
        .failure_domains
        .iter()
        .map(|f| f.name.as_str())
        .collect();
    assert_eq!(names, ["DC0/DC0_C0", "DC0/DC0_C1"]);
    // vcsim's hosts answer `vmnix-x86`, as ESXi on x86-64 does.
    assert!(
        inv.failure_domains
            .iter()
            .all(|f| f.architecture == Some(banlieue_sdk::backend::Architecture::Amd64)),
        "{inv:?}"
    );
    let c1 = topology.cluster("DC0", "DC0_C1").unwrap();
    assert_eq!(
        c1.resource_pool,
        Some(MoRef::new("ResourcePool", "resgroup-27"))
    );
    assert!(c1.datastores.contains_key("LocalDS_0"));
    assert!(c1.networks.contains_key("VM Network"));
    assert!(ok("05_destroy_view").child("returnval").is_none());
}

#[test]
fn golden_find_clone_and_tasks() {
    assert_eq!(
        methods::decode_moref(&ok("06_find_by_inventory_path")),
        Some(template())
    );
    let (snap, _) = methods::decode_retrieve_result(&ok("07_retrieve_template_snapshot"));
    assert_eq!(
        snap[0].moref("snapshot.currentSnapshot").map(|m| m.kind),
        Some("VirtualMachineSnapshot".into())
    );
    let task = methods::decode_moref(&ok("08_clone_vm_task")).unwrap();
    assert_eq!(task.kind, "Task");
    let (t, _) = methods::decode_retrieve_result(&ok("09_retrieve_task"));
    let TaskState::Succeeded(Some(vm)) = methods::decode_task(&t[0]) else {
        panic!("{t:?}")
    };
    assert_eq!(vm.kind, "VirtualMachine");
    assert_eq!(
        methods::decode_moref(&ok("10_find_vm_by_uuid")),
        Some(vm.clone())
    );
    for name in [
        "11_reconfig_vm_task",
        "12_power_on_vm_task",
        "16_power_off_vm_task",
        "17_destroy_task",
    ] {
        assert_eq!(
            methods::decode_moref(&ok(name)).map(|t| t.kind),
            Some("Task".into()),
            "{name}"
        );
    }
    let (failed, _) = methods::decode_retrieve_result(&ok("18_retrieve_failed_task"));
    let TaskState::Failed(f) = methods::decode_task(&failed[0]) else {
        panic!("{failed:?}")
    };
    assert_eq!(f.kind, "DuplicateName");
    assert!(f.message.contains("name DC0_C1_RP0_VM0"), "{f}");
    // vcsim's tasks finish too fast to record a running one; the same answer, edited.
    let text = std::fs::read_to_string(dir("responses").join("09_retrieve_task.xml")).unwrap();
    let running_text = text.replace(">success<", ">running<");
    let Answer::Response(running) = soap::parse_response(&running_text).unwrap() else {
        panic!("fault")
    };
    let (running, _) = methods::decode_retrieve_result(&running);
    assert_eq!(methods::decode_task(&running[0]), TaskState::Running);
}

#[test]
fn golden_vm_properties() {
    let (objects, _) = methods::decode_retrieve_result(&ok("13_retrieve_vm"));
    let vm = Vm::from(&objects[0]);
    assert_eq!(vm.name, "golden-1");
    assert_eq!(vm.power, PowerState::PoweredOn);
    assert!(vm.bios_uuid.is_some());
    assert_eq!(vm.extra.get(guestinfo::UID_KEY), Some(&identity().uid));
    assert_eq!(
        vm.extra.get(guestinfo::CONFIGURED_KEY).map(String::as_str),
        Some("true")
    );
    assert_eq!(
        vm.extra
            .get("guestinfo.userdata.encoding")
            .map(String::as_str),
        Some("base64")
    );
    assert!(vm.tools_running);
    let addresses = vm.addresses();
    assert_eq!(addresses.len(), 1, "{addresses:?}");
    assert!(addresses[0].address.starts_with("10.77."), "{addresses:?}");
    // What it runs with, from the same answer (no read of its own): vcsim's VM has
    // no hot-add set, so its ceilings are what it has.
    let r = crate::backend::resources(&vm);
    assert_eq!(
        (r.cpus, r.cores_per_socket, r.memory_mib, r.os_disk_gib),
        (2, Some(1), 2048, Some(10))
    );
    assert_eq!(r.networks, 1);
    assert_eq!(r.firmware, Some(banlieue_sdk::api::common::Firmware::Bios));
    assert_eq!((r.max_cpus, r.max_memory_mib), (Some(2), Some(2048)));
    assert!(r.data_disks.is_empty(), "{r:?}");
    assert!(ok("14_shutdown_guest").child("returnval").is_none());
    assert!(ok("20_logout").child("returnval").is_none());
}

#[test]
fn golden_create_on_imported_disks() {
    assert!(ok("21_make_directory").child("returnval").is_none());
    let task = methods::decode_moref(&ok("22_create_vm_task")).unwrap();
    assert_eq!(task.kind, "Task");
    // vcsim attached the uploaded disk and made the VM.
    let (t, _) = methods::decode_retrieve_result(&ok("22_retrieve_created_task"));
    let TaskState::Succeeded(Some(vm)) = methods::decode_task(&t[0]) else {
        panic!("{t:?}")
    };
    assert_eq!(vm.kind, "VirtualMachine");
}

/// A VM and its task in one `RetrievePropertiesEx` (what a reconcile reads once the
/// VM's reference is known); once the VM is destroyed, the same read is a
/// `ManagedObjectNotFound` fault, on which the backend reads them apart.
#[test]
fn golden_vm_and_task_in_one_read() {
    let (objects, _) = methods::decode_retrieve_result(&ok("13b_retrieve_vm_and_task"));
    assert_eq!(objects.len(), 2, "{objects:?}");
    let vm = objects
        .iter()
        .find(|o| o.obj.kind == "VirtualMachine")
        .map(Vm::from)
        .unwrap();
    assert_eq!(vm.name, "golden-1");
    assert_eq!(vm.instance_uuid.as_deref(), Some(identity().uid.as_str()));
    let task = objects.iter().find(|o| o.obj.kind == "Task").unwrap();
    assert!(matches!(
        methods::decode_task(task),
        TaskState::Succeeded(Some(_))
    ));
    assert_eq!(
        fault("17b_retrieve_destroyed_vm_and_task").kind,
        "ManagedObjectNotFound"
    );
}
