//! Whether every shared store has listed once, as a flag reconciles can check or await.
//!
//! A reconcile that decides on an empty Provider cache would report "Provider not found"
//! for every machine while a new leader is still listing (seen in a rolling update of
//! the operator: Ready machines flipped to `ProviderNotFound` for a moment). Reconciles
//! that read the shared stores wait here first; the watches keep flowing meanwhile.

use tokio::sync::watch;

/// Set once, when the Provider, VMClass, VMImage and machine caches have all listed.
#[derive(Debug)]
pub(crate) struct StoresSynced(watch::Sender<bool>);

impl Default for StoresSynced {
    fn default() -> Self {
        Self(watch::Sender::new(false))
    }
}

impl StoresSynced {
    /// Whether the caches have listed (never goes back to false).
    pub(crate) fn is_synced(&self) -> bool {
        *self.0.borrow()
    }

    /// Marks the caches listed and wakes every waiter.
    pub(crate) fn mark(&self) {
        self.0.send_replace(true);
    }

    /// Returns once the caches have listed (at once if they have).
    pub(crate) async fn wait(&self) {
        let mut receiver = self.0.subscribe();
        // The sender lives in the Context, which outlives every reconcile.
        let _ = receiver.wait_for(|synced| *synced).await;
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::StoresSynced;

    #[tokio::test]
    async fn waiters_before_and_after_the_mark_all_return() {
        let synced = Arc::new(StoresSynced::default());
        assert!(!synced.is_synced());
        let early: Vec<_> = (0..3)
            .map(|_| {
                let synced = synced.clone();
                tokio::spawn(async move { synced.wait().await })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(
            early.iter().all(|w| !w.is_finished()),
            "a waiter returned before the caches listed"
        );
        synced.mark();
        for waiter in early {
            tokio::time::timeout(Duration::from_secs(1), waiter)
                .await
                .expect("a waiter was not woken")
                .unwrap();
        }
        assert!(synced.is_synced());
        tokio::time::timeout(Duration::from_secs(1), synced.wait())
            .await
            .expect("a late waiter did not return at once");
    }
}
