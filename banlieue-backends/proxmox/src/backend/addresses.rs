//! A VM's addresses, from the guest agent.

use super::*;

impl ProxmoxBackend {
    pub(super) async fn addresses(&self, found: &Found, name: &str) -> Vec<MachineAddress> {
        let path = format!(
            "{}/agent/network-get-interfaces",
            vm_path(&found.node, found.vmid)
        );
        let mut out = Vec::new();
        // No agent (yet): no addresses, not an error.
        if let Ok(data) = self.client.get(&path, &Form::new()).await {
            let interfaces = data
                .get("result")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            for iface in interfaces {
                for ip in iface
                    .get("ip-addresses")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    let Some(addr) = ip.get("ip-address").and_then(Value::as_str) else {
                        continue;
                    };
                    let Ok(parsed) = addr.parse::<std::net::IpAddr>() else {
                        continue;
                    };
                    let link_local = match parsed {
                        std::net::IpAddr::V4(v4) => v4.is_link_local(),
                        std::net::IpAddr::V6(v6) => (v6.segments()[0] & 0xffc0) == 0xfe80,
                    };
                    if parsed.is_loopback() || link_local || parsed.is_unspecified() {
                        continue;
                    }
                    out.push(MachineAddress {
                        type_: MachineAddressType::InternalIp,
                        address: addr.to_string(),
                    });
                }
            }
        }
        out.push(MachineAddress {
            type_: MachineAddressType::Hostname,
            address: name.to_string(),
        });
        out
    }
}
