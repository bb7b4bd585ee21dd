//! Backend errors, classified so controllers know whether to retry.

use std::time::Duration;

/// Reason of [`BackendError::machine_missing`].
pub const BACKEND_VM_MISSING: &str = "BackendVMMissing";

/// Whether retrying can help.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorClass {
    /// Retry with backoff: timeouts, 5xx, connection resets, expired sessions, locks.
    Transient,
    /// Retrying the same request cannot help until something changes: bad
    /// credentials, a missing template, an invalid spec, quota. Surfaced as a condition.
    Terminal,
}

/// An error from a backend, with a CamelCase reason for conditions and the backend's
/// own message. Messages must never contain credentials.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{reason}: {message}")]
pub struct BackendError {
    /// Transient or terminal.
    pub class: ErrorClass,
    /// CamelCase reason, e.g. `Unreachable`, `Unauthorized`, `TemplateNotFound`.
    pub reason: String,
    /// Human-readable detail, usually the backend's own words.
    pub message: String,
    /// For transient errors: when the backend asked to be retried (e.g. `Retry-After`).
    pub retry_after: Option<Duration>,
}

impl BackendError {
    /// A transient error: the controller retries with backoff.
    pub fn transient(reason: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            class: ErrorClass::Transient,
            reason: reason.into(),
            message: message.into(),
            retry_after: None,
        }
    }

    /// A terminal error: the controller records it and waits for a change.
    pub fn terminal(reason: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            class: ErrorClass::Terminal,
            reason: reason.into(),
            message: message.into(),
            retry_after: None,
        }
    }

    /// The terminal error of a machine whose `spec.providerID` is set but that no
    /// machine on the backend answers to (reason [`BACKEND_VM_MISSING`]). Backends
    /// return it instead of creating a machine: the object was moved, restored or
    /// re-created from one whose VM is gone or lives on another backend, and a second
    /// VM under the old provider ID would only hide that. `looked` says where it was
    /// looked for.
    pub fn machine_missing(provider_id: &str, looked: impl std::fmt::Display) -> Self {
        Self::terminal(
            BACKEND_VM_MISSING,
            format!(
                "no machine with provider ID {provider_id} on {looked}; banlieue does not \
                 create a second one under that ID (was it deleted out of band, or does the \
                 machine point at the wrong Provider?). Delete this object to let its owner \
                 replace it, or restore the VM"
            ),
        )
    }

    /// Asks for a retry no sooner than `after`.
    pub fn retry_after(mut self, after: Duration) -> Self {
        self.retry_after = Some(after);
        self
    }

    /// True for [`ErrorClass::Transient`].
    pub fn is_transient(&self) -> bool {
        self.class == ErrorClass::Transient
    }
}
