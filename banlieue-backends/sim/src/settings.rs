//! The simulator's settings, parsed and validated from `Provider.spec.settings`.
//!
//! See the crate documentation for the table of keys; [`SimSettings::parse`] is the
//! single place that reads them.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::time::Duration;

use banlieue_sdk::backend::{Architecture, BackendError, FailureDomainInventory};

/// The label every simulated failure domain carries, with the domain's name as value.
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";

/// The resource keys a simulated failure domain reports (the keys that Provider
/// storage and network class mappings use, across every backend).
pub const RESOURCE_KEYS: [&str; 11] = [
    "datastore",
    "datastoreCluster",
    "storagePolicy",
    "portGroup",
    "distributedPortGroup",
    "storage",
    "bridge",
    "vlan",
    "pool",
    "network",
    "directory",
];

/// The value every resource key offers when no `resources.<key>` setting names others.
pub const DEFAULT_RESOURCE: &str = "default";

/// The failure domains of a simulator that names none.
pub const DEFAULT_FAILURE_DOMAINS: [&str; 2] = ["sim-a", "sim-b"];

/// The longest `latency` accepted (`slow` faults take ten times as long).
pub const MAX_LATENCY: Duration = Duration::from_secs(24 * 60 * 60);

/// The most failure domains a simulator may declare (CAPI's limit per cluster).
pub const MAX_FAILURE_DOMAINS: usize = 100;

/// The keys accepted in `Provider.spec.settings`, for error messages.
const KNOWN_KEYS: &str = "latency, failureRate, failureKinds, failureCalls, recordCalls, seed, capacity, failureDomains, \
     features, features.<domain>, resources.<key>, resources.<key>.<domain>, architecture, architecture.<domain>, version, machineKind, maxConcurrentCreates, capabilities.<name>";

/// What an injected fault does to the call it hits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FaultKind {
    /// The call fails with a transient `SimulatedFault` error (think 5xx, timeout).
    Transient,
    /// The call fails with a terminal `SimulatedFault` error (think bad request, quota).
    Terminal,
    /// The call succeeds, but an operation it starts takes ten times `latency`.
    Slow,
}

impl FaultKind {
    /// The name used in the `failureKinds` setting.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Transient => "transient",
            Self::Terminal => "terminal",
            Self::Slow => "slow",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        match s {
            "transient" => Some(Self::Transient),
            "terminal" => Some(Self::Terminal),
            "slow" => Some(Self::Slow),
            _ => None,
        }
    }
}

impl fmt::Display for FaultKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The backend calls a fault can hit, as named in the `failureCalls` setting.
pub const FAULT_CALLS: [&str; 6] = [
    "check",
    "findImage",
    "ensure",
    "observe",
    "delete",
    "applyChanges",
];

/// One simulated failure domain: its name and what it offers.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct SimFailureDomain {
    /// Name, also the value of its `topology.kubernetes.io/zone` label and `host` location.
    pub name: String,
    /// Resource key (one of [`RESOURCE_KEYS`]) to the values reachable here.
    pub resources: BTreeMap<String, BTreeSet<String>>,
    /// Features available here.
    pub features: BTreeSet<String>,
    /// The architecture its simulated hosts report (`architecture`,
    /// `architecture.<domain>`; `amd64` by default). `None` (the value `none`) plays a
    /// backend that reports none, which the scheduler places no image on.
    pub architecture: Option<Architecture>,
}

impl SimFailureDomain {
    /// The failure domain as [`banlieue_sdk::backend::Backend::check`] reports it.
    pub fn inventory(&self) -> FailureDomainInventory {
        FailureDomainInventory {
            name: self.name.clone(),
            labels: BTreeMap::from([(ZONE_LABEL.to_string(), self.name.clone())]),
            location: BTreeMap::from([("host".to_string(), self.name.clone())]),
            resources: self.resources.clone(),
            features: self.features.clone(),
            architecture: self.architecture,
        }
    }
}

/// The validated settings of one simulated Provider.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct SimSettings {
    /// How long each create, power and delete operation takes (`latency`).
    pub latency: Duration,
    /// Probability in `[0, 1]` that a call is hit by a fault (`failureRate`).
    pub failure_rate: f64,
    /// The kinds a fault is drawn from, uniformly (`failureKinds`). Never empty.
    pub failure_kinds: Vec<FaultKind>,
    /// The calls faults can hit (`failureCalls`), named as in [`FAULT_CALLS`]; every
    /// call by default. Lets a test break `ensure` while `check` keeps the Provider Ready.
    pub failure_calls: BTreeSet<String>,
    /// Whether every call is recorded with its time (`recordCalls`), for
    /// [`crate::SimFactory::calls`]. Off by default: a benchmark's calls would pile up.
    pub record_calls: bool,
    /// Seed of the fault-injection random number generator (`seed`).
    pub seed: u64,
    /// Maximum number of machines in this simulated hypervisor (`capacity`).
    pub capacity: Option<usize>,
    /// Failure domains, in the order given (`failureDomains`, `resources.*`, `features*`).
    pub failure_domains: Vec<SimFailureDomain>,
    /// The version string `check()` reports (`version`).
    pub version: String,
    /// The infrastructure kind the operator builds for this Provider (`machineKind`).
    /// Read by the operator, not by the simulator, which serves every kind.
    pub machine_kind: Option<String>,
}

impl SimSettings {
    /// Parses and validates `settings` for a Provider whose endpoint is `endpoint`
    /// (the endpoint seeds the default `seed`). Every problem found is reported in one
    /// terminal `InvalidSettings` error naming the key and what it accepts.
    pub fn parse(
        endpoint: &str,
        settings: &BTreeMap<String, String>,
    ) -> Result<Self, BackendError> {
        let mut errors = Vec::new();
        let mut parsed = Self::defaults(endpoint);

        for (key, raw) in settings {
            let value = raw.trim();
            let result = match key.as_str() {
                "latency" => parse_duration(value).and_then(|d| {
                    if d > MAX_LATENCY {
                        Err("must be at most 24h".to_string())
                    } else {
                        parsed.latency = d;
                        Ok(())
                    }
                }),
                "failureRate" => parse_rate(value).map(|r| parsed.failure_rate = r),
                "failureKinds" => parse_kinds(value).map(|k| parsed.failure_kinds = k),
                "failureCalls" => parse_calls(value).map(|c| parsed.failure_calls = c),
                "recordCalls" => value
                    .parse::<bool>()
                    .map(|b| parsed.record_calls = b)
                    .map_err(|_| format!("{value:?} is not a boolean; use true or false")),
                "seed" => value
                    .parse::<u64>()
                    .map(|s| parsed.seed = s)
                    .map_err(|_| format!("{value:?} is not an unsigned 64-bit integer")),
                "capacity" => value
                    .parse::<usize>()
                    .map(|c| parsed.capacity = Some(c))
                    .map_err(|_| {
                        format!("{value:?} is not a machine count; use a non-negative integer such as 500")
                    }),
                "version" => {
                    if value.is_empty() {
                        Err("must not be empty".to_string())
                    } else {
                        parsed.version = value.to_string();
                        Ok(())
                    }
                }
                "machineKind" => {
                    parsed.machine_kind = Some(value.to_string());
                    Ok(())
                }
                // Read below, once the failure domains are known.
                "failureDomains" | "features" | "architecture" => Ok(()),
                k if k.starts_with("features.")
                    || k.starts_with("resources.")
                    || k.starts_with("architecture.") =>
                {
                    Ok(())
                }
                // Read by the operator: narrows what the Provider publishes it can do.
                k if k.starts_with("capabilities.") => Ok(()),
                // Read by the operator: its cap on creates in flight (no cap by default).
                banlieue_sdk::backend::concurrency::MAX_CONCURRENT_CREATES_SETTING => Ok(()),
                _ => Err(format!("unknown key; the simulator accepts {KNOWN_KEYS}")),
            };
            if let Err(e) = result {
                errors.push(format!("settings.{key}: {e}"));
            }
        }

        match settings
            .get("failureDomains")
            .map(|v| parse_domain_names(v.trim()))
        {
            Some(Err(e)) => errors.push(format!("settings.failureDomains: {e}")),
            Some(Ok(names)) => {
                parsed.failure_domains = names.into_iter().map(default_domain).collect()
            }
            None => {}
        }
        if let Some(v) = settings.get("features") {
            let features = parse_list(v.trim(), false).unwrap_or_default();
            for fd in &mut parsed.failure_domains {
                fd.features = features.iter().cloned().collect();
            }
        }
        // Settings for every domain first, then per-domain overrides.
        let mut overrides = Vec::new();
        for (key, raw) in settings {
            if let Some(rest) = key.strip_prefix("resources.") {
                let (res, domain) = match rest.split_once('.') {
                    Some((res, domain)) => (res, Some(domain)),
                    None => (rest, None),
                };
                if !RESOURCE_KEYS.contains(&res) {
                    errors.push(format!(
                        "settings.{key}: {res:?} is not a resource key; use one of {}",
                        RESOURCE_KEYS.join(", ")
                    ));
                    continue;
                }
                match parse_list(raw.trim(), true) {
                    Ok(values) => overrides.push((domain, Some(res), values)),
                    Err(e) => errors.push(format!("settings.{key}: {e}")),
                }
            } else if let Some(domain) = key.strip_prefix("features.") {
                match parse_list(raw.trim(), false) {
                    Ok(values) => overrides.push((Some(domain), None, values)),
                    Err(e) => errors.push(format!("settings.{key}: {e}")),
                }
            }
        }
        if let Some(e) = settings
            .get("features")
            .and_then(|v| parse_list(v.trim(), false).err())
        {
            errors.push(format!("settings.features: {e}"));
        }
        overrides.sort_by_key(|(domain, _, _)| domain.is_some());
        let names: Vec<String> = parsed
            .failure_domains
            .iter()
            .map(|d| d.name.clone())
            .collect();
        for (domain, resource, values) in overrides {
            let targets: Vec<&mut SimFailureDomain> = match domain {
                None => parsed.failure_domains.iter_mut().collect(),
                Some(name) => match parsed.failure_domains.iter_mut().find(|d| d.name == name) {
                    Some(fd) => vec![fd],
                    None => {
                        let key = match resource {
                            Some(res) => format!("resources.{res}.{name}"),
                            None => format!("features.{name}"),
                        };
                        errors.push(format!(
                            "settings.{key}: {name:?} is not one of the failure domains ({})",
                            names.join(", ")
                        ));
                        continue;
                    }
                },
            };
            for fd in targets {
                let set: BTreeSet<String> = values.iter().cloned().collect();
                match resource {
                    Some(res) => {
                        fd.resources.insert(res.to_string(), set);
                    }
                    None => fd.features = set,
                }
            }
        }

        // Every domain's architecture, then a domain's own.
        let mut architectures: Vec<(Option<&str>, &str, &String)> = settings
            .iter()
            .filter_map(|(key, raw)| {
                let domain = match key.strip_prefix("architecture") {
                    Some("") => None,
                    Some(rest) => Some(rest.strip_prefix('.')?),
                    None => return None,
                };
                Some((domain, key.as_str(), raw))
            })
            .collect();
        architectures.sort_by_key(|(domain, _, _)| domain.is_some());
        for (domain, key, raw) in architectures {
            let architecture = match parse_architecture(raw.trim()) {
                Ok(a) => a,
                Err(e) => {
                    errors.push(format!("settings.{key}: {e}"));
                    continue;
                }
            };
            match domain {
                None => {
                    for fd in &mut parsed.failure_domains {
                        fd.architecture = architecture;
                    }
                }
                Some(name) => match parsed.failure_domains.iter_mut().find(|d| d.name == name) {
                    Some(fd) => fd.architecture = architecture,
                    None => errors.push(format!(
                        "settings.{key}: {name:?} is not one of the failure domains ({})",
                        names.join(", ")
                    )),
                },
            }
        }

        if errors.is_empty() {
            Ok(parsed)
        } else {
            Err(BackendError::terminal("InvalidSettings", errors.join("; ")))
        }
    }

    /// The settings of a Provider that sets none.
    pub fn defaults(endpoint: &str) -> Self {
        Self {
            latency: Duration::ZERO,
            failure_rate: 0.0,
            failure_kinds: vec![FaultKind::Transient],
            failure_calls: FAULT_CALLS.iter().map(|c| c.to_string()).collect(),
            record_calls: false,
            seed: fnv1a(endpoint.as_bytes()),
            capacity: None,
            failure_domains: DEFAULT_FAILURE_DOMAINS
                .iter()
                .map(|n| default_domain(n.to_string()))
                .collect(),
            version: default_version(),
            machine_kind: None,
        }
    }

    /// The failure domain called `name`, if there is one.
    pub fn failure_domain(&self, name: &str) -> Option<&SimFailureDomain> {
        self.failure_domains.iter().find(|d| d.name == name)
    }
}

/// `banlieue-sim <crate version>`.
pub fn default_version() -> String {
    format!("banlieue-sim {}", env!("CARGO_PKG_VERSION"))
}

fn default_domain(name: String) -> SimFailureDomain {
    SimFailureDomain {
        name,
        resources: RESOURCE_KEYS
            .iter()
            .map(|k| {
                (
                    k.to_string(),
                    BTreeSet::from([DEFAULT_RESOURCE.to_string()]),
                )
            })
            .collect(),
        features: BTreeSet::new(),
        architecture: Some(Architecture::Amd64),
    }
}

/// `amd64`, `arm64`, or `none` (no architecture reported).
fn parse_architecture(value: &str) -> Result<Option<Architecture>, String> {
    match value {
        "amd64" => Ok(Some(Architecture::Amd64)),
        "arm64" => Ok(Some(Architecture::Arm64)),
        "none" => Ok(None),
        _ => Err(format!(
            "{value:?} is not an architecture; use amd64, arm64 or none (reports none)"
        )),
    }
}

/// FNV-1a, 64 bits: a stable hash for default seeds and machine UUIDs.
pub(crate) fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Parses a Go-style duration: `0`, or a sequence of decimal numbers each with a unit
/// (`ns`, `us`, `µs`, `ms`, `s`, `m`, `h`), e.g. `200ms`, `1.5s`, `1m30s`.
pub fn parse_duration(value: &str) -> Result<Duration, String> {
    let bad = || {
        format!(
            "{value:?} is not a duration; use a number with a unit (ms, s, m, h) such as 200ms, 2s or 1m30s"
        )
    };
    if value.trim() != value {
        return Err(bad());
    }
    let duration = banlieue_sdk::duration::parse(value).map_err(|_| bad())?;
    if duration.as_nanos() > MAX_LATENCY.as_nanos() * 1000 {
        return Err(bad());
    }
    Ok(duration)
}

fn parse_rate(value: &str) -> Result<f64, String> {
    match value.parse::<f64>() {
        Ok(r) if r.is_finite() && (0.0..=1.0).contains(&r) => Ok(r),
        _ => Err(format!(
            "{value:?} is not a probability; use a number from 0 to 1 such as 0.05"
        )),
    }
}

fn parse_kinds(value: &str) -> Result<Vec<FaultKind>, String> {
    let allowed = "use a comma-separated list of transient, terminal and slow";
    let items = parse_list(value, true).map_err(|e| format!("{e}; {allowed}"))?;
    let mut kinds = Vec::new();
    for item in items {
        let kind = FaultKind::parse(&item)
            .ok_or_else(|| format!("{item:?} is not a fault kind; {allowed}"))?;
        if !kinds.contains(&kind) {
            kinds.push(kind);
        }
    }
    Ok(kinds)
}

fn parse_calls(value: &str) -> Result<BTreeSet<String>, String> {
    let allowed = format!("use a comma-separated list of {}", FAULT_CALLS.join(", "));
    let items = parse_list(value, true).map_err(|e| format!("{e}; {allowed}"))?;
    items
        .into_iter()
        .map(|item| {
            if FAULT_CALLS.contains(&item.as_str()) {
                Ok(item)
            } else {
                Err(format!("{item:?} is not a backend call; {allowed}"))
            }
        })
        .collect()
}

fn parse_domain_names(value: &str) -> Result<Vec<String>, String> {
    let names = parse_list(value, true)?;
    let mut seen = BTreeSet::new();
    for name in &names {
        if !is_label_value(name) {
            return Err(format!(
                "{name:?} is not a valid failure domain name; names are label values: \
                 at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit"
            ));
        }
        if !seen.insert(name) {
            return Err(format!("{name:?} is listed twice"));
        }
    }
    if names.len() > MAX_FAILURE_DOMAINS {
        return Err(format!(
            "at most {MAX_FAILURE_DOMAINS} failure domains are allowed, got {}",
            names.len()
        ));
    }
    Ok(names)
}

/// A comma-separated list; items are trimmed and must not be empty. An empty value
/// is an empty list unless `non_empty`.
fn parse_list(value: &str, non_empty: bool) -> Result<Vec<String>, String> {
    if value.is_empty() {
        return if non_empty {
            Err("must not be empty".to_string())
        } else {
            Ok(Vec::new())
        };
    }
    value
        .split(',')
        .map(|item| {
            let item = item.trim();
            if item.is_empty() {
                Err(format!(
                    "{value:?} has an empty item; use a comma-separated list such as a,b"
                ))
            } else {
                Ok(item.to_string())
            }
        })
        .collect()
}

fn is_label_value(s: &str) -> bool {
    let bytes = s.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 63
        && bytes[0].is_ascii_alphanumeric()
        && bytes[bytes.len() - 1].is_ascii_alphanumeric()
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

#[cfg(test)]
mod tests {
    use super::*;
    use banlieue_sdk::backend::ErrorClass;

    fn parse(pairs: &[(&str, &str)]) -> Result<SimSettings, BackendError> {
        let map = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        SimSettings::parse("sim://test", &map)
    }

    fn error(pairs: &[(&str, &str)]) -> String {
        let err = parse(pairs).expect_err("settings should be rejected");
        assert_eq!(err.class, ErrorClass::Terminal);
        assert_eq!(err.reason, "InvalidSettings");
        err.message
    }

    #[test]
    fn defaults() {
        let s = parse(&[]).unwrap();
        assert_eq!(s.latency, Duration::ZERO);
        assert_eq!(s.failure_rate, 0.0);
        assert_eq!(s.failure_kinds, vec![FaultKind::Transient]);
        assert_eq!(s.capacity, None);
        assert_eq!(
            s.version,
            format!("banlieue-sim {}", env!("CARGO_PKG_VERSION"))
        );
        let names: Vec<_> = s.failure_domains.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(names, ["sim-a", "sim-b"]);
        let fd = s.failure_domains[0].inventory();
        assert_eq!(fd.labels[ZONE_LABEL], "sim-a");
        assert_eq!(fd.location["host"], "sim-a");
        assert_eq!(fd.resources.len(), RESOURCE_KEYS.len());
        assert!(
            fd.resources
                .values()
                .all(|v| v.contains("default") && v.len() == 1)
        );
        assert!(fd.features.is_empty());
        // The default seed is derived from the endpoint: stable, but different per endpoint.
        assert_eq!(s.seed, SimSettings::defaults("sim://test").seed);
        assert_ne!(s.seed, SimSettings::defaults("sim://other").seed);
    }

    #[test]
    fn architectures_for_every_domain_then_one() {
        let arch = |pairs: &[(&str, &str)]| {
            parse(pairs)
                .unwrap()
                .failure_domains
                .iter()
                .map(|d| d.inventory().architecture)
                .collect::<Vec<_>>()
        };
        use Architecture::{Amd64, Arm64};
        type Case<'a> = (&'a [(&'a str, &'a str)], [Option<Architecture>; 2]);
        let table: [Case<'_>; 5] = [
            (&[], [Some(Amd64), Some(Amd64)]),
            (&[("architecture", "arm64")], [Some(Arm64), Some(Arm64)]),
            (
                &[("architecture.sim-b", "arm64")],
                [Some(Amd64), Some(Arm64)],
            ),
            (
                &[("architecture", "arm64"), ("architecture.sim-a", "amd64")],
                [Some(Amd64), Some(Arm64)],
            ),
            (&[("architecture.sim-a", " none ")], [None, Some(Amd64)]),
        ];
        for (pairs, want) in table {
            assert_eq!(arch(pairs), want, "{pairs:?}");
        }
        let message = error(&[("architecture", "x86_64"), ("architecture.sim-c", "arm64")]);
        assert!(
            message.contains(
                "settings.architecture: \"x86_64\" is not an architecture; use amd64, arm64 or none"
            ),
            "{message}"
        );
        assert!(
            message.contains("settings.architecture.sim-c: \"sim-c\" is not one of the failure domains (sim-a, sim-b)"),
            "{message}"
        );
        assert!(error(&[("architectures", "arm64")]).contains("unknown key"));
    }

    #[test]
    fn failure_calls() {
        assert_eq!(parse(&[]).unwrap().failure_calls.len(), FAULT_CALLS.len());
        let s = parse(&[("failureCalls", "ensure, delete")]).unwrap();
        assert_eq!(
            s.failure_calls.into_iter().collect::<Vec<_>>(),
            ["delete", "ensure"]
        );
        let message = error(&[("failureCalls", "ensure,create")]);
        assert!(message.contains("settings.failureCalls"), "{message}");
        assert!(
            message.contains("\"create\" is not a backend call"),
            "{message}"
        );
        assert!(message.contains("findImage"), "{message}");
        assert!(parse(&[("recordCalls", "true")]).unwrap().record_calls);
        assert!(error(&[("recordCalls", "yes")]).contains("settings.recordCalls"));
    }

    #[test]
    fn durations() {
        let ok = [
            ("0", 0),
            ("0s", 0),
            ("200ms", 200_000_000),
            ("2s", 2_000_000_000),
            ("1.5s", 1_500_000_000),
            ("1m30s", 90_000_000_000),
            ("1h", 3_600_000_000_000),
            ("250us", 250_000),
            ("10ns", 10),
        ];
        for (text, nanos) in ok {
            assert_eq!(
                parse_duration(text),
                Ok(Duration::from_nanos(nanos)),
                "{text}"
            );
        }
        for bad in ["", "200", "ms", "2 s", "-1s", "1d", "1..2s", "abc"] {
            assert!(parse_duration(bad).is_err(), "{bad:?} should be rejected");
        }
    }

    #[test]
    fn good_values() {
        let s = parse(&[
            ("latency", " 200ms "),
            ("failureRate", "0.25"),
            ("failureKinds", "transient, slow,transient"),
            ("seed", "42"),
            ("capacity", "10"),
            ("failureDomains", "rack-1,rack-2,rack-3"),
            ("features", "nestedVirtualization, hotAddCPU"),
            ("features.rack-3", "gpu"),
            ("resources.datastore", "fast,slow"),
            ("resources.datastore.rack-2", "slow"),
            ("resources.portGroup", "VM Network"),
            ("version", "VMware vCenter Server 8.0.3 (simulated)"),
            ("machineKind", "VSphereMachine"),
        ])
        .unwrap();
        assert_eq!(s.latency, Duration::from_millis(200));
        assert_eq!(s.failure_rate, 0.25);
        assert_eq!(s.failure_kinds, vec![FaultKind::Transient, FaultKind::Slow]);
        assert_eq!(s.seed, 42);
        assert_eq!(s.capacity, Some(10));
        assert_eq!(s.version, "VMware vCenter Server 8.0.3 (simulated)");
        assert_eq!(s.machine_kind.as_deref(), Some("VSphereMachine"));
        let set = |items: &[&str]| items.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
        let [r1, r2, r3] = &s.failure_domains[..] else {
            panic!("three domains expected")
        };
        assert_eq!(r1.name, "rack-1");
        assert_eq!(r1.resources["datastore"], set(&["fast", "slow"]));
        assert_eq!(r2.resources["datastore"], set(&["slow"]));
        assert_eq!(r3.resources["datastore"], set(&["fast", "slow"]));
        assert_eq!(r2.resources["portGroup"], set(&["VM Network"]));
        assert_eq!(r1.resources["pool"], set(&["default"]));
        assert_eq!(r1.features, set(&["hotAddCPU", "nestedVirtualization"]));
        assert_eq!(r3.features, set(&["gpu"]));
        assert_eq!(s.failure_domain("rack-2"), Some(r2));
        assert_eq!(parse(&[("capacity", "0")]).unwrap().capacity, Some(0));
        assert_eq!(parse(&[("failureRate", "1")]).unwrap().failure_rate, 1.0);
    }

    #[test]
    fn bad_values_name_the_key_and_what_is_allowed() {
        type Case<'a> = (&'a [(&'a str, &'a str)], &'a [&'a str]);
        let cases: &[Case] = &[
            (
                &[("latency", "fast")],
                &["settings.latency", "\"fast\"", "200ms"],
            ),
            (&[("latency", "48h")], &["settings.latency", "at most 24h"]),
            (
                &[("failureRate", "1.5")],
                &["settings.failureRate", "from 0 to 1"],
            ),
            (
                &[("failureRate", "NaN")],
                &["settings.failureRate", "probability"],
            ),
            (
                &[("failureKinds", "flaky")],
                &[
                    "settings.failureKinds",
                    "\"flaky\"",
                    "transient, terminal and slow",
                ],
            ),
            (
                &[("failureKinds", "")],
                &["settings.failureKinds", "must not be empty"],
            ),
            (&[("seed", "-1")], &["settings.seed", "unsigned"]),
            (
                &[("capacity", "lots")],
                &["settings.capacity", "non-negative integer"],
            ),
            (
                &[("failureDomains", "a,,b")],
                &["settings.failureDomains", "empty item"],
            ),
            (
                &[("failureDomains", "a,a")],
                &["settings.failureDomains", "listed twice"],
            ),
            (
                &[("failureDomains", "-bad-")],
                &["settings.failureDomains", "label values"],
            ),
            (
                &[("failureDomains", "")],
                &["settings.failureDomains", "must not be empty"],
            ),
            (
                &[("resources.cpu", "x")],
                &["settings.resources.cpu", "not a resource key", "datastore"],
            ),
            (
                &[("resources.pool", "")],
                &["settings.resources.pool", "must not be empty"],
            ),
            (
                &[("resources.pool.sim-z", "x")],
                &["settings.resources.pool.sim-z", "sim-a, sim-b"],
            ),
            (
                &[("features.sim-z", "x")],
                &["settings.features.sim-z", "not one of the failure domains"],
            ),
            (&[("features", "a,")], &["settings.features", "empty item"]),
            (
                &[("version", " ")],
                &["settings.version", "must not be empty"],
            ),
            (
                &[("latncy", "1s")],
                &["settings.latncy", "unknown key", "latency, failureRate"],
            ),
        ];
        for (pairs, needles) in cases {
            let message = error(pairs);
            for needle in *needles {
                assert!(
                    message.contains(needle),
                    "{pairs:?}: {message:?} should contain {needle:?}"
                );
            }
        }
    }

    #[test]
    fn every_problem_is_reported_at_once() {
        let message = error(&[("latency", "x"), ("capacity", "y")]);
        assert!(
            message.contains("settings.latency") && message.contains("settings.capacity"),
            "{message}"
        );
    }

    #[test]
    fn machine_kind_is_accepted_verbatim() {
        let s = parse(&[("machineKind", "anything")]).unwrap();
        assert_eq!(s.machine_kind.as_deref(), Some("anything"));
    }
}
