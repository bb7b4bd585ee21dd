//! Device edits made when a clone is configured: each network device of the template
//! moved to the machine's port group (standard or distributed), an optional fixed
//! MAC, and the first disk grown to `diskGiB`. Devices are read from
//! `config.hardware.device`, changed in place and sent back whole, as vSphere replaces
//! a device on `edit`.
//!
//! Also the devices of a machine created on imported disks ([`create_devices`]): a SCSI
//! controller, the disks on it, network devices; and the disks of a machine as an
//! export reads them ([`virtual_disks`]).

use banlieue_sdk::api::common::DiskProvisioning;
use banlieue_sdk::api::infra::MachineDisk;
use banlieue_sdk::backend::BackendError;

use crate::client::methods::{DeviceChange, DiskLocator};
use crate::client::{DatastorePath, Element, MoRef};

/// Where a network device should be connected.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NetworkBacking {
    /// A standard port group (`Network`).
    Standard {
        /// Its name.
        name: String,
        /// Its reference.
        network: MoRef,
    },
    /// A distributed port group.
    Distributed {
        /// The distributed switch's UUID.
        switch_uuid: String,
        /// The port group's key.
        portgroup_key: String,
    },
}

impl NetworkBacking {
    fn element(&self) -> Element {
        match self {
            Self::Standard { name, network } => Element {
                name: "backing".into(),
                xsi_type: Some("VirtualEthernetCardNetworkBackingInfo".into()),
                children: vec![
                    Element::leaf("deviceName", name.clone()),
                    Element {
                        name: "network".into(),
                        attributes: vec![("type".into(), network.kind.clone())],
                        text: network.value.clone(),
                        ..Default::default()
                    },
                ],
                ..Default::default()
            },
            Self::Distributed {
                switch_uuid,
                portgroup_key,
            } => Element {
                name: "backing".into(),
                xsi_type: Some("VirtualEthernetCardDistributedVirtualPortBackingInfo".into()),
                children: vec![Element {
                    name: "port".into(),
                    children: vec![
                        Element::leaf("switchUuid", switch_uuid.clone()),
                        Element::leaf("portgroupKey", portgroup_key.clone()),
                    ],
                    ..Default::default()
                }],
                ..Default::default()
            },
        }
    }
}

/// One network device as the machine wants it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WantedNic {
    /// Where to connect it.
    pub backing: NetworkBacking,
    /// A fixed MAC address.
    pub mac_address: Option<String>,
}

/// The devices of an `ArrayOfVirtualDevice` value.
pub fn devices(value: &Element) -> Vec<Element> {
    value.children.clone()
}

/// Network devices: the ones with a MAC address and a backing.
fn is_nic(device: &Element) -> bool {
    device.child("macAddress").is_some() || device.child("addressType").is_some()
}

/// Edits moving the template's network devices, in order, to the wanted backings.
/// More wanted devices than the template has is a terminal error (adding devices is
/// not supported); extra template devices are left as they are.
pub fn nic_edits(
    devices: &[Element],
    wanted: &[WantedNic],
) -> Result<Vec<DeviceChange>, BackendError> {
    let nics: Vec<&Element> = devices.iter().filter(|d| is_nic(d)).collect();
    nics_suffice(wanted.len(), nics.len())?;
    Ok(nics
        .into_iter()
        .zip(wanted)
        .map(|(nic, want)| {
            let mut device = nic.clone();
            let backing = want.backing.element();
            match device.child_mut("backing") {
                Some(b) => *b = backing,
                None => {
                    // `backing` follows `key` and `deviceInfo`.
                    let at = device
                        .children
                        .iter()
                        .position(|c| c.name != "key" && c.name != "deviceInfo")
                        .unwrap_or(device.children.len());
                    device.children.insert(at, backing);
                }
            }
            // vSphere regenerates the summary from the new backing.
            if let Some(info) = device.child_mut("deviceInfo") {
                info.children.retain(|c| c.name != "summary");
                info.children.push(Element::leaf("summary", ""));
            }
            if let Some(mac) = &want.mac_address {
                if let Some(t) = device.child_mut("addressType") {
                    t.text = "manual".into();
                }
                if let Some(m) = device.child_mut("macAddress") {
                    m.text = mac.to_lowercase();
                }
            }
            DeviceChange {
                operation: "edit".into(),
                file_operation: None,
                device,
            }
        })
        .collect())
}

/// Whether a template with `have` network devices serves a machine that asks for
/// `wanted`: each is moved onto one of the template's, and none is added, so more is a
/// terminal `TooManyNetworkDevices`. Checked before the clone (nothing is made) and
/// again when the clone is configured.
pub fn nics_suffice(wanted: usize, have: usize) -> Result<(), BackendError> {
    if wanted > have {
        return Err(BackendError::terminal(
            "TooManyNetworkDevices",
            format!(
                "the machine asks for {wanted} network devices and the template has {have}; adding devices is not supported"
            ),
        ));
    }
    Ok(())
}

/// An edit growing the first disk to `gib` GiB, when it is smaller.
pub fn disk_grow(devices: &[Element], gib: u32) -> Option<DeviceChange> {
    let disk = devices
        .iter()
        .find(|d| d.xsi_type.as_deref() == Some("VirtualDisk"))?;
    grow(disk, gib)
}

/// An edit growing the disk at `location` ([`disk_location`]) to `gib` GiB, when it
/// is smaller.
pub fn disk_grow_at(devices: &[Element], location: &str, gib: u32) -> Option<DeviceChange> {
    let disk = devices.iter().find(|d| {
        d.xsi_type.as_deref() == Some("VirtualDisk")
            && disk_location(
                d.text_at(&["controllerKey"]).unwrap_or_default(),
                d.text_at(&["unitNumber"]).unwrap_or_default(),
            ) == location
    })?;
    grow(disk, gib)
}

/// The number of network devices.
pub fn nic_count(devices: &[Element]) -> usize {
    devices.iter().filter(|d| is_nic(d)).count()
}

/// An edit of `disk` with its capacity raised to `gib` GiB (vSphere extends the disk
/// on `edit`, live), when it is smaller.
fn grow(disk: &Element, gib: u32) -> Option<DeviceChange> {
    let want_kb = u64::from(gib) * 1024 * 1024;
    let have_kb: u64 = disk.text_at(&["capacityInKB"])?.trim().parse().ok()?;
    if want_kb <= have_kb {
        return None;
    }
    let mut device = disk.clone();
    if let Some(kb) = device.child_mut("capacityInKB") {
        kb.text = want_kb.to_string();
    }
    if let Some(bytes) = device.child_mut("capacityInBytes") {
        bytes.text = (want_kb * 1024).to_string();
    }
    Some(DeviceChange {
        operation: "edit".into(),
        file_operation: None,
        device,
    })
}

/// The unit number a SCSI controller keeps for itself.
const SCSI_CONTROLLER_UNIT: u32 = 7;
/// Units on one SCSI controller.
const SCSI_UNITS: u32 = 16;

/// Adds for the machine's additional disks, on the template's first SCSI controller's
/// free units, in order: thin, thick or eager-zeroed, on `[datastore]` when named
/// (else next to the VM).
pub fn disk_adds(
    devices: &[Element],
    disks: &[MachineDisk],
) -> Result<Vec<DeviceChange>, BackendError> {
    if disks.is_empty() {
        return Ok(Vec::new());
    }
    let controller = devices
        .iter()
        .find(|d| d.child("scsiCtlrUnitNumber").is_some())
        .and_then(|d| d.text_at(&["key"]))
        .ok_or_else(|| {
            BackendError::terminal(
                "NoDiskController",
                "the template has no SCSI controller for additional disks",
            )
        })?
        .trim()
        .to_string();
    let used: Vec<u32> = devices
        .iter()
        .filter(|d| d.text_at(&["controllerKey"]).map(str::trim) == Some(controller.as_str()))
        .filter_map(|d| d.text_at(&["unitNumber"])?.trim().parse().ok())
        .collect();
    let mut free = (0..SCSI_UNITS).filter(|u| *u != SCSI_CONTROLLER_UNIT && !used.contains(u));
    let mut out = Vec::new();
    for (i, disk) in disks.iter().enumerate() {
        let unit = free.next().ok_or_else(|| {
            BackendError::terminal(
                "TooManyDisks",
                format!(
                    "no free unit on SCSI controller {controller} for disk {}",
                    disk.name
                ),
            )
        })?;
        let (thin, eager) = match disk.provisioning {
            DiskProvisioning::Thin => (true, false),
            DiskProvisioning::Thick => (false, false),
            DiskProvisioning::EagerZeroed => (false, true),
        };
        let kb = u64::from(disk.size_gib) * 1024 * 1024;
        let file = disk
            .storage
            .as_ref()
            .map(|ds| format!("[{ds}]"))
            .unwrap_or_default();
        out.push(DeviceChange {
            operation: "add".into(),
            file_operation: Some("create".into()),
            device: Element {
                name: "device".into(),
                xsi_type: Some("VirtualDisk".into()),
                children: vec![
                    // Negative keys are placeholders vSphere replaces.
                    Element::leaf("key", format!("-{}", 101 + i)),
                    Element {
                        name: "backing".into(),
                        xsi_type: Some("VirtualDiskFlatVer2BackingInfo".into()),
                        children: vec![
                            Element::leaf("fileName", file),
                            Element::leaf("diskMode", "persistent"),
                            Element::leaf("thinProvisioned", thin.to_string()),
                            Element::leaf("eagerlyScrub", eager.to_string()),
                        ],
                        ..Default::default()
                    },
                    Element::leaf("controllerKey", controller.clone()),
                    Element::leaf("unitNumber", unit.to_string()),
                    Element::leaf("capacityInKB", kb.to_string()),
                ],
                ..Default::default()
            },
        });
    }
    Ok(out)
}

/// Where a disk sits: `<controller key>:<unit number>`, as
/// [`guestinfo::DISK_NAMES_KEY`](crate::guestinfo::DISK_NAMES_KEY) records it.
pub fn disk_location(controller_key: &str, unit_number: &str) -> String {
    format!("{}:{}", controller_key.trim(), unit_number.trim())
}

/// `(location, name)` of each additional disk [`disk_adds`] placed, in order.
pub fn added_disk_locations(adds: &[DeviceChange], disks: &[MachineDisk]) -> Vec<(String, String)> {
    adds.iter()
        .zip(disks)
        .filter_map(|(add, disk)| {
            Some((
                disk_location(
                    add.device.text_at(&["controllerKey"])?,
                    add.device.text_at(&["unitNumber"])?,
                ),
                disk.name.clone(),
            ))
        })
        .collect()
}

/// A virtual disk of a machine, as `config.hardware.device` describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VirtualDisk {
    /// The device key.
    pub key: String,
    /// The backing's type, e.g. `VirtualDiskFlatVer2BackingInfo`.
    pub backing_type: String,
    /// The backing's descriptor file (`[ds] dir/name.vmdk`), when it has one.
    pub file: Option<DatastorePath>,
    /// The backing's datastore.
    pub datastore: Option<MoRef>,
    /// True when the backing names a parent (a linked clone or snapshot delta).
    pub has_parent: bool,
    /// Where it sits ([`disk_location`]).
    pub location: String,
    /// Its size as the guest sees it, in bytes.
    pub capacity_bytes: u64,
}

/// The machine's virtual disks, in device order.
pub fn virtual_disks(devices: &[Element]) -> Vec<VirtualDisk> {
    devices
        .iter()
        .filter(|d| d.xsi_type.as_deref() == Some("VirtualDisk"))
        .map(|d| {
            let backing = d.child("backing");
            let number = |path: &[&str]| -> Option<u64> { d.text_at(path)?.trim().parse().ok() };
            VirtualDisk {
                key: d.text_at(&["key"]).unwrap_or_default().trim().to_string(),
                backing_type: backing.and_then(|b| b.xsi_type.clone()).unwrap_or_default(),
                file: backing
                    .and_then(|b| b.text_at(&["fileName"]))
                    .and_then(DatastorePath::parse),
                datastore: backing
                    .and_then(|b| b.child("datastore"))
                    .and_then(Element::as_moref),
                has_parent: backing.is_some_and(|b| b.child("parent").is_some()),
                location: disk_location(
                    d.text_at(&["controllerKey"]).unwrap_or_default(),
                    d.text_at(&["unitNumber"]).unwrap_or_default(),
                ),
                capacity_bytes: number(&["capacityInBytes"])
                    .filter(|b| *b > 0)
                    .or_else(|| number(&["capacityInKB"]).map(|kb| kb.saturating_mul(1024)))
                    .unwrap_or_default(),
            }
        })
        .collect()
}

/// Which of `disks` is the OS disk: of those not named in `added` (the disks banlieue
/// added, by location), the one first on the first controller (`<controller
/// key>:<unit>` in number order). Never "the first in `config.hardware.device`":
/// vSphere (and vcsim) list an edited device last, so the device order changes once
/// a disk has grown.
pub fn os_disk_index(
    disks: &[VirtualDisk],
    added: &std::collections::BTreeMap<String, String>,
) -> Option<usize> {
    let order = |location: &str| -> (u64, u64) {
        let mut parts = location
            .split(':')
            .map(|p| p.trim().parse().unwrap_or(u64::MAX));
        (
            parts.next().unwrap_or(u64::MAX),
            parts.next().unwrap_or(u64::MAX),
        )
    };
    disks
        .iter()
        .enumerate()
        .filter(|(_, d)| !added.contains_key(&d.location))
        .min_by_key(|(_, d)| order(&d.location))
        .map(|(i, _)| i)
}

/// The disk locator that provisions a full clone's copy of the template's OS disk as
/// asked (thin → `thinProvisioned`; thick → neither; eagerZeroed → `eagerlyScrub`),
/// on `datastore` when the clone is placed on one, else on the disk's own. None when
/// the template has no disk (nothing to provision); an error when its disk names no
/// datastore (the locator needs one, and leaving it out would ignore the ask).
pub fn os_disk_locator(
    devices: &[Element],
    provisioning: DiskProvisioning,
    datastore: Option<&MoRef>,
) -> Result<Option<DiskLocator>, BackendError> {
    let disks = virtual_disks(devices);
    let Some(index) = os_disk_index(&disks, &Default::default()) else {
        return Ok(None);
    };
    let os = &disks[index];
    let datastore = datastore.or(os.datastore.as_ref()).ok_or_else(|| {
        BackendError::terminal(
            "TemplateDiskWithoutDatastore",
            format!(
                "the template's OS disk {} names no datastore: diskProvisioning cannot be applied to its copy",
                os.key
            ),
        )
    })?;
    Ok(Some(DiskLocator {
        disk_id: os.key.clone(),
        datastore: datastore.clone(),
        thin_provisioned: provisioning == DiskProvisioning::Thin,
        eagerly_scrub: provisioning == DiskProvisioning::EagerZeroed,
    }))
}

/// The type of the first SCSI controller, e.g. `ParaVirtualSCSIController`.
pub fn scsi_controller_type(devices: &[Element]) -> Option<String> {
    devices
        .iter()
        .find(|d| d.child("scsiCtlrUnitNumber").is_some())
        .and_then(|d| d.xsi_type.clone())
}

/// The type of the first network device, e.g. `VirtualVmxnet3`.
pub fn nic_type(devices: &[Element]) -> Option<String> {
    devices
        .iter()
        .find(|d| is_nic(d))
        .and_then(|d| d.xsi_type.clone())
}

/// The SCSI controller a machine created on imported disks gets when its template
/// does not say: paravirtual, which current Linux kernels drive in-tree.
pub const DEFAULT_SCSI_CONTROLLER: &str = "ParaVirtualSCSIController";
/// The network device type a machine created on imported disks gets when its
/// template does not say.
pub const DEFAULT_NIC: &str = "VirtualVmxnet3";

/// A disk file on a datastore to attach as it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExistingDisk {
    /// Its descriptor.
    pub file: DatastorePath,
    /// The datastore's reference, when known.
    pub datastore: Option<MoRef>,
    /// Its size, in bytes (a whole number of KiB).
    pub capacity_bytes: u64,
}

/// The devices of a new machine on existing disks: a SCSI controller of
/// `controller_type` with `disks` on its units in order (the boot disk on unit 0),
/// then network devices of `nic_type`. Placeholder (negative) keys tie the disks to
/// the controller; vSphere assigns the real ones.
pub fn create_devices(
    controller_type: &str,
    disks: &[ExistingDisk],
    nic_type: &str,
    nics: &[WantedNic],
) -> Result<Vec<DeviceChange>, BackendError> {
    const CONTROLLER_KEY: &str = "-200";
    let add = |device: Element| DeviceChange {
        operation: "add".into(),
        file_operation: None,
        device,
    };
    let mut out = vec![add(Element {
        name: "device".into(),
        xsi_type: Some(controller_type.into()),
        children: vec![
            Element::leaf("key", CONTROLLER_KEY),
            Element::leaf("busNumber", "0"),
            Element::leaf("sharedBus", "noSharing"),
        ],
        ..Default::default()
    })];
    let mut units = (0..SCSI_UNITS).filter(|u| *u != SCSI_CONTROLLER_UNIT);
    for (i, disk) in disks.iter().enumerate() {
        let unit = units.next().ok_or_else(|| {
            BackendError::terminal(
                "TooManyDisks",
                format!(
                    "{} disks do not fit on one SCSI controller ({} units); {} is one too many",
                    disks.len(),
                    SCSI_UNITS - 1,
                    disk.file
                ),
            )
        })?;
        let mut backing = vec![Element::leaf("fileName", disk.file.to_string())];
        if let Some(ds) = &disk.datastore {
            backing.push(Element {
                name: "datastore".into(),
                attributes: vec![("type".into(), ds.kind.clone())],
                text: ds.value.clone(),
                ..Default::default()
            });
        }
        // Nothing about provisioning: the file is what it is.
        backing.push(Element::leaf("diskMode", "persistent"));
        out.push(add(Element {
            name: "device".into(),
            xsi_type: Some("VirtualDisk".into()),
            children: vec![
                Element::leaf("key", format!("-{}", 201 + i)),
                Element {
                    name: "backing".into(),
                    xsi_type: Some("VirtualDiskFlatVer2BackingInfo".into()),
                    children: backing,
                    ..Default::default()
                },
                Element::leaf("controllerKey", CONTROLLER_KEY),
                Element::leaf("unitNumber", unit.to_string()),
                Element::leaf("capacityInKB", (disk.capacity_bytes / 1024).to_string()),
                Element::leaf("capacityInBytes", disk.capacity_bytes.to_string()),
            ],
            ..Default::default()
        }));
    }
    for (i, nic) in nics.iter().enumerate() {
        let mut children = vec![
            Element::leaf("key", format!("-{}", 301 + i)),
            nic.backing.element(),
            Element {
                name: "connectable".into(),
                children: vec![
                    Element::leaf("startConnected", "true"),
                    Element::leaf("allowGuestControl", "true"),
                    Element::leaf("connected", "true"),
                ],
                ..Default::default()
            },
        ];
        match &nic.mac_address {
            Some(mac) => {
                children.push(Element::leaf("addressType", "manual"));
                children.push(Element::leaf("macAddress", mac.to_lowercase()));
            }
            None => children.push(Element::leaf("addressType", "generated")),
        }
        out.push(add(Element {
            name: "device".into(),
            xsi_type: Some(nic_type.into()),
            children,
            ..Default::default()
        }));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::methods;
    use crate::client::soap::{Answer, parse_response};

    fn template_devices() -> Vec<Element> {
        let text = std::fs::read_to_string(format!(
            "{}/tests/golden/responses/template_devices.xml",
            env!("CARGO_MANIFEST_DIR")
        ))
        .unwrap();
        let Answer::Response(r) = parse_response(&text).unwrap() else {
            panic!("fault")
        };
        let (objects, _) = methods::decode_retrieve_result(&r);
        devices(objects[0].prop("config.hardware.device").unwrap())
    }

    #[test]
    fn the_template_nic_moves_to_a_standard_port_group_with_a_fixed_mac() {
        let edits = nic_edits(
            &template_devices(),
            &[WantedNic {
                backing: NetworkBacking::Standard {
                    name: "VM Network".into(),
                    network: MoRef::new("Network", "network-7"),
                },
                mac_address: Some("00:50:56:3F:00:01".into()),
            }],
        )
        .unwrap();
        assert_eq!(edits.len(), 1);
        let d = &edits[0].device;
        assert_eq!(d.xsi_type.as_deref(), Some("VirtualE1000"));
        assert_eq!(d.text_at(&["key"]), Some("4000"));
        let b = d.child("backing").unwrap();
        assert_eq!(
            b.xsi_type.as_deref(),
            Some("VirtualEthernetCardNetworkBackingInfo")
        );
        assert_eq!(
            b.child("network").unwrap().as_moref(),
            Some(MoRef::new("Network", "network-7"))
        );
        assert_eq!(d.text_at(&["addressType"]), Some("manual"));
        assert_eq!(d.text_at(&["macAddress"]), Some("00:50:56:3f:00:01"));
        // Order kept: backing still right after deviceInfo.
        let names: Vec<&str> = d.children.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(&names[..3], ["key", "deviceInfo", "backing"]);
    }

    #[test]
    fn too_many_nics_is_terminal() {
        let want = WantedNic {
            backing: NetworkBacking::Distributed {
                switch_uuid: "u".into(),
                portgroup_key: "dvportgroup-1".into(),
            },
            mac_address: None,
        };
        let e = nic_edits(&template_devices(), &[want.clone(), want]).unwrap_err();
        assert_eq!(e.reason, "TooManyNetworkDevices");
    }

    #[test]
    fn additional_disks_go_to_free_scsi_units() {
        let disks: Vec<MachineDisk> = serde_json::from_value(serde_json::json!([
            {"name": "data", "sizeGiB": 50, "storage": "LocalDS_1", "provisioning": "eagerZeroed"},
            {"name": "logs", "sizeGiB": 5},
        ]))
        .unwrap();
        let adds = disk_adds(&template_devices(), &disks).unwrap();
        assert_eq!(adds.len(), 2);
        let d = &adds[0].device;
        assert_eq!(adds[0].file_operation.as_deref(), Some("create"));
        assert_eq!(d.text_at(&["capacityInKB"]), Some("52428800"));
        assert_eq!(d.text_at(&["backing", "fileName"]), Some("[LocalDS_1]"));
        assert_eq!(d.text_at(&["backing", "eagerlyScrub"]), Some("true"));
        let units: Vec<&str> = adds
            .iter()
            .map(|a| a.device.text_at(&["unitNumber"]).unwrap())
            .collect();
        // The template's disk holds unit 0.
        assert_eq!(units, ["1", "2"]);
        assert_eq!(
            adds[1].device.text_at(&["backing", "thinProvisioned"]),
            Some("true")
        );
    }

    #[test]
    fn the_templates_disk_and_hardware_are_read() {
        let devices = template_devices();
        let disks = virtual_disks(&devices);
        assert_eq!(disks.len(), 1);
        let d = &disks[0];
        assert_eq!(d.backing_type, "VirtualDiskFlatVer2BackingInfo");
        assert_eq!(
            d.file,
            Some(DatastorePath::new("LocalDS_0", "DC0_C0_RP0_VM0/disk1.vmdk"))
        );
        assert_eq!(d.datastore, Some(MoRef::new("Datastore", "datastore-39")));
        assert!(!d.has_parent);
        assert_eq!(d.location, "202:0");
        assert_eq!(d.capacity_bytes, 10 << 30);
        assert_eq!(
            scsi_controller_type(&devices).as_deref(),
            Some("ParaVirtualSCSIController")
        );
        assert_eq!(nic_type(&devices).as_deref(), Some("VirtualE1000"));
    }

    #[test]
    fn a_machine_on_existing_disks_gets_a_controller_its_disks_and_nics() {
        let disk = |name: &str| ExistingDisk {
            file: DatastorePath::new("LocalDS_0", format!("banlieue/u/{name}.vmdk")),
            datastore: None,
            capacity_bytes: 8 << 20,
        };
        let changes = create_devices(
            DEFAULT_SCSI_CONTROLLER,
            &[disk("os"), disk("data")],
            DEFAULT_NIC,
            &[WantedNic {
                backing: NetworkBacking::Standard {
                    name: "VM Network".into(),
                    network: MoRef::new("Network", "network-7"),
                },
                mac_address: Some("00:50:56:3F:00:02".into()),
            }],
        )
        .unwrap();
        assert!(
            changes
                .iter()
                .all(|c| c.operation == "add" && c.file_operation.is_none())
        );
        let types: Vec<&str> = changes
            .iter()
            .map(|c| c.device.xsi_type.as_deref().unwrap())
            .collect();
        assert_eq!(
            types,
            [
                "ParaVirtualSCSIController",
                "VirtualDisk",
                "VirtualDisk",
                "VirtualVmxnet3"
            ]
        );
        let os = &changes[1].device;
        assert_eq!(os.text_at(&["controllerKey"]), Some("-200"));
        assert_eq!(os.text_at(&["unitNumber"]), Some("0"));
        assert_eq!(os.text_at(&["capacityInKB"]), Some("8192"));
        assert_eq!(
            os.text_at(&["backing", "fileName"]),
            Some("[LocalDS_0] banlieue/u/os.vmdk")
        );
        assert_eq!(changes[2].device.text_at(&["unitNumber"]), Some("1"));
        let nic = &changes[3].device;
        assert_eq!(nic.text_at(&["macAddress"]), Some("00:50:56:3f:00:02"));
        assert_eq!(nic.text_at(&["addressType"]), Some("manual"));
        // The created NICs are what the configure step moves, like a template's.
        let edited = nic_edits(
            &changes.iter().map(|c| c.device.clone()).collect::<Vec<_>>(),
            &[WantedNic {
                backing: NetworkBacking::Distributed {
                    switch_uuid: "u".into(),
                    portgroup_key: "dvportgroup-1".into(),
                },
                mac_address: None,
            }],
        )
        .unwrap();
        assert_eq!(edited.len(), 1);
        let sixteen: Vec<ExistingDisk> = (0..16).map(|i| disk(&format!("d{i}"))).collect();
        let e = create_devices(DEFAULT_SCSI_CONTROLLER, &sixteen, DEFAULT_NIC, &[]).unwrap_err();
        assert_eq!(e.reason, "TooManyDisks");
        assert!(e.message.contains("d15"), "{e}");
    }

    #[test]
    fn added_disks_are_located_by_controller_and_unit() {
        let disks: Vec<MachineDisk> =
            serde_json::from_value(serde_json::json!([{"name": "data", "sizeGiB": 1}])).unwrap();
        let adds = disk_adds(&template_devices(), &disks).unwrap();
        assert_eq!(
            added_disk_locations(&adds, &disks),
            [("202:1".to_string(), "data".to_string())]
        );
    }

    #[test]
    fn the_disk_grows_but_never_shrinks() {
        let devices = template_devices();
        let grow = disk_grow(&devices, 40).unwrap();
        assert_eq!(grow.device.text_at(&["capacityInKB"]), Some("41943040"));
        assert!(disk_grow(&devices, 0).is_none());
    }
}
