//! cloud-init network config (v2) for static addresses (`network[].ipam`), matched to
//! each network device by its MAC, for when the bootstrap data brings none.

use banlieue_sdk::api::common::{Ipam, IpamMode};
use banlieue_sdk::backend::BackendError;
use serde_json::{Value, json};

/// The network config for the machine's devices (`(MAC, IPAM)` in device order), or
/// `None` when every device uses DHCP (the images' default).
pub fn network_config(nics: &[(Option<String>, &Ipam)]) -> Result<Option<String>, BackendError> {
    let static_ = |ipam: &Ipam| {
        ipam.mode == IpamMode::Static || (ipam.mode == IpamMode::Pool && !ipam.addresses.is_empty())
    };
    if !nics.iter().any(|(_, ipam)| static_(ipam)) {
        return Ok(None);
    }
    let mut ethernets = serde_json::Map::new();
    for (i, (mac, ipam)) in nics.iter().enumerate() {
        let name = format!("eth{i}");
        let mut nic = json!({});
        if let Some(mac) = mac {
            nic["match"] = json!({"macaddress": mac.to_lowercase()});
            nic["set-name"] = name.clone().into();
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

    #[test]
    fn dhcp_everywhere_needs_no_config() {
        let dhcp = ipam(json!({}));
        assert_eq!(network_config(&[(None, &dhcp)]).unwrap(), None);
    }

    #[test]
    fn static_addresses_match_the_mac() {
        let s = ipam(
            json!({"mode": "static", "addresses": ["10.0.0.5/24"], "gateway": "10.0.0.1", "nameservers": ["10.0.0.2"]}),
        );
        let dhcp = ipam(json!({}));
        let cfg = network_config(&[(Some("00:50:56:3F:00:01".into()), &s), (None, &dhcp)])
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
        let e = network_config(&[(None, &s), (None, &pool)]).unwrap_err();
        assert_eq!(e.reason, "IPAddressPending");
    }
}
