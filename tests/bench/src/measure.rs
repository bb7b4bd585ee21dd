//! What the benchmark measures besides time: API requests (from the apiserver's audit
//! log) and the operator's memory and CPU (from `/proc`).
//!
//! Every request reaching the apiserver is logged at level `Metadata` (no bodies) in JSON.
//! A request is attributed by its `User-Agent`: the benchmark's own client sends
//! [`BENCH_USER_AGENT`]; the apiserver's loopback client (`system:apiserver`) is ignored;
//! everything else is the operator's. Requests are counted once: watches when their
//! response starts (they may never complete), others when it completes.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufRead as _, BufReader};
use std::path::Path;
use std::process::Command;

use anyhow::Context as _;
use k8s_openapi::jiff::Timestamp;
use serde::{Deserialize, Serialize};

/// `User-Agent` of the benchmark's own client, to tell its requests from the operator's.
pub const BENCH_USER_AGENT: &str = "banlieue-bench";

/// The audit policy: every request at `level` (`Metadata` unless studying request
/// bodies), without the `RequestReceived` stage.
pub fn audit_policy(level: &str) -> String {
    format!(
        "apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: {level}
"
    )
}

/// etcd's backend quota on every control plane the benchmark starts (both sides): 8 GiB,
/// etcd's recommended maximum. The default 2 GiB fills before N = 100,000 (two objects per
/// VM, each rewritten several times before compaction), and a full quota turns every write
/// into `etcdserver: mvcc: database space exceeded`.
pub const ETCD_QUOTA_BYTES: u64 = 8 * 1024 * 1024 * 1024;

/// The apiserver flags that enable the audit log (`policy` and `log` are paths).
pub fn audit_flags(policy: &Path, log: &Path) -> Vec<String> {
    vec![
        format!("--audit-policy-file={}", policy.display()),
        format!("--audit-log-path={}", log.display()),
        "--audit-log-format=json".to_owned(),
        "--audit-log-maxsize=0".to_owned(),
    ]
}

/// A named interval of the run; requests are assigned to the phase their
/// `requestReceivedTimestamp` falls in.
#[derive(Clone, Debug)]
pub struct Phase {
    /// `startup`, `create`, `idle`, `delete`, `baseline-create`, ...
    pub name: &'static str,
    /// Inclusive start.
    pub start: Timestamp,
    /// Exclusive end.
    pub end: Timestamp,
}

/// Request counts per phase and actor, keyed `"<verb> <resource>[/<subresource>]"`.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct RequestCounts {
    /// Phase → actor (`operator`, `bench`) → request key → count.
    pub phases: BTreeMap<String, BTreeMap<String, BTreeMap<String, u64>>>,
}

impl RequestCounts {
    /// The counts of `actor` in `phase` (empty if none).
    pub fn of(&self, phase: &str, actor: &str) -> BTreeMap<String, u64> {
        self.phases
            .get(phase)
            .and_then(|p| p.get(actor))
            .cloned()
            .unwrap_or_default()
    }

    /// How many of `actor`'s requests in `phase` were writes.
    pub fn writes(&self, phase: &str, actor: &str) -> u64 {
        self.of(phase, actor)
            .iter()
            .filter(|(key, _)| is_write(key))
            .map(|(_, n)| n)
            .sum()
    }
}

/// Whether a request key (`"<verb> <resource>"`) is a write.
pub fn is_write(key: &str) -> bool {
    matches!(
        key.split(' ').next(),
        Some("create" | "update" | "patch" | "delete" | "deletecollection")
    )
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct AuditEvent {
    stage: String,
    verb: String,
    #[serde(default)]
    user_agent: String,
    #[serde(default)]
    user: AuditUser,
    #[serde(default)]
    object_ref: Option<AuditObjectRef>,
    request_received_timestamp: String,
}

#[derive(Deserialize, Default)]
struct AuditUser {
    #[serde(default)]
    username: String,
}

#[derive(Deserialize)]
struct AuditObjectRef {
    #[serde(default)]
    resource: String,
    #[serde(default)]
    subresource: String,
}

/// Reads the audit log at `path` and counts the requests of each phase: the benchmark's
/// own as `bench`, everyone else's as `operator`.
pub fn count_requests(path: &Path, phases: &[Phase]) -> anyhow::Result<RequestCounts> {
    count_requests_by(path, phases, |agent| {
        Some(if agent.starts_with(BENCH_USER_AGENT) {
            "bench"
        } else {
            "operator"
        })
    })
}

/// Reads the audit log at `path` and counts the requests of each phase under the actor
/// `actor_of` names for their `User-Agent` (`None`: not counted).
pub fn count_requests_by(
    path: &Path,
    phases: &[Phase],
    actor_of: impl Fn(&str) -> Option<&'static str>,
) -> anyhow::Result<RequestCounts> {
    let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut counts = RequestCounts::default();
    for line in BufReader::new(file).lines() {
        let line = line?;
        let Ok(event) = serde_json::from_str::<AuditEvent>(&line) else {
            continue;
        };
        let counted_stage = if event.verb == "watch" {
            "ResponseStarted"
        } else {
            "ResponseComplete"
        };
        if event.stage != counted_stage || event.user.username == "system:apiserver" {
            continue;
        }
        let Ok(at) = event.request_received_timestamp.parse::<Timestamp>() else {
            continue;
        };
        let Some(phase) = phases.iter().find(|p| p.start <= at && at < p.end) else {
            continue;
        };
        let Some(actor) = actor_of(&event.user_agent) else {
            continue;
        };
        let resource = match &event.object_ref {
            Some(r) if !r.subresource.is_empty() => format!("{}/{}", r.resource, r.subresource),
            Some(r) if !r.resource.is_empty() => r.resource.clone(),
            _ => "(non-resource)".to_owned(),
        };
        *counts
            .phases
            .entry(phase.name.to_owned())
            .or_default()
            .entry(actor.to_owned())
            .or_default()
            .entry(format!("{} {resource}", event.verb))
            .or_default() += 1;
    }
    Ok(counts)
}

/// A reading of a process's memory and CPU from `/proc`.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize)]
pub struct ProcSample {
    /// Resident set size now (`VmRSS`), MiB.
    pub rss_mib: f64,
    /// Peak resident set size so far (`VmHWM`), MiB.
    pub peak_rss_mib: f64,
    /// User + system CPU time so far, seconds.
    pub cpu_seconds: f64,
}

/// Reads `/proc/<pid>/status` and `/proc/<pid>/stat`; `None` once the process is gone.
pub fn sample(pid: u32, clock_ticks: f64) -> Option<ProcSample> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib = |field: &str| {
        status
            .lines()
            .find(|l| l.starts_with(field))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may contain spaces) start at field 3 (state);
    // utime and stime are fields 14 and 15.
    let after = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|v| v.parse::<f64>().ok());
    let cpu = ticks(11)? + ticks(12)?;
    Some(ProcSample {
        rss_mib: kib("VmRSS:") / 1024.0,
        peak_rss_mib: kib("VmHWM:") / 1024.0,
        cpu_seconds: cpu / clock_ticks,
    })
}

/// `sysconf(_SC_CLK_TCK)` through `getconf` (no unsafe code), 100 if that fails.
pub fn clock_ticks() -> f64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn audit_lines_are_attributed_and_phased() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("audit.log");
        let line = |stage: &str, verb: &str, ua: &str, res: &str, sub: &str, at: &str| {
            format!(
                r#"{{"stage":"{stage}","verb":"{verb}","userAgent":"{ua}","user":{{"username":"admin"}},"objectRef":{{"resource":"{res}","subresource":"{sub}"}},"requestReceivedTimestamp":"{at}"}}"#
            )
        };
        let lines = [
            line(
                "ResponseComplete",
                "patch",
                "",
                "virtualmachines",
                "status",
                "2026-01-01T00:00:01.5Z",
            ),
            line(
                "ResponseStarted",
                "patch",
                "",
                "virtualmachines",
                "status",
                "2026-01-01T00:00:01.5Z",
            ),
            line(
                "ResponseStarted",
                "watch",
                "",
                "libvirtmachines",
                "",
                "2026-01-01T00:00:01Z",
            ),
            line(
                "ResponseComplete",
                "create",
                "banlieue-bench",
                "virtualmachines",
                "",
                "2026-01-01T00:00:01Z",
            ),
            line(
                "ResponseComplete",
                "patch",
                "",
                "virtualmachines",
                "",
                "2026-01-01T00:00:09Z",
            ),
        ];
        std::fs::write(&log, lines.join("\n")).unwrap();
        let phases = [Phase {
            name: "create",
            start: "2026-01-01T00:00:00Z".parse().unwrap(),
            end: "2026-01-01T00:00:05Z".parse().unwrap(),
        }];
        let counts = count_requests(&log, &phases).unwrap();
        let operator = counts.of("create", "operator");
        assert_eq!(operator.get("patch virtualmachines/status"), Some(&1));
        assert_eq!(operator.get("watch libvirtmachines"), Some(&1));
        assert_eq!(operator.len(), 2, "{operator:?}");
        assert_eq!(counts.writes("create", "operator"), 1);
        assert_eq!(counts.writes("create", "bench"), 1);
    }

    #[test]
    fn samples_this_process() {
        let me = sample(std::process::id(), clock_ticks()).unwrap();
        assert!(me.rss_mib > 0.0 && me.peak_rss_mib >= me.rss_mib);
    }
}
