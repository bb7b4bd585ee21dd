//! The NoCloud files: `meta-data`, `user-data` and a version 2 `network-config`.

/// The three NoCloud files of one machine.
#[derive(Clone, PartialEq, Eq)]
pub struct SeedFiles {
    /// `meta-data` (YAML): at least `instance-id`.
    pub meta_data: String,
    /// `user-data`: the bootstrap data verbatim, or [`crate::EMPTY_USER_DATA`].
    pub user_data: String,
    /// `network-config` (version 2): given, or made by [`network_config`].
    pub network_config: String,
}

impl std::fmt::Debug for SeedFiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Sizes only: user-data carries bootstrap secrets.
        f.debug_struct("SeedFiles")
            .field("meta_data", &self.meta_data.len())
            .field("user_data", &self.user_data.len())
            .field("network_config", &self.network_config.len())
            .finish()
    }
}

impl SeedFiles {
    /// `(file name, contents)` in the order the images store them.
    pub fn entries(&self) -> [(&'static str, &[u8]); 3] {
        [
            ("meta-data", self.meta_data.as_bytes()),
            ("user-data", self.user_data.as_bytes()),
            ("network-config", self.network_config.as_bytes()),
        ]
    }
}

/// A YAML double-quoted scalar: any text is safe inside it.
pub fn yaml_quote(value: &str) -> String {
    let mut out = String::from("\"");
    for c in value.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 || c == '\u{7f}' => {
                out.push_str(&format!("\\x{:02x}", c as u32))
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// `meta-data`: the instance ID (cloud-init runs its per-instance modules once per
/// ID, so it must stay the same for the machine's life) and the host name.
pub fn meta_data(instance_id: &str, hostname: &str) -> String {
    format!(
        "instance-id: {}\nlocal-hostname: {}\n",
        yaml_quote(instance_id),
        yaml_quote(hostname)
    )
}

/// How an interface gets its addresses.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum AddressMode {
    /// DHCPv4.
    #[default]
    Dhcp,
    /// Fixed addresses (CIDR), an optional default gateway and name servers.
    Static {
        /// Addresses in CIDR notation, IPv4 and/or IPv6.
        addresses: Vec<String>,
        /// The default route's next hop.
        gateway: Option<String>,
        /// DNS servers.
        nameservers: Vec<String>,
    },
}

/// One guest interface of the network config, matched by MAC and named `eth<i>`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Interface {
    /// The MAC the hypervisor gives the NIC (`52:54:00:12:34:56`), as it should be
    /// matched (cloud-init compares it case-insensitively).
    pub mac: String,
    /// DHCP or static.
    pub mode: AddressMode,
    /// MTU to set in the guest, when not the link's.
    pub mtu: Option<u32>,
}

/// A version 2 network config: each interface matched by MAC, renamed `eth<i>`,
/// with DHCP or its static addresses, default route and name servers.
pub fn network_config(interfaces: &[Interface]) -> String {
    if interfaces.is_empty() {
        return String::from("version: 2\nethernets: {}\n");
    }
    let mut out = String::from("version: 2\nethernets:\n");
    for (i, nic) in interfaces.iter().enumerate() {
        out.push_str(&format!(
            "  eth{i}:\n    match:\n      macaddress: {}\n    set-name: eth{i}\n",
            yaml_quote(&nic.mac)
        ));
        if let Some(mtu) = nic.mtu {
            out.push_str(&format!("    mtu: {mtu}\n"));
        }
        match &nic.mode {
            AddressMode::Static {
                addresses,
                gateway,
                nameservers,
            } => {
                out.push_str("    dhcp4: false\n    dhcp6: false\n    addresses:\n");
                for a in addresses {
                    out.push_str(&format!("      - {}\n", yaml_quote(a)));
                }
                if let Some(gw) = gateway {
                    out.push_str(&format!(
                        "    routes:\n      - to: default\n        via: {}\n",
                        yaml_quote(gw)
                    ));
                }
                if !nameservers.is_empty() {
                    out.push_str("    nameservers:\n      addresses:\n");
                    for ns in nameservers {
                        out.push_str(&format!("        - {}\n", yaml_quote(ns)));
                    }
                }
            }
            AddressMode::Dhcp => out.push_str("    dhcp4: true\n"),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meta_data_quotes_its_values() {
        assert_eq!(
            meta_data("5f0c8a52-3b7e", "web-1"),
            "instance-id: \"5f0c8a52-3b7e\"\nlocal-hostname: \"web-1\"\n"
        );
        assert_eq!(yaml_quote("a\"b\\c\nd\u{1}"), "\"a\\\"b\\\\c\\nd\\x01\"");
    }

    #[test]
    fn network_config_has_dhcp_and_static_interfaces() {
        let nics = [
            Interface {
                mac: "bc:24:11:00:00:01".into(),
                ..Default::default()
            },
            Interface {
                mac: "bc:24:11:00:00:02".into(),
                mtu: Some(9000),
                mode: AddressMode::Static {
                    addresses: vec!["10.0.0.5/24".into(), "fd00::5/64".into()],
                    gateway: Some("10.0.0.1".into()),
                    nameservers: vec!["10.0.0.2".into()],
                },
            },
        ];
        assert_eq!(
            network_config(&nics),
            "version: 2\nethernets:\n  eth0:\n    match:\n      macaddress: \"bc:24:11:00:00:01\"\n    set-name: eth0\n    dhcp4: true\n  eth1:\n    match:\n      macaddress: \"bc:24:11:00:00:02\"\n    set-name: eth1\n    mtu: 9000\n    dhcp4: false\n    dhcp6: false\n    addresses:\n      - \"10.0.0.5/24\"\n      - \"fd00::5/64\"\n    routes:\n      - to: default\n        via: \"10.0.0.1\"\n    nameservers:\n      addresses:\n        - \"10.0.0.2\"\n"
        );
        assert_eq!(network_config(&[]), "version: 2\nethernets: {}\n");
    }

    #[test]
    fn debug_shows_sizes_not_contents() {
        let files = SeedFiles {
            meta_data: "m".into(),
            user_data: "token: s3cr3t".into(),
            network_config: String::new(),
        };
        let text = format!("{files:?}");
        assert!(!text.contains("s3cr3t"), "{text}");
        assert!(text.contains("user_data: 13"), "{text}");
    }
}
