//! Scoping helpers: which namespace and labels the controllers watch.

use kube::api::Api;
use std::time::Duration;

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
    let (reader, writer) = reflector::store();
    let objects = watcher(api, config)
        .modify(strip_managed_fields)
        .reflect(writer)
        .applied_objects();
    Controller::for_stream(objects, reader).trigger_backoff(backoff())
}

/// Drops what no cache reader needs (see [`controller`]).
pub(crate) fn strip_managed_fields<K: Resource>(object: &mut K) {
    object.meta_mut().managed_fields = None;
}
