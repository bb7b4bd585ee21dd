//! Device edits made when a clone is configured: each network device of the template
//! moved to the machine's port group (standard or distributed), an optional fixed
//! MAC, and the first disk grown to `diskGiB`. Devices are read from
//! `config.hardware.device`, changed in place and sent back whole, as vSphere replaces
//! a device on `edit`.

use banlieue_sdk::api::common::DiskProvisioning;
use banlieue_sdk::api::infra::MachineDisk;
use banlieue_sdk::backend::BackendError;

use crate::client::methods::DeviceChange;
use crate::client::{Element, MoRef};

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
    if wanted.len() > nics.len() {
        return Err(BackendError::terminal(
            "TooManyNetworkDevices",
            format!(
                "the machine asks for {} network devices and the template has {}; adding devices is not supported",
                wanted.len(),
                nics.len()
            ),
        ));
    }
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

/// An edit growing the first disk to `gib` GiB, when it is smaller.
pub fn disk_grow(devices: &[Element], gib: u32) -> Option<DeviceChange> {
    let disk = devices
        .iter()
        .find(|d| d.xsi_type.as_deref() == Some("VirtualDisk"))?;
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
                    "no free unit on SCSI controller {controller} for disk {:?}",
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
    fn the_disk_grows_but_never_shrinks() {
        let devices = template_devices();
        let grow = disk_grow(&devices, 40).unwrap();
        assert_eq!(grow.device.text_at(&["capacityInKB"]), Some("41943040"));
        assert!(disk_grow(&devices, 0).is_none());
    }
}
