//! What a run found: one line per check.

use std::fmt;

/// How one check ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// It did what the trait asks; what was seen, for the record.
    Passed(String),
    /// It did not; what was seen instead.
    Failed(String),
    /// The check could not be run against this target, and why (a target that cannot
    /// make an outage, a change its spec cannot express). Never a pass:
    /// [`Report::assert_complete`] fails on it.
    NotExercised(String),
}

/// One check and how it ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Check {
    /// What was checked, e.g. `change memoryMiB grow`.
    pub name: String,
    /// How it ended.
    pub outcome: Outcome,
}

/// Every check of one run against one target, in the order they ran.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Report {
    /// The target's name.
    pub target: String,
    /// The checks.
    pub checks: Vec<Check>,
}

impl Report {
    pub(crate) fn new(target: String) -> Self {
        Self {
            target,
            checks: Vec::new(),
        }
    }

    pub(crate) fn record(&mut self, name: impl Into<String>, outcome: Outcome) {
        let check = Check {
            name: name.into(),
            outcome,
        };
        // Printed as it happens: a run against a slow lab shows where it is.
        eprintln!("conformance [{}] {check}", self.target);
        self.checks.push(check);
    }

    pub(crate) fn result(&mut self, name: impl Into<String>, result: Result<String, String>) {
        self.record(
            name,
            match result {
                Ok(seen) => Outcome::Passed(seen),
                Err(why) => Outcome::Failed(why),
            },
        );
    }

    /// The checks that failed.
    pub fn failed(&self) -> impl Iterator<Item = &Check> {
        self.checks
            .iter()
            .filter(|c| matches!(c.outcome, Outcome::Failed(_)))
    }

    /// The checks that could not be run against this target.
    pub fn not_exercised(&self) -> impl Iterator<Item = &Check> {
        self.checks
            .iter()
            .filter(|c| matches!(c.outcome, Outcome::NotExercised(_)))
    }

    /// The check named `name`, if it ran.
    pub fn check(&self, name: &str) -> Option<&Check> {
        self.checks.iter().find(|c| c.name == name)
    }

    /// Panics, printing the whole report, when a check failed. Checks that were not
    /// exercised are printed loudly but do not fail: for an out-of-tree backend whose
    /// lab cannot, say, make an outage. In-tree targets use
    /// [`Report::assert_complete`].
    pub fn assert_passed(&self) {
        let unexercised = self.not_exercised().count();
        if unexercised > 0 {
            eprintln!(
                "conformance [{}]: {unexercised} check(s) NOT EXERCISED, see the report",
                self.target
            );
        }
        if self.failed().next().is_some() {
            panic!("the backend does not conform:\n{self}");
        }
    }

    /// Panics, printing the whole report, unless every check ran and passed.
    pub fn assert_complete(&self) {
        self.assert_passed();
        if self.not_exercised().next().is_some() {
            panic!("the conformance run is incomplete:\n{self}");
        }
    }
}

impl fmt::Display for Check {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (word, text) = match &self.outcome {
            Outcome::Passed(t) => ("ok", t),
            Outcome::Failed(t) => ("FAILED", t),
            Outcome::NotExercised(t) => ("NOT EXERCISED", t),
        };
        write!(f, "{:<40} {word}: {text}", self.name)
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let passed = self
            .checks
            .iter()
            .filter(|c| matches!(c.outcome, Outcome::Passed(_)))
            .count();
        writeln!(
            f,
            "conformance of {}: {passed} of {} checks passed",
            self.target,
            self.checks.len()
        )?;
        for check in &self.checks {
            writeln!(f, "  {check}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(outcomes: Vec<Outcome>) -> Report {
        Report {
            target: "t".into(),
            checks: outcomes
                .into_iter()
                .enumerate()
                .map(|(i, outcome)| Check {
                    name: format!("c{i}"),
                    outcome,
                })
                .collect(),
        }
    }

    #[test]
    fn a_failure_fails_and_an_unexercised_check_fails_only_completeness() {
        let ok = report(vec![Outcome::Passed("a".into())]);
        ok.assert_complete();
        let gap = report(vec![Outcome::NotExercised("no outage".into())]);
        gap.assert_passed();
        assert!(std::panic::catch_unwind(|| gap.assert_complete()).is_err());
        let bad = report(vec![Outcome::Failed("b".into())]);
        assert!(std::panic::catch_unwind(|| bad.assert_passed()).is_err());
    }
}
