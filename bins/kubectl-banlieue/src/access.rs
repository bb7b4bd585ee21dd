//! How to reach a VM's console and shell, derived only from what the objects say: the
//! Provider's class and endpoint, the machine's backend handle and the addresses.

use banlieue_sdk::api::Provider;
use banlieue_sdk::api::common::ProviderClass;
use banlieue_sdk::api::infra::{MachineAddress, MachineAddressType};

/// One way in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hint {
    /// `console` or `ssh`.
    pub kind: &'static str,
    /// A command or URL to use as is, except for `<placeholders>`.
    pub how: String,
    /// When it applies, or what it needs.
    pub note: Option<String>,
}

/// The console of the machine `backend_ref` (the machine's `status.backendRef`) on
/// `provider`, where the backend offers one.
pub fn console(provider: &Provider, backend_ref: Option<&str>) -> Option<Hint> {
    let endpoint = provider.spec.connection.endpoint.trim_end_matches('/');
    let backend_ref = backend_ref.filter(|r| !r.is_empty());
    match provider.spec.class {
        ProviderClass::Libvirt => backend_ref.map(|domain| Hint {
            kind: "console",
            how: format!("virsh -c {endpoint} console {domain}"),
            note: Some("serial console; leave with Ctrl+]".into()),
        }),
        ProviderClass::Proxmox => {
            let (node, vmid) = backend_ref?.split_once('/')?;
            Some(Hint {
                kind: "console",
                how: format!(
                    "{}/?console=kvm&novnc=1&vmid={vmid}&node={node}",
                    origin(endpoint)
                ),
                note: Some("Proxmox VE noVNC console, in a browser logged in to the cluster".into()),
            })
        }
        ProviderClass::Vsphere => backend_ref.map(|moref| Hint {
            kind: "console",
            how: format!("{}/ui", origin(endpoint)),
            note: Some(format!(
                "vSphere Client: find the VM with managed object ID {moref}, then Launch Web Console"
            )),
        }),
        ProviderClass::CloudHypervisor => {
            let socket = backend_ref?;
            let dir = socket.rsplit_once('/').map_or(".", |(dir, _)| dir);
            Some(Hint {
                kind: "console",
                how: format!("tail -f {dir}/serial.log"),
                note: Some(format!(
                    "on the Cloud Hypervisor host (read-only serial log); ch-remote --api-socket {socket} info shows the VMM"
                )),
            })
        }
        // The simulator has no console; an out-of-tree backend's is unknown here.
        _ => None,
    }
}

/// `https://host:port` of a URL, dropping any path (`/sdk`, `/api2/json`).
fn origin(url: &str) -> &str {
    let start = url.find("://").map_or(0, |i| i + 3);
    match url[start..].find('/') {
        Some(slash) => &url[..start + slash],
        None => url,
    }
}

/// `ssh` to the most reachable address: external before internal, IPs before names.
pub fn ssh(addresses: &[MachineAddress]) -> Option<Hint> {
    let rank = |t: &MachineAddressType| match t {
        MachineAddressType::ExternalIp => 0,
        MachineAddressType::ExternalDns => 1,
        MachineAddressType::InternalIp => 2,
        MachineAddressType::InternalDns => 3,
        MachineAddressType::Hostname => 4,
    };
    let best = addresses
        .iter()
        .filter(|a| !a.address.is_empty())
        .min_by_key(|a| rank(&a.type_))?;
    Some(Hint {
        kind: "ssh",
        how: format!("ssh <user>@{}", best.address),
        note: Some("the user and key are whatever the VM's bootstrap data set up".into()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn provider(class: &str, endpoint: &str) -> Provider {
        serde_json::from_value(json!({
            "apiVersion": "banlieue.io/v1alpha1", "kind": "Provider", "metadata": {"name": "p"},
            "spec": {"class": class, "connection": {"endpoint": endpoint}},
        }))
        .unwrap()
    }

    fn address(type_: &str, address: &str) -> MachineAddress {
        serde_json::from_value(json!({"type": type_, "address": address})).unwrap()
    }

    #[test]
    fn each_backend_offers_its_own_console() {
        let cases = [
            (
                "libvirt",
                "qemu+ssh://root@kvm-1/system",
                Some("lab_web-1"),
                Some("virsh -c qemu+ssh://root@kvm-1/system console lab_web-1"),
            ),
            (
                "proxmox",
                "https://pve.example.com:8006/api2/json",
                Some("pve-2/104"),
                Some("https://pve.example.com:8006/?console=kvm&novnc=1&vmid=104&node=pve-2"),
            ),
            (
                "proxmox",
                "https://pve.example.com:8006",
                Some("not-a-node-vmid"),
                None,
            ),
            (
                "vsphere",
                "https://vcenter.example.com/sdk",
                Some("vm-1042"),
                Some("https://vcenter.example.com/ui"),
            ),
            (
                "cloud-hypervisor",
                "unix:///run/banlieue/ch.sock",
                Some("/var/lib/banlieue/ch/1234/api.sock"),
                Some("tail -f /var/lib/banlieue/ch/1234/serial.log"),
            ),
            ("sim", "sim://lab", Some("vm-1001"), None),
            ("libvirt", "qemu:///system", None, None),
        ];
        for (class, endpoint, backend_ref, want) in cases {
            let got = console(&provider(class, endpoint), backend_ref).map(|h| h.how);
            assert_eq!(got.as_deref(), want, "{class} {backend_ref:?}");
        }
        let vsphere = console(&provider("vsphere", "https://vc/sdk"), Some("vm-7")).unwrap();
        assert!(vsphere.note.unwrap().contains("vm-7"));
    }

    #[test]
    fn ssh_prefers_external_then_internal_addresses() {
        assert_eq!(ssh(&[]), None);
        let hint = |a: &[MachineAddress]| ssh(a).map(|h| h.how);
        assert_eq!(
            hint(&[
                address("Hostname", "web-1"),
                address("InternalIP", "10.0.0.9"),
                address("ExternalIP", "203.0.113.7")
            ])
            .as_deref(),
            Some("ssh <user>@203.0.113.7")
        );
        assert_eq!(
            hint(&[
                address("Hostname", "web-1"),
                address("InternalIP", "10.0.0.9")
            ])
            .as_deref(),
            Some("ssh <user>@10.0.0.9")
        );
        assert_eq!(
            hint(&[address("InternalIP", "fd00::9")]).as_deref(),
            Some("ssh <user>@fd00::9")
        );
    }
}
