//! Why and when the controllers stop: SIGTERM/SIGINT, lost leadership, or the
//! controllers ending on their own. The first reason wins.

use std::future::Future;
use std::sync::Arc;

use tokio::sync::watch;

/// Why the process is stopping.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// SIGTERM or SIGINT: drain, release the Lease, exit 0.
    Signal(&'static str),
    /// Another replica holds the Lease now, or it could not be renewed: exit non-zero at once.
    LeadershipLost(String),
    /// The controllers returned (or panicked) without being asked to.
    ControllersExited(String),
}

impl std::fmt::Display for StopReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Signal(name) => write!(f, "received {name}"),
            Self::LeadershipLost(why) => write!(f, "leader election lost: {why}"),
            Self::ControllersExited(why) => {
                write!(f, "the controllers stopped unexpectedly: {why}")
            }
        }
    }
}

/// A one-shot, clonable stop trigger.
#[derive(Clone, Debug)]
pub struct Stop(Arc<watch::Sender<Option<StopReason>>>);

impl Default for Stop {
    fn default() -> Self {
        Self(Arc::new(watch::Sender::new(None)))
    }
}

impl Stop {
    /// Asks everything to stop; later reasons are ignored.
    pub fn trigger(&self, reason: StopReason) {
        self.0.send_if_modified(|current| {
            if current.is_some() {
                return false;
            }
            *current = Some(reason);
            true
        });
    }

    /// The reason, once triggered.
    pub fn reason(&self) -> Option<StopReason> {
        self.0.borrow().clone()
    }

    /// Completes once triggered (what `controllers::run` gets as its shutdown future).
    pub fn wait(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut receiver = self.0.subscribe();
        async move {
            // The sender lives as long as any `Stop`, which outlives this future's users.
            let _ = receiver.wait_for(Option::is_some).await;
        }
    }
}

/// Triggers `stop` on the first SIGTERM or SIGINT; a second one exits at once.
pub fn on_signals(stop: Stop) -> crate::Result<()> {
    #[cfg(unix)]
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(crate::Error::Signals)?;
    tokio::spawn(async move {
        for round in 0.. {
            #[cfg(unix)]
            let name = tokio::select! {
                _ = term.recv() => "SIGTERM",
                _ = tokio::signal::ctrl_c() => "SIGINT",
            };
            #[cfg(not(unix))]
            let name = {
                let _ = tokio::signal::ctrl_c().await;
                "SIGINT"
            };
            if round == 0 {
                stop.trigger(StopReason::Signal(name));
            } else {
                tracing::warn!(signal = name, "second signal: exiting without waiting");
                std::process::exit(1);
            }
        }
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_first_reason_wins_and_wakes_waiters() {
        let stop = Stop::default();
        let waiter = tokio::spawn(stop.wait());
        assert_eq!(stop.reason(), None);
        stop.trigger(StopReason::Signal("SIGTERM"));
        stop.trigger(StopReason::LeadershipLost("x".into()));
        waiter.await.unwrap();
        assert_eq!(stop.reason(), Some(StopReason::Signal("SIGTERM")));
        // Waiting after the fact completes at once.
        stop.wait().await;
    }
}
