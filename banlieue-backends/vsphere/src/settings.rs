//! `Provider.spec.settings` for the vsphere class.

use std::collections::BTreeMap;
use std::time::Duration;

use banlieue_kit::settings::{Settings, TaskPacing};
use banlieue_sdk::backend::BackendError;

/// Parsed settings (see the crate docs for the table).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VSphereSettings {
    /// `taskPollInterval` (default 1s), `shutdownTimeout` (how long a guest shutdown
    /// may take before the VM is powered off, default 120s) and `failedCloneBackoff`
    /// (default 60s).
    pub pacing: TaskPacing,
    /// Keep reporting `WaitingForAddress` until VMware Tools reports an IP
    /// (`waitForAddress`, default true), as CAPV does.
    pub wait_for_address: bool,
    /// The datacenter to use when neither the machine nor its failure domain names one
    /// (`datacenter`); default: the only datacenter, if there is exactly one.
    pub datacenter: Option<String>,
}

impl Default for VSphereSettings {
    fn default() -> Self {
        Self {
            pacing: TaskPacing {
                task_poll_interval: Duration::from_secs(1),
                shutdown_timeout: Duration::from_secs(120),
                failed_clone_backoff: Duration::from_secs(60),
            },
            wait_for_address: true,
            datacenter: None,
        }
    }
}

impl VSphereSettings {
    /// The keys this backend reads; any other key (but the operator's own) is refused.
    pub const KEYS: [&'static str; 5] = [
        TaskPacing::KEYS[0],
        TaskPacing::KEYS[1],
        TaskPacing::KEYS[2],
        "waitForAddress",
        "datacenter",
    ];

    /// Parses the settings; bad values and keys neither this backend nor the operator
    /// reads fail with a terminal `InvalidSettings`.
    pub fn parse(settings: &BTreeMap<String, String>) -> Result<Self, BackendError> {
        let mut parsed = Self::default();
        let mut read = Settings::new(settings);
        parsed.pacing.read(&mut read);
        read.flag("waitForAddress", &mut parsed.wait_for_address);
        parsed.datacenter = settings
            .get("datacenter")
            .cloned()
            .filter(|c| !c.is_empty());
        read.only("vsphere", &Self::KEYS);
        read.finish()?;
        Ok(parsed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_rejects() {
        let s = VSphereSettings::parse(&BTreeMap::from([
            ("taskPollInterval".into(), "250ms".into()),
            ("shutdownTimeout".into(), "30".into()),
            ("waitForAddress".into(), "false".into()),
            ("maxConcurrentCreates".into(), "4".into()),
        ]))
        .unwrap();
        assert_eq!(s.pacing.task_poll_interval, Duration::from_millis(250));
        assert_eq!(s.pacing.shutdown_timeout, Duration::from_secs(30));
        assert!(!s.wait_for_address);
        let e = VSphereSettings::parse(&BTreeMap::from([
            ("taskPollInterval".into(), "soon".into()),
            ("waitForAddress".into(), "maybe".into()),
        ]))
        .unwrap_err();
        assert_eq!(e.reason, "InvalidSettings");
        assert!(e.message.contains("taskPollInterval") && e.message.contains("maybe"));
        // A key only the sim backend reads, and a misspelt one, are refused by name.
        let e = VSphereSettings::parse(&BTreeMap::from([
            ("machineKind".into(), "VSphereMachine".into()),
            ("waitforaddress".into(), "false".into()),
        ]))
        .unwrap_err();
        assert_eq!(e.reason, "InvalidSettings");
        assert!(
            e.message.contains("settings.machineKind is not a setting")
                && e.message.contains(
                    "settings.waitforaddress is not a setting (did you mean waitForAddress?)"
                ),
            "{}",
            e.message
        );
    }
}
