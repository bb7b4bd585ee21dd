//! The next step of a `CopyDisk` move, decided from what the API objects and the copy
//! job show: nothing is remembered between reconciles but those, so a restarted
//! operator picks the move up where it was.

use crate::api::common::PowerState;

/// The machine the VM is moving away from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Source {
    /// Its `spec.powerState`.
    pub desired: PowerState,
    /// What its backend last reported.
    pub observed: Option<PowerState>,
    /// The VM generation whose copy failed, recorded on the source (see `job`).
    pub failed_at: Option<i64>,
}

/// The machine made on the copied disks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Target {
    /// Still annotated `banlieue.io/importing-disks`: its disks are not in place yet.
    pub importing: bool,
    /// Its `Ready` is `True`.
    pub ready: bool,
}

/// Whether both backends can move disks, and why not.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Transfer {
    Possible,
    /// A backend of the move cannot export or import disks (for good).
    Refused(String),
    /// A Provider of the move could not be reached to ask: not known yet.
    Unreachable(String),
}

/// Where the background copy of this VM is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Job {
    NotRunning,
    Running(String),
    Succeeded,
    Failed(String),
}

/// What a reconcile sees.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Facts {
    /// The live source; `None` once it is being deleted (or gone).
    pub source: Option<Source>,
    pub target: Option<Target>,
    pub transfer: Transfer,
    pub job: Job,
    pub generation: i64,
}

/// What to do now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// Refuse before anything is touched.
    Refuse(String),
    /// A Provider of the move is unreachable: touch nothing, ask again with backoff.
    RetryUnreachable(String),
    /// The copy failed for this generation: stay on the source until the spec changes.
    StayFailed,
    /// Set the source's `spec.powerState` to `PoweredOff`.
    StopSource,
    /// Wait for the backend to report the source off.
    WaitSourceStopped,
    /// Create the target machine, annotated as importing (its controller makes nothing).
    CreateTarget,
    /// (Re)start the copy job: export, convert, import.
    StartCopy,
    /// The job runs; its progress for the condition.
    Copying(String),
    /// The disks are in: drop the importing annotation, so the target is created on them.
    FinishImport,
    /// Undo: delete the target, power the source back as the VM wants, record the failure.
    Fail(String),
    /// Wait for the target to be Ready.
    WaitTarget,
    /// The target is Ready: delete the source.
    DeleteSource,
    /// The source is being deleted.
    WaitSourceGone,
}

/// The next step. Never both running: the target is created only once the source is
/// observed off, and the source is deleted only once the target is Ready.
pub(crate) fn next(facts: &Facts) -> Step {
    let Some(source) = &facts.source else {
        return Step::WaitSourceGone;
    };
    match facts.target {
        Some(Target {
            importing: false,
            ready,
        }) => {
            return if ready {
                Step::DeleteSource
            } else {
                Step::WaitTarget
            };
        }
        Some(Target {
            importing: true, ..
        }) => {
            return match &facts.job {
                Job::NotRunning => Step::StartCopy,
                Job::Running(progress) => Step::Copying(progress.clone()),
                Job::Succeeded => Step::FinishImport,
                Job::Failed(message) => Step::Fail(message.clone()),
            };
        }
        None => {}
    }
    if source.failed_at == Some(facts.generation) {
        return Step::StayFailed;
    }
    match &facts.transfer {
        Transfer::Refused(why) => return Step::Refuse(why.clone()),
        Transfer::Unreachable(why) => return Step::RetryUnreachable(why.clone()),
        Transfer::Possible => {}
    }
    if source.desired != PowerState::PoweredOff {
        return Step::StopSource;
    }
    if source.observed != Some(PowerState::PoweredOff) {
        return Step::WaitSourceStopped;
    }
    Step::CreateTarget
}

#[cfg(test)]
mod tests {
    use super::*;
    use PowerState::{PoweredOff as Off, PoweredOn as On};

    fn facts(source: Option<Source>, target: Option<Target>, job: Job) -> Facts {
        Facts {
            source,
            target,
            transfer: Transfer::Possible,
            job,
            generation: 3,
        }
    }
    fn src(desired: PowerState, observed: Option<PowerState>) -> Option<Source> {
        Some(Source {
            desired,
            observed,
            failed_at: None,
        })
    }
    const IMPORTING: Option<Target> = Some(Target {
        importing: true,
        ready: false,
    });

    #[test]
    fn a_move_walks_stop_copy_start_delete() {
        let running = Job::Running("Exporting 1 of 2 GiB".into());
        let cases: Vec<(Facts, Step)> = vec![
            (
                facts(src(On, Some(On)), None, Job::NotRunning),
                Step::StopSource,
            ),
            (
                facts(src(Off, Some(On)), None, Job::NotRunning),
                Step::WaitSourceStopped,
            ),
            (
                facts(src(Off, None), None, Job::NotRunning),
                Step::WaitSourceStopped,
            ),
            (
                facts(src(Off, Some(Off)), None, Job::NotRunning),
                Step::CreateTarget,
            ),
            (
                facts(src(Off, Some(Off)), IMPORTING, Job::NotRunning),
                Step::StartCopy,
            ),
            (
                facts(src(Off, Some(Off)), IMPORTING, running),
                Step::Copying("Exporting 1 of 2 GiB".into()),
            ),
            (
                facts(src(Off, Some(Off)), IMPORTING, Job::Succeeded),
                Step::FinishImport,
            ),
            (
                facts(src(Off, Some(Off)), IMPORTING, Job::Failed("full".into())),
                Step::Fail("full".into()),
            ),
            (
                facts(
                    src(Off, Some(Off)),
                    Some(Target {
                        importing: false,
                        ready: false,
                    }),
                    Job::NotRunning,
                ),
                Step::WaitTarget,
            ),
            (
                facts(
                    src(Off, Some(Off)),
                    Some(Target {
                        importing: false,
                        ready: true,
                    }),
                    Job::NotRunning,
                ),
                Step::DeleteSource,
            ),
            (
                facts(
                    None,
                    Some(Target {
                        importing: false,
                        ready: true,
                    }),
                    Job::NotRunning,
                ),
                Step::WaitSourceGone,
            ),
        ];
        for (facts, want) in cases {
            assert_eq!(next(&facts), want, "{facts:?}");
        }
    }

    #[test]
    fn a_refusal_comes_before_anything_is_touched_and_a_failure_stays() {
        let mut f = facts(src(On, Some(On)), None, Job::NotRunning);
        f.transfer = Transfer::Refused("proxmox cannot export disks".into());
        assert_eq!(
            next(&f),
            Step::Refuse("proxmox cannot export disks".into()),
            "not even the source is stopped"
        );
        let mut failed = facts(src(On, Some(On)), None, Job::NotRunning);
        failed.source.as_mut().unwrap().failed_at = Some(3);
        assert_eq!(next(&failed), Step::StayFailed);
        failed.generation = 4;
        assert_eq!(next(&failed), Step::StopSource, "a new spec tries again");
    }

    #[test]
    fn an_unreachable_provider_is_retried_not_refused() {
        let mut f = facts(src(On, Some(On)), None, Job::NotRunning);
        f.transfer = Transfer::Unreachable("pve: connection refused".into());
        assert_eq!(
            next(&f),
            Step::RetryUnreachable("pve: connection refused".into()),
            "not reported as unsupported, and nothing is touched"
        );
        // A copy that failed for this generation stays failed, reachable or not.
        f.source.as_mut().unwrap().failed_at = Some(3);
        assert_eq!(next(&f), Step::StayFailed);
        // Reachable again: the move goes on.
        f.source.as_mut().unwrap().failed_at = None;
        f.transfer = Transfer::Possible;
        assert_eq!(next(&f), Step::StopSource);
    }

    #[test]
    fn a_restarted_operator_resumes_a_copy_it_lost() {
        // The job lived in the dead process; the importing target says a copy was on.
        let f = facts(src(Off, Some(Off)), IMPORTING, Job::NotRunning);
        assert_eq!(next(&f), Step::StartCopy);
    }

    fn power() -> impl proptest::strategy::Strategy<Value = PowerState> {
        proptest::sample::select(vec![On, Off, PowerState::Suspended])
    }

    proptest::proptest! {
        /// Whatever the objects say: the target is made only from a stopped source,
        /// and the source deleted only for a Ready target made on its disks.
        #[test]
        fn never_both_running_never_the_source_deleted_first(
            live in proptest::bool::ANY,
            desired in power(),
            observed in proptest::option::of(power()),
            failed in proptest::option::of(0i64..5),
            target in proptest::option::of((proptest::bool::ANY, proptest::bool::ANY)),
            refused in 0u8..3,
            job in 0u8..4,
            generation in 0i64..5,
        ) {
            let facts = Facts {
                source: live.then_some(Source { desired, observed, failed_at: failed }),
                target: target.map(|(importing, ready)| Target { importing, ready }),
                transfer: match refused {
                    0 => Transfer::Possible,
                    1 => Transfer::Refused("no".into()),
                    _ => Transfer::Unreachable("down".into()),
                },
                job: match job {
                    0 => Job::NotRunning,
                    1 => Job::Running("x".into()),
                    2 => Job::Succeeded,
                    _ => Job::Failed("x".into()),
                },
                generation,
            };
            match next(&facts) {
                Step::CreateTarget => {
                    proptest::prop_assert_eq!(desired, Off);
                    proptest::prop_assert_eq!(observed, Some(Off));
                    proptest::prop_assert!(refused == 0 && facts.target.is_none());
                }
                Step::DeleteSource => proptest::prop_assert_eq!(
                    facts.target,
                    Some(Target { importing: false, ready: true })
                ),
                Step::StartCopy | Step::FinishImport | Step::Copying(_) | Step::Fail(_) => {
                    proptest::prop_assert!(facts.target.is_some_and(|t| t.importing));
                }
                Step::StopSource | Step::Refuse(_) | Step::RetryUnreachable(_) | Step::StayFailed => {
                    proptest::prop_assert!(facts.target.is_none());
                }
                Step::WaitSourceStopped | Step::WaitTarget | Step::WaitSourceGone => {}
            }
        }
    }
}
