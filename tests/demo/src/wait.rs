//! Watching the VirtualMachines until all are Ready, showing their progress.
//!
//! A reflector (list + watch) keeps a local copy of the namespace's VirtualMachines; every
//! [`TICK`] the table is rebuilt from it. On a terminal the table is redrawn in place;
//! otherwise (CI logs, a pipe) a line is printed only when a VM's row changes, followed
//! by a progress line such as `ready 3/6 after 4.2s`.

use std::io::Write as _;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use banlieue_sdk::api::VirtualMachine;
use banlieue_sdk::conditions::types;
use futures::StreamExt as _;
use k8s_openapi::jiff::Timestamp;
use kube::api::Api;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt as _, watcher};
use tokio::task::JoinHandle;

use crate::operator::Operator;
use crate::table::{self, Changes, Row};

/// How often the table is refreshed.
pub const TICK: Duration = Duration::from_millis(500);

/// A live, local copy of the VirtualMachines of one namespace.
#[derive(Debug)]
pub struct Watch {
    store: Store<VirtualMachine>,
    task: JoinHandle<()>,
    last_error: Arc<Mutex<Option<String>>>,
}

impl Watch {
    /// Starts listing and watching `api` in the background.
    pub fn start(api: Api<VirtualMachine>) -> Self {
        let (store, writer) = reflector::store();
        let last_error = Arc::new(Mutex::new(None));
        let errors = last_error.clone();
        let stream = reflector::reflector(
            writer,
            watcher(api, watcher::Config::default()).default_backoff(),
        );
        let task = tokio::spawn(stream.for_each(move |event| {
            let mut last = errors.lock().unwrap_or_else(PoisonError::into_inner);
            *last = event.err().map(|e| e.to_string());
            futures::future::ready(())
        }));
        Self {
            store,
            task,
            last_error,
        }
    }

    /// Waits until the first list has arrived (at most `timeout`), so that the first
    /// frame is not an empty table.
    pub async fn synced(&self, timeout: Duration) {
        let _ = tokio::time::timeout(timeout, self.store.wait_until_ready()).await;
    }

    /// The VirtualMachines as last seen.
    pub fn snapshot(&self) -> Vec<Arc<VirtualMachine>> {
        self.store.state()
    }

    /// The watch's last error, if its last event was one (it retries with backoff).
    pub fn last_error(&self) -> Option<String> {
        self.last_error
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// How the progress is shown.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Redraw the table in place (stdout is a terminal nobody else writes to).
    Live,
    /// Print changed rows and progress lines (stdout is a file or pipe, or the
    /// operator's logs go to the terminal too).
    Lines,
}

/// Draws the table on stdout.
#[derive(Debug)]
pub struct Display {
    mode: Mode,
    /// Lines of the last live frame, to move back over.
    drawn: usize,
    changes: Changes,
    /// Column widths so far in [`Mode::Lines`] (they only grow, to keep lines aligned).
    widths: Option<[usize; 9]>,
}

impl Display {
    /// A display in `mode`.
    pub fn new(mode: Mode) -> Self {
        Self {
            mode,
            drawn: 0,
            changes: Changes::default(),
            widths: None,
        }
    }

    /// Shows `rows` and the progress line.
    fn update(&mut self, rows: &[Row], progress: &str) {
        let now = Timestamp::now();
        let diff = self.changes.update(rows);
        match self.mode {
            Mode::Live => {
                let mut lines = table::render(rows, now);
                lines.push(String::new());
                lines.push(progress.to_owned());
                self.redraw(&lines);
            }
            Mode::Lines if diff.is_empty() => {}
            Mode::Lines => {
                let mut out = String::new();
                let widths = self.line_widths(rows, now, &mut out);
                for row in &diff.changed {
                    out.push_str(&table::row_line(row, &widths, now));
                    out.push('\n');
                }
                for name in &diff.removed {
                    out.push_str(&format!("{name} is gone\n"));
                }
                out.push_str(progress);
                out.push('\n');
                print(&out);
            }
        }
    }

    /// Prints rows that changed since the last call, each prefixed with the time.
    fn follow(&mut self, rows: &[Row]) {
        let now = Timestamp::now();
        let diff = self.changes.update(rows);
        if diff.is_empty() {
            return;
        }
        let clock = now.strftime("%H:%M:%S").to_string();
        let widths = table::widths(rows, now);
        let mut out = String::new();
        for row in &diff.changed {
            let line = table::row_line(row, &widths, now);
            out.push_str(&format!("{clock}  {line}\n"));
        }
        for name in &diff.removed {
            out.push_str(&format!("{clock}  {name} is gone\n"));
        }
        print(&out);
    }

    /// Column widths for [`Mode::Lines`], printing the header the first time.
    fn line_widths(&mut self, rows: &[Row], now: Timestamp, out: &mut String) -> [usize; 9] {
        let fit = table::widths(rows, now);
        let widths = match self.widths {
            None => {
                out.push_str(&table::header(&fit));
                out.push('\n');
                fit
            }
            Some(old) => std::array::from_fn(|i| old[i].max(fit[i])),
        };
        self.widths = Some(widths);
        widths
    }

    /// Replaces the last frame with `lines`. Line wrapping is off while drawing, so a
    /// line wider than the terminal is clipped rather than breaking the line count.
    fn redraw(&mut self, lines: &[String]) {
        let mut out = String::new();
        if self.drawn > 0 {
            out.push_str(&format!("\x1b[{}A\r", self.drawn));
        }
        out.push_str("\x1b[J\x1b[?7l");
        for line in lines {
            out.push_str(line);
            out.push('\n');
        }
        out.push_str("\x1b[?7h");
        print(&out);
        self.drawn = lines.len();
    }
}

/// Writes `text` to stdout at once, ignoring errors (a closed pipe must not stop the
/// teardown).
fn print(text: &str) {
    let mut stdout = std::io::stdout().lock();
    let _ = stdout.write_all(text.as_bytes());
    let _ = stdout.flush();
}

/// How waiting ended.
#[derive(Debug)]
pub enum Progress {
    /// Every expected VirtualMachine is Ready, this long after `since`.
    Ready(Duration),
    /// The deadline passed; the report says which VMs are not Ready and why.
    TimedOut(String),
}

/// Shows the VirtualMachines until every one of `expected` is Ready or `deadline` passes.
///
/// # Errors
/// If the operator exits (quoting the end of its log).
pub async fn until_ready(
    watch: &Watch,
    expected: &[String],
    since: Instant,
    deadline: Instant,
    operator: &mut Operator,
    display: &mut Display,
) -> anyhow::Result<Progress> {
    watch.synced(Duration::from_secs(5)).await;
    loop {
        let vms = watch.snapshot();
        let rows = table::rows(vms.iter().map(AsRef::as_ref), expected);
        let ready = table::count_ready(&rows, expected);
        let elapsed = since.elapsed();
        display.update(&rows, &table::progress(ready, expected.len(), elapsed));
        if ready == expected.len() {
            return Ok(Progress::Ready(elapsed));
        }
        if let Some(status) = operator.exited() {
            return Err(operator.exited_error(status));
        }
        if Instant::now() >= deadline {
            let mut report = not_ready_report(vms.iter().map(AsRef::as_ref), expected);
            if let Some(error) = watch.last_error() {
                report.push_str(&format!("\nthe watch's last error: {error}"));
            }
            return Ok(Progress::TimedOut(report));
        }
        tokio::time::sleep(TICK).await;
    }
}

/// Prints each change to the VirtualMachines as it happens, until the operator exits.
pub async fn follow(
    watch: &Watch,
    expected: &[String],
    operator: &mut Operator,
    display: &mut Display,
) -> anyhow::Error {
    loop {
        let vms = watch.snapshot();
        display.follow(&table::rows(vms.iter().map(AsRef::as_ref), expected));
        if let Some(status) = operator.exited() {
            return operator.exited_error(status);
        }
        tokio::time::sleep(TICK).await;
    }
}

/// Which of `expected` are not Ready, with their phase and every condition that is not
/// `True` (reason and message).
pub fn not_ready_report<'a>(
    vms: impl IntoIterator<Item = &'a VirtualMachine> + Clone,
    expected: &[String],
) -> String {
    let mut lines = Vec::new();
    for name in expected {
        let Some(vm) = vms
            .clone()
            .into_iter()
            .find(|vm| vm.metadata.name.as_deref() == Some(name))
        else {
            lines.push(format!("  {name}: not found"));
            continue;
        };
        let row = Row::of(vm);
        if row.is_ready() {
            continue;
        }
        let conditions = vm.status.as_ref().map(|s| &s.conditions[..]).unwrap_or(&[]);
        let mut line = format!(
            "  {name}: phase {}",
            row.phase.as_deref().unwrap_or("(none)")
        );
        if !conditions.iter().any(|c| c.type_ == types::READY) {
            line.push_str("; no Ready condition yet (has the operator seen it?)");
        }
        for condition in conditions.iter().filter(|c| c.status != "True") {
            line.push_str(&format!(
                "; {}={} {}",
                condition.type_, condition.status, condition.reason
            ));
            if !condition.message.is_empty() {
                line.push_str(&format!(": {}", condition.message));
            }
        }
        lines.push(line);
    }
    format!(
        "{} of {} VirtualMachines are not Ready:\n{}",
        lines.len(),
        expected.len(),
        lines.join("\n")
    )
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn vm(name: &str, conditions: serde_json::Value) -> VirtualMachine {
        serde_json::from_value(json!({
            "apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine",
            "metadata": {"name": name},
            "spec": {"classRef": {"name": "c"}, "imageRef": {"name": "i"}},
            "status": {"phase": "Pending", "conditions": conditions}
        }))
        .unwrap()
    }

    fn condition(type_: &str, status: &str, reason: &str, message: &str) -> serde_json::Value {
        json!({"type": type_, "status": status, "reason": reason, "message": message,
               "lastTransitionTime": "2026-05-01T12:00:00Z"})
    }

    #[test]
    fn the_report_names_what_is_not_ready_and_why() {
        let vms = [
            vm("ok", json!([condition("Ready", "True", "Ready", "")])),
            vm(
                "stuck",
                json!([
                    condition(
                        "Scheduled",
                        "False",
                        "NoFeasibleProvider",
                        "zone-a is taken"
                    ),
                    condition("Ready", "False", "NotScheduled", ""),
                    condition("PowerState", "True", "Matches", ""),
                ]),
            ),
            vm("new", json!([])),
        ];
        let expected = ["ok", "stuck", "new", "missing"].map(String::from);
        let report = not_ready_report(&vms, &expected);
        assert_eq!(
            report,
            "3 of 4 VirtualMachines are not Ready:\n\
             \x20 stuck: phase Pending; Scheduled=False NoFeasibleProvider: zone-a is taken; Ready=False NotScheduled\n\
             \x20 new: phase Pending; no Ready condition yet (has the operator seen it?)\n\
             \x20 missing: not found"
        );
    }
}
