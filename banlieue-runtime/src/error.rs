//! The runtime's one error type: why the process could not start, or stopped on its
//! own. An embedder matches on it (a taken port, a missing kubeconfig, lost
//! leadership) instead of parsing a message.

use std::net::SocketAddr;

/// Why the operator process could not start, or stopped on its own.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// No kubeconfig could be read or inferred, or the client could not be built.
    #[error("{what}: {source}")]
    Client {
        /// What was being done (e.g. `reading kubeconfig /path`).
        what: String,
        /// The underlying failure.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A server (probes, metrics and diagnostics) could not listen on its address.
    #[error("binding the {server} server to {addr}: {source}")]
    Listen {
        /// Which server.
        server: &'static str,
        /// The address asked for.
        addr: SocketAddr,
        /// The underlying failure.
        #[source]
        source: std::io::Error,
    },
    /// The diagnostics server's TLS could not be set up.
    #[error("{what}: {message}")]
    Tls {
        /// What was being done.
        what: &'static str,
        /// The underlying failure, in words.
        message: String,
    },
    /// The logger could not be installed (bad filter directives, or a global logger
    /// already installed).
    #[error("{0}")]
    Logging(String),
    /// Leader election is misconfigured, or its Lease could not be prepared.
    #[error("leader election: {0}")]
    Leader(String),
    /// The SIGTERM/SIGINT handlers could not be installed.
    #[error("installing the signal handlers: {0}")]
    Signals(#[source] std::io::Error),
    /// The process stopped on its own (leadership lost, the controllers ended): it
    /// exits non-zero so that its pod restarts cleanly.
    #[error("{0}")]
    Stopped(crate::shutdown::StopReason),
}

impl Error {
    pub(crate) fn client(
        what: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        Self::Client {
            what: what.into(),
            source: Box::new(source),
        }
    }
}

/// The runtime's result.
pub type Result<T, E = Error> = std::result::Result<T, E>;
