//! The VMImage controller: on which Providers each image is available.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::Api;
use kube::runtime::controller::Config as ControllerConfig;
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use serde_json::json;

use super::context::Context;
use super::kernel::{self, Next, Plan, Reconciler, StatusChange};
use super::watch;
use super::written::Written;
use crate::api::vm_image::{ImageAvailability, VMImageStatus};
use crate::api::{Provider, VMImage};
use crate::backend::ImageLookup;
use crate::conditions::{self, Desired, Status, types};

const FIELD_MANAGER: &str = "banlieue-vmimage";

pub(crate) async fn run(
    ctx: Arc<Context>,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let controller =
        watch::controller(Api::<VMImage>::all(ctx.client.clone()), watch::unfiltered())
            .with_config(ControllerConfig::default().concurrency(ctx.settings.concurrency.image));
    let images = controller.store();
    let controller = controller.watches(
        watch::namespaced::<Provider>(&ctx.client, &ctx.settings),
        watch::unfiltered(),
        move |_| {
            images
                .state()
                .into_iter()
                .map(|i| ObjectRef::from_obj(i.as_ref()))
                .collect::<Vec<_>>()
        },
    );
    kernel::drive(Images, controller, ctx, shutdown).await;
}

/// The longest wait before looking again while a Provider is not Ready.
const PROVIDER_RECHECK: Duration = Duration::from_secs(3);

/// The VMImage controller.
struct Images;

/// What an image's status is decided from.
#[derive(Debug, Clone)]
struct Facts {
    /// One row per Provider with a source for the image, as looked up just now.
    rows: Vec<ImageAvailability>,
    /// The namespace this operator watches alone, if any.
    namespace: Option<String>,
    now: Time,
}

impl Reconciler for Images {
    type Object = VMImage;
    type Facts = Facts;
    type Status = VMImageStatus;

    fn name(&self) -> &str {
        "vmimage"
    }
    const FIELD_MANAGER: &'static str = FIELD_MANAGER;

    /// Rows are applied server-side (several operators share them), so there is no
    /// merge-patch ledger.
    fn ledger(_: &Context) -> Option<&Written<VMImageStatus>> {
        None
    }

    fn api(ctx: &Context, _: &VMImage) -> Api<VMImage> {
        Api::all(ctx.client.clone())
    }

    async fn observe(&self, image: &Arc<VMImage>, ctx: &Arc<Context>) -> kube::Result<Facts> {
        // With the Provider cache unlisted, the image would read as served nowhere.
        ctx.stores_synced.wait().await;
        let mut rows = Vec::new();
        for provider in ctx.stores.providers.state() {
            if !image.spec.sources.has(provider.spec.class) {
                continue;
            }
            rows.push(look_up(image, &provider, ctx).await);
        }
        rows.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
        Ok(Facts {
            rows,
            namespace: ctx.settings.namespace.clone(),
            now: Time(k8s_openapi::jiff::Timestamp::now()),
        })
    }

    fn plan(&self, image: &VMImage, facts: &Facts) -> Plan<VMImageStatus> {
        plan(image, facts)
    }
}

/// Whether `provider` serves `image`: asked of its backend once it is Ready.
async fn look_up(image: &VMImage, provider: &Provider, ctx: &Context) -> ImageAvailability {
    let ready = provider
        .status
        .as_ref()
        .is_some_and(|s| conditions::is_true(&s.conditions, types::READY));
    let (available, resolved, reason, message) = if !ready {
        (false, None, Some("ProviderNotReady".to_owned()), None)
    } else {
        match ctx.backends.for_provider(&ctx.client, provider).await {
            Err(u) => (false, None, Some(u.reason), Some(u.message)),
            Ok(backend) => match backend.find_image(&image.spec.sources).await {
                Ok(ImageLookup::Available { resolved }) => (true, Some(resolved), None, None),
                Ok(ImageLookup::Missing { message }) => {
                    (false, None, Some("ImageNotFound".into()), Some(message))
                }
                Err(e) => (false, None, Some(e.reason), Some(e.message)),
            },
        }
    };
    ImageAvailability {
        namespace: provider.namespace().unwrap_or_default(),
        name: provider.name_any(),
        available,
        resolved,
        reason,
        message,
    }
}

/// The image's status from the rows just looked up, and when to look again.
fn plan(image: &VMImage, facts: &Facts) -> Plan<VMImageStatus> {
    let previous = image.status.clone().unwrap_or_default();
    let rows = facts.rows.clone();
    let status = match &facts.namespace {
        // Watching one namespace: own only that namespace's rows (a field manager per
        // namespace, rows merged by key), and leave the conditions to a cluster-wide
        // operator.
        Some(namespace) => {
            let mine: Vec<_> = previous
                .providers
                .iter()
                .filter(|r| &r.namespace == namespace)
                .cloned()
                .collect();
            if mine == rows {
                StatusChange::Unchanged
            } else {
                StatusChange::Shared {
                    manager: format!("{FIELD_MANAGER}-{namespace}"),
                    status: json!({ "providers": rows }),
                }
            }
        }
        None => {
            let mut status = previous.clone();
            let generation = image.meta().generation;
            status.observed_generation = generation;
            let count = rows.iter().filter(|r| r.available).count();
            status.providers = rows;
            let message = format!("available on {count} Provider(s)");
            let reason = if count > 0 {
                "Available"
            } else {
                "NotAvailable"
            };
            let ready =
                Desired::new(types::READY, Status::from_bool(count > 0), reason).message(&message);
            conditions::set(&mut status.conditions, ready, generation, &facts.now);
            if previous == status {
                StatusChange::Unchanged
            } else {
                StatusChange::Shared {
                    manager: FIELD_MANAGER.to_owned(),
                    status: json!(status),
                }
            }
        }
    };
    let next = match next_look(&facts.rows) {
        NextLook::SyncPeriod => Next::SyncPeriod,
        NextLook::Backoff => Next::Backoff { at_most: None },
        NextLook::Soon => Next::Backoff {
            at_most: Some(PROVIDER_RECHECK),
        },
    };
    Plan::status(status, next)
}

/// When a VMImage is looked at again, from the rows just computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum NextLook {
    /// Found on every Provider with a source for it: only the periodic resync.
    SyncPeriod,
    /// Missing, or its lookup failed, on a Ready Provider: again with the image's
    /// backoff (1 s, 2 s, ... at most a sync period), sparing the backend. A
    /// transient lookup failure must not leave the image unavailable, and every VM
    /// using it unscheduled, for a whole sync period.
    Backoff,
    /// A Provider is not Ready, or none is in the cache yet: a Provider turning Ready
    /// wakes us through the Provider watch, which can be a moment ahead of the cache
    /// read here, so look again within a few seconds whatever the backoff has grown to.
    Soon,
}

fn next_look(rows: &[ImageAvailability]) -> NextLook {
    let provider_not_ready = rows
        .iter()
        .any(|r| r.reason.as_deref() == Some("ProviderNotReady"));
    if rows.is_empty() || provider_not_ready {
        NextLook::Soon
    } else if rows.iter().all(|r| r.available) {
        NextLook::SyncPeriod
    } else {
        NextLook::Backoff
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(available: bool, reason: Option<&str>) -> ImageAvailability {
        ImageAvailability {
            namespace: "ns".into(),
            name: "p".into(),
            available,
            resolved: available.then(|| "template-1".into()),
            reason: reason.map(str::to_owned),
            message: None,
        }
    }

    fn image(status: Option<VMImageStatus>) -> VMImage {
        let mut image = VMImage::new("debian", serde_json::from_value(json!({
            "os": {"family": "linux", "distribution": "debian", "version": "13"}, "sources": {"sim": {"name": "debian"}}
        })).expect("a VMImage spec"));
        image.metadata.generation = Some(3);
        image.status = status;
        image
    }

    fn facts(rows: Vec<ImageAvailability>, namespace: Option<&str>) -> Facts {
        Facts {
            rows,
            namespace: namespace.map(str::to_owned),
            now: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
        }
    }

    /// The status a cluster-wide plan applies, decoded.
    fn applied(plan: &Plan<VMImageStatus>) -> (String, VMImageStatus) {
        match &plan.status {
            StatusChange::Shared { manager, status } => (
                manager.clone(),
                serde_json::from_value(status.clone()).expect("a VMImageStatus"),
            ),
            other => panic!("expected an apply, got {other:?}"),
        }
    }

    #[test]
    fn a_cluster_wide_operator_applies_rows_and_ready_and_then_writes_nothing_more() {
        let rows = vec![row(true, None), row(false, Some("ImageNotFound"))];
        let first = plan(&image(None), &facts(rows.clone(), None));
        let (manager, status) = applied(&first);
        assert_eq!(manager, FIELD_MANAGER);
        assert_eq!(status.providers, rows);
        assert_eq!(status.observed_generation, Some(3));
        assert!(conditions::is_true(&status.conditions, types::READY));
        assert_eq!(first.next, Next::Backoff { at_most: None });
        // Seen again with the same rows: nothing to write.
        let again = plan(&image(Some(status)), &facts(rows, None));
        assert_eq!(again.status, StatusChange::Unchanged);
        // Available nowhere: Ready=False NotAvailable.
        let none = plan(
            &image(None),
            &facts(vec![row(false, Some("ImageNotFound"))], None),
        );
        let (_, status) = applied(&none);
        let ready = conditions::get(&status.conditions, types::READY).expect("Ready");
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", "NotAvailable")
        );
    }

    #[test]
    fn an_operator_of_one_namespace_applies_its_rows_only_under_a_manager_of_its_own() {
        let rows = vec![row(true, None)];
        let first = plan(&image(None), &facts(rows.clone(), Some("ns")));
        assert_eq!(
            first.status,
            StatusChange::Shared {
                manager: format!("{FIELD_MANAGER}-ns"),
                status: json!({ "providers": rows }),
            }
        );
        assert_eq!(first.next, Next::SyncPeriod);
        // Its rows are there already (another namespace's too): nothing to write.
        let mut other = row(false, Some("ImageNotFound"));
        other.namespace = "elsewhere".into();
        let status = VMImageStatus {
            providers: vec![rows[0].clone(), other],
            ..VMImageStatus::default()
        };
        let again = plan(&image(Some(status)), &facts(rows, Some("ns")));
        assert_eq!(again.status, StatusChange::Unchanged);
        // No Provider cached yet: look again soon.
        let empty = plan(&image(None), &facts(vec![], Some("ns")));
        assert_eq!(
            empty.next,
            Next::Backoff {
                at_most: Some(PROVIDER_RECHECK)
            }
        );
    }

    #[test]
    fn the_next_look_follows_what_the_rows_say() {
        let cases = [
            (vec![], NextLook::Soon),
            (vec![row(true, None)], NextLook::SyncPeriod),
            (vec![row(true, None), row(true, None)], NextLook::SyncPeriod),
            (
                vec![row(true, None), row(false, Some("ProviderNotReady"))],
                NextLook::Soon,
            ),
            (vec![row(false, Some("ImageNotFound"))], NextLook::Backoff),
            // A transient lookup failure on a Ready Provider (the fault suite's
            // random run waited a 30 s sync period for this one).
            (
                vec![row(true, None), row(false, Some("SimulatedFault"))],
                NextLook::Backoff,
            ),
            (
                vec![
                    row(false, Some("SimulatedFault")),
                    row(false, Some("ProviderNotReady")),
                ],
                NextLook::Soon,
            ),
        ];
        for (rows, want) in cases {
            assert_eq!(next_look(&rows), want, "{rows:?}");
        }
    }
}
