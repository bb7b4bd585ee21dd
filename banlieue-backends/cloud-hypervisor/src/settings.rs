//! `Provider.spec.connection.endpoint` and `spec.settings` for the cloud-hypervisor class.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use banlieue_kit::settings::{Settings, Zero};
use banlieue_sdk::backend::{BackendError, Connection};

/// Parsed connection and settings (see the crate docs for the table).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChSettings {
    /// The state directory: one subdirectory per machine (from the endpoint).
    pub state_dir: PathBuf,
    /// The VMM executable (`binary`, default `cloud-hypervisor`, looked up in `PATH`).
    pub binary: PathBuf,
    /// The failure domain's name (`hostName`, default the host's name).
    pub host_name: Option<String>,
    /// How long the guest may take to power off after the ACPI power button before
    /// `vm.shutdown` stops it (`shutdownTimeout`, default 60s).
    pub shutdown_timeout: Duration,
    /// How long a VMM that died is reported before it is started again
    /// (`restartDelay`, default 5s).
    pub restart_delay: Duration,
    /// How long a new VMM may take to answer `vmm.ping` (`startTimeout`, default 10s).
    pub start_timeout: Duration,
    /// How soon to look again while an operation is in flight (`pollInterval`, default 1s).
    pub poll_interval: Duration,
    /// How long one API call may take (`apiTimeout`, default 10s).
    pub api_timeout: Duration,
    /// How long a live VMM may go without answering before it is killed and handled
    /// as a crash (`hangTimeout`, default 60s).
    pub hang_timeout: Duration,
    /// A dnsmasq-style lease file to read DHCP addresses from (`dhcpLeases`).
    pub dhcp_leases: Option<PathBuf>,
    /// qcow2 images become qcow2 overlays backed by the image (`qcow2Disks: overlay`,
    /// the default) instead of copies (`copy`).
    pub qcow2_overlay: bool,
    /// The directories an image's disk, kernel and firmware may come from
    /// (`imageDirectories`, default `<state dir>/images`; see [`crate::paths`]).
    pub image_dirs: Vec<PathBuf>,
}

/// The state directory an endpoint names: `local:///var/lib/banlieue/ch`,
/// `unix:///var/lib/banlieue/ch` or a bare absolute path.
pub fn state_dir(endpoint: &str) -> Result<PathBuf, BackendError> {
    let path = endpoint
        .strip_prefix("local://")
        .or_else(|| endpoint.strip_prefix("unix://"))
        .unwrap_or(endpoint);
    if path.starts_with('/') && !path.contains("..") {
        Ok(PathBuf::from(path))
    } else {
        Err(BackendError::terminal(
            "UnsupportedEndpoint",
            format!(
                "endpoint {endpoint:?}: the cloud-hypervisor class runs VMMs on the operator's own host and takes local:///<state directory> (a remote host agent is not implemented)"
            ),
        ))
    }
}

impl ChSettings {
    /// The keys this backend reads; any other key (but the operator's own) is refused.
    pub const KEYS: [&'static str; 11] = [
        "shutdownTimeout",
        "restartDelay",
        "startTimeout",
        "pollInterval",
        "apiTimeout",
        "hangTimeout",
        "binary",
        "qcow2Disks",
        "hostName",
        "dhcpLeases",
        crate::paths::IMAGE_DIRECTORIES_SETTING,
    ];

    /// Parses the connection; bad values and keys neither this backend nor the
    /// operator reads fail with a terminal `InvalidSettings`.
    pub fn parse(connection: &Connection) -> Result<Self, BackendError> {
        Self::parse_parts(&connection.endpoint, &connection.settings)
    }

    /// As [`ChSettings::parse`], from the endpoint and settings map.
    pub fn parse_parts(
        endpoint: &str,
        settings: &BTreeMap<String, String>,
    ) -> Result<Self, BackendError> {
        let state_dir = state_dir(endpoint)?;
        let mut parsed = Self {
            image_dirs: Vec::new(),
            state_dir,
            binary: PathBuf::from("cloud-hypervisor"),
            host_name: None,
            shutdown_timeout: Duration::from_secs(60),
            restart_delay: Duration::from_secs(5),
            start_timeout: Duration::from_secs(10),
            poll_interval: Duration::from_secs(1),
            api_timeout: Duration::from_secs(10),
            hang_timeout: Duration::from_secs(60),
            dhcp_leases: None,
            qcow2_overlay: true,
        };
        let mut read = Settings::new(settings);
        read.duration(
            "shutdownTimeout",
            Zero::Allowed,
            3600,
            &mut parsed.shutdown_timeout,
        );
        read.duration(
            "restartDelay",
            Zero::Allowed,
            3600,
            &mut parsed.restart_delay,
        );
        read.duration(
            "startTimeout",
            Zero::Allowed,
            300,
            &mut parsed.start_timeout,
        );
        read.duration(
            "pollInterval",
            Zero::Allowed,
            300,
            &mut parsed.poll_interval,
        );
        read.duration("apiTimeout", Zero::Allowed, 300, &mut parsed.api_timeout);
        read.duration("hangTimeout", Zero::Allowed, 3600, &mut parsed.hang_timeout);
        if parsed.poll_interval.is_zero() || parsed.api_timeout.is_zero() {
            read.bad("pollInterval and apiTimeout must not be zero");
        }
        if let Some(v) = settings.get("binary").filter(|v| !v.is_empty()) {
            parsed.binary = PathBuf::from(v);
        }
        match settings.get("qcow2Disks").map(String::as_str) {
            None | Some("overlay") => {}
            Some("copy") => parsed.qcow2_overlay = false,
            Some(other) => read.bad(format!("qcow2Disks {other:?} is not overlay or copy")),
        }
        parsed.host_name = settings.get("hostName").cloned().filter(|h| !h.is_empty());
        parsed.dhcp_leases = settings
            .get("dhcpLeases")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from);
        match crate::paths::parse_dirs(
            settings
                .get(crate::paths::IMAGE_DIRECTORIES_SETTING)
                .map(String::as_str),
            &parsed.state_dir,
        ) {
            Ok(dirs) => parsed.image_dirs = dirs,
            Err(problem) => read.bad(problem),
        }
        read.only("cloud-hypervisor", &Self::KEYS);
        read.finish()?;
        Ok(parsed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_endpoint_and_settings() {
        let s = ChSettings::parse_parts(
            "local:///var/lib/banlieue/ch",
            &BTreeMap::from([
                ("binary".into(), "/opt/ch/cloud-hypervisor".into()),
                ("shutdownTimeout".into(), "5".into()),
                ("restartDelay".into(), "500ms".into()),
                ("dhcpLeases".into(), "/var/lib/misc/dnsmasq.leases".into()),
            ]),
        )
        .unwrap();
        assert_eq!(s.state_dir, PathBuf::from("/var/lib/banlieue/ch"));
        assert_eq!(s.binary, PathBuf::from("/opt/ch/cloud-hypervisor"));
        assert_eq!(s.shutdown_timeout, Duration::from_secs(5));
        assert_eq!(s.restart_delay, Duration::from_millis(500));
        assert_eq!(s.start_timeout, Duration::from_secs(10));
        assert!(s.dhcp_leases.is_some());
        assert_eq!(
            s.image_dirs,
            vec![PathBuf::from("/var/lib/banlieue/ch/images")],
            "images come from the state directory's images/ unless the setting says"
        );
        assert_eq!(
            ChSettings::parse_parts("/srv/ch", &BTreeMap::new())
                .unwrap()
                .binary,
            PathBuf::from("cloud-hypervisor")
        );
    }

    #[test]
    fn rejects_bad_values() {
        let e = ChSettings::parse_parts("https://host:8443", &BTreeMap::new()).unwrap_err();
        assert_eq!(e.reason, "UnsupportedEndpoint");
        let e = ChSettings::parse_parts(
            "local:///x",
            &BTreeMap::from([("restartDelay".into(), "soon".into())]),
        )
        .unwrap_err();
        assert_eq!(e.reason, "InvalidSettings");
        assert!(e.message.contains("restartDelay"));
        let e = ChSettings::parse_parts(
            "local:///x",
            &BTreeMap::from([("imageDirectories".into(), "relative/dir".into())]),
        )
        .unwrap_err();
        assert!(e.message.contains("imageDirectories"), "{}", e.message);
    }
}
