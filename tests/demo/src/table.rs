//! The progress table: VirtualMachines turned into rows and rows into aligned text.
//!
//! Everything here is a pure function of the objects and the current time, so the
//! rendering is unit-tested; drawing it on a terminal is [`crate::wait`]'s job.

use std::collections::BTreeMap;
use std::time::Duration;

use banlieue_sdk::api::VirtualMachine;
use banlieue_sdk::api::infra::MachineAddressType;
use banlieue_sdk::conditions::{self, types};
use k8s_openapi::jiff::Timestamp;

/// What an empty cell shows.
const NONE: &str = "-";

/// Column headers, in order. `REASON` is last so that a narrow terminal clips only it.
const HEADERS: [&str; COLUMNS] = [
    "NAME",
    "PROVIDER",
    "FAILURE-DOMAIN",
    "PHASE",
    "POWER",
    "IP",
    "READY",
    "AGE",
    "REASON",
];

/// Number of columns.
const COLUMNS: usize = 9;

/// Index of the `AGE` column, the only one that changes without the object changing.
#[cfg(test)]
const AGE: usize = 7;

/// Minimum column widths, so that lines printed one at a time (when stdout is not a
/// terminal) stay aligned with the header as values come and go.
const MIN_WIDTHS: [usize; COLUMNS] = [8, 8, 14, 12, 10, 12, 5, 4, 0];

/// One VirtualMachine as the table shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Row {
    /// `metadata.name`.
    pub name: String,
    /// `status.placement.provider`.
    pub provider: Option<String>,
    /// `status.placement.failureDomain`.
    pub failure_domain: Option<String>,
    /// `status.phase`.
    pub phase: Option<String>,
    /// `status.powerState`.
    pub power: Option<String>,
    /// The first `InternalIP` of `status.addresses`.
    pub ip: Option<String>,
    /// The `Ready` condition's status (`True`, `False`, `Unknown`), if set.
    pub ready: Option<String>,
    /// The `Ready` condition's reason while it is not `True`.
    pub reason: Option<String>,
    /// `metadata.creationTimestamp`.
    pub created: Option<Timestamp>,
}

impl Row {
    /// The row of `vm`.
    pub fn of(vm: &VirtualMachine) -> Self {
        let status = vm.status.as_ref();
        let placement = status.and_then(|s| s.placement.as_ref());
        let ready = status.and_then(|s| conditions::get(&s.conditions, types::READY));
        Self {
            name: vm.metadata.name.clone().unwrap_or_default(),
            provider: placement
                .map(|p| p.provider.clone())
                .filter(|p| !p.is_empty()),
            failure_domain: placement.and_then(|p| p.failure_domain.clone()),
            phase: status.and_then(|s| s.phase).map(|p| format!("{p:?}")),
            power: status.and_then(|s| s.power_state).map(|p| format!("{p:?}")),
            ip: status.and_then(|s| {
                s.addresses
                    .iter()
                    .find(|a| a.type_ == MachineAddressType::InternalIp)
                    .map(|a| a.address.clone())
            }),
            ready: ready.map(|c| c.status.clone()),
            reason: ready
                .filter(|c| c.status != "True")
                .map(|c| c.reason.clone())
                .filter(|r| !r.is_empty()),
            created: vm.metadata.creation_timestamp.as_ref().map(|t| t.0),
        }
    }

    /// Whether the `Ready` condition is `True`.
    pub fn is_ready(&self) -> bool {
        self.ready.as_deref() == Some("True")
    }

    /// The cells, formatted, with the age measured at `now`.
    fn cells(&self, now: Timestamp) -> [String; COLUMNS] {
        let cell = |value: &Option<String>| value.clone().unwrap_or_else(|| NONE.to_owned());
        [
            self.name.clone(),
            cell(&self.provider),
            cell(&self.failure_domain),
            cell(&self.phase),
            cell(&self.power),
            cell(&self.ip),
            cell(&self.ready),
            self.created
                .map_or_else(|| NONE.to_owned(), |created| age(created, now)),
            self.reason.clone().unwrap_or_default(),
        ]
    }

    /// Whether `other` shows the same state (everything but the age).
    pub fn same_state(&self, other: &Row) -> bool {
        Row {
            created: None,
            ..self.clone()
        } == Row {
            created: None,
            ..other.clone()
        }
    }
}

/// Rows for `vms`: those named in `order` first, in that order, then the others by name.
pub fn rows<'a>(vms: impl IntoIterator<Item = &'a VirtualMachine>, order: &[String]) -> Vec<Row> {
    let mut rows: Vec<Row> = vms.into_iter().map(Row::of).collect();
    let rank = |name: &str| order.iter().position(|n| n == name).unwrap_or(order.len());
    rows.sort_by(|a, b| {
        rank(&a.name)
            .cmp(&rank(&b.name))
            .then_with(|| a.name.cmp(&b.name))
    });
    rows
}

/// Column widths that fit the header, `rows` and the minimum widths.
pub fn widths(rows: &[Row], now: Timestamp) -> [usize; COLUMNS] {
    let mut widths = MIN_WIDTHS;
    for (width, header) in widths.iter_mut().zip(HEADERS) {
        *width = (*width).max(header.len());
    }
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row.cells(now)) {
            *width = (*width).max(cell.chars().count());
        }
    }
    widths
}

/// One line of aligned cells, three spaces apart, without trailing spaces.
fn line<S: AsRef<str>>(cells: &[S], widths: &[usize; COLUMNS]) -> String {
    let mut line = String::new();
    for (i, (cell, width)) in cells.iter().zip(widths).enumerate() {
        if i > 0 {
            line.push_str("   ");
        }
        let cell = cell.as_ref();
        line.push_str(cell);
        let pad = width.saturating_sub(cell.chars().count());
        line.extend(std::iter::repeat_n(' ', pad));
    }
    line.trim_end().to_owned()
}

/// The header line.
pub fn header(widths: &[usize; COLUMNS]) -> String {
    line(&HEADERS, widths)
}

/// The line of one row.
pub fn row_line(row: &Row, widths: &[usize; COLUMNS], now: Timestamp) -> String {
    line(&row.cells(now), widths)
}

/// The whole table: the header, then one line per row, aligned to fit.
pub fn render(rows: &[Row], now: Timestamp) -> Vec<String> {
    let widths = widths(rows, now);
    std::iter::once(header(&widths))
        .chain(rows.iter().map(|row| row_line(row, &widths, now)))
        .collect()
}

/// The progress line: `ready 3/6 after 4.2s`.
pub fn progress(ready: usize, total: usize, elapsed: Duration) -> String {
    format!("ready {ready}/{total} after {:.1}s", elapsed.as_secs_f64())
}

/// How many of `expected` have a row that is Ready.
pub fn count_ready(rows: &[Row], expected: &[String]) -> usize {
    expected
        .iter()
        .filter(|name| rows.iter().any(|r| &r.name == *name && r.is_ready()))
        .count()
}

/// An age as kubectl prints it: `42s`, `3m7s`, `12m`, `5h3m`, `2d4h`.
pub fn age(created: Timestamp, now: Timestamp) -> String {
    let secs = now.as_second().saturating_sub(created.as_second()).max(0);
    let (m, h, d) = (secs / 60, secs / 3600, secs / 86_400);
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 600 => format!("{m}m{}s", s % 60),
        s if s < 3600 => format!("{m}m"),
        s if s < 86_400 => format!("{h}h{}m", m % 60),
        _ => format!("{d}d{}h", h % 24),
    }
}

/// Remembers the rows last shown, to tell which ones changed.
#[derive(Debug, Default)]
pub struct Changes {
    last: BTreeMap<String, Row>,
}

/// What changed since the previous [`Changes::update`].
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Diff {
    /// Rows that are new or show a different state (the age does not count).
    pub changed: Vec<Row>,
    /// Names of rows that disappeared.
    pub removed: Vec<String>,
}

impl Diff {
    /// Whether nothing changed.
    pub fn is_empty(&self) -> bool {
        self.changed.is_empty() && self.removed.is_empty()
    }
}

impl Changes {
    /// Compares `rows` with the previous call's, and remembers them.
    pub fn update(&mut self, rows: &[Row]) -> Diff {
        let mut diff = Diff::default();
        let mut next = BTreeMap::new();
        for row in rows {
            if !self
                .last
                .get(&row.name)
                .is_some_and(|last| last.same_state(row))
            {
                diff.changed.push(row.clone());
            }
            next.insert(row.name.clone(), row.clone());
        }
        diff.removed = self
            .last
            .keys()
            .filter(|name| !next.contains_key(*name))
            .cloned()
            .collect();
        self.last = next;
        diff
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn now() -> Timestamp {
        "2026-05-01T12:00:30Z".parse().unwrap()
    }

    fn vm(value: serde_json::Value) -> VirtualMachine {
        serde_json::from_value(value).unwrap()
    }

    fn pending(name: &str) -> VirtualMachine {
        vm(json!({
            "apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine",
            "metadata": {"name": name, "creationTimestamp": "2026-05-01T12:00:00Z"},
            "spec": {"classRef": {"name": "c"}, "imageRef": {"name": "i"}}
        }))
    }

    fn running(name: &str) -> VirtualMachine {
        let mut object = serde_json::to_value(pending(name)).unwrap();
        object["status"] = json!({
            "phase": "Running",
            "placement": {"provider": "sim-lab", "failureDomain": "zone-b"},
            "powerState": "PoweredOn",
            "addresses": [
                {"type": "Hostname", "address": name},
                {"type": "InternalIP", "address": "10.0.0.7"}
            ],
            "conditions": [{
                "type": "Ready", "status": "True", "reason": "Ready", "message": "",
                "lastTransitionTime": "2026-05-01T12:00:05Z"
            }]
        });
        vm(object)
    }

    fn provisioning(name: &str) -> VirtualMachine {
        let mut object = serde_json::to_value(pending(name)).unwrap();
        object["status"] = json!({
            "phase": "Provisioning",
            "placement": {"provider": "sim-lab", "failureDomain": "zone-a"},
            "conditions": [{
                "type": "Ready", "status": "False", "reason": "InfrastructureNotReady",
                "message": "", "lastTransitionTime": "2026-05-01T12:00:01Z"
            }]
        });
        vm(object)
    }

    #[test]
    fn a_row_shows_placement_power_address_and_readiness() {
        let row = Row::of(&running("web-1"));
        assert_eq!(row.provider.as_deref(), Some("sim-lab"));
        assert_eq!(row.failure_domain.as_deref(), Some("zone-b"));
        assert_eq!(row.phase.as_deref(), Some("Running"));
        assert_eq!(row.power.as_deref(), Some("PoweredOn"));
        assert_eq!(
            row.ip.as_deref(),
            Some("10.0.0.7"),
            "InternalIP, not Hostname"
        );
        assert!(row.is_ready());
        assert_eq!(row.reason, None, "no reason once Ready");

        let row = Row::of(&provisioning("web-2"));
        assert!(!row.is_ready());
        assert_eq!(row.reason.as_deref(), Some("InfrastructureNotReady"));

        let row = Row::of(&pending("web-3"));
        assert_eq!((row.ready.as_deref(), row.phase.as_deref()), (None, None));
    }

    #[test]
    fn renders_an_aligned_table() {
        let vms = [running("web-1"), provisioning("db-1"), pending("extra")];
        let order = ["web-1".to_owned(), "db-1".to_owned()];
        let lines = render(&rows(&vms, &order), now());
        let expected = [
            "NAME       PROVIDER   FAILURE-DOMAIN   PHASE          POWER        IP             READY   AGE    REASON",
            "web-1      sim-lab    zone-b           Running        PoweredOn    10.0.0.7       True    30s",
            "db-1       sim-lab    zone-a           Provisioning   -            -              False   30s    InfrastructureNotReady",
            "extra      -          -                -              -            -              -       30s",
        ];
        assert_eq!(lines, expected);
    }

    #[test]
    fn columns_grow_to_fit() {
        let long = "a-rather-long-virtual-machine-name";
        let lines = render(&rows(&[pending(long)], &[]), now());
        assert!(lines[0].starts_with(&format!("NAME{}   PROVIDER", " ".repeat(long.len() - 4))));
        assert!(lines[1].starts_with(&format!("{long}   -")));
    }

    #[test]
    fn rows_follow_the_manifest_order_then_names() {
        let vms = [
            pending("z"),
            pending("b"),
            pending("web-2"),
            pending("web-1"),
        ];
        let order = ["web-2".to_owned(), "web-1".to_owned()];
        let names: Vec<_> = rows(&vms, &order).into_iter().map(|r| r.name).collect();
        assert_eq!(names, ["web-2", "web-1", "b", "z"]);
    }

    #[test]
    fn counts_only_expected_ready_rows() {
        let vms = [running("a"), running("other"), provisioning("b")];
        let all = rows(&vms, &[]);
        let expected = ["a".to_owned(), "b".to_owned(), "missing".to_owned()];
        assert_eq!(count_ready(&all, &expected), 1);
        assert_eq!(
            progress(1, 3, Duration::from_millis(4230)),
            "ready 1/3 after 4.2s"
        );
    }

    #[test]
    fn ages_read_like_kubectl() {
        let at = |s: &str| s.parse::<Timestamp>().unwrap();
        let now = at("2026-05-03T12:00:00Z");
        assert_eq!(age(at("2026-05-03T11:59:18Z"), now), "42s");
        assert_eq!(age(at("2026-05-03T11:56:53Z"), now), "3m7s");
        assert_eq!(age(at("2026-05-03T11:48:00Z"), now), "12m");
        assert_eq!(age(at("2026-05-03T06:57:00Z"), now), "5h3m");
        assert_eq!(age(at("2026-05-01T08:00:00Z"), now), "2d4h");
        assert_eq!(age(at("2026-05-03T12:00:09Z"), now), "0s", "clock skew");
    }

    #[test]
    fn changes_ignore_the_age() {
        let mut changes = Changes::default();
        let first = rows(&[pending("a"), provisioning("b")], &[]);
        assert_eq!(changes.update(&first).changed.len(), 2, "all new");
        assert!(changes.update(&first).is_empty());

        let mut older = first.clone();
        older[0].created = None;
        assert!(changes.update(&older).is_empty(), "age alone is no change");

        let next = rows(&[running("b")], &[]);
        let diff = changes.update(&next);
        assert_eq!(diff.changed, next);
        assert_eq!(diff.removed, ["a"]);
    }

    #[test]
    fn the_age_column_is_the_only_time_dependent_one() {
        let row = Row::of(&running("a"));
        let later = now() + k8s_openapi::jiff::SignedDuration::from_secs(600);
        let (a, b) = (row.cells(now()), row.cells(later));
        for i in 0..COLUMNS {
            assert_eq!(a[i] == b[i], i != AGE, "column {}", HEADERS[i]);
        }
    }
}
