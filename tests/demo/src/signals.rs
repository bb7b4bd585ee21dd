//! SIGINT (Ctrl-C), SIGTERM and SIGHUP, turned into a future.
//!
//! Installed before anything starts: from then on these signals no longer kill the demo
//! but ask it to tear down in order (operator, then control plane).

use tokio::signal::unix::{Signal, SignalKind, signal};

/// The signals that stop the demo.
#[derive(Debug)]
pub struct Signals {
    interrupt: Signal,
    terminate: Signal,
    hangup: Signal,
}

impl Signals {
    /// Starts listening (needs a Tokio runtime).
    ///
    /// # Errors
    /// If a signal handler cannot be installed.
    pub fn install() -> std::io::Result<Self> {
        Ok(Self {
            interrupt: signal(SignalKind::interrupt())?,
            terminate: signal(SignalKind::terminate())?,
            hangup: signal(SignalKind::hangup())?,
        })
    }

    /// Completes with the signal's name at the next signal. Cancel-safe.
    pub async fn recv(&mut self) -> &'static str {
        tokio::select! {
            _ = self.interrupt.recv() => "SIGINT",
            _ = self.terminate.recv() => "SIGTERM",
            _ = self.hangup.recv() => "SIGHUP",
        }
    }
}
