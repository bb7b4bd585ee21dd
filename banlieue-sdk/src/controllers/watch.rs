//! Scoping helpers: which namespace and labels the controllers watch.

use kube::api::Api;
use kube::runtime::watcher;
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
