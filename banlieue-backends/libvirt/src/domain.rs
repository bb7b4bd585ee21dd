//! The domain XML for a machine, and what is read back from a defined domain.
//!
//! The domain's `<uuid>` is the infra object's UID and its `<metadata>` carries the UID,
//! namespace and name under banlieue's XML namespace: libvirt refuses a second domain
//! with the same UUID, so a restart between "defined" and "status written" finds the
//! domain again instead of defining another.

use banlieue_sdk::api::common::Firmware;
use banlieue_sdk::api::infra::libvirt::{
    LibvirtCpuMode, LibvirtMachineSpec, LibvirtNetworkInterface,
};
use banlieue_sdk::backend::{BackendError, MachineIdentity};

use crate::xml::escape;

/// banlieue's XML namespace in `<metadata>`.
pub const METADATA_NS: &str = "https://banlieue.io/xmlns/libvirt/v1";

/// banlieue's `<metadata>` element for `id`, as `virDomainSetMetadata` takes it (no
/// prefix: libvirt puts it in [`METADATA_NS`] under the key `banlieue`): what an
/// adopting object (a move, a restore) writes so the domain names its new owner.
pub(crate) fn metadata_element(id: &MachineIdentity) -> String {
    format!(
        "<machine><uid>{}</uid><namespace>{}</namespace><name>{}</name></machine>",
        escape(&id.uid),
        escape(&id.namespace),
        escape(&id.name)
    )
}

/// `kvm` (hardware virtualisation) or `qemu` (TCG).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DomainType {
    /// Hardware-assisted.
    Kvm,
    /// Software emulation.
    Qemu,
}

impl DomainType {
    /// The `<domain type>` value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Kvm => "kvm",
            Self::Qemu => "qemu",
        }
    }
}

/// A volume in a storage pool.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct VolumeRef {
    /// Pool name.
    pub pool: String,
    /// Volume name.
    pub name: String,
}

/// Everything the domain XML is made from.
#[derive(Clone, Debug)]
pub struct DomainPlan<'a> {
    /// The domain's name ([`domain_name`]).
    pub name: String,
    /// Which machine.
    pub identity: &'a MachineIdentity,
    /// Its spec.
    pub spec: &'a LibvirtMachineSpec,
    /// `kvm` or `qemu`.
    pub domain_type: DomainType,
    /// QEMU machine type, when the Provider sets one.
    pub machine: Option<&'a str>,
    /// The OS disk (a qcow2 overlay on the image).
    pub os_disk: VolumeRef,
    /// Additional disks, in spec order.
    pub data_disks: Vec<VolumeRef>,
    /// The NoCloud seed volume.
    pub seed: VolumeRef,
}

/// The domain's name: `<namespace>.<name>`. Namespaces are DNS labels (no dots), so
/// two machines never share one.
pub fn domain_name(identity: &MachineIdentity) -> String {
    format!("{}.{}", identity.namespace, identity.name)
}

/// Volume names carry the UID so `delete` finds them even without a domain.
pub fn volume_prefix(uid: &str) -> String {
    format!("bnl-{uid}-")
}

/// The OS disk's volume name.
pub fn os_volume_name(uid: &str) -> String {
    format!("{}os.qcow2", volume_prefix(uid))
}

/// The seed's volume name.
pub fn seed_volume_name(uid: &str) -> String {
    format!("{}seed.img", volume_prefix(uid))
}

/// An additional disk's volume name.
pub fn data_volume_name(uid: &str, disk: &str) -> String {
    format!("{}disk-{disk}.qcow2", volume_prefix(uid))
}

/// The MAC of interface `index` when the spec gives none: QEMU's `52:54:00` prefix
/// and three bytes of a hash of the UID and index, so it is stable across redefines
/// and the seed's network config can match on it.
pub fn default_mac(uid: &str, index: usize) -> String {
    // FNV-1a: small, stable across Rust versions (unlike std's hasher).
    let mut hash: u32 = 0x811c_9dc5;
    for byte in uid.bytes().chain((index as u32).to_le_bytes()) {
        hash ^= u32::from(byte);
        hash = hash.wrapping_mul(0x0100_0193);
    }
    let [a, b, c, _] = hash.to_be_bytes();
    format!("52:54:00:{a:02x}:{b:02x}:{c:02x}")
}

/// The MACs of the spec's interfaces, given or derived.
pub fn macs(uid: &str, spec: &LibvirtMachineSpec) -> Vec<String> {
    spec.network
        .iter()
        .enumerate()
        .map(|(i, n)| {
            n.mac_address
                .as_ref()
                .map(|m| m.to_ascii_lowercase())
                .unwrap_or_else(|| default_mac(uid, i))
        })
        .collect()
}

fn disk_target(index: usize) -> String {
    // vda..vdz, then vdaa..: libvirt's own naming.
    let mut n = index;
    let mut name = Vec::new();
    loop {
        name.push(b'a' + (n % 26) as u8);
        if n < 26 {
            break;
        }
        n = n / 26 - 1;
    }
    name.reverse();
    format!("vd{}", String::from_utf8_lossy(&name))
}

fn volume_disk(out: &mut String, volume: &VolumeRef, format: &str, target: &str, readonly: bool) {
    out.push_str(&format!(
        "    <disk type='volume' device='disk'>\n      <driver name='qemu' type='{format}'/>\n      <source pool='{}' volume='{}'/>\n      <target dev='{target}' bus='virtio'/>\n{}    </disk>\n",
        escape(&volume.pool),
        escape(&volume.name),
        if readonly { "      <readonly/>\n" } else { "" },
    ));
}

/// One `<interface>` element (in the domain XML, and alone for a hot-plug).
pub fn interface_xml(nic: &LibvirtNetworkInterface, mac: &str) -> String {
    let source = match (&nic.network, &nic.bridge) {
        (_, Some(bridge)) => format!(
            "type='bridge'>\n      <source bridge='{}'/>",
            escape(bridge)
        ),
        (network, None) => format!(
            "type='network'>\n      <source network='{}'/>",
            escape(network.as_deref().unwrap_or("default"))
        ),
    };
    let mtu = nic
        .mtu
        .map(|size| format!("      <mtu size='{size}'/>\n"))
        .unwrap_or_default();
    format!(
        "    <interface {source}\n      <mac address='{}'/>\n      <model type='virtio'/>\n{mtu}    </interface>\n",
        escape(mac)
    )
}

/// Memory module slots of a domain with `maxMemoryMiB`: how many times memory can be
/// hot-added before its next power cycle (which folds the modules into its boot memory).
pub const MEMORY_SLOTS: u32 = 16;

/// The `<numa>` element of a domain with memory hot-plug: one cell with every vCPU
/// (`vcpus` is the maximum) and its boot memory.
pub fn numa_xml(vcpus: u32, memory_kib: u64) -> String {
    let cpus = if vcpus > 1 {
        format!("0-{}", vcpus - 1)
    } else {
        "0".to_owned()
    };
    format!(
        "    <numa>\n      <cell id='0' cpus='{cpus}' memory='{memory_kib}' unit='KiB'/>\n    </numa>\n"
    )
}

/// A domain's CPU topology (`<cpu><topology>`). libvirt refuses one whose product is
/// not the domain's most vCPUs (`<vcpu>`): it describes every vCPU the domain can
/// have, plugged or not.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Topology {
    /// `sockets`.
    pub sockets: u32,
    /// `dies` per socket.
    pub dies: u32,
    /// `clusters` per die (libvirt 10.1 and later; 1 when absent).
    pub clusters: u32,
    /// `cores` per cluster.
    pub cores: u32,
    /// `threads` per core.
    pub threads: u32,
}

impl Topology {
    /// The topology banlieue defines: `cores` per socket, one die, one thread per core,
    /// as many sockets as hold `max_vcpus`. Refused (terminal, before anything is made)
    /// when `max_vcpus` is not a multiple of `cores`: libvirt would refuse the domain.
    pub fn for_machine(max_vcpus: u32, cores: u32) -> Result<Self, BackendError> {
        if cores == 0 || !max_vcpus.is_multiple_of(cores) {
            return Err(BackendError::terminal(
                "CpuTopologyMismatch",
                format!(
                    "the domain can have {max_vcpus} vCPUs (maxCPUs, else cpus), which is not \
                     a multiple of coresPerSocket {cores}: libvirt's CPU topology (sockets × \
                     cores) must hold exactly the most vCPUs the domain can have; make \
                     maxCPUs a multiple of coresPerSocket, or change coresPerSocket"
                ),
            ));
        }
        Ok(Self {
            sockets: max_vcpus / cores,
            dies: 1,
            clusters: 1,
            cores,
            threads: 1,
        })
    }

    /// vCPUs per socket (dies × clusters × cores × threads): what banlieue calls cores
    /// per socket (banlieue's own topologies have one die and one thread per core).
    pub fn per_socket(&self) -> u32 {
        self.dies * self.clusters * self.cores * self.threads
    }

    /// The `<topology>` element (`clusters` only when not 1: older libvirt does not
    /// know the attribute).
    pub fn xml(&self) -> String {
        let clusters = if self.clusters == 1 {
            String::new()
        } else {
            format!(" clusters='{}'", self.clusters)
        };
        format!(
            "<topology sockets='{}' dies='{}'{clusters} cores='{}' threads='{}'/>",
            self.sockets, self.dies, self.cores, self.threads
        )
    }
}

/// The most vCPUs the spec's domain can have: `maxCPUs`, else `cpus`.
pub fn max_vcpus(spec: &LibvirtMachineSpec) -> u32 {
    spec.max_cpus.unwrap_or(spec.cpus).max(spec.cpus)
}

/// The topology the spec asks (`coresPerSocket`), `None` without it (libvirt then
/// starts QEMU with one socket per vCPU). A maximum that is not a multiple of
/// `coresPerSocket` is refused: admission refuses it too, this is the last guard.
pub fn spec_topology(spec: &LibvirtMachineSpec) -> Result<Option<Topology>, BackendError> {
    spec.cores_per_socket
        .map(|cores| Topology::for_machine(max_vcpus(spec), cores))
        .transpose()
}

/// The domain XML. Refused when the spec's CPU topology cannot be defined
/// ([`spec_topology`]).
pub fn domain_xml(plan: &DomainPlan<'_>) -> Result<String, BackendError> {
    let spec = plan.spec;
    let id = plan.identity;
    let mut out = String::new();
    out.push_str(&format!("<domain type='{}'>\n", plan.domain_type.as_str()));
    out.push_str(&format!("  <name>{}</name>\n", escape(&plan.name)));
    out.push_str(&format!("  <uuid>{}</uuid>\n", escape(&id.uid)));
    out.push_str(&format!(
        "  <title>{}</title>\n  <description>banlieue LibvirtMachine {}/{} (uid {})</description>\n",
        escape(&id.name),
        escape(&id.namespace),
        escape(&id.name),
        escape(&id.uid)
    ));
    out.push_str(&format!(
        "  <metadata>\n    <banlieue:machine xmlns:banlieue='{METADATA_NS}'>\n      <banlieue:uid>{}</banlieue:uid>\n      <banlieue:namespace>{}</banlieue:namespace>\n      <banlieue:name>{}</banlieue:name>\n    </banlieue:machine>\n  </metadata>\n",
        escape(&id.uid),
        escape(&id.namespace),
        escape(&id.name)
    ));
    // Room to hot-add memory: QEMU gets a memory hot-plug area up to `maxMemoryMiB`
    // with DIMM slots, which needs a NUMA topology (one cell holding every vCPU).
    let max_memory = spec.max_memory_mib.filter(|max| *max > spec.memory_mib);
    if let Some(max) = max_memory {
        out.push_str(&format!(
            "  <maxMemory slots='{MEMORY_SLOTS}' unit='MiB'>{max}</maxMemory>\n"
        ));
    }
    out.push_str(&format!(
        "  <memory unit='MiB'>{}</memory>\n",
        spec.memory_mib
    ));
    // Room to hot-add vCPUs: QEMU is started with `maxCPUs` possible vCPUs, `cpus` of
    // them plugged.
    let max_vcpus = max_vcpus(spec);
    if max_vcpus > spec.cpus {
        out.push_str(&format!(
            "  <vcpu current='{}'>{max_vcpus}</vcpu>\n",
            spec.cpus
        ));
    } else {
        out.push_str(&format!("  <vcpu>{}</vcpu>\n", spec.cpus));
    }
    let secure = spec.firmware == Firmware::EfiSecure;
    // Secure Boot needs SMM, which only q35 has.
    let machine = plan.machine.or(secure.then_some("q35"));
    let firmware = match spec.firmware {
        Firmware::Bios => "",
        Firmware::Efi | Firmware::EfiSecure => " firmware='efi'",
    };
    out.push_str(&format!("  <os{firmware}>\n"));
    match machine {
        Some(m) => out.push_str(&format!(
            "    <type arch='x86_64' machine='{}'>hvm</type>\n",
            escape(m)
        )),
        None => out.push_str("    <type arch='x86_64'>hvm</type>\n"),
    }
    if secure {
        out.push_str("    <loader secure='yes'/>\n");
    }
    out.push_str("    <boot dev='hd'/>\n  </os>\n");
    // ACPI is what makes a graceful shutdown (the power button) reach the guest.
    out.push_str("  <features>\n    <acpi/>\n    <apic/>\n");
    if secure {
        out.push_str("    <smm state='on'/>\n");
    }
    out.push_str("  </features>\n");
    // The CPU mode only means something with KVM; TCG emulates its default model.
    let mode = match (plan.domain_type, spec.cpu_mode) {
        (DomainType::Kvm, LibvirtCpuMode::HostPassthrough) => {
            Some(" mode='host-passthrough' check='none'")
        }
        (DomainType::Kvm, LibvirtCpuMode::HostModel) => Some(" mode='host-model'"),
        _ => None,
    };
    // `coresPerSocket`: the topology covers every vCPU the domain can have, plugged or
    // not (hot-plug still adds them one at a time).
    let topology = spec_topology(spec)?
        .map(|t| format!("    {}\n", t.xml()))
        .unwrap_or_default();
    let numa = max_memory
        .map(|_| numa_xml(max_vcpus, spec.memory_mib * 1024))
        .unwrap_or_default();
    let inner = format!("{topology}{numa}");
    match (mode, inner.is_empty()) {
        (Some(mode), true) => out.push_str(&format!("  <cpu{mode}/>\n")),
        (mode, false) => out.push_str(&format!(
            "  <cpu{}>\n{inner}  </cpu>\n",
            mode.unwrap_or_default()
        )),
        (None, true) => {}
    }
    out.push_str("  <on_poweroff>destroy</on_poweroff>\n  <on_reboot>restart</on_reboot>\n  <on_crash>destroy</on_crash>\n");
    out.push_str("  <devices>\n");
    volume_disk(&mut out, &plan.os_disk, "qcow2", &disk_target(0), false);
    for (i, disk) in plan.data_disks.iter().enumerate() {
        volume_disk(&mut out, disk, "qcow2", &disk_target(i + 1), false);
    }
    volume_disk(
        &mut out,
        &plan.seed,
        "raw",
        &disk_target(plan.data_disks.len() + 1),
        true,
    );
    for (nic, mac) in spec.network.iter().zip(macs(&id.uid, spec)) {
        out.push_str(&interface_xml(nic, &mac));
    }
    // A pty serial console works on remote hosts too; virtlogd keeps its output.
    out.push_str(&format!(
        "    <serial type='pty'>\n      <target port='0'/>\n      <log file='/var/log/libvirt/qemu/{}-console.log' append='off'/>\n    </serial>\n    <console type='pty'>\n      <target type='serial' port='0'/>\n    </console>\n",
        escape(&plan.name)
    ));
    out.push_str("    <channel type='unix'>\n      <target type='virtio' name='org.qemu.guest_agent.0'/>\n    </channel>\n");
    out.push_str("    <rng model='virtio'>\n      <backend model='random'>/dev/urandom</backend>\n    </rng>\n");
    out.push_str("  </devices>\n</domain>\n");
    Ok(out)
}

/// What banlieue reads back from a defined domain's XML.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DefinedDomain {
    /// The UID in banlieue's metadata, if the domain has it.
    pub uid: Option<String>,
    /// Volumes its disks use (`type='volume'` disks).
    pub volumes: Vec<VolumeRef>,
    /// Interfaces: MAC and, for `type='network'`, the network.
    pub interfaces: Vec<(String, Option<String>)>,
}

/// Parses a domain's XML (`virDomainGetXMLDesc`).
pub fn parse_defined(xml: &str) -> Result<DefinedDomain, String> {
    let doc = roxmltree::Document::parse(xml).map_err(|e| format!("domain XML: {e}"))?;
    let root = doc.root_element();
    let mut out = DefinedDomain::default();
    for node in root.descendants() {
        if node.has_tag_name((METADATA_NS, "uid")) {
            out.uid = node.text().map(str::to_string);
        }
    }
    if let Some(devices) = root.children().find(|n| n.has_tag_name("devices")) {
        for dev in devices.children().filter(|n| n.is_element()) {
            if dev.has_tag_name("disk")
                && dev.attribute("type") == Some("volume")
                && let Some(src) = dev.children().find(|n| n.has_tag_name("source"))
                && let (Some(pool), Some(name)) = (src.attribute("pool"), src.attribute("volume"))
            {
                out.volumes.push(VolumeRef {
                    pool: pool.into(),
                    name: name.into(),
                });
            }
            if dev.has_tag_name("interface") {
                let mac = dev
                    .children()
                    .find(|n| n.has_tag_name("mac"))
                    .and_then(|n| n.attribute("address"))
                    .unwrap_or_default()
                    .to_ascii_lowercase();
                let network = (dev.attribute("type") == Some("network"))
                    .then(|| {
                        dev.children()
                            .find(|n| n.has_tag_name("source"))
                            .and_then(|n| n.attribute("network"))
                            .map(str::to_string)
                    })
                    .flatten();
                out.interfaces.push((mac, network));
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn disk_targets_follow_libvirt() {
        assert_eq!(disk_target(0), "vda");
        assert_eq!(disk_target(25), "vdz");
        assert_eq!(disk_target(26), "vdaa");
    }

    #[test]
    fn default_macs_are_stable_and_distinct() {
        let a = default_mac("2d9a0c1e-0000-4000-8000-000000000001", 0);
        assert_eq!(a, default_mac("2d9a0c1e-0000-4000-8000-000000000001", 0));
        assert_ne!(a, default_mac("2d9a0c1e-0000-4000-8000-000000000001", 1));
        assert!(a.starts_with("52:54:00:"));
    }
}
