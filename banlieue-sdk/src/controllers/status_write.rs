//! The one way a controller writes an object's `/status`.
//!
//! A status with one writer (its controller, which computes it whole) is written as a
//! merge patch of what changed since the status this process knows last: the one it
//! wrote itself until the cache shows that write ([`Written`]), else the cached one.
//! Nothing is written when nothing changed. A merge patch costs the API server less
//! than an apply of the whole status (ADR 0013), and starting from our own last write
//! keeps a reconcile that reads a lagging cache from writing the same status twice.
//!
//! VMImage rows are the exception, [`apply`]: operators watching one namespace each
//! own their namespace's rows of one shared status, which only server-side apply's
//! per-manager ownership of list entries can express.

use std::fmt::Debug;

use kube::api::{Api, Patch, PatchParams};
use kube::{Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::json;

use super::context::Context;
use super::status_patch::status_patch;
use super::written::Written;

/// The status to compute from: ours if this process wrote one the cached `object`
/// does not show yet, else `cached` (the cached object's status).
pub(crate) fn known<K: Resource, S: Clone>(
    written: &Written<S>,
    object: &K,
    cached: Option<&S>,
) -> Option<S> {
    written.latest(
        object.meta().uid.as_deref().unwrap_or_default(),
        object.meta().resource_version.as_deref(),
        cached,
    )
}

/// Writes `next` as `object`'s status through `api` when it differs from `known`
/// (see [`known`]), as field manager `manager`, counting the write under `metric`, and
/// remembers it in `written` (a controller without a ledger reads its cache only).
/// Returns whether it wrote.
pub(crate) async fn write<K, S>(
    ctx: &Context,
    api: &Api<K>,
    object: &K,
    written: Option<&Written<S>>,
    manager: (&str, &str),
    known: Option<&S>,
    next: S,
) -> Result<bool, kube::Error>
where
    K: Resource + Clone + DeserializeOwned + Debug,
    S: Serialize + Clone + PartialEq,
{
    Ok(
        write_versioned(ctx, api, object, written, manager, known, next)
            .await?
            .is_some(),
    )
}

/// [`write`], returning the resourceVersion the write produced (`None`: nothing
/// written), for a controller that knows its own write's watch event by it
/// ([`super::echoes`]).
pub(crate) async fn write_versioned<K, S>(
    ctx: &Context,
    api: &Api<K>,
    object: &K,
    written: Option<&Written<S>>,
    (manager, metric): (&str, &str),
    known: Option<&S>,
    next: S,
) -> Result<Option<String>, kube::Error>
where
    K: Resource + Clone + DeserializeOwned + Debug,
    S: Serialize + Clone + PartialEq,
{
    if known == Some(&next) {
        return Ok(None);
    }
    let patch = status_patch(known, &next);
    let params = PatchParams {
        field_manager: Some(manager.into()),
        ..PatchParams::default()
    };
    let wrote = api
        .patch_status(&object.name_any(), &params, &Patch::Merge(&patch))
        .await?;
    ctx.metrics.wrote(metric);
    let version = wrote.resource_version();
    if let Some(written) = written {
        written.remember(
            object.meta().uid.as_deref().unwrap_or_default(),
            version.clone(),
            next,
        );
    }
    Ok(Some(version.unwrap_or_default()))
}

/// Server-side applies `status` (the fields `manager` owns) to `object`, forced,
/// counting the write under `metric`: for statuses several managers share.
pub(crate) async fn apply<K, S>(
    ctx: &Context,
    api: &Api<K>,
    object: &K,
    (manager, metric): (&str, &str),
    status: &S,
) -> Result<(), kube::Error>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug,
    S: Serialize,
{
    let patch = json!({"apiVersion": K::api_version(&()), "kind": K::kind(&()), "status": status});
    api.patch_status(
        &object.name_any(),
        &PatchParams::apply(manager).force(),
        &Patch::Apply(&patch),
    )
    .await?;
    ctx.metrics.wrote(metric);
    Ok(())
}
