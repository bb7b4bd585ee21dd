//! A VM as banlieue reads it: the properties it asks for and what they mean.

use std::collections::BTreeMap;
use std::net::IpAddr;

use banlieue_sdk::api::common::PowerState;
use banlieue_sdk::api::infra::{MachineAddress, MachineAddressType};

use crate::client::methods;
use crate::client::{MoRef, ObjectContent};

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
