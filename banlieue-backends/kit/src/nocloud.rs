//! A NIC's IPAM as the cloud-init network config a NoCloud seed carries
//! ([`banlieue_nocloud`]).

use banlieue_nocloud::{AddressMode, Interface};
use banlieue_sdk::api::common::{Ipam, IpamMode};

/// The seed's interface for a NIC with this MAC, MTU and IPAM: its static addresses,
/// gateway and name servers, or DHCP. A `pool` NIC is DHCP here: its addresses arrive
/// as static ones once claimed from the pool.
pub fn interface(mac: &str, mtu: Option<u32>, ipam: &Ipam) -> Interface {
    Interface {
        mac: mac.to_ascii_lowercase(),
        mtu,
        mode: match ipam.mode {
            IpamMode::Static => AddressMode::Static {
                addresses: ipam.addresses.clone(),
                gateway: ipam.gateway.clone(),
                nameservers: ipam.nameservers.clone(),
            },
            IpamMode::Dhcp | IpamMode::Pool => AddressMode::Dhcp,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn static_addresses_travel_and_pools_are_dhcp_until_claimed() {
        let ipam = Ipam {
            mode: IpamMode::Static,
            addresses: vec!["10.0.0.5/24".into()],
            gateway: Some("10.0.0.1".into()),
            nameservers: vec!["10.0.0.53".into()],
            ..Default::default()
        };
        let nic = interface("52:54:00:AB:CD:EF", Some(1400), &ipam);
        assert_eq!(nic.mac, "52:54:00:ab:cd:ef");
        assert_eq!(nic.mtu, Some(1400));
        assert_eq!(
            nic.mode,
            AddressMode::Static {
                addresses: vec!["10.0.0.5/24".into()],
                gateway: Some("10.0.0.1".into()),
                nameservers: vec!["10.0.0.53".into()],
            }
        );
        for mode in [IpamMode::Dhcp, IpamMode::Pool] {
            let ipam = Ipam {
                mode,
                ..Default::default()
            };
            assert_eq!(interface("m", None, &ipam).mode, AddressMode::Dhcp);
        }
    }
}
