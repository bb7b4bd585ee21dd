//! Shared watches: one watch and one cache per kind, fanned out to the controllers that
//! react to it.
//!
//! Infra machines are read by three parties: their own controller, the VirtualMachine
//! controller (which owns them) and every reconciler that looks one up by name. With a
//! watch each, every change was decoded three times and cached twice, and the
//! VirtualMachine controller was woken by one watch while reading another: it could
//! see the event before the cache it reads had it, and then apply or delete the
//! machine a second time (the scale benchmark counted a fifth of a write per VM).
//! Here a subscriber is sent an object only after the store holds it.
//!
//! kube-runtime's own shared streams (`unstable-runtime-subscribe`) do not pass deletions
//! on, which an owner needs to hear of, so this is a few lines of our own (ADR 0012).

use futures::{Stream, StreamExt};
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::store::Writer;
use kube::runtime::watcher::{self, Event, watcher};

use super::watch::Watched;
use tokio::sync::{mpsc, oneshot};

/// How many objects a subscriber may lag behind before the watch waits for it.
const BUFFER: usize = 1024;

/// What a subscriber hears about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Hears {
    /// Objects listed, added and changed (a controller of the kind itself).
    Applied,
    /// Deletions too (an owner's controller, woken when its child is gone).
    Touched,
    /// Deletions only (the last state of each object deleted).
    Deleted,
}

/// The sending end a shared watch keeps for one subscriber.
pub(crate) struct Subscriber<K> {
    hears: Hears,
    sender: mpsc::Sender<Sighting<K>>,
}

/// An object a subscriber hears of.
struct Sighting<K> {
    object: K,
    /// Brought by a live watch event, not by a (re)list.
    live: bool,
}

/// A subscription: the receiving end, as a controller trigger stream.
pub(crate) struct Subscription<K> {
    receiver: mpsc::Receiver<Sighting<K>>,
}

/// A new subscriber and its subscription.
pub(crate) fn subscribe<K>(hears: Hears) -> (Subscriber<K>, Subscription<K>) {
    let (sender, receiver) = mpsc::channel(BUFFER);
    (Subscriber { hears, sender }, Subscription { receiver })
}

impl<K: Send + 'static> Subscription<K> {
    /// The objects, in the shape kube's `Controller::for_stream` and `owns_stream` take.
    pub fn into_stream(self) -> impl Stream<Item = Result<K, watcher::Error>> + Send + 'static {
        self.into_stream_skipping(|_| false)
    }

    /// The objects less those a live event brought that `skip` drops (a (re)listed
    /// object is never skipped: it may stand for changes whose events were missed).
    pub fn into_stream_skipping(
        self,
        skip: impl Fn(&K) -> bool + Send + 'static,
    ) -> impl Stream<Item = Result<K, watcher::Error>> + Send + 'static {
        futures::stream::unfold((self.receiver, skip), |(mut receiver, skip)| async move {
            loop {
                let seen = receiver.recv().await?;
                if seen.live && skip(&seen.object) {
                    continue;
                }
                return Some((Ok(seen.object), (receiver, skip)));
            }
        })
    }
}

/// Watches `api`, keeps `writer`'s store without `managedFields`, and passes every
/// object on to `subscribers` once the store has it. `synced` is told when the first
/// list is in the store. Runs until the watch ends (never, on its own: errors back off
/// and retry). A subscriber that went away is skipped. `observe` sees each event once
/// the store has it, before any subscriber (an index kept beside the cache).
///
/// `synced` exists because the store's own `wait_until_ready` wakes only one waiter
/// (kube-runtime keeps one waker), and the kind's controller already waits on it.
pub(crate) async fn run<K: Watched>(
    api: Api<K>,
    config: watcher::Config,
    writer: Writer<K>,
    subscribers: Vec<Subscriber<K>>,
    synced: oneshot::Sender<()>,
    observe: impl Fn(&Event<K>) + Sync,
) {
    let subscribers = &subscribers;
    let observe = &observe;
    let synced = &std::sync::Mutex::new(Some(synced));
    watcher(api, config)
        .backoff(super::watch::backoff())
        .modify(super::watch::strip_managed_fields)
        .reflect(writer)
        .for_each(|event| async move {
            if let Ok(event) = &event {
                observe(event);
            }
            let (object, deleted, live) = match event {
                Ok(Event::Apply(object)) => (object, false, true),
                Ok(Event::InitApply(object)) => (object, false, false),
                Ok(Event::Delete(object)) => (object, true, true),
                Ok(Event::InitDone) => {
                    if let Some(synced) = synced.lock().ok().and_then(|mut s| s.take()) {
                        let _ = synced.send(());
                    }
                    return;
                }
                Ok(Event::Init) => return,
                Err(error) => {
                    tracing::warn!(%error, kind = %K::kind(&()), "watch error");
                    return;
                }
            };
            for subscriber in subscribers {
                let hears = match subscriber.hears {
                    Hears::Applied => !deleted,
                    Hears::Touched => true,
                    Hears::Deleted => deleted,
                };
                if !hears {
                    continue;
                }
                let seen = Sighting {
                    object: object.clone(),
                    live,
                };
                if subscriber.sender.send(seen).await.is_err() {
                    tracing::debug!(kind = %K::kind(&()), name = %object.name_any(), "subscriber gone");
                }
            }
        })
        .await;
}

/// The three subscriptions to one infra machine kind's shared watch.
pub(crate) struct MachineFeeds<K> {
    /// For the kind's own controller.
    pub controller: Subscription<K>,
    /// For the VirtualMachine controller, which owns them.
    pub owner: Subscription<K>,
    /// For the sweep of machines that vanished without their cleanup
    /// (`machine::orphan::sweep`).
    pub deleted: Subscription<K>,
}

/// The subscribers of one infra machine kind's shared watch, and their subscriptions.
pub(crate) fn machine_feeds<K>() -> (Vec<Subscriber<K>>, MachineFeeds<K>) {
    let (to_controller, controller) = subscribe(Hears::Applied);
    let (to_owner, owner) = subscribe(Hears::Touched);
    let (to_sweep, deleted) = subscribe(Hears::Deleted);
    (
        vec![to_controller, to_owner, to_sweep],
        MachineFeeds {
            controller,
            owner,
            deleted,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn subscriptions_end_when_the_watch_drops_its_senders() {
        let (subscriber, subscription) = subscribe::<String>(Hears::Touched);
        subscriber.sender.send(sighting("a", true)).await.unwrap();
        drop(subscriber);
        let seen: Vec<_> = subscription
            .into_stream()
            .map(|r| r.expect("no errors"))
            .collect()
            .await;
        assert_eq!(seen, vec!["a".to_owned()]);
    }

    fn sighting(object: &str, live: bool) -> Sighting<String> {
        Sighting {
            object: object.to_owned(),
            live,
        }
    }

    #[tokio::test]
    async fn only_live_events_are_skipped() {
        let (subscriber, subscription) = subscribe::<String>(Hears::Applied);
        for (object, live) in [("echo", true), ("echo", false), ("change", true)] {
            subscriber
                .sender
                .send(sighting(object, live))
                .await
                .unwrap();
        }
        drop(subscriber);
        let seen: Vec<_> = subscription
            .into_stream_skipping(|o| o == "echo")
            .map(|r| r.expect("no errors"))
            .collect()
            .await;
        assert_eq!(
            seen,
            vec!["echo".to_owned(), "change".to_owned()],
            "the listed echo passes, the live one does not"
        );
    }
}
