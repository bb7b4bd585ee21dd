//! Scoping helpers: which namespace and labels the controllers watch.

use kube::api::Api;
use std::time::Duration;

use futures::StreamExt;
use kube::runtime::controller::Controller;
use kube::runtime::reflector;
use kube::runtime::utils::{Backoff, ResetTimerBackoff};
use kube::runtime::watcher::{self, ExponentialBackoff};
use kube::runtime::{WatchStreamExt, watcher::watcher};
use kube::{Client, Resource};
use serde::de::DeserializeOwned;

use super::Settings;

/// The label CAPI's `--watch-filter` selects on.
pub(crate) const WATCH_FILTER_LABEL: &str = "cluster.x-k8s.io/watch-filter";

/// An `Api` over the watched namespace (or all namespaces).
pub(crate) fn namespaced<K>(client: &Client, settings: &Settings) -> Api<K>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug,
{
    match &settings.namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// Watcher config for objects the watch filter applies to.
pub(crate) fn filtered(settings: &Settings) -> watcher::Config {
    let config = watcher::Config::default().any_semantic();
    match &settings.watch_filter {
        Some(value) => config.labels(&format!("{WATCH_FILTER_LABEL}={value}")),
        None => config,
    }
}

/// Watcher config for supporting objects (Providers, classes, images, Secrets).
pub(crate) fn unfiltered() -> watcher::Config {
    watcher::Config::default().any_semantic()
}

/// Backoff after a watch error, for every controller's trigger stream and every shared
/// reflector.
///
/// kube-runtime pauses *all* of a controller's watches while it backs off one error,
/// and its default (0.8 s doubling to 30 s, plus up to 100 % jitter, reset only after
/// 120 s without errors) adds up over the errors one apiserver restart produces
/// (refused connections, then `410 Gone` on every watch): in the restart test the
/// operator stayed blind for minutes. This policy never retries sooner than 200 ms
/// (no hot loop against a struggling apiserver), caps one wait at 3 s (6 s with
/// jitter), and forgets after 15 s of health.
pub(crate) fn backoff() -> impl Backoff + 'static {
    let builder = backon::ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(200))
        .with_max_delay(Duration::from_secs(3))
        .with_factor(2.0)
        .with_jitter()
        .without_max_times();
    ResetTimerBackoff::new(ExponentialBackoff::from(builder), Duration::from_secs(15))
}

/// What a watch, its cache and a controller need of a kind.
pub(crate) trait Watched:
    Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static
{
}

impl<K> Watched for K where
    K: Resource<DynamicType = ()>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static
{
}

/// A controller for `api`'s objects whose cache holds them without `managedFields`.
///
/// Objects applied with server-side apply carry their field managers' sets, which the
/// scale benchmark measured at about 85 % of a cached infra machine (16 KB of 19 KB);
/// nothing in banlieue reads them from a cache. `Controller::new` offers no hook into
/// its watch, so this builds the reflector itself (ADR 0011). Watch errors back off
/// with [`backoff`].
pub(crate) fn controller<K: Watched>(api: Api<K>, config: watcher::Config) -> Controller<K> {
    controller_skipping(api, config, |_| false)
}

/// [`controller`], not woken by the live events `skip` drops (the echoes of our own
/// writes, see [`super::echoes`]); a (re)listed object always wakes it. The cache has
/// every event either way: `skip` sees an object after the store took it.
pub(crate) fn controller_skipping<K: Watched>(
    api: Api<K>,
    config: watcher::Config,
    skip: impl Fn(&K) -> bool + Send + 'static,
) -> Controller<K> {
    let (reader, writer) = reflector::store();
    let objects = watcher(api, config)
        .modify(strip_managed_fields)
        .reflect(writer)
        .filter_map(move |event| std::future::ready(trigger(event, &skip)));
    Controller::for_stream(objects, reader).trigger_backoff(backoff())
}

/// What one watch event wakes: the object, for an add, change or listing that `skip`
/// lets through (as kube's `applied_objects`, less the skipped); errors pass on.
fn trigger<K, E>(
    event: Result<watcher::Event<K>, E>,
    skip: impl Fn(&K) -> bool,
) -> Option<Result<K, E>> {
    match event {
        Ok(watcher::Event::Apply(object)) if skip(&object) => None,
        Ok(watcher::Event::Apply(object) | watcher::Event::InitApply(object)) => Some(Ok(object)),
        Ok(_) => None,
        Err(error) => Some(Err(error)),
    }
}

/// Drops what no cache reader needs (see [`controller`]).
pub(crate) fn strip_managed_fields<K: Resource>(object: &mut K) {
    object.meta_mut().managed_fields = None;
}

#[cfg(test)]
mod tests {
    use super::trigger;
    use kube::runtime::watcher::Event;

    #[test]
    fn only_live_changes_are_skipped_and_errors_pass() {
        let skip = |o: &&str| *o == "echo";
        let woken = |event: Result<Event<&'static str>, &'static str>| trigger(event, skip);
        assert_eq!(woken(Ok(Event::Apply("echo"))), None, "our write's event");
        assert_eq!(woken(Ok(Event::Apply("change"))), Some(Ok("change")));
        assert_eq!(
            woken(Ok(Event::InitApply("echo"))),
            Some(Ok("echo")),
            "a listed object always wakes"
        );
        assert_eq!(woken(Ok(Event::Delete("gone"))), None, "as applied_objects");
        assert_eq!(woken(Ok(Event::Init)), None);
        assert_eq!(woken(Ok(Event::InitDone)), None);
        assert_eq!(woken(Err("watch error")), Some(Err("watch error")));
    }
}
