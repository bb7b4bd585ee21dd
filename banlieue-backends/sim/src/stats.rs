//! Per-world call and fault counters.

use std::sync::atomic::AtomicU64;

/// Counters of one simulated hypervisor, for benchmarks (see [`crate::SimFactory::stats`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SimStats {
    /// `check()` calls.
    pub check: u64,
    /// `find_image()` calls.
    pub find_image: u64,
    /// `ensure()` calls.
    pub ensure: u64,
    /// `observe()` calls.
    pub observe: u64,
    /// `delete()` calls.
    pub delete: u64,
    /// `apply_changes` calls.
    pub apply_changes: u64,
    /// Calls failed with an injected transient fault.
    pub transient_faults: u64,
    /// Calls failed with an injected terminal fault.
    pub terminal_faults: u64,
    /// Calls slowed down by an injected `slow` fault.
    pub slow_faults: u64,
    /// Machines whose creation started.
    pub machines_created: u64,
    /// Machines removed (deletion completed, or removed out of band).
    pub machines_deleted: u64,
    /// Machines that exist now (including those being created or deleted).
    pub machines: u64,
    /// The most machines being created at once: from the `ensure` that started each
    /// until its creation completed (`latency` later). A machine deleted while being
    /// created still counts until then.
    pub creating_peak: u64,
}

impl SimStats {
    /// Every backend call counted: `check + find_image + ensure + observe + delete`.
    pub fn calls(&self) -> u64 {
        self.check + self.find_image + self.ensure + self.observe + self.delete + self.apply_changes
    }
}

/// One backend call, recorded when the Provider sets `recordCalls: "true"` (for tests
/// that check retry spacing; see [`crate::SimFactory::calls`]).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct SimCall {
    /// When the call arrived ([`tokio::time::Instant`]).
    pub at: tokio::time::Instant,
    /// Which call, named as in the `failureCalls` setting (`ensure`, `findImage`, ...).
    pub call: &'static str,
    /// The machine it was about (`None` for `check` and `findImage`).
    pub uid: Option<String>,
    /// Whether an injected fault failed it.
    pub failed: bool,
}

/// Which counter a call increments.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Call {
    Check,
    FindImage,
    Ensure,
    Observe,
    Delete,
    ApplyChanges,
}

impl Call {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Check => "check",
            Self::FindImage => "find_image",
            Self::Ensure => "ensure",
            Self::Observe => "observe",
            Self::Delete => "delete",
            Self::ApplyChanges => "apply_changes",
        }
    }

    /// The name the `failureCalls` setting uses.
    pub(crate) fn setting_name(self) -> &'static str {
        match self {
            Self::FindImage => "findImage",
            Self::ApplyChanges => "applyChanges",
            other => other.name(),
        }
    }
}

/// Which fault counter an injected fault increments.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FaultCounter {
    Transient,
    Terminal,
    Slow,
}

#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) calls: [AtomicU64; 6],
    pub(crate) faults: [AtomicU64; 3],
}
