//! Shared reads: many reconciles that each need a listing taken after they asked (a
//! Proxmox `/cluster/resources`, say) get one request between them.
//!
//! A caller joins the round that is still gathering, or opens one. A round gathers for
//! a short window, then sends its one request; whoever arrives after that waits for the
//! next round. So every caller gets an answer to a request sent after it asked — what
//! it would have got reading alone, never an older listing that could hide a VM made
//! since (and so start a second one) — at the cost of the window's latency.

use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use banlieue_sdk::backend::BackendError;
use tokio::sync::watch;

type Answer<T> = Option<Result<Arc<T>, BackendError>>;

/// One request for every caller of a gathering window. See the module docs.
#[derive(Debug)]
pub struct SharedRead<T> {
    gather: Duration,
    gathering: Mutex<Option<(u64, watch::Receiver<Answer<T>>)>>,
    rounds: Mutex<u64>,
}

enum Role<T> {
    Join(watch::Receiver<Answer<T>>),
    Lead(u64, watch::Sender<Answer<T>>),
}

impl<T> SharedRead<T> {
    /// Rounds that gather callers for `gather` before their request.
    pub fn new(gather: Duration) -> Self {
        Self {
            gather,
            gathering: Mutex::new(None),
            rounds: Mutex::new(0),
        }
    }

    /// How many rounds have sent their request (for tests and metrics).
    pub fn rounds(&self) -> u64 {
        *self.rounds.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The answer of a request `fetch` sends after this call began, shared with the
    /// other callers of the same round. When the round's leader is cancelled, its
    /// followers read alone.
    pub async fn read<F, Fut>(&self, fetch: F) -> Result<Arc<T>, BackendError>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, BackendError>>,
    {
        let role = {
            let mut gathering = self
                .gathering
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            match gathering.as_ref() {
                // A leader that was cancelled dropped its sender: its round is dead.
                Some((_, rx)) if rx.has_changed().is_ok() => Role::Join(rx.clone()),
                _ => {
                    let id = {
                        let mut rounds = self.rounds.lock().unwrap_or_else(PoisonError::into_inner);
                        *rounds += 1;
                        *rounds
                    };
                    let (tx, rx) = watch::channel(None);
                    *gathering = Some((id, rx));
                    Role::Lead(id, tx)
                }
            }
        };
        match role {
            Role::Join(mut rx) => {
                if let Ok(answer) = rx.wait_for(Option::is_some).await
                    && let Some(answer) = answer.clone()
                {
                    return answer;
                }
                fetch().await.map(Arc::new)
            }
            Role::Lead(id, tx) => {
                tokio::time::sleep(self.gather).await;
                {
                    let mut gathering = self
                        .gathering
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner);
                    if gathering.as_ref().is_some_and(|(open, _)| *open == id) {
                        *gathering = None;
                    }
                }
                let answer = fetch().await.map(Arc::new);
                // No one may be listening: that is fine.
                let _ = tx.send(Some(answer.clone()));
                answer
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[tokio::test(start_paused = true)]
    async fn callers_of_one_window_share_one_request() {
        let shared = Arc::new(SharedRead::<u32>::new(Duration::from_millis(20)));
        let sent = Arc::new(AtomicU32::new(0));
        let mut callers = Vec::new();
        for _ in 0..10 {
            let (shared, sent) = (shared.clone(), sent.clone());
            callers.push(tokio::spawn(async move {
                shared
                    .read(|| async move { Ok(sent.fetch_add(1, Ordering::SeqCst) + 1) })
                    .await
            }));
        }
        for c in callers {
            assert_eq!(*c.await.unwrap().unwrap(), 1);
        }
        assert_eq!(sent.load(Ordering::SeqCst), 1);
        assert_eq!(shared.rounds(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_caller_after_the_request_left_gets_a_newer_one() {
        let shared = Arc::new(SharedRead::<u32>::new(Duration::from_millis(20)));
        let sent = Arc::new(AtomicU32::new(0));
        let (started_tx, started_rx) = tokio::sync::oneshot::channel::<()>();
        let (release_tx, release_rx) = tokio::sync::oneshot::channel::<()>();
        let first = {
            let (shared, sent) = (shared.clone(), sent.clone());
            tokio::spawn(async move {
                shared
                    .read(|| async move {
                        let n = sent.fetch_add(1, Ordering::SeqCst) + 1;
                        started_tx.send(()).unwrap();
                        release_rx.await.unwrap();
                        Ok(n)
                    })
                    .await
            })
        };
        // The first round's request is out; this caller must not share it.
        started_rx.await.unwrap();
        let second = {
            let (shared, sent) = (shared.clone(), sent.clone());
            tokio::spawn(async move {
                shared
                    .read(|| async move { Ok(sent.fetch_add(1, Ordering::SeqCst) + 1) })
                    .await
            })
        };
        release_tx.send(()).unwrap();
        assert_eq!(*first.await.unwrap().unwrap(), 1);
        assert_eq!(*second.await.unwrap().unwrap(), 2);
        assert_eq!(shared.rounds(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn errors_are_shared_and_a_cancelled_leader_strands_no_one() {
        let shared = Arc::new(SharedRead::<u32>::new(Duration::from_millis(20)));
        let failing = {
            let shared = shared.clone();
            tokio::spawn(async move {
                shared
                    .read(|| async { Err(BackendError::transient("Unreachable", "down")) })
                    .await
            })
        };
        let follower = {
            let shared = shared.clone();
            tokio::spawn(async move { shared.read(|| async { Ok(7) }).await })
        };
        assert_eq!(failing.await.unwrap().unwrap_err().reason, "Unreachable");
        assert_eq!(follower.await.unwrap().unwrap_err().reason, "Unreachable");

        // A leader dropped while gathering: its follower reads alone, and the next
        // caller opens a new round instead of joining the dead one.
        let leader = {
            let shared = shared.clone();
            tokio::spawn(async move { shared.read(|| async { Ok(1) }).await })
        };
        tokio::task::yield_now().await;
        let follower = {
            let shared = shared.clone();
            tokio::spawn(async move { shared.read(|| async { Ok(2) }).await })
        };
        tokio::task::yield_now().await;
        leader.abort();
        assert_eq!(*follower.await.unwrap().unwrap(), 2);
        assert_eq!(*shared.read(|| async { Ok(3) }).await.unwrap(), 3);
    }
}
