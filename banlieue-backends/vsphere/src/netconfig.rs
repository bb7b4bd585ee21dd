//! cloud-init network config (v2) for static addresses (`network[].ipam`) and MTUs
//! (`network[].mtu`), matched to each network device by its MAC, for when the
//! bootstrap data brings none.
//!
//! A vSphere virtual NIC has no MTU of its own (the port group's switch has one), so
//! an MTU reaches the guest only through this config; [`check_mtu`] refuses one that
//! would not, before anything is made.

use banlieue_sdk::api::common::{BootstrapFormat, Ipam, IpamMode};
use banlieue_sdk::api::infra::vsphere::VSphereNetworkDevice;
use banlieue_sdk::backend::{BackendError, BootstrapData};
use serde_json::{Value, json};

/// The reason of an MTU the guest would not get.
pub const MTU_UNSUPPORTED: &str = "MTUUnsupported";

/// One network device as the guest config sees it.
#[derive(Clone, Copy, Debug)]
pub struct GuestNic<'a> {
    /// Its MAC, when known (the config matches it).
    pub mac: Option<&'a str>,
    /// The MTU to set in the guest.
    pub mtu: Option<u32>,
    /// How it gets its addresses.
    pub ipam: &'a Ipam,
}

/// Refuses (terminal [`MTU_UNSUPPORTED`]) a device MTU the guest would never get: when
/// the bootstrap data brings its own network config (it goes to the guest as given,
/// instead of the one [`network_config`] makes), or is Ignition (which reads no
/// cloud-init network config). The message names the field and the device.
pub fn check_mtu(
    network: &[VSphereNetworkDevice],
    bootstrap: Option<&BootstrapData>,
) -> Result<(), BackendError> {
    let Some((i, mtu)) = network
        .iter()
        .enumerate()
        .find_map(|(i, n)| n.mtu.map(|m| (i, m)))
    else {
        return Ok(());
    };
    let why = match bootstrap {
        Some(b) if b.format == BootstrapFormat::Ignition => {
            "the bootstrap data is Ignition, which reads no cloud-init network config, and a \
             vSphere NIC has no MTU of its own: set it in the Ignition config (a networkd unit)"
        }
        Some(b) if b.network_config.is_some() => {
            "the bootstrap data brings its own network config, which the guest gets as given, \
             and a vSphere NIC has no MTU of its own: set mtu on the interface there"
        }
        _ => return Ok(()),
    };
    Err(BackendError::terminal(
        MTU_UNSUPPORTED,
        format!(
            "network[{i}].mtu {mtu} ({}): {why}, and leave network[].mtu unset",
            network[i].network_name
        ),
    ))
}

/// The network config for the machine's devices (in device order), or `None` when
/// every device uses DHCP with the guest's MTU (the images' default).
pub fn network_config(nics: &[GuestNic<'_>]) -> Result<Option<String>, BackendError> {
    let static_ = |ipam: &Ipam| {
        ipam.mode == IpamMode::Static || (ipam.mode == IpamMode::Pool && !ipam.addresses.is_empty())
    };
    if !nics.iter().any(|n| static_(n.ipam) || n.mtu.is_some()) {
        return Ok(None);
    }
    let mut ethernets = serde_json::Map::new();
    for (i, n) in nics.iter().enumerate() {
        let (ipam, name) = (n.ipam, format!("eth{i}"));
        let mut nic = json!({});
        if let Some(mac) = n.mac {
            nic["match"] = json!({"macaddress": mac.to_lowercase()});
            nic["set-name"] = name.clone().into();
        }
        if let Some(mtu) = n.mtu {
            nic["mtu"] = mtu.into();
        }
        match ipam.mode {
            _ if static_(ipam) => {
                nic["dhcp4"] = false.into();
                nic["dhcp6"] = false.into();
                nic["addresses"] = json!(ipam.addresses);
                if let Some(gw) = &ipam.gateway {
                    let to = if gw.contains(':') {
                        "::/0"
                    } else {
                        "0.0.0.0/0"
                    };
                    nic["routes"] = json!([{"to": to, "via": gw}]);
                }
                if !ipam.nameservers.is_empty() {
                    nic["nameservers"] = json!({"addresses": ipam.nameservers});
                }
            }
            IpamMode::Pool => {
                return Err(BackendError::terminal(
                    "IPAddressPending",
                    format!(
                        "network device {i} takes its address from an IPAM pool and none was allocated yet"
                    ),
                ));
            }
            _ => nic["dhcp4"] = true.into(),
        }
        ethernets.insert(name, nic);
    }
    Ok(Some(
        json!({"version": 2, "ethernets": Value::Object(ethernets)}).to_string(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ipam(v: Value) -> Ipam {
        serde_json::from_value(v).unwrap()
    }

    fn nic<'a>(mac: Option<&'a str>, mtu: Option<u32>, ipam: &'a Ipam) -> GuestNic<'a> {
        GuestNic { mac, mtu, ipam }
    }

    #[test]
    fn an_mtu_makes_a_config_even_with_dhcp() {
        let dhcp = ipam(json!({}));
        let s = ipam(json!({"mode": "static", "addresses": ["10.0.0.5/24"]}));
        let cfg = network_config(&[
            nic(Some("00:50:56:3F:00:01"), Some(9000), &dhcp),
            nic(Some("00:50:56:3F:00:02"), None, &dhcp),
            nic(Some("00:50:56:3F:00:03"), Some(1400), &s),
        ])
        .unwrap()
        .expect("a config: the MTUs travel in it");
        let v: Value = serde_json::from_str(&cfg).unwrap();
        let eth = |i: usize| v["ethernets"][format!("eth{i}")].clone();
        assert_eq!(eth(0)["mtu"], 9000);
        assert_eq!(eth(0)["dhcp4"], true);
        assert_eq!(eth(0)["match"]["macaddress"], "00:50:56:3f:00:01");
        assert!(eth(1).get("mtu").is_none(), "{cfg}");
        assert_eq!(
            (eth(2)["mtu"].clone(), eth(2)["dhcp4"].clone()),
            (json!(1400), json!(false))
        );
    }

    #[test]
    fn an_mtu_the_guest_would_not_get_is_refused() {
        use banlieue_sdk::backend::SecretValue;
        let device = |mtu: Option<u32>| VSphereNetworkDevice {
            network_name: "VM Network".into(),
            mtu,
            ..Default::default()
        };
        let bootstrap = |format, network: Option<&str>| BootstrapData {
            format,
            user_data: SecretValue::new("#cloud-config\n"),
            network_config: network.map(SecretValue::new),
        };
        let cloud = bootstrap(BootstrapFormat::CloudConfig, None);
        let own = bootstrap(BootstrapFormat::CloudConfig, Some("version: 2\n"));
        let ignition = bootstrap(BootstrapFormat::Ignition, None);
        let with = [device(None), device(Some(9000))];
        let without = [device(None), device(None)];
        // (devices, bootstrap, refused with these words)
        let table: &[(
            &[VSphereNetworkDevice],
            Option<&BootstrapData>,
            Option<&str>,
        )] = &[
            (&with, None, None),
            (&with, Some(&cloud), None),
            (&with, Some(&own), Some("brings its own network config")),
            (&with, Some(&ignition), Some("Ignition")),
            (&without, Some(&own), None),
            (&without, Some(&ignition), None),
        ];
        for (devices, bootstrap, refused) in table {
            match (check_mtu(devices, *bootstrap), refused) {
                (Ok(()), None) => {}
                (Err(e), Some(words)) => {
                    assert_eq!(e.reason, MTU_UNSUPPORTED);
                    assert!(!e.is_transient());
                    assert!(
                        e.message.starts_with("network[1].mtu 9000 (VM Network): "),
                        "{e}"
                    );
                    assert!(e.message.contains(words), "{e}");
                }
                (got, _) => panic!("{refused:?}: {got:?}"),
            }
        }
    }

    #[test]
    fn dhcp_everywhere_needs_no_config() {
        let dhcp = ipam(json!({}));
        assert_eq!(network_config(&[nic(None, None, &dhcp)]).unwrap(), None);
    }

    #[test]
    fn static_addresses_match_the_mac() {
        let s = ipam(
            json!({"mode": "static", "addresses": ["10.0.0.5/24"], "gateway": "10.0.0.1", "nameservers": ["10.0.0.2"]}),
        );
        let dhcp = ipam(json!({}));
        let cfg = network_config(&[
            nic(Some("00:50:56:3F:00:01"), None, &s),
            nic(None, None, &dhcp),
        ])
        .unwrap()
        .unwrap();
        let v: Value = serde_json::from_str(&cfg).unwrap();
        let eth0 = &v["ethernets"]["eth0"];
        assert_eq!(v["version"], 2);
        assert_eq!(eth0["match"]["macaddress"], "00:50:56:3f:00:01");
        assert_eq!(eth0["addresses"], json!(["10.0.0.5/24"]));
        assert_eq!(
            eth0["routes"],
            json!([{"to": "0.0.0.0/0", "via": "10.0.0.1"}])
        );
        assert_eq!(eth0["nameservers"]["addresses"], json!(["10.0.0.2"]));
        assert_eq!(v["ethernets"]["eth1"]["dhcp4"], true);
    }

    #[test]
    fn an_empty_pool_is_reported() {
        let pool = ipam(json!({"mode": "pool"}));
        let s = ipam(json!({"mode": "static", "addresses": ["10.0.0.5/24"]}));
        let e = network_config(&[nic(None, None, &s), nic(None, None, &pool)]).unwrap_err();
        assert_eq!(e.reason, "IPAddressPending");
    }
}
