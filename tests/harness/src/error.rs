//! The error type of control-plane startup.

use std::path::PathBuf;
use std::time::Duration;

/// Why the control plane could not be started.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A control-plane binary is not installed where the harness looks for it.
    #[error(
        "banlieue-testenv: `{name}` not found (searched: {searched}).\n\
         Build the test binaries with `make testbin` and point KUBEBUILDER_ASSETS at the directory \
         it prints (the Makefile's test targets do both), or set TEST_ASSET_ETCD / \
         TEST_ASSET_KUBE_APISERVER."
    )]
    MissingBinary {
        /// The binary's name, e.g. `kube-apiserver`.
        name: String,
        /// Human-readable list of the places that were searched.
        searched: String,
    },

    /// A filesystem or process operation failed.
    #[error("banlieue-testenv: {context}: {source}")]
    Io {
        /// What the harness was doing.
        context: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },

    /// Generating a certificate or key failed.
    #[error("banlieue-testenv: generating certificates: {0}")]
    Certificate(#[from] rcgen::Error),

    /// A control-plane process exited while the harness waited for it to become ready.
    #[error("banlieue-testenv: {name} exited during startup ({status}); {log}")]
    Exited {
        /// The process's name.
        name: String,
        /// Its exit status.
        status: std::process::ExitStatus,
        /// The tail of its log (or a note that output was attached).
        log: String,
    },

    /// A component did not become ready in time.
    #[error(
        "banlieue-testenv: {what} not ready after {timeout:?} (last error: {last_error}; \
         raise KUBEBUILDER_CONTROLPLANE_START_TIMEOUT if the host is slow); {log}"
    )]
    Timeout {
        /// What was being waited for.
        what: String,
        /// The timeout that expired.
        timeout: Duration,
        /// The last probe error.
        last_error: String,
        /// The tail of the relevant log.
        log: String,
    },

    /// Loading the generated kubeconfig failed.
    #[error("banlieue-testenv: loading kubeconfig {path}: {source}")]
    Kubeconfig {
        /// The kubeconfig's path.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: kube::config::KubeconfigError,
    },

    /// A CRD did not become `Established`.
    #[error("banlieue-testenv: CRD {name}: {reason}")]
    CrdNotEstablished {
        /// The CRD's name.
        name: String,
        /// Why (timeout or watch error).
        reason: String,
    },

    /// A Kubernetes API call failed.
    #[error("banlieue-testenv: {context}: {source}")]
    Kube {
        /// What the harness was doing.
        context: String,
        /// The underlying error.
        #[source]
        source: kube::Error,
    },
}

impl Error {
    pub(crate) fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> Self {
        let context = context.into();
        move |source| Self::Io { context, source }
    }

    pub(crate) fn kube(context: impl Into<String>) -> impl FnOnce(kube::Error) -> Self {
        let context = context.into();
        move |source| Self::Kube { context, source }
    }
}
