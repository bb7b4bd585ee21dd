//! Invalid objects are rejected at admission, by the CRD schema and its CEL rules,
//! with a message that says what to fix. Each case names the substring the
//! apiserver's message must contain.

use banlieue_integration_tests::{apply, apply_status, post, with, without};
use serde_json::{Value, json};

/// How a case reaches the apiserver.
enum Step {
    /// Server-side apply `object`; it must be rejected.
    Create(Value),
    /// POST `object` (as `kubectl create` does). Used where server-side apply cannot even
    /// build its typed patch (duplicate list-map keys, wrong JSON types, undeclared fields)
    /// and answers with a 500 instead of the schema's 422.
    Post(Value),
    /// Create `before` (must succeed), then apply `after`; the update must be rejected.
    Update { before: Value, after: Value },
    /// Create `object`, apply `status_before` (must succeed), then `status_after`.
    StatusUpdate {
        object: Value,
        status_before: Value,
        status_after: Value,
    },
}

struct Case {
    what: &'static str,
    step: Step,
    expect: &'static str,
}

fn create(what: &'static str, object: Value, expect: &'static str) -> Case {
    Case {
        what,
        step: Step::Create(object),
        expect,
    }
}

fn post_case(what: &'static str, object: Value, expect: &'static str) -> Case {
    Case {
        what,
        step: Step::Post(object),
        expect,
    }
}

fn update(what: &'static str, before: Value, after: Value, expect: &'static str) -> Case {
    Case {
        what,
        step: Step::Update { before, after },
        expect,
    }
}

fn named(mut object: Value, name: &str) -> Value {
    object["metadata"]["name"] = json!(name);
    object
}

fn provider() -> Value {
    json!({
        "apiVersion": "banlieue.io/v1alpha1", "kind": "Provider", "metadata": {"name": "p"},
        "spec": {
            "class": "vsphere",
            "connection": {
                "endpoint": "https://vc.example.com/sdk",
                "credentialsRef": {"name": "vc-credentials"},
                "caBundle": {"configMapRef": {"name": "vc-ca"}}
            },
            "capabilities": {
                "storageClasses": [{"name": "fast", "target": {"datastore": "ds1"}}],
                "networkClasses": [{"name": "frontend", "target": {"portGroup": "pg1"}}]
            }
        }
    })
}

fn vm_class() -> Value {
    json!({
        "apiVersion": "banlieue.io/v1alpha1", "kind": "VMClass", "metadata": {"name": "c"},
        "spec": {"cpus": 2, "memoryMiB": 2048, "disk": {"sizeGiB": 10}}
    })
}

fn vm_image() -> Value {
    json!({
        "apiVersion": "banlieue.io/v1alpha1", "kind": "VMImage", "metadata": {"name": "i"},
        "spec": {
            "os": {"family": "linux", "distribution": "debian", "version": "13"},
            "sources": {"sim": {"name": "debian"}, "proxmox": {"templateID": 9000}}
        }
    })
}

fn vm() -> Value {
    json!({
        "apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine", "metadata": {"name": "v"},
        "spec": {
            "classRef": {"name": "small"}, "imageRef": {"name": "ubuntu"},
            "networks": [{"name": "eth0", "networkClass": "frontend"}]
        }
    })
}

fn vsphere_machine() -> Value {
    json!({
        "apiVersion": "infrastructure.banlieue.io/v1alpha1", "kind": "VSphereMachine", "metadata": {"name": "m"},
        "spec": {"template": "ubuntu", "numCPUs": 2, "memoryMiB": 2048, "network": [{"networkName": "VM Network"}]}
    })
}

fn proxmox_machine() -> Value {
    json!({
        "apiVersion": "infrastructure.banlieue.io/v1alpha1", "kind": "ProxmoxMachine", "metadata": {"name": "m"},
        "spec": {"templateID": 9000, "cores": 2, "memoryMiB": 2048, "network": [{"bridge": "vmbr0"}]}
    })
}

fn libvirt_machine() -> Value {
    json!({
        "apiVersion": "infrastructure.banlieue.io/v1alpha1", "kind": "LibvirtMachine", "metadata": {"name": "m"},
        "spec": {"image": {"path": "/var/lib/libvirt/images/debian.qcow2"}, "cpus": 1, "memoryMiB": 512,
                 "network": [{"network": "default"}]}
    })
}

fn ch_machine() -> Value {
    json!({
        "apiVersion": "infrastructure.banlieue.io/v1alpha1", "kind": "CloudHypervisorMachine", "metadata": {"name": "m"},
        "spec": {"image": {"kernel": "/boot/vmlinuz", "disk": "/var/lib/ch/disk.raw"}, "cpus": 1, "memoryMiB": 512}
    })
}

fn cluster(kind: &str) -> Value {
    json!({
        "apiVersion": "infrastructure.banlieue.io/v1alpha1", "kind": kind, "metadata": {"name": "k"},
        "spec": {"providerRefs": [{"name": "p1"}]}
    })
}

fn machine_template() -> Value {
    json!({
        "apiVersion": "infrastructure.banlieue.io/v1alpha1", "kind": "VSphereMachineTemplate", "metadata": {"name": "t"},
        "spec": {"template": {"spec": vsphere_machine()["spec"].clone()}}
    })
}

fn cluster_template() -> Value {
    json!({
        "apiVersion": "infrastructure.banlieue.io/v1alpha1", "kind": "ProxmoxClusterTemplate", "metadata": {"name": "t"},
        "spec": {"template": {"spec": {"providerRefs": [{"name": "p1"}]}}}
    })
}

const PEM: &str = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";

fn cases() -> Vec<Case> {
    let p = provider;
    vec![
        // Provider
        create(
            "unknown provider class",
            with(p(), "/spec/class", json!("hyperv")),
            "Unsupported value: \"hyperv\"",
        ),
        create(
            "missing connection",
            without(p(), "/spec/connection"),
            "spec.connection: Required value",
        ),
        create(
            "missing endpoint",
            without(p(), "/spec/connection/endpoint"),
            "spec.connection.endpoint: Required value",
        ),
        create(
            "endpoint is not a URL",
            with(
                p(),
                "/spec/connection/endpoint",
                json!("vcenter.example.com"),
            ),
            "connection.endpoint must be a URL",
        ),
        create(
            "vsphere without credentials",
            without(p(), "/spec/connection/credentialsRef"),
            "credentialsRef is required for class vsphere and proxmox",
        ),
        create(
            "two CA sources",
            with(p(), "/spec/connection/caBundle/inline", json!(PEM)),
            "set exactly one of inline, configMapRef or secretRef",
        ),
        create(
            "empty CA source",
            with(p(), "/spec/connection/caBundle", json!({})),
            "set exactly one of inline, configMapRef or secretRef",
        ),
        create(
            "inline CA is not PEM",
            with(
                p(),
                "/spec/connection/caBundle",
                json!({"inline": "not a cert"}),
            ),
            "must hold PEM certificates",
        ),
        create(
            "CA bundle and insecure",
            with(p(), "/spec/connection/insecureSkipTLSVerify", json!(true)),
            "caBundle and insecureSkipTLSVerify are mutually exclusive",
        ),
        create(
            "storage class name not a DNS label",
            with(
                p(),
                "/spec/capabilities/storageClasses/0/name",
                json!("Fast_SSD"),
            ),
            "class names must be DNS labels",
        ),
        create(
            "storage class with empty target",
            with(p(), "/spec/capabilities/storageClasses/0/target", json!({})),
            "target must name at least one backend key",
        ),
        post_case(
            "duplicate storage class",
            with(
                p(),
                "/spec/capabilities/storageClasses/1",
                json!({"name": "fast", "target": {"datastore": "ds2"}}),
            ),
            "Duplicate value",
        ),
        update(
            "class changed",
            p(),
            with(p(), "/spec/class", json!("proxmox")),
            "spec.class is immutable",
        ),
        create(
            "credentialsRef without name",
            with(p(), "/spec/connection/credentialsRef", json!({})),
            "credentialsRef.name: Required value",
        ),
        // VMClass
        create(
            "zero CPUs",
            with(vm_class(), "/spec/cpus", json!(0)),
            "spec.cpus: Invalid value: 0: spec.cpus in body should be greater than or equal to 1",
        ),
        create(
            "too many CPUs",
            with(vm_class(), "/spec/cpus", json!(1000)),
            "should be less than or equal to 768",
        ),
        create(
            "too little memory",
            with(vm_class(), "/spec/memoryMiB", json!(64)),
            "should be greater than or equal to 128",
        ),
        post_case(
            "CPUs as a string",
            with(vm_class(), "/spec/cpus", json!("two")),
            "spec.cpus: Invalid value: \"string\": spec.cpus in body must be of type integer",
        ),
        create(
            "unknown firmware",
            with(vm_class(), "/spec/firmware", json!("uefi")),
            "supported values: \"bios\", \"efi\", \"efi-secure\"",
        ),
        create(
            "cpus not a multiple of cores per socket",
            with(vm_class(), "/spec/coresPerSocket", json!(3)),
            "cpus must be a multiple of coresPerSocket",
        ),
        create(
            "zero-size disk",
            with(vm_class(), "/spec/disk/sizeGiB", json!(0)),
            "spec.disk.sizeGiB",
        ),
        create(
            "unknown disk provisioning",
            with(vm_class(), "/spec/disk/provisioning", json!("lazy")),
            "Unsupported value: \"lazy\"",
        ),
        create(
            "missing disk",
            without(vm_class(), "/spec/disk"),
            "spec.disk: Required value",
        ),
        // VMImage
        create(
            "no sources",
            with(vm_image(), "/spec/sources", json!({})),
            "sources must name the image for at least one backend class",
        ),
        create(
            "unknown OS family",
            with(vm_image(), "/spec/os/family", json!("plan9")),
            "Unsupported value: \"plan9\"",
        ),
        create(
            "unknown architecture",
            with(vm_image(), "/spec/architecture", json!("riscv64")),
            "Unsupported value: \"riscv64\"",
        ),
        create(
            "vsphere template and library item",
            with(
                vm_image(),
                "/spec/sources/vsphere",
                json!({"template": "t", "contentLibraryItem": {"library": "l", "item": "i"}}),
            ),
            "set exactly one of template or contentLibraryItem",
        ),
        create(
            "proxmox template ID below 100",
            with(vm_image(), "/spec/sources/proxmox/templateID", json!(99)),
            "greater than or equal to 100",
        ),
        create(
            "proxmox volume without storage",
            with(
                vm_image(),
                "/spec/sources/proxmox",
                json!({"volume": "noble.qcow2"}),
            ),
            "must look like <storage>:<path>",
        ),
        create(
            "libvirt relative path",
            with(
                vm_image(),
                "/spec/sources/libvirt",
                json!({"path": "images/debian.qcow2"}),
            ),
            "must be an absolute path on the host",
        ),
        create(
            "cloud-hypervisor kernel and firmware",
            with(
                vm_image(),
                "/spec/sources/cloudHypervisor",
                json!({"kernel": "/k", "firmware": "/f", "disk": "/d"}),
            ),
            "set exactly one of kernel or firmware",
        ),
        create(
            "cloud-hypervisor cmdline without kernel",
            with(
                vm_image(),
                "/spec/sources/cloudHypervisor",
                json!({"firmware": "/f", "cmdline": "console=ttyS0", "disk": "/d"}),
            ),
            "cmdline needs kernel",
        ),
        create(
            "unknown bootstrap format",
            with(vm_image(), "/spec/bootstrapFormats", json!(["sysprep"])),
            "Unsupported value: \"sysprep\"",
        ),
        // VirtualMachine
        create(
            "missing classRef",
            without(vm(), "/spec/classRef"),
            "spec.classRef: Required value",
        ),
        create(
            "providerRef and providerSelector",
            with(
                vm(),
                "/spec/placement",
                json!({"providerRef": {"name": "p"}, "providerSelector": {"matchLabels": {"a": "b"}}}),
            ),
            "set either providerRef or providerSelector, not both",
        ),
        create(
            "start the new machine before stopping the old",
            with(
                vm(),
                "/spec/migration",
                json!({"strategy": "Recreate", "stopSourceFirst": false}),
            ),
            "migration.stopSourceFirst: false is not supported yet",
        ),
        create(
            "unknown power state",
            with(vm(), "/spec/powerState", json!("On")),
            "supported values: \"PoweredOn\", \"PoweredOff\", \"Suspended\"",
        ),
        create(
            "static IPAM without address",
            with(vm(), "/spec/networks/0/ipam", json!({"mode": "static"})),
            "mode static needs at least one entry in addresses",
        ),
        create(
            "address that is not a CIDR",
            with(
                vm(),
                "/spec/networks/0/ipam",
                json!({"mode": "static", "addresses": ["10.0.0.300/24"]}),
            ),
            "must be CIDRs such as 10.0.0.5/24",
        ),
        create(
            "gateway that is not an IP",
            with(
                vm(),
                "/spec/networks/0/ipam",
                json!({"mode": "static", "addresses": ["10.0.0.5/24"], "gateway": "router"}),
            ),
            "ipam.gateway must be an IP address",
        ),
        create(
            "addresses with DHCP",
            with(
                vm(),
                "/spec/networks/0/ipam",
                json!({"mode": "dhcp", "addresses": ["10.0.0.5/24"]}),
            ),
            "addresses are only allowed with mode static",
        ),
        create(
            "pool IPAM without poolRef",
            with(vm(), "/spec/networks/0/ipam", json!({"mode": "pool"})),
            "mode pool needs poolRef",
        ),
        create(
            "unknown IPAM mode",
            with(vm(), "/spec/networks/0/ipam", json!({"mode": "slaac"})),
            "Unsupported value: \"slaac\"",
        ),
        create(
            "bad MAC address",
            with(
                vm(),
                "/spec/networks/0/macAddress",
                json!("52:54:00:zz:00:01"),
            ),
            "macAddress must look like",
        ),
        post_case(
            "duplicate interface name",
            with(
                vm(),
                "/spec/networks/1",
                json!({"name": "eth0", "networkClass": "backend"}),
            ),
            "Duplicate value",
        ),
        create(
            "interface name not a DNS label",
            with(vm(), "/spec/networks/0/name", json!("Eth_0")),
            "networks[].name must be a DNS label",
        ),
        create(
            "bootstrap without data",
            with(vm(), "/spec/bootstrap", json!({"format": "cloud-config"})),
            "set userData, networkConfig or both",
        ),
        create(
            "ignition with network config",
            with(
                vm(),
                "/spec/bootstrap",
                json!({"format": "ignition", "userData": {"name": "s"}, "networkConfig": {"name": "s"}}),
            ),
            "networkConfig is cloud-init only",
        ),
        create(
            "unknown migration strategy",
            with(vm(), "/spec/migration/strategy", json!("LiveMigrate")),
            "Unsupported value: \"LiveMigrate\"",
        ),
        create(
            "anti-affinity without topology key",
            with(
                vm(),
                "/spec/placement/antiAffinity",
                json!([{"labelSelector": {}}]),
            ),
            "topologyKey: Required value",
        ),
        create(
            "data disk too large",
            with(
                vm(),
                "/spec/disks",
                json!([{"name": "d", "sizeGiB": 100000}]),
            ),
            "should be less than or equal to 65536",
        ),
        // Infrastructure machines
        create(
            "vsphere zero CPUs",
            with(vsphere_machine(), "/spec/numCPUs", json!(0)),
            "spec.numCPUs",
        ),
        post_case(
            "vsphere failureDomain in spec",
            with(vsphere_machine(), "/spec/failureDomain", json!("east-a")),
            "unknown field \"spec.failureDomain\"",
        ),
        create(
            "vsphere datastore and storage policy",
            with(
                with(vsphere_machine(), "/spec/datastore", json!("ds")),
                "/spec/storagePolicyName",
                json!("gold"),
            ),
            "set either datastore or storagePolicyName",
        ),
        create(
            "vsphere providerID with wrong scheme",
            with(vsphere_machine(), "/spec/providerID", json!("proxmox://1")),
            "must start with vsphere://",
        ),
        create(
            "vsphere unknown clone mode",
            with(vsphere_machine(), "/spec/cloneMode", json!("InstantClone")),
            "Unsupported value: \"InstantClone\"",
        ),
        update(
            "providerID changed once set",
            with(
                vsphere_machine(),
                "/spec/providerID",
                json!("vsphere://4203-aaaa"),
            ),
            with(
                vsphere_machine(),
                "/spec/providerID",
                json!("vsphere://4203-bbbb"),
            ),
            "spec.providerID is immutable once set",
        ),
        update(
            "providerID removed once set",
            with(
                proxmox_machine(),
                "/spec/providerID",
                json!("proxmox://1234"),
            ),
            proxmox_machine(),
            "spec.providerID is immutable once set",
        ),
        create(
            "proxmox VLAN out of range",
            with(proxmox_machine(), "/spec/network/0/vlan", json!(4095)),
            "should be less than or equal to 4094",
        ),
        create(
            "proxmox inverted VMID range",
            with(
                proxmox_machine(),
                "/spec/vmIDRange",
                json!({"start": 2000, "end": 1000}),
            ),
            "vmIDRange.end must not be below vmIDRange.start",
        ),
        create(
            "proxmox bad bridge",
            with(proxmox_machine(), "/spec/network/0/bridge", json!("vmbr 0")),
            "bridge must be an interface name",
        ),
        create(
            "libvirt network and bridge",
            with(libvirt_machine(), "/spec/network/0/bridge", json!("br0")),
            "exactly one of network or bridge",
        ),
        create(
            "libvirt unknown CPU mode",
            with(libvirt_machine(), "/spec/cpuMode", json!("max")),
            "Unsupported value: \"max\"",
        ),
        create(
            "cloud-hypervisor maxCPUs below cpus",
            with(ch_machine(), "/spec/maxCPUs", json!(0)),
            "spec.maxCPUs",
        ),
        create(
            "cloud-hypervisor maxCPUs below boot CPUs",
            with(
                with(ch_machine(), "/spec/cpus", json!(4)),
                "/spec/maxCPUs",
                json!(2),
            ),
            "maxCPUs must be at least cpus",
        ),
        // Infrastructure clusters and templates
        create(
            "cluster with refs and selector",
            with(
                cluster("VSphereCluster"),
                "/spec/providerSelector",
                json!({"matchLabels": {"a": "b"}}),
            ),
            "set either providerRefs or providerSelector, not both",
        ),
        create(
            "endpoint port zero",
            with(
                cluster("LibvirtCluster"),
                "/spec/controlPlaneEndpoint",
                json!({"host": "10.0.0.1", "port": 0}),
            ),
            "spec.controlPlaneEndpoint.port",
        ),
        create(
            "endpoint without host",
            with(
                cluster("ProxmoxCluster"),
                "/spec/controlPlaneEndpoint",
                json!({"port": 6443}),
            ),
            "spec.controlPlaneEndpoint.host: Required value",
        ),
        update(
            "endpoint changed once set",
            with(
                cluster("CloudHypervisorCluster"),
                "/spec/controlPlaneEndpoint",
                json!({"host": "a", "port": 6443}),
            ),
            with(
                cluster("CloudHypervisorCluster"),
                "/spec/controlPlaneEndpoint",
                json!({"host": "b", "port": 6443}),
            ),
            "controlPlaneEndpoint cannot be changed or removed once set",
        ),
        update(
            "machine template spec changed",
            machine_template(),
            with(machine_template(), "/spec/template/spec/numCPUs", json!(8)),
            "spec.template is immutable",
        ),
        update(
            "cluster template spec changed",
            cluster_template(),
            with(
                cluster_template(),
                "/spec/template/spec/providerRefs/0/name",
                json!("p2"),
            ),
            "spec.template is immutable",
        ),
        Case {
            what: "provisioned flips back to false",
            step: Step::StatusUpdate {
                object: libvirt_machine(),
                status_before: json!({"initialization": {"provisioned": true}}),
                status_after: json!({"initialization": {"provisioned": false}}),
            },
            expect: "provisioned cannot go back to false once true",
        },
        Case {
            what: "bad address type in status",
            step: Step::StatusUpdate {
                object: vsphere_machine(),
                status_before: json!({"initialization": {"provisioned": false}}),
                status_after: json!({"addresses": [{"type": "PublicIP", "address": "1.2.3.4"}]}),
            },
            expect: "Unsupported value: \"PublicIP\"",
        },
    ]
}

#[tokio::test]
async fn invalid_objects_are_rejected_at_admission_with_a_clear_message() {
    let ns = banlieue_testenv::namespace("admission").await;
    let client = &ns.client;
    let cases = cases();
    let mut failures = Vec::new();

    for (i, case) in cases.iter().enumerate() {
        let name = format!("case-{i}");
        let outcome = match &case.step {
            Step::Create(object) => apply(client, &ns.name, &named(object.clone(), &name)).await,
            Step::Post(object) => post(client, &ns.name, &named(object.clone(), &name)).await,
            Step::Update { before, after } => {
                if let Err(e) = apply(client, &ns.name, &named(before.clone(), &name)).await {
                    failures.push(format!(
                        "{}: the valid starting object was rejected: {e}",
                        case.what
                    ));
                    continue;
                }
                apply(client, &ns.name, &named(after.clone(), &name)).await
            }
            Step::StatusUpdate {
                object,
                status_before,
                status_after,
            } => {
                let object = named(object.clone(), &name);
                let mut status = json!({"apiVersion": object["apiVersion"], "kind": object["kind"], "metadata": {"name": name}});
                if let Err(e) = apply(client, &ns.name, &object).await {
                    failures.push(format!("{}: the valid object was rejected: {e}", case.what));
                    continue;
                }
                status["status"] = status_before.clone();
                if let Err(e) = apply_status(client, &ns.name, &status).await {
                    failures.push(format!(
                        "{}: the valid starting status was rejected: {e}",
                        case.what
                    ));
                    continue;
                }
                status["status"] = status_after.clone();
                apply_status(client, &ns.name, &status).await
            }
        };
        match outcome {
            Ok(_) => failures.push(format!(
                "{}: accepted, expected a rejection mentioning {:?}",
                case.what, case.expect
            )),
            Err(kube::Error::Api(status))
                if status.is_invalid() || status.code == 422 || status.code == 400 =>
            {
                if !status.message.contains(case.expect) {
                    failures.push(format!(
                        "{}: rejected, but the message lacks {:?}: {}",
                        case.what, case.expect, status.message
                    ));
                }
            }
            Err(other) => failures.push(format!("{}: unexpected error {other}", case.what)),
        }
    }

    eprintln!(
        "admission: {} invalid objects tried, {} rejected with the expected message",
        cases.len(),
        cases.len() - failures.len()
    );
    assert!(cases.len() >= 40, "the table must keep at least 40 cases");
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

/// The starting points the table mutates are themselves valid, so every rejection above
/// is caused by the mutation alone.
#[tokio::test]
async fn the_base_objects_are_valid() {
    let ns = banlieue_testenv::namespace("admission-bases").await;
    let bases = [
        provider(),
        vm_class(),
        vm_image(),
        vm(),
        vsphere_machine(),
        proxmox_machine(),
        libvirt_machine(),
        ch_machine(),
        cluster("VSphereCluster"),
        cluster("ProxmoxCluster"),
        cluster("LibvirtCluster"),
        cluster("CloudHypervisorCluster"),
        machine_template(),
        cluster_template(),
    ];
    for (i, base) in bases.iter().enumerate() {
        let object = named(base.clone(), &format!("base-{i}"));
        apply(&ns.client, &ns.name, &object)
            .await
            .unwrap_or_else(|e| panic!("{} rejected: {e}", object["kind"]));
    }
}
