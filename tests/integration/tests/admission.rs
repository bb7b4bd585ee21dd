//! Invalid objects are rejected at admission, by the CRD schema and its CEL rules,
//! with a message that says what to fix. Each case names the substring the
//! apiserver's message must contain.

use banlieue_integration_tests::admission_cases::{
    Case, accept, accept_status, accept_update, assert_none_failed, named, provider, reject,
    reject_post, reject_status, reject_update, run, vm, vm_class, vm_image,
};
use banlieue_integration_tests::{apply, with, without};
use serde_json::{Value, json};

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
        // Any DNS label is a class (an out-of-tree backend registers its own); what
        // is not one is refused. An unserved class is the Provider's condition.
        reject(
            "provider class that is not a DNS label",
            with(p(), "/spec/class", json!("Hyper_V")),
            "banlieue's own classes are vsphere, proxmox, libvirt, cloud-hypervisor and sim",
        ),
        // Before, `Sim` got the raw regex back: the message now names the classes.
        reject(
            "provider class in the wrong case",
            with(p(), "/spec/class", json!("Sim")),
            "class must be a lowercase DNS label",
        ),
        reject(
            "missing connection",
            without(p(), "/spec/connection"),
            "spec.connection: Required value",
        ),
        reject(
            "missing endpoint",
            without(p(), "/spec/connection/endpoint"),
            "spec.connection.endpoint: Required value",
        ),
        reject(
            "endpoint is not a URL",
            with(
                p(),
                "/spec/connection/endpoint",
                json!("vcenter.example.com"),
            ),
            "connection.endpoint must be a URL",
        ),
        reject(
            "vsphere without credentials",
            without(p(), "/spec/connection/credentialsRef"),
            "credentialsRef is required for class vsphere and proxmox",
        ),
        reject(
            "two CA sources",
            with(p(), "/spec/connection/caBundle/inline", json!(PEM)),
            "set exactly one of inline, configMapRef or secretRef",
        ),
        reject(
            "empty CA source",
            with(p(), "/spec/connection/caBundle", json!({})),
            "set exactly one of inline, configMapRef or secretRef",
        ),
        reject(
            "inline CA is not PEM",
            with(
                p(),
                "/spec/connection/caBundle",
                json!({"inline": "not a cert"}),
            ),
            "must hold PEM certificates",
        ),
        reject(
            "CA bundle and insecure",
            with(p(), "/spec/connection/insecureSkipTLSVerify", json!(true)),
            "caBundle and insecureSkipTLSVerify are mutually exclusive",
        ),
        reject(
            "storage class name not a DNS label",
            with(
                p(),
                "/spec/capabilities/storageClasses/0/name",
                json!("Fast_SSD"),
            ),
            "class names must be DNS labels",
        ),
        reject(
            "storage class with empty target",
            with(p(), "/spec/capabilities/storageClasses/0/target", json!({})),
            "target must name at least one backend key",
        ),
        reject_post(
            "duplicate storage class",
            with(
                p(),
                "/spec/capabilities/storageClasses/1",
                json!({"name": "fast", "target": {"datastore": "ds2"}}),
            ),
            "Duplicate value",
        ),
        reject_update(
            "class changed",
            p(),
            with(p(), "/spec/class", json!("proxmox")),
            "spec.class is immutable",
        ),
        reject(
            "credentialsRef without name",
            with(p(), "/spec/connection/credentialsRef", json!({})),
            "credentialsRef.name: Required value",
        ),
        // VMClass
        reject(
            "zero CPUs",
            with(vm_class(), "/spec/cpus", json!(0)),
            "spec.cpus: Invalid value: 0: spec.cpus in body should be greater than or equal to 1",
        ),
        reject(
            "too many CPUs",
            with(vm_class(), "/spec/cpus", json!(1000)),
            "should be less than or equal to 768",
        ),
        reject(
            "too little memory",
            with(vm_class(), "/spec/memoryMiB", json!(64)),
            "should be greater than or equal to 128",
        ),
        reject_post(
            "CPUs as a string",
            with(vm_class(), "/spec/cpus", json!("two")),
            "spec.cpus: Invalid value: \"string\": spec.cpus in body must be of type integer",
        ),
        reject(
            "unknown firmware",
            with(vm_class(), "/spec/firmware", json!("uefi")),
            "supported values: \"bios\", \"efi\", \"efi-secure\"",
        ),
        reject(
            "cpus not a multiple of cores per socket",
            with(vm_class(), "/spec/coresPerSocket", json!(3)),
            "cpus must be a multiple of coresPerSocket",
        ),
        // A topology must hold every CPU the VM can grow to.
        reject(
            "class maxCPUs not a multiple of cores per socket",
            with(
                with(vm_class(), "/spec/coresPerSocket", json!(2)),
                "/spec/maxCPUs",
                json!(5),
            ),
            "maxCPUs must be a multiple of coresPerSocket: the CPU topology (sockets × coresPerSocket) holds every CPU the VM can grow to",
        ),
        accept(
            "class maxCPUs a multiple of cores per socket",
            with(
                with(vm_class(), "/spec/coresPerSocket", json!(2)),
                "/spec/maxCPUs",
                json!(6),
            ),
        ),
        reject(
            "libvirt maxCPUs not a multiple of cores per socket",
            with(
                with(libvirt_machine(), "/spec/coresPerSocket", json!(2)),
                "/spec/maxCPUs",
                json!(3),
            ),
            "maxCPUs (else cpus) must be a multiple of coresPerSocket: the CPU topology of the domain",
        ),
        reject(
            "libvirt cpus (no maxCPUs) not a multiple of cores per socket",
            with(
                with(libvirt_machine(), "/spec/coresPerSocket", json!(2)),
                "/spec/cpus",
                json!(3),
            ),
            "maxCPUs (else cpus) must be a multiple of coresPerSocket: the CPU topology of the domain",
        ),
        // Only the maximum must divide: one vCPU of two sockets of two cores.
        accept(
            "libvirt topology over maxCPUs",
            with(
                with(libvirt_machine(), "/spec/coresPerSocket", json!(2)),
                "/spec/maxCPUs",
                json!(4),
            ),
        ),
        reject(
            "cloud-hypervisor maxCPUs not a multiple of cores per socket",
            with(
                with(ch_machine(), "/spec/coresPerSocket", json!(4)),
                "/spec/maxCPUs",
                json!(6),
            ),
            "maxCPUs (else cpus) must be a multiple of coresPerSocket: the CPU topology of the VM",
        ),
        accept(
            "cloud-hypervisor topology over maxCPUs",
            with(
                with(ch_machine(), "/spec/coresPerSocket", json!(2)),
                "/spec/maxCPUs",
                json!(6),
            ),
        ),
        reject(
            "class maxCPUs below cpus",
            with(vm_class(), "/spec/maxCPUs", json!(1)),
            "maxCPUs is the most CPUs the VM can grow to while it runs: it must be at least cpus (raise maxCPUs, or lower cpus)",
        ),
        reject(
            "class maxMemoryMiB below memoryMiB",
            with(vm_class(), "/spec/maxMemoryMiB", json!(128)),
            "it must be at least memoryMiB (raise maxMemoryMiB, or lower memoryMiB)",
        ),
        reject(
            "vsphere maxCPUs below numCPUs",
            with(vsphere_machine(), "/spec/maxCPUs", json!(1)),
            "maxCPUs must be at least numCPUs",
        ),
        reject(
            "vsphere maxMemoryMiB below memoryMiB",
            with(vsphere_machine(), "/spec/maxMemoryMiB", json!(1024)),
            "maxMemoryMiB must be at least memoryMiB",
        ),
        reject(
            "zero-size disk",
            with(vm_class(), "/spec/disk/sizeGiB", json!(0)),
            "spec.disk.sizeGiB",
        ),
        reject(
            "unknown disk provisioning",
            with(vm_class(), "/spec/disk/provisioning", json!("lazy")),
            "Unsupported value: \"lazy\"",
        ),
        reject(
            "missing disk",
            without(vm_class(), "/spec/disk"),
            "spec.disk: Required value",
        ),
        // VMImage
        reject(
            "no sources",
            with(vm_image(), "/spec/sources", json!({})),
            "sources must name the image for at least one backend class",
        ),
        reject(
            "unknown OS family",
            with(vm_image(), "/spec/os/family", json!("plan9")),
            "Unsupported value: \"plan9\"",
        ),
        reject(
            "unknown architecture",
            with(vm_image(), "/spec/architecture", json!("riscv64")),
            "Unsupported value: \"riscv64\"",
        ),
        reject(
            "vsphere template and library item",
            with(
                vm_image(),
                "/spec/sources/vsphere",
                json!({"template": "t", "contentLibraryItem": {"library": "l", "item": "i"}}),
            ),
            "set exactly one of template or contentLibraryItem",
        ),
        reject(
            "proxmox template ID below 100",
            with(vm_image(), "/spec/sources/proxmox/templateID", json!(99)),
            "greater than or equal to 100",
        ),
        reject(
            "proxmox volume without storage",
            with(
                vm_image(),
                "/spec/sources/proxmox",
                json!({"volume": "noble.qcow2"}),
            ),
            "must look like <storage>:<path>",
        ),
        reject(
            "libvirt relative path",
            with(
                vm_image(),
                "/spec/sources/libvirt",
                json!({"path": "images/debian.qcow2"}),
            ),
            "must be an absolute path on the host",
        ),
        reject(
            "cloud-hypervisor kernel and firmware",
            with(
                vm_image(),
                "/spec/sources/cloudHypervisor",
                json!({"kernel": "/k", "firmware": "/f", "disk": "/d"}),
            ),
            "set exactly one of kernel or firmware",
        ),
        reject(
            "cloud-hypervisor cmdline without kernel",
            with(
                vm_image(),
                "/spec/sources/cloudHypervisor",
                json!({"firmware": "/f", "cmdline": "console=ttyS0", "disk": "/d"}),
            ),
            "cmdline needs kernel",
        ),
        reject(
            "an image that takes no bootstrap format",
            with(vm_image(), "/spec/bootstrapFormats", json!([])),
            "spec.bootstrapFormats in body should have at least 1 items",
        ),
        reject(
            "libvirt image path with a newline",
            with(
                vm_image(),
                "/spec/sources/libvirt",
                json!({"path": "/var/lib/libvirt/images/a.qcow2\n/etc/shadow"}),
            ),
            "sources.libvirt.path must be an absolute path on the host, without '..' segments or control characters",
        ),
        reject(
            "libvirt image path climbing out with ..",
            with(
                vm_image(),
                "/spec/sources/libvirt",
                json!({"path": "/var/lib/libvirt/images/../../../etc/shadow"}),
            ),
            "sources.libvirt.path must be an absolute path on the host, without '..' segments",
        ),
        reject(
            "cloud-hypervisor disk path with a tab",
            with(
                vm_image(),
                "/spec/sources/cloudHypervisor",
                json!({"firmware": "/f", "disk": "/d\tx"}),
            ),
            "disk must be an absolute path on the host, without '..' segments or control characters",
        ),
        reject(
            "unknown bootstrap format",
            with(vm_image(), "/spec/bootstrapFormats", json!(["sysprep"])),
            "Unsupported value: \"sysprep\"",
        ),
        // VirtualMachine
        reject(
            "missing classRef",
            without(vm(), "/spec/classRef"),
            "spec.classRef: Required value",
        ),
        reject(
            "providerRef and providerSelector",
            with(
                vm(),
                "/spec/placement",
                json!({"providerRef": {"name": "p"}, "providerSelector": {"matchLabels": {"a": "b"}}}),
            ),
            "set either providerRef or providerSelector, not both",
        ),
        reject(
            "start the new machine before stopping the old",
            with(
                vm(),
                "/spec/migration",
                json!({"strategy": "Recreate", "stopSourceFirst": false}),
            ),
            "migration.stopSourceFirst: false is not supported yet",
        ),
        reject(
            "unknown power state",
            with(vm(), "/spec/powerState", json!("On")),
            "supported values: \"PoweredOn\", \"PoweredOff\", \"Suspended\"",
        ),
        reject(
            "static IPAM without address",
            with(vm(), "/spec/networks/0/ipam", json!({"mode": "static"})),
            "mode static needs at least one entry in addresses",
        ),
        reject(
            "address that is not a CIDR",
            with(
                vm(),
                "/spec/networks/0/ipam",
                json!({"mode": "static", "addresses": ["10.0.0.300/24"]}),
            ),
            "must be CIDRs such as 10.0.0.5/24",
        ),
        reject(
            "gateway that is not an IP",
            with(
                vm(),
                "/spec/networks/0/ipam",
                json!({"mode": "static", "addresses": ["10.0.0.5/24"], "gateway": "router"}),
            ),
            "ipam.gateway must be an IP address",
        ),
        reject(
            "addresses with DHCP",
            with(
                vm(),
                "/spec/networks/0/ipam",
                json!({"mode": "dhcp", "addresses": ["10.0.0.5/24"]}),
            ),
            "addresses are only allowed with mode static",
        ),
        reject(
            "pool IPAM without poolRef",
            with(vm(), "/spec/networks/0/ipam", json!({"mode": "pool"})),
            "mode pool needs poolRef",
        ),
        reject(
            "unknown IPAM mode",
            with(vm(), "/spec/networks/0/ipam", json!({"mode": "slaac"})),
            "Unsupported value: \"slaac\"",
        ),
        reject(
            "bad MAC address",
            with(
                vm(),
                "/spec/networks/0/macAddress",
                json!("52:54:00:zz:00:01"),
            ),
            "macAddress must look like",
        ),
        reject_post(
            "duplicate interface name",
            with(
                vm(),
                "/spec/networks/1",
                json!({"name": "eth0", "networkClass": "backend"}),
            ),
            "Duplicate value",
        ),
        reject(
            "interface name not a DNS label",
            with(vm(), "/spec/networks/0/name", json!("Eth_0")),
            "networks[].name must be a DNS label",
        ),
        reject(
            "bootstrap without data",
            with(vm(), "/spec/bootstrap", json!({"format": "cloud-config"})),
            "set userData, networkConfig or both",
        ),
        reject(
            "ignition with network config",
            with(
                vm(),
                "/spec/bootstrap",
                json!({"format": "ignition", "userData": {"name": "s"}, "networkConfig": {"name": "s"}}),
            ),
            "networkConfig is cloud-init only",
        ),
        reject(
            "unknown migration strategy",
            with(vm(), "/spec/migration/strategy", json!("LiveMigrate")),
            "Unsupported value: \"LiveMigrate\"",
        ),
        reject(
            "anti-affinity without topology key",
            with(
                vm(),
                "/spec/placement/antiAffinity",
                json!([{"labelSelector": {}}]),
            ),
            "topologyKey: Required value",
        ),
        reject(
            "data disk too large",
            with(
                vm(),
                "/spec/disks",
                json!([{"name": "d", "sizeGiB": 100000}]),
            ),
            "should be less than or equal to 65536",
        ),
        // Infrastructure machines
        reject(
            "vsphere zero CPUs",
            with(vsphere_machine(), "/spec/numCPUs", json!(0)),
            "spec.numCPUs",
        ),
        reject_post(
            "vsphere failureDomain in spec",
            with(vsphere_machine(), "/spec/failureDomain", json!("east-a")),
            "unknown field \"spec.failureDomain\"",
        ),
        reject(
            "vsphere datastore and storage policy",
            with(
                with(vsphere_machine(), "/spec/datastore", json!("ds")),
                "/spec/storagePolicyName",
                json!("gold"),
            ),
            "set either datastore or storagePolicyName",
        ),
        reject(
            "vsphere providerID with wrong scheme",
            with(vsphere_machine(), "/spec/providerID", json!("proxmox://1")),
            "must start with vsphere://",
        ),
        reject(
            "vsphere unknown clone mode",
            with(vsphere_machine(), "/spec/cloneMode", json!("InstantClone")),
            "Unsupported value: \"InstantClone\"",
        ),
        reject_update(
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
        reject_update(
            "providerID removed once set",
            with(
                proxmox_machine(),
                "/spec/providerID",
                json!("proxmox://1234"),
            ),
            proxmox_machine(),
            "spec.providerID is immutable once set",
        ),
        // Disks only grow (issue 38): a shrink is refused before anything is asked of
        // a backend, and a grow is accepted.
        reject_update(
            "OS disk shrunk",
            with(libvirt_machine(), "/spec/diskGiB", json!(20)),
            with(libvirt_machine(), "/spec/diskGiB", json!(10)),
            "diskGiB cannot shrink",
        ),
        accept_update(
            "OS disk grown",
            with(ch_machine(), "/spec/diskGiB", json!(10)),
            with(ch_machine(), "/spec/diskGiB", json!(20)),
        ),
        reject_update(
            "data disk shrunk",
            with(
                proxmox_machine(),
                "/spec/additionalDisks",
                json!([{"name": "data", "sizeGiB": 20}]),
            ),
            with(
                proxmox_machine(),
                "/spec/additionalDisks",
                json!([{"name": "data", "sizeGiB": 10}]),
            ),
            "sizeGiB cannot shrink",
        ),
        accept_update(
            "data disk replaced by another of any size",
            with(
                vsphere_machine(),
                "/spec/additionalDisks",
                json!([{"name": "data", "sizeGiB": 20}]),
            ),
            with(
                vsphere_machine(),
                "/spec/additionalDisks",
                json!([{"name": "other", "sizeGiB": 1}]),
            ),
        ),
        reject_update(
            "VM data disk shrunk",
            with(
                vm(),
                "/spec/disks",
                json!([{"name": "data", "sizeGiB": 20, "storageClass": "fast"}]),
            ),
            with(
                vm(),
                "/spec/disks",
                json!([{"name": "data", "sizeGiB": 5, "storageClass": "fast"}]),
            ),
            "sizeGiB cannot shrink",
        ),
        // An existing disk or interface keeps what no backend changes in place: an edit
        // is refused, not silently ignored.
        reject_update(
            "VM data disk provisioning changed",
            with(
                vm(),
                "/spec/disks",
                json!([{"name": "data", "sizeGiB": 20}]),
            ),
            with(
                vm(),
                "/spec/disks",
                json!([{"name": "data", "sizeGiB": 20, "provisioning": "thick"}]),
            ),
            "an existing disk keeps its provisioning and storageClass",
        ),
        reject_update(
            "VM data disk moved to another storage class",
            with(
                vm(),
                "/spec/disks",
                json!([{"name": "data", "sizeGiB": 20, "storageClass": "fast"}]),
            ),
            with(
                vm(),
                "/spec/disks",
                json!([{"name": "data", "sizeGiB": 30, "storageClass": "slow"}]),
            ),
            "an existing disk keeps its provisioning and storageClass",
        ),
        accept_update(
            "VM data disk grown, its provisioning written out as it was",
            with(
                vm(),
                "/spec/disks",
                json!([{"name": "data", "sizeGiB": 20}]),
            ),
            with(
                vm(),
                "/spec/disks",
                json!([{"name": "data", "sizeGiB": 30, "provisioning": "thin"}]),
            ),
        ),
        reject_update(
            "machine disk provisioning changed",
            with(
                proxmox_machine(),
                "/spec/additionalDisks",
                json!([{"name": "data", "sizeGiB": 20, "provisioning": "thin"}]),
            ),
            with(
                proxmox_machine(),
                "/spec/additionalDisks",
                json!([{"name": "data", "sizeGiB": 20, "provisioning": "eagerZeroed"}]),
            ),
            "an existing disk keeps its provisioning and storage",
        ),
        reject_update(
            "VM network interface moved to another network class",
            with(
                vm(),
                "/spec/networks",
                json!([{"name": "eth0", "networkClass": "lan"}]),
            ),
            with(
                vm(),
                "/spec/networks",
                json!([{"name": "eth0", "networkClass": "dmz"}]),
            ),
            "an existing network interface keeps its networkClass",
        ),
        reject_update(
            "VM network interface MTU changed",
            with(
                vm(),
                "/spec/networks",
                json!([{"name": "eth0", "networkClass": "lan"}]),
            ),
            with(
                vm(),
                "/spec/networks",
                json!([{"name": "eth0", "networkClass": "lan", "mtu": 9000}]),
            ),
            "an existing network interface keeps its networkClass",
        ),
        accept_update(
            "VM network interface added beside an unchanged one",
            with(
                vm(),
                "/spec/networks",
                json!([{"name": "eth0", "networkClass": "lan"}]),
            ),
            with(
                vm(),
                "/spec/networks",
                json!([{"name": "eth0", "networkClass": "lan"}, {"name": "eth1", "networkClass": "dmz", "mtu": 9000}]),
            ),
        ),
        reject(
            "proxmox VLAN out of range",
            with(proxmox_machine(), "/spec/network/0/vlan", json!(4095)),
            "should be less than or equal to 4094",
        ),
        reject(
            "proxmox inverted VMID range",
            with(
                proxmox_machine(),
                "/spec/vmIDRange",
                json!({"start": 2000, "end": 1000}),
            ),
            "vmIDRange.end must not be below vmIDRange.start",
        ),
        reject(
            "proxmox bad bridge",
            with(proxmox_machine(), "/spec/network/0/bridge", json!("vmbr 0")),
            "bridge must be an interface name",
        ),
        reject(
            "libvirt network and bridge",
            with(libvirt_machine(), "/spec/network/0/bridge", json!("br0")),
            "exactly one of network or bridge",
        ),
        reject(
            "libvirt unknown CPU mode",
            with(libvirt_machine(), "/spec/cpuMode", json!("max")),
            "Unsupported value: \"max\"",
        ),
        reject(
            "cloud-hypervisor maxCPUs below cpus",
            with(ch_machine(), "/spec/maxCPUs", json!(0)),
            "spec.maxCPUs",
        ),
        reject(
            "cloud-hypervisor maxCPUs below boot CPUs",
            with(
                with(ch_machine(), "/spec/cpus", json!(4)),
                "/spec/maxCPUs",
                json!(2),
            ),
            "maxCPUs must be at least cpus",
        ),
        reject(
            "cloud-hypervisor maxMemoryMiB below memoryMiB",
            with(
                with(ch_machine(), "/spec/memoryMiB", json!(2048)),
                "/spec/maxMemoryMiB",
                json!(1024),
            ),
            "maxMemoryMiB must be at least memoryMiB",
        ),
        reject(
            "vsphere linked clone with a thick OS disk",
            with(
                with(vsphere_machine(), "/spec/cloneMode", json!("LinkedClone")),
                "/spec/diskProvisioning",
                json!("eagerZeroed"),
            ),
            "a LinkedClone's disk is a thin delta",
        ),
        reject(
            "cloud-hypervisor data disk on a storage other than local",
            with(
                ch_machine(),
                "/spec/additionalDisks",
                json!([{"name": "data", "sizeGiB": 1, "storage": "fast-nvme"}]),
            ),
            "leave storage unset or set it to local",
        ),
        reject(
            "cloud-hypervisor template's data disk on a storage other than local",
            json!({
                "apiVersion": "infrastructure.banlieue.io/v1alpha1", "kind": "CloudHypervisorMachineTemplate",
                "metadata": {"name": "t"},
                "spec": {"template": {"spec": with(ch_machine(), "/spec/additionalDisks",
                    json!([{"name": "data", "sizeGiB": 1, "storage": "fast-nvme"}]))["spec"].clone()}}
            }),
            "leave storage unset or set it to local",
        ),
        // Infrastructure clusters and templates
        reject(
            "cluster with refs and selector",
            with(
                cluster("VSphereCluster"),
                "/spec/providerSelector",
                json!({"matchLabels": {"a": "b"}}),
            ),
            "set either providerRefs or providerSelector, not both",
        ),
        reject(
            "endpoint port zero",
            with(
                cluster("LibvirtCluster"),
                "/spec/controlPlaneEndpoint",
                json!({"host": "10.0.0.1", "port": 0}),
            ),
            "spec.controlPlaneEndpoint.port",
        ),
        reject(
            "endpoint without host",
            with(
                cluster("ProxmoxCluster"),
                "/spec/controlPlaneEndpoint",
                json!({"port": 6443}),
            ),
            "spec.controlPlaneEndpoint.host: Required value",
        ),
        reject_update(
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
        reject_update(
            "machine template spec changed",
            machine_template(),
            with(machine_template(), "/spec/template/spec/numCPUs", json!(8)),
            "spec.template is immutable",
        ),
        reject_update(
            "cluster template spec changed",
            cluster_template(),
            with(
                cluster_template(),
                "/spec/template/spec/providerRefs/0/name",
                json!("p2"),
            ),
            "spec.template is immutable",
        ),
        reject_status(
            "provisioned flips back to false",
            libvirt_machine(),
            json!({"initialization": {"provisioned": true}}),
            json!({"initialization": {"provisioned": false}}),
            "provisioned cannot go back to false once true",
        ),
        reject_status(
            "bad address type in status",
            vsphere_machine(),
            json!({"initialization": {"provisioned": false}}),
            json!({"addresses": [{"type": "PublicIP", "address": "1.2.3.4"}]}),
            "Unsupported value: \"PublicIP\"",
        ),
    ]
}

#[tokio::test]
async fn invalid_objects_are_rejected_at_admission_with_a_clear_message() {
    let ns = banlieue_testenv::namespace("admission").await;
    let client = &ns.client;
    let cases = cases();
    let mut failures = Vec::new();

    for (i, case) in cases.iter().enumerate() {
        if let Err(why) = run(client, &ns.name, &format!("case-{i}"), case).await {
            failures.push(format!("{}: {why}", case.what));
        }
    }

    eprintln!(
        "admission: {} invalid objects tried, {} rejected with the expected message",
        cases.len(),
        cases.len() - failures.len()
    );
    assert!(cases.len() >= 40, "the table must keep at least 40 cases");
    assert_none_failed(&failures, cases.len());
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
        with(ch_machine(), "/spec/maxMemoryMiB", json!(1024)),
        with(
            with(vm_class(), "/spec/maxCPUs", json!(8)),
            "/spec/maxMemoryMiB",
            json!(8192),
        ),
        with(
            with(vsphere_machine(), "/spec/maxCPUs", json!(2)),
            "/spec/maxMemoryMiB",
            json!(4096),
        ),
        with(vsphere_machine(), "/spec/cloneMode", json!("LinkedClone")),
        with(
            vsphere_machine(),
            "/spec/diskProvisioning",
            json!("eagerZeroed"),
        ),
        // Every provisioning, and the host's one storage named.
        with(
            ch_machine(),
            "/spec/additionalDisks",
            json!([{"name": "a", "sizeGiB": 1, "provisioning": "thin", "storage": "local"},
                   {"name": "b", "sizeGiB": 1, "provisioning": "thick"},
                   {"name": "c", "sizeGiB": 1, "provisioning": "eagerZeroed"}]),
        ),
        cluster("VSphereCluster"),
        cluster("ProxmoxCluster"),
        cluster("LibvirtCluster"),
        cluster("CloudHypervisorCluster"),
        machine_template(),
        cluster_template(),
        // The class of a backend registered out of tree.
        with(provider(), "/spec/class", json!("hyperv")),
    ];
    for (i, base) in bases.iter().enumerate() {
        let object = named(base.clone(), &format!("base-{i}"));
        apply(&ns.client, &ns.name, &object)
            .await
            .unwrap_or_else(|e| panic!("{} rejected: {e}", object["kind"]));
    }
}

// ---------------------------------------------------------------------------------
// Cluster API machines keep their hardware (banlieue_sdk::admission, docs/adr/0023):
// the ValidatingAdmissionPolicies an install ships, installed by the test control
// plane from the same SDK functions (`ControlPlaneConfig::banlieue_api`).

/// `object` with one owner reference (`controller: true`, as Cluster API sets it).
fn owned_by(object: Value, api_version: &str, kind: &str, name: &str) -> Value {
    with(
        object,
        "/metadata/ownerReferences",
        json!([{"apiVersion": api_version, "kind": kind, "name": name,
                "uid": "6c0f3d4e-0000-4000-8000-000000000001", "controller": true}]),
    )
}

fn capi_owned(object: Value) -> Value {
    owned_by(object, "cluster.x-k8s.io/v1beta2", "Machine", "w1")
}

const OWNED_VSPHERE: &str = "is owned by Machine w1: its hardware is immutable (Cluster API convention); \
     create a new VSphereMachineTemplate, point the MachineDeployment or control plane at it and \
     let Cluster API roll out instead (changed: spec.memoryMiB, spec.numCPUs)";

/// A policy is enforced about a second after it is created (the apiserver's informer),
/// and no API says when: retry the first refusal until it comes, so that no accepted
/// case below passes only because the policy was not enforced yet.
async fn wait_until_enforced(client: &kube::Client, namespace: &str) {
    let probe = reject_update(
        "probe",
        capi_owned(vsphere_machine()),
        capi_owned(with(
            with(vsphere_machine(), "/spec/numCPUs", json!(4)),
            "/spec/memoryMiB",
            json!(4096),
        )),
        OWNED_VSPHERE,
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    for attempt in 0.. {
        match run(client, namespace, &format!("probe-{attempt}"), &probe).await {
            Ok(()) => return,
            Err(_) if std::time::Instant::now() < deadline => {
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            }
            Err(why) => panic!("the hardware policy was not enforced within 30 s: {why}"),
        }
    }
}

fn hardware_cases() -> Vec<Case> {
    let vs = vsphere_machine;
    vec![
        reject_update(
            "CAPI-owned VSphereMachine resized",
            capi_owned(vs()),
            capi_owned(with(
                with(vs(), "/spec/numCPUs", json!(4)),
                "/spec/memoryMiB",
                json!(4096),
            )),
            OWNED_VSPHERE,
        ),
        reject_update(
            "CAPI-owned LibvirtMachine resized",
            capi_owned(libvirt_machine()),
            capi_owned(with(
                with(libvirt_machine(), "/spec/cpus", json!(2)),
                "/spec/memoryMiB",
                json!(1024),
            )),
            "create a new LibvirtMachineTemplate, point the MachineDeployment or control plane at it \
             and let Cluster API roll out instead (changed: spec.cpus, spec.memoryMiB)",
        ),
        reject_update(
            "CAPI-owned ProxmoxMachine moved to another bridge",
            capi_owned(proxmox_machine()),
            capi_owned(with(
                proxmox_machine(),
                "/spec/network/0/bridge",
                json!("vmbr1"),
            )),
            "(changed: spec.network)",
        ),
        // A grow is fine on a standalone machine (the table above); not on CAPI's.
        reject_update(
            "CAPI-owned CloudHypervisorMachine disk grown",
            capi_owned(with(ch_machine(), "/spec/diskGiB", json!(10))),
            capi_owned(with(ch_machine(), "/spec/diskGiB", json!(20))),
            "(changed: spec.diskGiB)",
        ),
        reject_update(
            "CAPI-owned machine powered off",
            capi_owned(vs()),
            capi_owned(with(vs(), "/spec/powerState", json!("PoweredOff"))),
            "(changed: spec.powerState)",
        ),
        reject_update(
            "CAPI-owned machine moved to another Provider while running",
            capi_owned(with(vs(), "/spec/providerRef", json!({"name": "p1"}))),
            capi_owned(with(vs(), "/spec/providerRef", json!({"name": "p2"}))),
            "(changed: spec.providerRef)",
        ),
        reject_update(
            "owned by a v1beta1 Machine",
            owned_by(vs(), "cluster.x-k8s.io/v1beta1", "Machine", "old"),
            owned_by(
                with(vs(), "/spec/numCPUs", json!(4)),
                "cluster.x-k8s.io/v1beta1",
                "Machine",
                "old",
            ),
            "is owned by Machine old: its hardware is immutable",
        ),
        // Dropping the owner in the same write does not lift the rule.
        reject_update(
            "owner dropped and spec changed at once",
            capi_owned(vs()),
            with(vs(), "/spec/numCPUs", json!(4)),
            "is owned by Machine w1: its hardware is immutable (Cluster API convention)",
        ),
        reject_update(
            "template edited",
            json!({"apiVersion": "infrastructure.banlieue.io/v1alpha1", "kind": "LibvirtMachineTemplate",
                   "metadata": {"name": "t"}, "spec": {"template": {"spec": libvirt_machine()["spec"].clone()}}}),
            json!({"apiVersion": "infrastructure.banlieue.io/v1alpha1", "kind": "LibvirtMachineTemplate",
                   "metadata": {"name": "t"},
                   "spec": {"template": {"spec": with(libvirt_machine(), "/spec/cpus", json!(4))["spec"].clone()}}}),
            "spec.template is immutable",
        ),
        // What stays writable on a CAPI machine.
        accept_update(
            "providerID set once on a CAPI-owned machine",
            capi_owned(vs()),
            capi_owned(with(vs(), "/spec/providerID", json!("vsphere://4203-aaaa"))),
        ),
        accept_update(
            "CAPI-owned machine labelled",
            capi_owned(vs()),
            capi_owned(with(vs(), "/metadata/labels", json!({"team": "a"}))),
        ),
        accept_update(
            "adopted by its Machine (owner reference added, spec unchanged)",
            libvirt_machine(),
            capi_owned(libvirt_machine()),
        ),
        accept_status(
            "CAPI-owned machine's status written",
            capi_owned(vs()),
            json!({"initialization": {"provisioned": false}}),
            json!({"initialization": {"provisioned": true}, "addresses": [{"type": "InternalIP", "address": "10.0.0.5"}]}),
        ),
        // clusterctl move (and CAPI's clone) create: creates are not matched.
        accept(
            "CAPI-owned machine created with its providerID (clusterctl move)",
            capi_owned(with(vs(), "/spec/providerID", json!("vsphere://4203-bbbb"))),
        ),
        // Everything else stays editable: banlieue applies the change (issue 38).
        accept_update(
            "standalone VSphereMachine resized",
            vs(),
            with(
                with(vs(), "/spec/numCPUs", json!(4)),
                "/spec/memoryMiB",
                json!(4096),
            ),
        ),
        accept_update(
            "VirtualMachine-owned LibvirtMachine resized",
            owned_by(
                libvirt_machine(),
                "banlieue.io/v1alpha1",
                "VirtualMachine",
                "v",
            ),
            owned_by(
                with(
                    with(libvirt_machine(), "/spec/cpus", json!(2)),
                    "/spec/memoryMiB",
                    json!(1024),
                ),
                "banlieue.io/v1alpha1",
                "VirtualMachine",
                "v",
            ),
        ),
        accept_update(
            "owned by a Machine of another group",
            owned_by(vs(), "example.com/v1", "Machine", "m"),
            owned_by(
                with(vs(), "/spec/numCPUs", json!(4)),
                "example.com/v1",
                "Machine",
                "m",
            ),
        ),
    ]
}

#[tokio::test]
async fn cluster_api_machines_keep_their_hardware() {
    let ns = banlieue_testenv::namespace("admission-capi-hardware").await;
    let client = &ns.client;
    wait_until_enforced(client, &ns.name).await;
    let cases = hardware_cases();
    let mut failures = Vec::new();
    for (i, case) in cases.iter().enumerate() {
        if let Err(why) = run(client, &ns.name, &format!("hw-{i}"), case).await {
            failures.push(format!("{}: {why}", case.what));
        }
    }
    eprintln!(
        "admission: {} CAPI hardware cases, {} as expected",
        cases.len(),
        cases.len() - failures.len()
    );
    assert_none_failed(&failures, cases.len());
}

/// A deleting CAPI machine whose Provider is gone is told to name the recreated
/// Provider in `spec.providerRef` to finish its deletion: that one edit is allowed
/// while it is deleting; its hardware still is not.
#[tokio::test]
async fn a_deleting_cluster_api_machine_may_name_its_provider() {
    use banlieue_sdk::api::infra::vsphere::VSphereMachine;
    use kube::api::{Api, DeleteParams, Patch, PatchParams};

    let ns = banlieue_testenv::namespace("admission-capi-deleting").await;
    let client = &ns.client;
    wait_until_enforced(client, &ns.name).await;
    let held = with(
        capi_owned(named(vsphere_machine(), "deleting")),
        "/metadata/finalizers",
        json!(["test.banlieue.io/hold"]),
    );
    apply(client, &ns.name, &held).await.expect("the machine");
    let api: Api<VSphereMachine> = Api::namespaced(client.clone(), &ns.name);
    api.delete("deleting", &DeleteParams::default())
        .await
        .expect("delete");

    let named_provider = with(held.clone(), "/spec/providerRef", json!({"name": "p1"}));
    apply(client, &ns.name, &named_provider)
        .await
        .expect("naming the Provider of a deleting CAPI machine is allowed");
    let resized = with(named_provider, "/spec/numCPUs", json!(4));
    match apply(client, &ns.name, &resized).await {
        Err(kube::Error::Api(status)) => assert!(
            status.message.contains("(changed: spec.numCPUs)"),
            "{}",
            status.message
        ),
        other => panic!("resizing a deleting CAPI machine was not refused: {other:?}"),
    }

    api.patch(
        "deleting",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .expect("releasing the machine");
}
