//! Reading a Provider's `spec.settings` (string keys and values, documented per
//! backend): every bad value is collected, so one terminal `InvalidSettings` names all
//! that is wrong at once. A backend lists the keys it reads ([`Settings::only`]): any
//! other key, unless the operator reads it itself
//! ([`OPERATOR_KEYS`](banlieue_sdk::backend::settings::OPERATOR_KEYS)), is a mistake
//! named in the same error — a misspelt setting must not be silently ignored.

use std::collections::BTreeMap;
use std::time::Duration;

use banlieue_sdk::backend::BackendError;
use banlieue_sdk::duration::parse_or_seconds;

/// Whether a duration setting may be zero.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Zero {
    /// `0s` is a valid value (e.g. "no timeout" or "no backoff").
    Allowed,
    /// The value must be at least 1ms (a poll interval).
    Refused,
}

/// Reads settings into a value, collecting what is wrong.
///
/// ```
/// use std::collections::BTreeMap;
/// use std::time::Duration;
/// use banlieue_kit::settings::{Settings, Zero};
///
/// let given = BTreeMap::from([("pollInterval".to_string(), "1m30s".to_string())]);
/// let mut settings = Settings::new(&given);
/// let mut poll = Duration::from_secs(1);
/// settings.duration("pollInterval", Zero::Refused, 300, &mut poll);
/// settings.finish().unwrap();
/// assert_eq!(poll, Duration::from_secs(90));
/// ```
#[derive(Debug)]
pub struct Settings<'a> {
    given: &'a BTreeMap<String, String>,
    bad: Vec<String>,
}

impl<'a> Settings<'a> {
    /// A reader over `spec.settings`.
    pub fn new(given: &'a BTreeMap<String, String>) -> Self {
        Self {
            given,
            bad: Vec::new(),
        }
    }

    /// The raw value of `key`, when set.
    pub fn get(&self, key: &str) -> Option<&'a str> {
        self.given.get(key).map(String::as_str)
    }

    /// Sets `slot` from `key` when it is set: a duration (`500ms`, `30s`, `1m30s`, or
    /// bare seconds) up to `max_secs`, zero only when `zero` allows it.
    pub fn duration(&mut self, key: &str, zero: Zero, max_secs: u64, slot: &mut Duration) {
        // Unset: the backend's documented default stands (the caller's `slot`).
        let Some(v) = self.get(key) else { return };
        let max = Duration::from_secs(max_secs);
        match parse_or_seconds(v)
            .ok()
            .filter(|d| *d <= max && (zero == Zero::Allowed || !d.is_zero()))
        {
            Some(d) => *slot = d,
            None => {
                let range = match zero {
                    Zero::Allowed => format!("up to {max_secs}s"),
                    Zero::Refused => format!("from 1ms to {max_secs}s"),
                };
                self.bad.push(format!(
                    "{key} {v:?} is not a duration {range} (e.g. 500ms, 30s, 1m30s)"
                ));
            }
        }
    }

    /// Sets `slot` from `key` when it is set: `true` or `false` (spaces around ignored).
    pub fn flag(&mut self, key: &str, slot: &mut bool) {
        // Unset: the backend's documented default stands (the caller's `slot`).
        let Some(v) = self.get(key) else { return };
        match v.trim() {
            "true" => *slot = true,
            "false" => *slot = false,
            _ => self.bad.push(format!("{key} {v:?} is not true or false")),
        }
    }

    /// Records a problem the caller found in a value of its own kind.
    pub fn bad(&mut self, problem: impl Into<String>) {
        self.bad.push(problem.into());
    }

    /// Records every given key that neither `keys` (what the `backend` reads) nor the
    /// operator reads, naming the nearest known key when there is one.
    pub fn only(&mut self, backend: &str, keys: &[&str]) {
        self.bad
            .extend(banlieue_sdk::backend::settings::unknown_keys(
                self.given, backend, keys,
            ));
    }

    /// `Ok` when every value read was good, else a terminal `InvalidSettings` naming
    /// each bad one.
    pub fn finish(self) -> Result<(), BackendError> {
        if self.bad.is_empty() {
            Ok(())
        } else {
            Err(BackendError::terminal(
                "InvalidSettings",
                self.bad.join("; "),
            ))
        }
    }
}

/// The pacing settings of a backend that drives long-running hypervisor tasks (clones,
/// power operations), read under the same keys by every such backend:
///
/// | key | value | what |
/// |---|---|---|
/// | `taskPollInterval` | duration from 1ms to 300s | how soon to look at a running task again |
/// | `shutdownTimeout` | duration up to 86400s (bare seconds too) | how long a guest shutdown may take before the VM is stopped |
/// | `failedCloneBackoff` | duration up to 3600s | how long a failed clone is reported before it is tried again (a failure's status write re-triggers the reconcile at once, and a tight clone loop helps nobody) |
///
/// ```
/// use std::collections::BTreeMap;
/// use std::time::Duration;
/// use banlieue_kit::settings::{Settings, TaskPacing};
///
/// let given = BTreeMap::from([("shutdownTimeout".to_string(), "2m".to_string())]);
/// let mut settings = Settings::new(&given);
/// let mut pacing = TaskPacing {
///     task_poll_interval: Duration::from_secs(1),
///     shutdown_timeout: Duration::from_secs(120),
///     failed_clone_backoff: Duration::from_secs(60),
/// };
/// pacing.read(&mut settings);
/// settings.finish().unwrap();
/// assert_eq!(pacing.shutdown_timeout, Duration::from_secs(120));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TaskPacing {
    /// `taskPollInterval`.
    pub task_poll_interval: Duration,
    /// `shutdownTimeout`.
    pub shutdown_timeout: Duration,
    /// `failedCloneBackoff`.
    pub failed_clone_backoff: Duration,
}

impl TaskPacing {
    /// The keys [`TaskPacing::read`] reads.
    pub const KEYS: [&'static str; 3] =
        ["taskPollInterval", "shutdownTimeout", "failedCloneBackoff"];

    /// Overwrites each field whose key is set (the values already there are the
    /// backend's defaults); a bad value is recorded in `settings`.
    pub fn read(&mut self, settings: &mut Settings<'_>) {
        settings.duration(
            "taskPollInterval",
            Zero::Refused,
            300,
            &mut self.task_poll_interval,
        );
        settings.duration(
            "shutdownTimeout",
            Zero::Allowed,
            86_400,
            &mut self.shutdown_timeout,
        );
        settings.duration(
            "failedCloneBackoff",
            Zero::Allowed,
            3600,
            &mut self.failed_clone_backoff,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn given(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn good_values_are_read_and_unset_ones_keep_their_defaults() {
        let given = given(&[("a", "250ms"), ("b", "0s"), ("c", "90"), ("on", "false")]);
        let mut s = Settings::new(&given);
        let (mut a, mut b, mut c, mut d) = (
            Duration::ZERO,
            Duration::MAX,
            Duration::ZERO,
            Duration::from_secs(7),
        );
        let mut on = true;
        s.duration("a", Zero::Refused, 300, &mut a);
        s.duration("b", Zero::Allowed, 300, &mut b);
        s.duration("c", Zero::Refused, 300, &mut c);
        s.duration("unset", Zero::Refused, 300, &mut d);
        s.flag("on", &mut on);
        s.finish().unwrap();
        assert_eq!(
            (a, b, c, d),
            (
                Duration::from_millis(250),
                Duration::ZERO,
                Duration::from_secs(90),
                Duration::from_secs(7)
            )
        );
        assert!(!on);
    }

    #[test]
    fn every_bad_value_is_named_in_one_error() {
        let given = given(&[
            ("zero", "0"),
            ("long", "301s"),
            ("word", "soon"),
            ("on", "yes"),
        ]);
        let mut s = Settings::new(&given);
        let mut slot = Duration::from_secs(1);
        let mut on = true;
        s.duration("zero", Zero::Refused, 300, &mut slot);
        s.duration("long", Zero::Allowed, 300, &mut slot);
        s.duration("word", Zero::Allowed, 300, &mut slot);
        s.flag("on", &mut on);
        s.bad("vlans: \"x\" is not a VLAN tag");
        let e = s.finish().unwrap_err();
        assert_eq!(e.reason, "InvalidSettings");
        for part in [
            "zero \"0\" is not a duration from 1ms to 300s",
            "long \"301s\" is not a duration up to 300s",
            "word \"soon\"",
            "on \"yes\" is not true or false",
            "vlans",
        ] {
            assert!(e.message.contains(part), "{part} in {}", e.message);
        }
        assert_eq!(
            slot,
            Duration::from_secs(1),
            "a bad value leaves the default"
        );
        assert!(on);
    }

    #[test]
    fn task_pacing_reads_its_three_keys_and_names_a_bad_one() {
        let defaults = TaskPacing {
            task_poll_interval: Duration::from_secs(2),
            shutdown_timeout: Duration::from_secs(120),
            failed_clone_backoff: Duration::from_secs(60),
        };
        let good = given(&[
            ("taskPollInterval", "250ms"),
            ("shutdownTimeout", "30"),
            ("failedCloneBackoff", "0s"),
        ]);
        let mut s = Settings::new(&good);
        let mut pacing = defaults;
        pacing.read(&mut s);
        s.finish().unwrap();
        assert_eq!(
            pacing,
            TaskPacing {
                task_poll_interval: Duration::from_millis(250),
                shutdown_timeout: Duration::from_secs(30),
                failed_clone_backoff: Duration::ZERO,
            }
        );
        let unset = given(&[]);
        let mut s = Settings::new(&unset);
        let mut pacing = defaults;
        pacing.read(&mut s);
        s.finish().unwrap();
        assert_eq!(pacing, defaults, "unset keys keep the backend's defaults");
        let bad = given(&[("taskPollInterval", "0"), ("shutdownTimeout", "2d")]);
        let mut s = Settings::new(&bad);
        let mut pacing = defaults;
        pacing.read(&mut s);
        let e = s.finish().unwrap_err();
        assert!(e.message.contains("taskPollInterval") && e.message.contains("shutdownTimeout"));
        assert_eq!(pacing, defaults);
    }
}
