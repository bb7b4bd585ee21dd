//! A domain that exists, resized, as pure decisions: the shape a domain's XML
//! describes ([`parse_shape`], [`resources`]), and the steps that apply a change of
//! the spec ([`plan`]). Reading a domain back is `read_back`'s, carrying the steps out
//! `reconfigure`'s.
//!
//! The change table ([`change_table`]) lists only what this module does and a test on
//! the real libvirtd + QEMU rig exercises; every other field is `Never` here.

use banlieue_sdk::api::common::Firmware;
use banlieue_sdk::api::infra::libvirt::LibvirtMachineSpec;
use banlieue_sdk::api::resources::{
    ChangeMode, ChangeRule, DiskSize, MachineField, MachineResources,
};
use banlieue_sdk::backend::BackendError;

use crate::domain::{
    Topology, VolumeRef, data_volume_name, interface_xml, macs, os_volume_name, volume_prefix,
};

const KIB: u64 = 1024;
const GIB: u64 = 1024 * 1024 * 1024;

/// The libvirt backend's change table: how a change of a domain that runs reaches it.
///
/// - `cpus` grow **Live**: vCPU hot-plug (`virDomainSetVcpusFlags` on the live domain
///   and its persistent definition) up to the domain's maximum (`<vcpu>`, the spec's
///   `maxCPUs`); beyond it the assessor makes it NextBoot, and the persistent
///   definition's maximum and count are written for the next power cycle. A shrink
///   is **NextBoot**: hot-unplug needs the guest's cooperation, so the persistent
///   count is lowered and the next boot takes it.
/// - `memoryMiB` grows **Live** up to the domain's `<maxMemory>` (the spec's
///   `maxMemoryMiB`: the domain then has one NUMA cell and DIMM slots): a memory
///   module of the difference is hot-plugged, and the persistent definition is
///   rewritten to boot with it all. Without `<maxMemory>` the domain reports its
///   memory as its ceiling, so a grow is NextBoot. A shrink is **NextBoot**: the
///   persistent `<memory>` is written (`virDomainSetMemoryFlags` with `CONFIG`, or the
///   definition rewritten when it has a NUMA cell, which that call refuses).
/// - `osDiskSize` and `dataDiskSize` grow **Live**: `virDomainBlockResize` has QEMU
///   grow the qcow2 volume under the running guest (a powered-off domain's volume is
///   resized through the storage pool); disks never shrink.
/// - `networks` grow **Live**: each interface added at the end of the list is
///   hot-plugged (`virDomainAttachDeviceFlags`, live and persistent) with the MAC
///   banlieue derives for its index. Removing one is Never (hot-unplug needs the
///   guest's cooperation, and a later index would change its MAC).
/// - `coresPerSocket`: **NextBoot** both ways. The topology (`<cpu><topology>`) is
///   fixed while QEMU runs (it is on QEMU's command line, `-smp`; no libvirt call
///   changes it on a live domain), so the persistent definition is rewritten and
///   defined again with the new topology (sockets = most vCPUs ÷ cores), and the next
///   boot starts with it. The running domain keeps its own until then, and reads back
///   unchanged. A maximum that is not a multiple of the new cores is refused
///   (`CpuTopologyMismatch`) before anything is written.
/// - `firmware` and `dataDisks` added or removed: **Never**.
pub fn change_table() -> Vec<ChangeRule> {
    use ChangeMode::*;
    use MachineField as M;
    vec![
        ChangeRule::grow_shrink(M::Cpus, Live, NextBoot),
        ChangeRule::both(M::CoresPerSocket, NextBoot),
        ChangeRule::grow_shrink(M::MemoryMib, Live, NextBoot),
        ChangeRule::grow_shrink(M::OsDiskSize, Live, Never),
        ChangeRule::grow_shrink(M::DataDiskSize, Live, Never),
        ChangeRule::grow_shrink(M::Networks, Live, Never),
    ]
}

/// What banlieue reads from one domain XML (live or persistent).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DomainShape {
    /// vCPUs plugged (`<vcpu current>`, else the maximum).
    pub vcpus: u32,
    /// The most vCPUs the domain can have (`<vcpu>`).
    pub max_vcpus: u32,
    /// Memory (`<memory>`: boot memory and hot-plugged modules) in KiB.
    pub memory_kib: u64,
    /// The memory hot-plug ceiling (`<maxMemory>`) in KiB, when the domain has one.
    pub max_memory_kib: Option<u64>,
    /// Whether the domain has a NUMA topology (`<cpu><numa>`): its vCPU maximum and
    /// boot memory are then changed by rewriting its persistent definition, which
    /// libvirt's vCPU and memory calls refuse to do.
    pub numa: bool,
    /// The CPU topology (`<cpu><topology>`), when the domain defines one.
    pub topology: Option<Topology>,
    /// `<interface>` devices.
    pub interfaces: u32,
    /// BIOS, EFI, or EFI with Secure Boot (`<loader secure='yes'>`).
    pub firmware: Firmware,
    /// Volume disks: target device (`vda`) and volume.
    pub disks: Vec<(String, VolumeRef)>,
}

fn kib(value: u64, unit: Option<&str>) -> Result<u64, String> {
    let factor = match unit.unwrap_or("KiB") {
        "b" | "bytes" => return Ok(value / KIB),
        "k" | "KiB" => 1,
        "KB" => return Ok(value * 1000 / KIB),
        "M" | "MiB" => KIB,
        "G" | "GiB" => KIB * KIB,
        other => return Err(format!("unknown memory unit {other}")),
    };
    Ok(value * factor)
}

/// Parses what banlieue resizes from a domain XML (`virDomainGetXMLDesc`).
pub fn parse_shape(xml: &str) -> Result<DomainShape, String> {
    let doc = roxmltree::Document::parse(xml).map_err(|e| format!("domain XML: {e}"))?;
    let root = doc.root_element();
    let child = |name: &str| root.children().find(|n| n.has_tag_name(name));
    let number = |node: roxmltree::Node<'_, '_>, what: &str| -> Result<u64, String> {
        node.text()
            .unwrap_or_default()
            .trim()
            .parse::<u64>()
            .map_err(|e| format!("<{what}>: {e}"))
    };
    let vcpu = child("vcpu").ok_or("no <vcpu>")?;
    let max_vcpus = u32::try_from(number(vcpu, "vcpu")?).map_err(|e| e.to_string())?;
    let vcpus = match vcpu.attribute("current") {
        Some(c) => c
            .trim()
            .parse::<u32>()
            .map_err(|e| format!("<vcpu current>: {e}"))?,
        None => max_vcpus,
    };
    let memory = child("memory").ok_or("no <memory>")?;
    let memory_kib = kib(number(memory, "memory")?, memory.attribute("unit"))?;
    let max_memory_kib = match child("maxMemory") {
        Some(m) => Some(kib(number(m, "maxMemory")?, m.attribute("unit"))?),
        None => None,
    };
    let numa = child("cpu").is_some_and(|c| c.children().any(|n| n.has_tag_name("numa")));
    let topology =
        match child("cpu").and_then(|c| c.children().find(|n| n.has_tag_name("topology"))) {
            Some(t) => Some(parse_topology(t)?),
            None => None,
        };
    let os = child("os");
    let loader = os.and_then(|o| o.children().find(|n| n.has_tag_name("loader")));
    let efi = os.and_then(|o| o.attribute("firmware")) == Some("efi")
        || loader.is_some_and(|l| l.attribute("type") == Some("pflash"));
    let firmware = match (efi, loader.and_then(|l| l.attribute("secure"))) {
        (true, Some("yes")) => Firmware::EfiSecure,
        (true, _) => Firmware::Efi,
        (false, _) => Firmware::Bios,
    };
    let mut shape = DomainShape {
        vcpus,
        max_vcpus,
        memory_kib,
        max_memory_kib,
        numa,
        topology,
        firmware,
        ..Default::default()
    };
    if let Some(devices) = child("devices") {
        for dev in devices.children().filter(|n| n.is_element()) {
            if dev.has_tag_name("interface") {
                shape.interfaces += 1;
            }
            if dev.has_tag_name("disk")
                && dev.attribute("type") == Some("volume")
                && dev.attribute("device").unwrap_or("disk") == "disk"
                && let Some(src) = dev.children().find(|n| n.has_tag_name("source"))
                && let (Some(pool), Some(name)) = (src.attribute("pool"), src.attribute("volume"))
                && let Some(target) = dev
                    .children()
                    .find(|n| n.has_tag_name("target"))
                    .and_then(|t| t.attribute("dev"))
            {
                shape.disks.push((
                    target.to_owned(),
                    VolumeRef {
                        pool: pool.into(),
                        name: name.into(),
                    },
                ));
            }
        }
    }
    Ok(shape)
}

/// A `<topology>` element: `sockets`, `cores` and `threads` are required (libvirt
/// writes them all), `dies` and `clusters` default to 1.
fn parse_topology(node: roxmltree::Node<'_, '_>) -> Result<Topology, String> {
    let attr = |name: &str, default: Option<u32>| -> Result<u32, String> {
        match node.attribute(name) {
            Some(v) => v
                .trim()
                .parse::<u32>()
                .map_err(|e| format!("<topology {name}>: {e}")),
            None => default.ok_or_else(|| format!("<topology> without {name}")),
        }
    };
    let topology = Topology {
        sockets: attr("sockets", None)?,
        dies: attr("dies", Some(1))?,
        clusters: attr("clusters", Some(1))?,
        cores: attr("cores", None)?,
        threads: attr("threads", None)?,
    };
    if topology.per_socket() == 0 || topology.sockets == 0 {
        return Err(format!("<topology> with a zero part: {topology:?}"));
    }
    Ok(topology)
}

/// The additional disk's name of a volume banlieue made for `uid`
/// (`bnl-<uid>-disk-<name>.qcow2`).
pub fn data_disk_name<'a>(uid: &str, volume: &'a str) -> Option<&'a str> {
    volume
        .strip_prefix(&volume_prefix(uid))?
        .strip_prefix("disk-")?
        .strip_suffix(".qcow2")
}

/// The sizes of `shape`, with each volume's capacity in bytes from `capacity`.
pub fn resources(
    uid: &str,
    shape: &DomainShape,
    capacity: impl Fn(&VolumeRef) -> Option<u64>,
) -> MachineResources {
    let os = os_volume_name(uid);
    let mut out = MachineResources {
        cpus: shape.vcpus,
        // Without `<topology>` libvirt starts QEMU with one socket per vCPU
        // (`-smp N,maxcpus=M,sockets=M,cores=1,threads=1`, seen on the rig's QEMU
        // command line): one core per socket, not an unknown.
        cores_per_socket: Some(shape.topology.map_or(1, |t| t.per_socket())),
        memory_mib: shape.memory_kib / KIB,
        networks: shape.interfaces,
        firmware: Some(shape.firmware),
        max_cpus: Some(shape.max_vcpus),
        // Without a hot-plug area the memory it has is all it can have live.
        max_memory_mib: Some(shape.max_memory_kib.unwrap_or(shape.memory_kib) / KIB),
        ..Default::default()
    };
    for (_, volume) in &shape.disks {
        let Some(bytes) = capacity(volume) else {
            continue;
        };
        // Whole GiB, rounded down: a disk is never reported larger than it is.
        let gib = u32::try_from(bytes / GIB).unwrap_or(u32::MAX);
        if volume.name == os {
            out.os_disk_gib = Some(gib);
        } else if let Some(name) = data_disk_name(uid, &volume.name) {
            out.data_disks.push(DiskSize {
                name: name.to_owned(),
                size_gib: gib,
            });
        }
    }
    out.data_disks.sort();
    out
}

/// One libvirt call that applies (part of) a change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// `virDomainSetVcpusFlags`: `live` plugs vCPUs into the running domain, else the
    /// persistent definition's count (or, with `maximum`, its maximum) is written.
    Vcpus {
        /// The count.
        count: u32,
        /// The running domain (`VIR_DOMAIN_VCPU_LIVE`), else the persistent one.
        live: bool,
        /// The maximum (`VIR_DOMAIN_VCPU_MAXIMUM`, persistent only).
        maximum: bool,
    },
    /// `virDomainSetMemoryFlags` on the persistent definition: `<currentMemory>`, or
    /// with `maximum` `<memory>`.
    Memory {
        /// KiB.
        kib: u64,
        /// `VIR_DOMAIN_MEM_MAXIMUM`.
        maximum: bool,
    },
    /// `virDomainAttachDeviceFlags` of a memory module (DIMM) into the running domain.
    AttachMemory {
        /// Its size in KiB.
        kib: u64,
    },
    /// The persistent definition rewritten ([`rewrite_persistent`]) and defined again:
    /// a domain with a NUMA cell or a CPU topology takes its next boot's vCPUs and
    /// memory this way, and every domain its next boot's topology.
    Redefine {
        /// vCPUs plugged and maximum, when they change.
        vcpus: Option<(u32, u32)>,
        /// Boot memory and hot-plug ceiling in KiB, when they change.
        memory: Option<(u64, u64)>,
        /// Cores per socket, when they change.
        cores: Option<u32>,
    },
    /// `virDomainBlockResize` of a running domain's disk.
    BlockResize {
        /// Target device, e.g. `vdb`.
        target: String,
        /// New size in bytes.
        bytes: u64,
    },
    /// `virStorageVolResize` of a powered-off domain's volume.
    VolumeResize {
        /// The volume.
        volume: VolumeRef,
        /// New capacity in bytes.
        bytes: u64,
    },
    /// `virDomainAttachDeviceFlags` of a network interface.
    AttachInterface {
        /// The `<interface>` XML.
        xml: String,
        /// The running domain, else the persistent definition.
        live: bool,
    },
}

/// The domain as [`plan`] sees it.
#[derive(Clone, Debug)]
pub struct Current<'a> {
    /// Whether the domain runs.
    pub active: bool,
    /// The live XML's shape (the persistent one's when it does not run).
    pub live: &'a DomainShape,
    /// The persistent XML's shape.
    pub config: &'a DomainShape,
    /// Each volume's capacity in bytes (`None`: the volume is gone).
    pub capacities: &'a [(VolumeRef, Option<u64>)],
}

impl Current<'_> {
    fn capacity(&self, volume: &VolumeRef) -> Option<u64> {
        self.capacities
            .iter()
            .find(|(v, _)| v == volume)
            .and_then(|(_, c)| *c)
    }
}

/// The libvirt calls that apply `fields` of `spec` to the domain of `uid`, in order.
/// Each call is skipped when the domain has its value already, so a repeated plan is
/// empty. `fields` are those the change table allows now: a vCPU count beyond the
/// running maximum is only written to the persistent definition (it waits for the
/// next boot), a disk is only grown.
pub fn plan(
    uid: &str,
    spec: &LibvirtMachineSpec,
    now: &Current<'_>,
    fields: &[MachineField],
) -> Result<Vec<Step>, BackendError> {
    let mut steps = Vec::new();
    let config_cores = now.config.topology.map_or(1, |t| t.per_socket());
    let want_cores = spec.cores_per_socket.unwrap_or(1);
    let new_cores = (fields.contains(&MachineField::CoresPerSocket) && want_cores != config_cores)
        .then_some(want_cores);
    // libvirt's vCPU calls refuse a maximum the topology does not hold, and a NUMA
    // cell must list every vCPU: with either, the definition is rewritten as a whole.
    let rewrite_vcpus = now.config.numa || now.config.topology.is_some() || new_cores.is_some();
    for field in fields {
        match field {
            MachineField::Cpus => cpus(spec, now, rewrite_vcpus, &mut steps),
            // Written below, in the one rewrite of the definition.
            MachineField::CoresPerSocket => {}
            MachineField::MemoryMib => memory(spec, now, &mut steps),
            MachineField::OsDiskSize => {
                if let Some(gib) = spec.disk_gib {
                    grow_disk(&os_volume_name(uid), gib, now, &mut steps);
                }
            }
            MachineField::DataDiskSize => {
                for disk in &spec.additional_disks {
                    grow_disk(
                        &data_volume_name(uid, &disk.name),
                        disk.size_gib,
                        now,
                        &mut steps,
                    );
                }
            }
            MachineField::Networks => networks(uid, spec, now, &mut steps),
            other => {
                return Err(BackendError::terminal(
                    "ChangeUnsupported",
                    format!(
                        "{}: the libvirt backend does not change it on a domain that exists",
                        other.as_str()
                    ),
                ));
            }
        }
    }
    if let Some(cores) = new_cores {
        redefine(&mut steps, None, None, Some(cores));
    }
    check_topology(now.config, &steps)?;
    Ok(steps)
}

/// The topology the rewrite leaves must hold the maximum it leaves: checked before
/// anything is written (libvirt would refuse the definition, after the live steps).
fn check_topology(config: &DomainShape, steps: &[Step]) -> Result<(), BackendError> {
    for step in steps {
        if let Step::Redefine { vcpus, cores, .. } = step {
            let max = vcpus.map_or(config.max_vcpus, |(_, max)| max);
            if let Some(cores) = cores.or(config.topology.map(|t| t.per_socket())) {
                Topology::for_machine(max, cores)?;
            }
        }
    }
    Ok(())
}

fn cpus(spec: &LibvirtMachineSpec, now: &Current<'_>, rewrite: bool, steps: &mut Vec<Step>) {
    let count = spec.cpus;
    let max = spec.max_cpus.unwrap_or(count).max(count);
    // Hot-plug only adds, and only up to what QEMU was started with.
    if now.active && count > now.live.vcpus && count <= now.live.max_vcpus {
        steps.push(Step::Vcpus {
            count,
            live: true,
            maximum: false,
        });
    }
    let config = now.config;
    if rewrite {
        if (count, max) != (config.vcpus, config.max_vcpus) {
            redefine(steps, Some((count, max)), None, None);
        }
        return;
    }
    let set_max = (max != config.max_vcpus).then_some(Step::Vcpus {
        count: max,
        live: false,
        maximum: true,
    });
    let set_count = (count != config.vcpus).then_some(Step::Vcpus {
        count,
        live: false,
        maximum: false,
    });
    // libvirt refuses a count above the maximum: raise the maximum first, lower it last.
    if max > config.max_vcpus {
        steps.extend(set_max.into_iter().chain(set_count));
    } else {
        steps.extend(set_count.into_iter().chain(set_max));
    }
}

/// Adds a [`Step::Redefine`], or merges into the one planned already.
fn redefine(
    steps: &mut Vec<Step>,
    vcpus: Option<(u32, u32)>,
    memory: Option<(u64, u64)>,
    cores: Option<u32>,
) {
    for step in steps.iter_mut() {
        if let Step::Redefine {
            vcpus: v,
            memory: m,
            cores: c,
        } = step
        {
            *v = vcpus.or(*v);
            *m = memory.or(*m);
            *c = cores.or(*c);
            return;
        }
    }
    steps.push(Step::Redefine {
        vcpus,
        memory,
        cores,
    });
}

fn memory(spec: &LibvirtMachineSpec, now: &Current<'_>, steps: &mut Vec<Step>) {
    let kib = spec.memory_mib * KIB;
    let live = now.live;
    // Hot-plug only adds, and only up to the domain's hot-plug area.
    if now.active && kib > live.memory_kib && live.max_memory_kib.is_some_and(|max| kib <= max) {
        steps.push(Step::AttachMemory {
            kib: kib - live.memory_kib,
        });
    }
    let config = now.config;
    if config.numa {
        // The next boot starts with it all as boot memory (the modules folded in).
        let max = spec
            .max_memory_mib
            .map(|m| m * KIB)
            .or(config.max_memory_kib)
            .unwrap_or(kib)
            .max(kib);
        if (kib, Some(max)) != (config.memory_kib, config.max_memory_kib) {
            redefine(steps, None, Some((kib, max)), None);
        }
        return;
    }
    let current = Step::Memory {
        kib,
        maximum: false,
    };
    // `<currentMemory>` stays within `<memory>`: grow the maximum first, shrink it last.
    if kib > config.memory_kib {
        steps.push(Step::Memory { kib, maximum: true });
        steps.push(current);
    } else {
        steps.push(current);
        if kib != config.memory_kib {
            steps.push(Step::Memory { kib, maximum: true });
        }
    }
}

fn grow_disk(volume: &str, gib: u32, now: &Current<'_>, steps: &mut Vec<Step>) {
    let Some((target, vol)) = now.live.disks.iter().find(|(_, v)| v.name == volume) else {
        return;
    };
    let bytes = u64::from(gib) * GIB;
    if now.capacity(vol).is_some_and(|have| have >= bytes) {
        return;
    }
    steps.push(if now.active {
        Step::BlockResize {
            target: target.clone(),
            bytes,
        }
    } else {
        Step::VolumeResize {
            volume: vol.clone(),
            bytes,
        }
    });
}

fn networks(uid: &str, spec: &LibvirtMachineSpec, now: &Current<'_>, steps: &mut Vec<Step>) {
    let macs = macs(uid, spec);
    let xml = |i: usize| interface_xml(&spec.network[i], &macs[i]);
    if now.active {
        for i in (now.live.interfaces as usize)..spec.network.len() {
            steps.push(Step::AttachInterface {
                xml: xml(i),
                live: true,
            });
        }
    }
    for i in (now.config.interfaces as usize)..spec.network.len() {
        steps.push(Step::AttachInterface {
            xml: xml(i),
            live: false,
        });
    }
}

/// A memory module of `kib` KiB on the domain's one NUMA cell.
pub fn dimm_xml(kib: u64) -> String {
    format!(
        "<memory model='dimm'>\n  <target>\n    <size unit='KiB'>{kib}</size>\n    <node>0</node>\n  </target>\n</memory>\n"
    )
}

/// A domain's persistent XML with `vcpus` (plugged, maximum), `memory` (boot
/// memory, hot-plug ceiling, KiB) and `cores` (per socket) in place of its own:
/// `<vcpu>`, `<memory>`, `<currentMemory>`, `<maxMemory>` (its slots kept), the NUMA
/// cell and the CPU topology are replaced, and with a new memory size the memory
/// modules are dropped (the boot memory holds it all). The topology holds the
/// maximum it leaves: `cores` per socket, or the domain's own cores with as many
/// sockets as the new maximum needs. Everything else is kept byte for byte.
pub fn rewrite_persistent(
    xml: &str,
    vcpus: Option<(u32, u32)>,
    memory: Option<(u64, u64)>,
    cores: Option<u32>,
) -> Result<String, String> {
    let doc = roxmltree::Document::parse(xml).map_err(|e| format!("domain XML: {e}"))?;
    let root = doc.root_element();
    let shape = parse_shape(xml)?;
    let child = |name: &str| root.children().find(|n| n.has_tag_name(name));
    let mut edits: Vec<(std::ops::Range<usize>, String)> = Vec::new();
    let (current, max_vcpus) = vcpus.unwrap_or((shape.vcpus, shape.max_vcpus));
    if vcpus.is_some() {
        let node = child("vcpu").ok_or("no <vcpu>")?;
        let text = if current < max_vcpus {
            format!("<vcpu placement='static' current='{current}'>{max_vcpus}</vcpu>")
        } else {
            format!("<vcpu placement='static'>{max_vcpus}</vcpu>")
        };
        edits.push((node.range(), text));
    }
    let cell_kib = |doc_cell: Option<roxmltree::Node<'_, '_>>| -> Result<u64, String> {
        let cell = doc_cell.ok_or("no NUMA cell")?;
        let value = cell
            .attribute("memory")
            .ok_or("a NUMA cell without memory")?
            .parse::<u64>()
            .map_err(|e| format!("NUMA cell memory: {e}"))?;
        kib(value, cell.attribute("unit"))
    };
    let numa = child("cpu").and_then(|c| c.children().find(|n| n.has_tag_name("numa")));
    let mut boot_kib = None;
    if let Some((total, max)) = memory {
        boot_kib = Some(total);
        for name in ["memory", "currentMemory"] {
            if let Some(node) = child(name) {
                edits.push((node.range(), format!("<{name} unit='KiB'>{total}</{name}>")));
            }
        }
        if let Some(node) = child("maxMemory") {
            let slots = node.attribute("slots").unwrap_or("16");
            edits.push((
                node.range(),
                format!("<maxMemory slots='{slots}' unit='KiB'>{max}</maxMemory>"),
            ));
        }
        if let Some(devices) = child("devices") {
            for module in devices.children().filter(|n| n.has_tag_name("memory")) {
                edits.push((module.range(), String::new()));
            }
        }
    }
    if let Some(numa) = numa {
        let cells = numa.children().filter(|n| n.has_tag_name("cell")).count();
        if cells != 1 {
            return Err(format!(
                "the domain has {cells} NUMA cells; banlieue resizes domains with one"
            ));
        }
        let memory_kib = match boot_kib {
            Some(k) => k,
            None => cell_kib(numa.children().find(|n| n.has_tag_name("cell")))?,
        };
        let text = crate::domain::numa_xml(max_vcpus, memory_kib);
        edits.push((numa.range(), text.trim().to_owned()));
    }
    let topology = match (cores, shape.topology) {
        (Some(cores), _) => Some(cores),
        (None, Some(t)) if vcpus.is_some() => Some(t.per_socket()),
        _ => None,
    };
    if let Some(per_socket) = topology {
        let mut t = Topology::for_machine(max_vcpus, per_socket).map_err(|e| e.message)?;
        // The domain's own split of a socket is kept when only the sockets change.
        if cores.is_none()
            && let Some(own) = shape.topology
        {
            t = Topology {
                sockets: t.sockets,
                ..own
            };
        }
        edits.push(topology_edit(xml, &doc, &t.xml())?);
    }
    edits.sort_by_key(|(range, _)| std::cmp::Reverse(range.start));
    let mut out = xml.to_owned();
    for (range, text) in edits {
        out.replace_range(range, &text);
    }
    Ok(out)
}

/// Where `topology` goes in `xml`: in place of the domain's `<topology>`, else at the
/// end of its `<cpu>` (a self-closing one opened), else in a `<cpu>` of its own before
/// `<devices>` (libvirt's schema takes a domain's elements in any order).
fn topology_edit(
    xml: &str,
    doc: &roxmltree::Document<'_>,
    topology: &str,
) -> Result<(std::ops::Range<usize>, String), String> {
    let root = doc.root_element();
    let Some(cpu) = root.children().find(|n| n.has_tag_name("cpu")) else {
        let at = root
            .children()
            .find(|n| n.has_tag_name("devices"))
            .map(|d| d.range().start)
            .or_else(|| xml[..root.range().end].rfind("</domain>"))
            .ok_or("no </domain>")?;
        return Ok((at..at, format!("<cpu>\n    {topology}\n  </cpu>\n  ")));
    };
    if let Some(own) = cpu.children().find(|n| n.has_tag_name("topology")) {
        return Ok((own.range(), topology.to_owned()));
    }
    let range = cpu.range();
    let text = &xml[range.clone()];
    if let Some(open) = text.strip_suffix("/>") {
        return Ok((
            range,
            format!("{}>\n    {topology}\n  </cpu>", open.trim_end()),
        ));
    }
    let close = range.end - "</cpu>".len();
    if !text.ends_with("</cpu>") {
        return Err(format!(
            "a <cpu> element that does not end in </cpu>: {text}"
        ));
    }
    Ok((close..close, format!("  {topology}\n  ")))
}

#[cfg(test)]
mod tests {
    use super::*;

    const UID: &str = "6f1c2b3a-4d5e-4f60-8a7b-9c0d1e2f3a4b";

    /// A live domain XML as libvirt formats it (trimmed).
    fn xml(vcpu: &str, memory_kib: u64, nics: usize, os: &str) -> String {
        let nics = "<interface type='network'><source network='n'/></interface>".repeat(nics);
        format!(
            "<domain type='qemu'><name>ns.m</name><uuid>{UID}</uuid>\
             <memory unit='KiB'>{memory_kib}</memory><currentMemory unit='KiB'>{memory_kib}</currentMemory>\
             {vcpu}<os{os}><type arch='x86_64' machine='pc-i440fx-7.2'>hvm</type></os>\
             <devices>\
             <disk type='volume' device='disk'><driver name='qemu' type='qcow2'/>\
               <source pool='vms' volume='bnl-{UID}-os.qcow2' index='3'/><target dev='vda' bus='virtio'/></disk>\
             <disk type='volume' device='disk'><source pool='fast' volume='bnl-{UID}-disk-data.qcow2'/>\
               <target dev='vdb' bus='virtio'/></disk>\
             <disk type='volume' device='disk'><source pool='vms' volume='bnl-{UID}-seed.img'/>\
               <target dev='vdc' bus='virtio'/><readonly/></disk>\
             <disk type='file' device='cdrom'><source file='/x.iso'/><target dev='sda' bus='sata'/></disk>\
             {nics}</devices></domain>"
        )
    }

    fn os(uid: &str) -> VolumeRef {
        VolumeRef {
            pool: "vms".into(),
            name: os_volume_name(uid),
        }
    }

    fn data() -> VolumeRef {
        VolumeRef {
            pool: "fast".into(),
            name: data_volume_name(UID, "data"),
        }
    }

    #[test]
    fn reads_vcpus_memory_nics_firmware_and_disks() {
        let shape = parse_shape(&xml(
            "<vcpu placement='static' current='2'>4</vcpu>",
            524288,
            2,
            "",
        ))
        .unwrap();
        assert_eq!(
            (
                shape.vcpus,
                shape.max_vcpus,
                shape.memory_kib,
                shape.interfaces
            ),
            (2, 4, 524288, 2)
        );
        assert_eq!(shape.firmware, Firmware::Bios);
        let targets: Vec<&str> = shape.disks.iter().map(|(t, _)| t.as_str()).collect();
        assert_eq!(targets, ["vda", "vdb", "vdc"], "the cdrom is not a volume");

        let all = parse_shape(&xml("<vcpu>3</vcpu>", 1024, 0, " firmware='efi'")).unwrap();
        assert_eq!(
            (all.vcpus, all.max_vcpus),
            (3, 3),
            "no current: all plugged"
        );
        assert_eq!(all.firmware, Firmware::Efi);
        let secure = xml(
            "<vcpu>1</vcpu>",
            1024,
            0,
            "><loader readonly='yes' secure='yes' type='pflash'>/c.fd</loader",
        );
        // `<os` + `><loader ...</loader` + `>`: a loader element inside <os>.
        assert_eq!(
            parse_shape(&secure).unwrap().firmware,
            Firmware::EfiSecure,
            "{secure}"
        );
        let mib = xml("<vcpu>1</vcpu>", 1, 0, "").replace("unit='KiB'>1<", "unit='MiB'>2<");
        assert_eq!(parse_shape(&mib).unwrap().memory_kib, 2048);
        assert!(parse_shape("<domain><vcpu>x</vcpu></domain>").is_err());
    }

    #[test]
    fn resources_name_data_disks_and_round_sizes_down() {
        let shape = parse_shape(&xml("<vcpu current='1'>2</vcpu>", 262144, 1, "")).unwrap();
        let sizes = |v: &VolumeRef| {
            if *v == os(UID) {
                Some(GIB + GIB / 2)
            } else if *v == data() {
                Some(3 * GIB)
            } else {
                Some(1 << 20)
            }
        };
        let r = resources(UID, &shape, sizes);
        assert_eq!(
            r,
            MachineResources {
                cpus: 1,
                cores_per_socket: Some(1),
                memory_mib: 256,
                os_disk_gib: Some(1),
                data_disks: vec![DiskSize {
                    name: "data".into(),
                    size_gib: 3
                }],
                networks: 1,
                firmware: Some(Firmware::Bios),
                max_cpus: Some(2),
                max_memory_mib: Some(256),
            }
        );
        // Another machine's volumes are not this one's disks.
        let other = resources("00000000-0000-4000-8000-000000000000", &shape, sizes);
        assert_eq!((other.os_disk_gib, other.data_disks.len()), (None, 0));
        assert_eq!(
            data_disk_name(UID, &data_volume_name(UID, "logs-1")),
            Some("logs-1")
        );
        assert_eq!(data_disk_name(UID, &os_volume_name(UID)), None);
    }

    fn spec(cpus: u32, max: Option<u32>, memory_mib: u64) -> LibvirtMachineSpec {
        serde_json::from_value(serde_json::json!({
            "image": {"volume": {"pool": "images", "name": "g.qcow2"}},
            "storagePool": "vms", "cpus": cpus, "maxCPUs": max, "memoryMiB": memory_mib,
            "diskGiB": 2,
            "additionalDisks": [{"name": "data", "sizeGiB": 4, "storage": "fast"}],
            "network": [{"network": "n"}, {"bridge": "br0"}]
        }))
        .unwrap()
    }

    fn shape(vcpus: u32, max_vcpus: u32, memory_mib: u64) -> DomainShape {
        let mut s = parse_shape(&xml("<vcpu>1</vcpu>", 1024, 1, "")).unwrap();
        s.vcpus = vcpus;
        s.max_vcpus = max_vcpus;
        s.memory_kib = memory_mib * 1024;
        s
    }

    fn vcpus(count: u32, live: bool, maximum: bool) -> Step {
        Step::Vcpus {
            count,
            live,
            maximum,
        }
    }

    fn plan_for(
        spec: &LibvirtMachineSpec,
        active: bool,
        live: &DomainShape,
        config: &DomainShape,
        fields: &[MachineField],
    ) -> Vec<Step> {
        let capacities = [(os(UID), Some(GIB)), (data(), Some(4 * GIB))];
        let now = Current {
            active,
            live,
            config,
            capacities: &capacities,
        };
        plan(UID, spec, &now, fields).unwrap()
    }

    #[test]
    fn vcpus_are_plugged_within_the_maximum_and_written_for_the_next_boot_beyond() {
        use MachineField::Cpus;
        let running = shape(1, 2, 256);
        // Within the maximum: plugged live, and the persistent count follows.
        assert_eq!(
            plan_for(&spec(2, Some(2), 256), true, &running, &running, &[Cpus]),
            [vcpus(2, true, false), vcpus(2, false, false)]
        );
        // Beyond it: the persistent maximum is raised first, then the count; nothing live.
        assert_eq!(
            plan_for(&spec(4, Some(4), 256), true, &running, &running, &[Cpus]),
            [vcpus(4, false, true), vcpus(4, false, false)]
        );
        // Without maxCPUs the maximum is the count.
        assert_eq!(
            plan_for(&spec(3, None, 256), true, &running, &running, &[Cpus]),
            [vcpus(3, false, true), vcpus(3, false, false)]
        );
        // A shrink is never unplugged live: the count is lowered first, then the maximum.
        let four = shape(4, 4, 256);
        assert_eq!(
            plan_for(&spec(2, None, 256), true, &four, &four, &[Cpus]),
            [vcpus(2, false, false), vcpus(2, false, true)]
        );
        // Written already (the next boot has it): nothing to do.
        let written = shape(4, 4, 256);
        assert_eq!(
            plan_for(&spec(4, None, 256), true, &running, &written, &[Cpus]),
            []
        );
        // Powered off: the persistent definition only.
        assert_eq!(
            plan_for(&spec(2, Some(2), 256), false, &running, &running, &[Cpus]),
            [vcpus(2, false, false)]
        );
    }

    #[test]
    fn memory_is_written_to_the_persistent_definition_within_its_maximum() {
        use MachineField::MemoryMib;
        let d = shape(1, 1, 256);
        let mem = |mib: u64, maximum: bool| Step::Memory {
            kib: mib * 1024,
            maximum,
        };
        assert_eq!(
            plan_for(&spec(1, None, 512), true, &d, &d, &[MemoryMib]),
            [mem(512, true), mem(512, false)]
        );
        assert_eq!(
            plan_for(&spec(1, None, 128), false, &d, &d, &[MemoryMib]),
            [mem(128, false), mem(128, true)]
        );
    }

    /// A persistent XML with a hot-plug area as libvirt formats it (trimmed), with one
    /// module hot-plugged (and kept) earlier.
    const NUMA_XML: &str = "<domain type='qemu'>
  <name>ns.m</name>
  <maxMemory slots='16' unit='KiB'>1048576</maxMemory>
  <memory unit='KiB'>393216</memory>
  <currentMemory unit='KiB'>393216</currentMemory>
  <vcpu placement='static' current='1'>2</vcpu>
  <os><type arch='x86_64' machine='pc-i440fx-7.2'>hvm</type></os>
  <cpu mode='custom' match='exact' check='none'>
    <model fallback='forbid'>qemu64</model>
    <numa>
      <cell id='0' cpus='0-1' memory='262144' unit='KiB'/>
    </numa>
  </cpu>
  <devices>
    <interface type='network'><source network='n'/></interface>
    <memory model='dimm'>
      <target><size unit='KiB'>131072</size><node>0</node></target>
      <address type='dimm' slot='0'/>
    </memory>
  </devices>
</domain>";

    #[test]
    fn memory_is_hot_plugged_within_max_memory_and_the_next_boot_takes_it_all() {
        use MachineField::{Cpus, MemoryMib};
        let shape = parse_shape(NUMA_XML).unwrap();
        assert_eq!(
            (shape.memory_kib, shape.max_memory_kib, shape.numa),
            (393216, Some(1048576), true)
        );
        assert_eq!(resources(UID, &shape, |_| None).max_memory_mib, Some(1024));
        let mut s = spec(1, Some(2), 512);
        s.max_memory_mib = Some(1024);
        // 384 MiB running, 512 asked: a 128 MiB module live, and the next boot boots
        // with 512 (the persistent definition rewritten, not the modules kept).
        assert_eq!(
            plan_for(&s, true, &shape, &shape, &[MemoryMib]),
            [
                Step::AttachMemory { kib: 131072 },
                Step::Redefine {
                    vcpus: None,
                    memory: Some((524288, 1048576)),
                    cores: None,
                }
            ]
        );
        // Beyond the hot-plug area (maxMemoryMiB raised with it): the next boot only.
        s.memory_mib = 2048;
        s.max_memory_mib = Some(4096);
        s.cpus = 2;
        assert_eq!(
            plan_for(&s, true, &shape, &shape, &[Cpus, MemoryMib]),
            [
                vcpus(2, true, false),
                Step::Redefine {
                    vcpus: Some((2, 2)),
                    memory: Some((2 << 20, 4 << 20)),
                    cores: None,
                }
            ],
            "the vCPU within maxCPUs live, one rewrite for both"
        );
        // Powered off: no module, the definition only.
        s.memory_mib = 512;
        s.max_memory_mib = Some(1024);
        assert_eq!(
            plan_for(&s, false, &shape, &shape, &[MemoryMib]),
            [Step::Redefine {
                vcpus: None,
                memory: Some((524288, 1048576)),
                cores: None,
            }]
        );
    }

    #[test]
    fn the_persistent_definition_is_rewritten_in_place() {
        let out =
            rewrite_persistent(NUMA_XML, Some((3, 4)), Some((524288, 2097152)), None).unwrap();
        let shape = parse_shape(&out).unwrap();
        assert_eq!(
            (
                shape.vcpus,
                shape.max_vcpus,
                shape.memory_kib,
                shape.max_memory_kib
            ),
            (3, 4, 524288, Some(2097152))
        );
        assert!(
            out.contains("<cell id='0' cpus='0-3' memory='524288' unit='KiB'/>"),
            "{out}"
        );
        assert!(out.contains("<maxMemory slots='16' unit='KiB'>2097152</maxMemory>"));
        assert!(out.contains("<currentMemory unit='KiB'>524288</currentMemory>"));
        assert!(!out.contains("model='dimm'"), "modules folded in: {out}");
        assert!(
            out.contains("<model fallback='forbid'>qemu64</model>"),
            "kept: {out}"
        );
        assert!(out.contains("<interface type='network'>"), "kept: {out}");
        // vCPUs only: the memory and its modules are kept, the cell covers every vCPU.
        let cpus_only = rewrite_persistent(NUMA_XML, Some((4, 4)), None, None).unwrap();
        assert!(
            cpus_only.contains("<vcpu placement='static'>4</vcpu>"),
            "{cpus_only}"
        );
        assert!(
            cpus_only.contains("cpus='0-3' memory='262144'"),
            "{cpus_only}"
        );
        assert!(cpus_only.contains("model='dimm'"), "{cpus_only}");
        assert_eq!(
            rewrite_persistent(NUMA_XML, None, None, None).unwrap(),
            NUMA_XML,
            "nothing asked: the same document"
        );
    }

    /// A persistent XML as libvirt formats a domain made with `coresPerSocket` 2 and
    /// `maxCPUs` 4 (trimmed).
    const TOPOLOGY_XML: &str = "<domain type='qemu'>
  <name>ns.m</name>
  <memory unit='KiB'>262144</memory>
  <vcpu placement='static' current='1'>4</vcpu>
  <os><type arch='x86_64' machine='pc-i440fx-7.2'>hvm</type></os>
  <cpu>
    <topology sockets='2' dies='1' cores='2' threads='1'/>
  </cpu>
  <devices>
    <interface type='network'><source network='n'/></interface>
  </devices>
</domain>";

    fn topology_of(xml: &str) -> (u32, u32, u32, Option<(u32, u32, u32)>) {
        let s = parse_shape(xml).unwrap();
        (
            s.vcpus,
            s.max_vcpus,
            resources(UID, &s, |_| None).cores_per_socket.unwrap(),
            s.topology.map(|t| (t.sockets, t.cores, t.threads)),
        )
    }

    #[test]
    fn a_topology_is_rewritten_for_the_next_boot_over_the_new_maximum() {
        assert_eq!(topology_of(TOPOLOGY_XML), (1, 4, 2, Some((2, 2, 1))));
        // New cores: the sockets follow the maximum.
        let four = rewrite_persistent(TOPOLOGY_XML, None, None, Some(4)).unwrap();
        assert_eq!(topology_of(&four), (1, 4, 4, Some((1, 4, 1))), "{four}");
        assert!(four.contains("<interface type='network'>"), "kept: {four}");
        // A new maximum keeps the cores: more sockets.
        let six = rewrite_persistent(TOPOLOGY_XML, Some((2, 6)), None, None).unwrap();
        assert_eq!(topology_of(&six), (2, 6, 2, Some((3, 2, 1))), "{six}");
        // One that the cores do not divide is refused, named.
        let odd = rewrite_persistent(TOPOLOGY_XML, Some((2, 5)), None, None).unwrap_err();
        assert!(
            odd.contains("5 vCPUs") && odd.contains("coresPerSocket 2"),
            "{odd}"
        );
        // A domain without a topology gets one: in its <cpu>, or in a <cpu> of its own.
        let plain = "<domain><vcpu>4</vcpu><memory>1024</memory><devices/></domain>";
        assert_eq!(topology_of(plain), (4, 4, 1, None));
        let added = rewrite_persistent(plain, None, None, Some(2)).unwrap();
        assert_eq!(topology_of(&added), (4, 4, 2, Some((2, 2, 1))), "{added}");
        let closed = "<domain><vcpu>4</vcpu><memory>1024</memory>\
                      <cpu mode='host-passthrough' check='none'/><devices/></domain>";
        let opened = rewrite_persistent(closed, None, None, Some(4)).unwrap();
        assert!(
            opened.contains("<cpu mode='host-passthrough' check='none'>\n    <topology sockets='1' dies='1' cores='4' threads='1'/>\n  </cpu>"),
            "{opened}"
        );
        let numa = rewrite_persistent(NUMA_XML, None, None, Some(2)).unwrap();
        assert_eq!(topology_of(&numa).3, Some((1, 2, 1)), "{numa}");
        assert!(
            numa.contains("<cell id='0' cpus='0-1'"),
            "the cell kept: {numa}"
        );
        assert_eq!(
            rewrite_persistent(TOPOLOGY_XML, None, None, None).unwrap(),
            TOPOLOGY_XML,
            "nothing asked: the same document"
        );
    }

    #[test]
    fn cores_per_socket_waits_in_the_persistent_definition() {
        use MachineField::{CoresPerSocket, Cpus};
        let with = parse_shape(TOPOLOGY_XML).unwrap();
        let mut s = spec(1, Some(4), 256);
        s.cores_per_socket = Some(4);
        let redefine = |vcpus, cores| Step::Redefine {
            vcpus,
            memory: None,
            cores,
        };
        // Running or off, the definition is rewritten; nothing is done live.
        for active in [true, false] {
            assert_eq!(
                plan_for(&s, active, &with, &with, &[CoresPerSocket]),
                [redefine(None, Some(4))]
            );
        }
        // Written already: nothing to do.
        let written =
            parse_shape(&rewrite_persistent(TOPOLOGY_XML, None, None, Some(4)).unwrap()).unwrap();
        assert_eq!(plan_for(&s, true, &with, &written, &[CoresPerSocket]), []);
        // With a topology, a vCPU is still plugged live within the maximum, and the
        // next boot's count is written by the rewrite (libvirt's vCPU call would refuse
        // a maximum the topology does not hold); both fields, one rewrite.
        s.cpus = 2;
        assert_eq!(
            plan_for(&s, true, &with, &with, &[Cpus, CoresPerSocket]),
            [vcpus(2, true, false), redefine(Some((2, 4)), Some(4))]
        );
        // A new maximum the cores do not divide: refused before anything is done.
        s.max_cpus = Some(6);
        s.cpus = 6;
        let capacities = [];
        let now = Current {
            active: true,
            live: &with,
            config: &with,
            capacities: &capacities,
        };
        let err = plan(UID, &s, &now, &[Cpus, CoresPerSocket]).unwrap_err();
        assert_eq!(err.reason, "CpuTopologyMismatch");
        assert!(
            err.message.contains("6 vCPUs") && err.message.contains("coresPerSocket 4"),
            "{err}"
        );
        // A domain without a topology takes one; its vCPU maximum goes with it.
        let plain = shape(1, 2, 256);
        s.cores_per_socket = Some(2);
        s.max_cpus = Some(4);
        s.cpus = 1;
        assert_eq!(
            plan_for(&s, true, &plain, &plain, &[Cpus, CoresPerSocket]),
            [redefine(Some((1, 4)), Some(2))]
        );
        // Unset is one core per socket: a domain without a topology has it already.
        s.cores_per_socket = None;
        assert_eq!(plan_for(&s, true, &plain, &plain, &[CoresPerSocket]), []);
    }

    #[test]
    fn disks_grow_through_qemu_when_running_and_the_pool_when_off() {
        use MachineField::{DataDiskSize, OsDiskSize};
        let d = shape(1, 1, 256);
        let s = spec(1, None, 256);
        assert_eq!(
            plan_for(&s, true, &d, &d, &[OsDiskSize, DataDiskSize]),
            [Step::BlockResize {
                target: "vda".into(),
                bytes: 2 * GIB
            }],
            "the data disk has its 4 GiB already"
        );
        assert_eq!(
            plan_for(&s, false, &d, &d, &[OsDiskSize]),
            [Step::VolumeResize {
                volume: os(UID),
                bytes: 2 * GIB
            }]
        );
        let mut smaller = s.clone();
        smaller.disk_gib = Some(1);
        smaller.additional_disks[0].size_gib = 3;
        assert_eq!(
            plan_for(&smaller, true, &d, &d, &[OsDiskSize, DataDiskSize]),
            [],
            "never shrunk"
        );
    }

    #[test]
    fn interfaces_added_at_the_end_are_plugged_live_and_kept() {
        let one = shape(1, 1, 256);
        let mut two = one.clone();
        two.interfaces = 2;
        let s = spec(1, None, 256);
        let second = interface_xml(&s.network[1], &macs(UID, &s)[1]);
        assert!(second.contains("<source bridge='br0'/>"), "{second}");
        let attach = |live| Step::AttachInterface {
            xml: second.clone(),
            live,
        };
        let nets = [MachineField::Networks];
        assert_eq!(
            plan_for(&s, true, &one, &one, &nets),
            [attach(true), attach(false)]
        );
        assert_eq!(
            plan_for(&s, true, &one, &two, &nets),
            [attach(true)],
            "the persistent definition has it already"
        );
        assert_eq!(plan_for(&s, false, &one, &one, &nets), [attach(false)]);
        assert_eq!(plan_for(&s, true, &two, &two, &nets), []);
    }

    #[test]
    fn fields_it_cannot_change_are_refused_by_name() {
        let d = shape(1, 1, 256);
        let capacities = [];
        let now = Current {
            active: true,
            live: &d,
            config: &d,
            capacities: &capacities,
        };
        let err = plan(UID, &spec(1, None, 256), &now, &[MachineField::Firmware]).unwrap_err();
        assert_eq!(err.reason, "ChangeUnsupported");
        assert!(err.message.starts_with("firmware:"), "{err}");
    }

    #[test]
    fn the_table_lists_only_what_is_applied() {
        let table = change_table();
        for rule in &table {
            assert_ne!(
                (rule.grow, rule.shrink),
                (ChangeMode::Never, ChangeMode::Never),
                "{:?}",
                rule.field
            );
        }
        assert!(!table.iter().any(|r| r.field == MachineField::Firmware));
    }
}
