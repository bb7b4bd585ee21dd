//! Machine addresses: static IPAM addresses from the spec, DHCP addresses from the
//! host's lease file (dnsmasq format) by MAC, and the machine's name as `Hostname`.

use std::path::Path;

use banlieue_sdk::api::common::IpamMode;
use banlieue_sdk::api::infra::cloud_hypervisor::CloudHypervisorNetworkInterface;
use banlieue_sdk::api::infra::{MachineAddress, MachineAddressType};

/// Addresses of a machine whose interfaces have `macs`.
pub fn addresses(
    name: &str,
    interfaces: &[CloudHypervisorNetworkInterface],
    macs: &[String],
    leases: Option<&Path>,
) -> Vec<MachineAddress> {
    let lease_text = leases
        .and_then(|p| std::fs::read_to_string(p).ok())
        .unwrap_or_default();
    let mut out = Vec::new();
    let mut push = |address: String| {
        if !out.iter().any(|a: &MachineAddress| a.address == address) {
            out.push(MachineAddress {
                type_: MachineAddressType::InternalIp,
                address,
            });
        }
    };
    for (nic, mac) in interfaces.iter().zip(macs) {
        match nic.ipam.mode {
            IpamMode::Static => {
                for cidr in &nic.ipam.addresses {
                    push(cidr.split('/').next().unwrap_or(cidr).to_owned());
                }
            }
            IpamMode::Dhcp | IpamMode::Pool => {
                for ip in leased(&lease_text, mac) {
                    push(ip);
                }
            }
        }
    }
    out.push(MachineAddress {
        type_: MachineAddressType::Hostname,
        address: name.to_owned(),
    });
    out
}

/// Addresses leased to `mac` in a dnsmasq lease file
/// (`<expiry> <mac> <ip> <hostname> <client-id>` per line).
pub fn leased(text: &str, mac: &str) -> Vec<String> {
    text.lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let _expiry = fields.next()?;
            let lease_mac = fields.next()?;
            let ip = fields.next()?;
            lease_mac.eq_ignore_ascii_case(mac).then(|| ip.to_owned())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use banlieue_sdk::api::common::Ipam;

    #[test]
    fn static_and_leased_addresses() {
        let dir = tempfile::tempdir().unwrap();
        let leases = dir.path().join("leases");
        std::fs::write(
            &leases,
            "1700000000 52:54:00:aa:bb:cc 10.99.0.7 web-1 *\n1700000000 52:54:00:00:00:01 10.99.0.8 other *\n",
        )
        .unwrap();
        let nics = vec![
            CloudHypervisorNetworkInterface::default(),
            CloudHypervisorNetworkInterface {
                ipam: Ipam {
                    mode: IpamMode::Static,
                    addresses: vec!["192.168.5.5/24".into()],
                    ..Default::default()
                },
                ..Default::default()
            },
        ];
        let macs = vec!["52:54:00:AA:BB:CC".into(), "52:54:00:00:00:02".into()];
        let got: Vec<String> = addresses("web-1", &nics, &macs, Some(&leases))
            .into_iter()
            .map(|a| a.address)
            .collect();
        assert_eq!(got, ["10.99.0.7", "192.168.5.5", "web-1"]);
    }
}
