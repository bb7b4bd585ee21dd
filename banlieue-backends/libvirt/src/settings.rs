//! `Provider.spec.settings` for the libvirt class.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use banlieue_kit::settings::{Settings, Zero};
use banlieue_sdk::backend::BackendError;

/// Which `<domain type>` to define.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DomainTypeSetting {
    /// `kvm` when the host offers usable hardware virtualisation, else `qemu`.
    #[default]
    Auto,
    /// Always `kvm`.
    Kvm,
    /// Always `qemu` (TCG, software emulation).
    Qemu,
}

/// Parsed settings (see the crate docs for the table).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LibvirtSettings {
    /// `domainType`: `auto` (default), `kvm` or `qemu`.
    pub domain_type: DomainTypeSetting,
    /// `machine`: the QEMU machine type (`pc`, `q35`, ...); default: libvirt's.
    pub machine: Option<String>,
    /// `shutdownTimeout`: how long an ACPI shutdown may take before the domain is
    /// destroyed (default 60s).
    pub shutdown_timeout: Duration,
    /// `pollInterval`: how soon to look again while a domain boots or stops (default 2s).
    pub poll_interval: Duration,
    /// `failureDomain`: the failure domain's name (default: the libvirt host's hostname).
    pub failure_domain: Option<String>,
    /// `bridges`: host bridges the Provider offers (comma list), published as
    /// resource `bridge`: libvirt cannot list a remote host's bridges without netcf.
    pub bridges: BTreeSet<String>,
    /// `waitForAddress`: while a running domain on a libvirt network has no address,
    /// report it as still booting (default true).
    pub wait_for_address: bool,
    /// `imageDirectories`: where on the host an image may be (comma list); `None`: the
    /// directories of the host's active directory pools (see [`crate::paths`]).
    pub image_dirs: Option<Vec<std::path::PathBuf>>,
}

impl Default for LibvirtSettings {
    fn default() -> Self {
        Self {
            domain_type: DomainTypeSetting::Auto,
            machine: None,
            shutdown_timeout: Duration::from_secs(60),
            poll_interval: Duration::from_secs(2),
            failure_domain: None,
            bridges: BTreeSet::new(),
            wait_for_address: true,
            image_dirs: None,
        }
    }
}

impl LibvirtSettings {
    /// The keys this backend reads; any other key (but the operator's own) is refused.
    pub const KEYS: [&'static str; 8] = [
        "domainType",
        "machine",
        "shutdownTimeout",
        "pollInterval",
        "failureDomain",
        "bridges",
        "waitForAddress",
        crate::paths::IMAGE_DIRECTORIES_SETTING,
    ];

    /// Parses the settings; bad values and keys neither this backend nor the operator
    /// reads fail with a terminal `InvalidSettings`.
    pub fn parse(settings: &BTreeMap<String, String>) -> Result<Self, BackendError> {
        let mut parsed = Self::default();
        let mut read = Settings::new(settings);
        if let Some(v) = settings.get("domainType") {
            match v.as_str() {
                "auto" => parsed.domain_type = DomainTypeSetting::Auto,
                "kvm" => parsed.domain_type = DomainTypeSetting::Kvm,
                "qemu" => parsed.domain_type = DomainTypeSetting::Qemu,
                _ => read.bad(format!("domainType {v:?} is not one of auto, kvm, qemu")),
            }
        }
        if let Some(v) = settings.get("machine") {
            if v.is_empty()
                || !v
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
            {
                read.bad(format!(
                    "machine {v:?} is not a QEMU machine type such as pc or q35"
                ));
            } else {
                parsed.machine = Some(v.clone());
            }
        }
        read.duration(
            "shutdownTimeout",
            Zero::Refused,
            3600,
            &mut parsed.shutdown_timeout,
        );
        read.duration(
            "pollInterval",
            Zero::Refused,
            300,
            &mut parsed.poll_interval,
        );
        if let Some(v) = settings.get("failureDomain") {
            parsed.failure_domain = Some(v.clone()).filter(|v| !v.is_empty());
        }
        if let Some(v) = settings.get("bridges") {
            parsed.bridges = v
                .split(',')
                .map(str::trim)
                .filter(|b| !b.is_empty())
                .map(String::from)
                .collect();
        }
        read.flag("waitForAddress", &mut parsed.wait_for_address);
        match crate::paths::parse_dirs(
            settings
                .get(crate::paths::IMAGE_DIRECTORIES_SETTING)
                .map(String::as_str),
        ) {
            Ok(dirs) => parsed.image_dirs = dirs,
            Err(problem) => read.bad(problem),
        }
        read.only("libvirt", &Self::KEYS);
        read.finish()?;
        Ok(parsed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn defaults_and_overrides() {
        assert_eq!(
            LibvirtSettings::parse(&settings(&[])).unwrap(),
            LibvirtSettings::default()
        );
        let parsed = LibvirtSettings::parse(&settings(&[
            ("domainType", "qemu"),
            ("machine", "q35"),
            ("shutdownTimeout", "5"),
            ("pollInterval", "250ms"),
            ("bridges", "br0, br1"),
            ("waitForAddress", "false"),
            ("imageDirectories", "/srv/images"),
        ]))
        .unwrap();
        assert_eq!(
            parsed.image_dirs,
            Some(vec![std::path::PathBuf::from("/srv/images")])
        );
        assert_eq!(parsed.domain_type, DomainTypeSetting::Qemu);
        assert_eq!(parsed.machine.as_deref(), Some("q35"));
        assert_eq!(parsed.shutdown_timeout, Duration::from_secs(5));
        assert_eq!(parsed.poll_interval, Duration::from_millis(250));
        assert_eq!(parsed.bridges.len(), 2);
        assert!(!parsed.wait_for_address);
    }

    #[test]
    fn bad_values_are_terminal_and_name_every_key() {
        let err = LibvirtSettings::parse(&settings(&[
            ("domainType", "xen"),
            ("machine", "pc'/>"),
            ("shutdownTimeout", "forever"),
            ("imageDirectories", "images"),
        ]))
        .unwrap_err();
        assert!(!err.is_transient());
        assert_eq!(err.reason, "InvalidSettings");
        for key in [
            "domainType",
            "machine",
            "shutdownTimeout",
            "imageDirectories",
        ] {
            assert!(err.message.contains(key), "{}", err.message);
        }
    }
}
