//! `Provider.spec.settings` for the proxmox class.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use banlieue_kit::settings::{Settings, TaskPacing};
use banlieue_sdk::backend::BackendError;

/// Parsed settings (see the crate docs for the table).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProxmoxSettings {
    /// `taskPollInterval` (default 2s), `shutdownTimeout` (how long a shutdown may
    /// take before PVE stops the VM, default 120s; PVE takes whole seconds, so a
    /// fraction is rounded up) and `failedCloneBackoff` (default 60s).
    pub pacing: TaskPacing,
    /// The cluster name for the `banlieue.io/proxmox-cluster` label (`cluster`);
    /// default: PVE's own (`/cluster/status`), else the first node's name.
    pub cluster: Option<String>,
    /// VLAN tags the Provider offers (`vlans`, a comma list), published as resource
    /// `vlan` on every failure domain. PVE cannot list the VLANs a bridge carries.
    pub vlans: BTreeSet<String>,
    /// The storage NoCloud seeds are uploaded to (`seedStorage`); default: the
    /// first active storage with `iso` content on the VM's node.
    pub seed_storage: Option<String>,
}

impl Default for ProxmoxSettings {
    fn default() -> Self {
        Self {
            pacing: TaskPacing {
                task_poll_interval: Duration::from_secs(2),
                shutdown_timeout: Duration::from_secs(120),
                failed_clone_backoff: Duration::from_secs(60),
            },
            cluster: None,
            vlans: BTreeSet::new(),
            seed_storage: None,
        }
    }
}

impl ProxmoxSettings {
    /// The keys this backend reads; any other key (but the operator's own) is refused.
    pub const KEYS: [&'static str; 6] = [
        TaskPacing::KEYS[0],
        TaskPacing::KEYS[1],
        TaskPacing::KEYS[2],
        "cluster",
        "seedStorage",
        "vlans",
    ];

    /// Parses the settings; bad values and keys neither this backend nor the operator
    /// reads fail with a terminal `InvalidSettings`.
    pub fn parse(settings: &BTreeMap<String, String>) -> Result<Self, BackendError> {
        let mut parsed = Self::default();
        let mut read = Settings::new(settings);
        parsed.pacing.read(&mut read);
        parsed.cluster = settings.get("cluster").cloned().filter(|c| !c.is_empty());
        parsed.seed_storage = settings
            .get("seedStorage")
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty());
        if let Some(v) = settings.get("vlans") {
            for tag in v.split(',').map(str::trim).filter(|t| !t.is_empty()) {
                match tag.parse::<u16>() {
                    Ok(1..=4094) => {
                        parsed.vlans.insert(tag.to_string());
                    }
                    _ => read.bad(format!("vlans: {tag:?} is not a VLAN tag from 1 to 4094")),
                }
            }
        }
        read.only("proxmox", &Self::KEYS);
        read.finish()?;
        Ok(parsed)
    }

    /// `shutdownTimeout` in PVE's whole seconds, rounded up (so `500ms` still waits).
    pub fn shutdown_seconds(&self) -> u64 {
        let t = self.pacing.shutdown_timeout;
        t.as_secs() + u64::from(t.subsec_nanos() > 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_rejects() {
        let s = ProxmoxSettings::parse(&BTreeMap::from([
            ("taskPollInterval".into(), "250ms".into()),
            ("shutdownTimeout".into(), "30".into()),
            ("vlans".into(), "10, 20".into()),
            ("maxConcurrentCreates".into(), "4".into()),
            ("seedStorage".into(), " isos ".into()),
        ]))
        .unwrap();
        assert_eq!(s.seed_storage.as_deref(), Some("isos"));
        assert_eq!(s.pacing.task_poll_interval, Duration::from_millis(250));
        assert_eq!(s.pacing.shutdown_timeout, Duration::from_secs(30));
        assert_eq!(s.shutdown_seconds(), 30);
        assert_eq!(s.vlans, BTreeSet::from(["10".into(), "20".into()]));
        let e = ProxmoxSettings::parse(&BTreeMap::from([
            ("taskPollInterval".into(), "soon".into()),
            ("vlans".into(), "5000".into()),
        ]))
        .unwrap_err();
        assert_eq!(e.reason, "InvalidSettings");
        assert!(e.message.contains("taskPollInterval") && e.message.contains("5000"));
        // A key only the sim backend reads, and a misspelt one, are refused by name.
        let e = ProxmoxSettings::parse(&BTreeMap::from([
            ("machineKind".into(), "ProxmoxMachine".into()),
            ("seedstorage".into(), "isos".into()),
        ]))
        .unwrap_err();
        assert!(
            e.message.contains("settings.machineKind is not a setting")
                && e.message
                    .contains("settings.seedstorage is not a setting (did you mean seedStorage?)"),
            "{}",
            e.message
        );
    }
}
