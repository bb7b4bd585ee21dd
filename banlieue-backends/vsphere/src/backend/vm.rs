//! A VM as banlieue reads it: the properties it asks for and what they mean.

use std::collections::BTreeMap;
use std::net::IpAddr;

use banlieue_sdk::api::common::PowerState;
use banlieue_sdk::api::infra::{MachineAddress, MachineAddressType};

use crate::client::methods;
use crate::client::{Element, MoRef, ObjectContent};
use crate::devices;

/// A whole-number property (`numCPU`, `memoryMB`, ...), when it reads as one.
fn number(o: &ObjectContent, path: &str) -> Option<u64> {
    o.text(path)?.trim().parse().ok()
}

/// A VM as banlieue reads it.
#[derive(Clone, Debug)]
pub(crate) struct Vm {
    pub(crate) moref: MoRef,
    pub(crate) name: String,
    pub(crate) bios_uuid: Option<String>,
    /// `config.instanceUuid`: the UID of the infra object that owns the VM.
    pub(crate) instance_uuid: Option<String>,
    pub(crate) extra: BTreeMap<String, String>,
    pub(crate) power: PowerState,
    pub(crate) ips: Vec<String>,
    pub(crate) tools_running: bool,
    /// `config.firmware`: `bios` or `efi`.
    pub(crate) firmware: Option<String>,
    /// `config.bootOptions.efiSecureBootEnabled`.
    pub(crate) secure_boot: bool,
    /// `config.hardware.numCPU`.
    pub(crate) cpus: u32,
    /// `config.hardware.numCoresPerSocket`.
    pub(crate) cores_per_socket: Option<u32>,
    /// `config.hardware.memoryMB`.
    pub(crate) memory_mib: u64,
    /// `config.cpuHotAddEnabled`.
    pub(crate) cpu_hot_add: bool,
    /// `config.memoryHotAddEnabled`.
    pub(crate) memory_hot_add: bool,
    /// `config.hardware.device`: read in the same call as the rest, so what the VM
    /// runs with (disks, network devices) costs no extra round trip.
    pub(crate) devices: Vec<Element>,
}

pub(crate) const VM_PATHS: &[&str] = &[
    "name",
    "config.uuid",
    "config.instanceUuid",
    "config.extraConfig",
    "runtime.powerState",
    "guest.ipAddress",
    "guest.net",
    "guest.toolsRunningStatus",
    "config.firmware",
    "config.bootOptions",
    "config.hardware.numCPU",
    "config.hardware.numCoresPerSocket",
    "config.hardware.memoryMB",
    "config.hardware.device",
    "config.cpuHotAddEnabled",
    "config.memoryHotAddEnabled",
];

impl Vm {
    pub(crate) fn from(o: &ObjectContent) -> Self {
        let extra = o
            .prop("config.extraConfig")
            .map(methods::option_values)
            .unwrap_or_default()
            .into_iter()
            .collect();
        let mut ips: Vec<String> = o
            .prop("guest.net")
            .map(methods::guest_ips)
            .unwrap_or_default();
        if let Some(ip) = o.text("guest.ipAddress").filter(|ip| !ip.is_empty())
            && !ips.iter().any(|i| i == ip)
        {
            ips.insert(0, ip.to_string());
        }
        Self {
            moref: o.obj.clone(),
            name: o.text("name").unwrap_or_default().to_string(),
            bios_uuid: o
                .text("config.uuid")
                .filter(|u| !u.is_empty())
                .map(str::to_string),
            instance_uuid: o
                .text("config.instanceUuid")
                .filter(|u| !u.is_empty())
                .map(str::to_ascii_lowercase),
            extra,
            power: match o.text("runtime.powerState") {
                Some("poweredOn") => PowerState::PoweredOn,
                Some("suspended") => PowerState::Suspended,
                _ => PowerState::PoweredOff,
            },
            ips,
            tools_running: o.text("guest.toolsRunningStatus") == Some("guestToolsRunning"),
            firmware: o
                .text("config.firmware")
                .filter(|f| !f.is_empty())
                .map(str::to_string),
            secure_boot: o
                .prop("config.bootOptions")
                .and_then(|b| b.text_at(&["efiSecureBootEnabled"]))
                == Some("true"),
            cpus: number(o, "config.hardware.numCPU").unwrap_or_default() as u32,
            cores_per_socket: number(o, "config.hardware.numCoresPerSocket")
                .filter(|n| *n > 0)
                .map(|n| n as u32),
            memory_mib: number(o, "config.hardware.memoryMB").unwrap_or_default(),
            cpu_hot_add: o.text("config.cpuHotAddEnabled") == Some("true"),
            memory_hot_add: o.text("config.memoryHotAddEnabled") == Some("true"),
            devices: o
                .prop("config.hardware.device")
                .map(devices::devices)
                .unwrap_or_default(),
        }
    }

    pub(crate) fn addresses(&self) -> Vec<MachineAddress> {
        let mut out: Vec<MachineAddress> = Vec::new();
        for ip in &self.ips {
            let Ok(parsed) = ip.parse::<IpAddr>() else {
                continue;
            };
            let link_local = match parsed {
                IpAddr::V4(v4) => v4.is_link_local(),
                IpAddr::V6(v6) => (v6.segments()[0] & 0xffc0) == 0xfe80,
            };
            if parsed.is_loopback() || link_local || parsed.is_unspecified() {
                continue;
            }
            if !out.iter().any(|a| a.address == *ip) {
                out.push(MachineAddress {
                    type_: MachineAddressType::InternalIp,
                    address: ip.clone(),
                });
            }
        }
        out
    }
}
