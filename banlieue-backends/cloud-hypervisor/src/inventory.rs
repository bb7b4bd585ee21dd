//! The host as the Provider's one failure domain: its name, CPUs, memory, bridges.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use banlieue_sdk::backend::{Architecture, FailureDomainInventory};

/// Label with the host's CPU count.
pub const CPUS_LABEL: &str = "banlieue.io/host-cpus";
/// Label with the host's memory in MiB.
pub const MEMORY_LABEL: &str = "banlieue.io/host-memory-mib";

/// The host's name (`/proc/sys/kernel/hostname`).
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_owned())
}

/// Online CPUs.
pub fn cpus() -> usize {
    std::thread::available_parallelism()
        .map(usize::from)
        .unwrap_or(1)
}

/// `MemTotal` in MiB from `/proc/meminfo`.
pub fn memory_mib() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|text| {
            text.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map(|kib| kib / 1024)
        .unwrap_or(0)
}

/// Linux bridges on the host (`/sys/class/net/<name>/bridge`).
pub fn bridges() -> BTreeSet<String> {
    let Ok(entries) = std::fs::read_dir("/sys/class/net") else {
        return BTreeSet::new();
    };
    entries
        .filter_map(Result::ok)
        .filter(|e| e.path().join("bridge").is_dir())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect()
}

/// The architecture of this host's guests: the operator's own (the VMMs run here, and
/// Cloud Hypervisor runs guests of its host's architecture only; the operator binary
/// is built for the host it runs on, so the architecture it was compiled for is the
/// host's).
pub fn architecture() -> Option<Architecture> {
    Architecture::from_machine(std::env::consts::ARCH)
}

/// The failure domain for this host, with the state directory as storage `local`.
pub fn failure_domain(name: &str, state_dir: &Path) -> FailureDomainInventory {
    let labels = BTreeMap::from([
        ("topology.kubernetes.io/zone".to_owned(), name.to_owned()),
        ("kubernetes.io/hostname".to_owned(), name.to_owned()),
        (CPUS_LABEL.to_owned(), cpus().to_string()),
        (MEMORY_LABEL.to_owned(), memory_mib().to_string()),
    ]);
    let mut resources = BTreeMap::from([
        ("bridge".to_owned(), bridges()),
        (
            "storage".to_owned(),
            BTreeSet::from([crate::prepare::LOCAL_STORAGE.to_owned()]),
        ),
        // An unbridged tap is always possible (routed or host-only setups).
        ("network".to_owned(), BTreeSet::from(["tap".to_owned()])),
    ]);
    resources.retain(|_, v| !v.is_empty());
    FailureDomainInventory {
        name: name.to_owned(),
        labels,
        location: BTreeMap::from([
            ("host".to_owned(), name.to_owned()),
            (
                "stateDir".to_owned(),
                state_dir.to_string_lossy().into_owned(),
            ),
        ]),
        resources,
        features: BTreeSet::new(),
        architecture: architecture(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn describes_this_host() {
        let fd = failure_domain("h1", Path::new("/var/lib/banlieue/ch"));
        assert_eq!(fd.labels["topology.kubernetes.io/zone"], "h1");
        assert!(fd.labels[CPUS_LABEL].parse::<usize>().unwrap() >= 1);
        assert!(fd.labels[MEMORY_LABEL].parse::<u64>().unwrap() > 0);
        assert_eq!(fd.location["host"], "h1");
        let expected = match std::env::consts::ARCH {
            "x86_64" => Some(Architecture::Amd64),
            "aarch64" => Some(Architecture::Arm64),
            _ => None,
        };
        assert_eq!(fd.architecture, expected);
        assert!(!host_name().is_empty());
    }
}
