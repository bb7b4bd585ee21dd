//! The Provider controller: connect through the backend, publish the inventory and
//! `Reachable`/`Ready`; re-check every sync period and whenever the credentials Secret
//! or CA bundle changes.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::ResourceExt;
use kube::api::{Api, PartialObjectMeta};
use kube::runtime::WatchStreamExt;
use kube::runtime::controller::Config as ControllerConfig;
use kube::runtime::events::EventType;
use kube::runtime::reflector::{ObjectRef, Store};

use super::context::Context;
use super::kernel::{self, Edit, Next, Note, Plan, Reconciler, StatusChange};
use super::orphan_backend::{self, LeftBehind};
use super::status_write;
use super::watch;
use super::written::Written;
use crate::api::Provider;
use crate::api::provider::ProviderStatus;
use crate::backend::{BackendCapabilities, Inventory};
use crate::conditions;
use crate::status::provider::{Unreachable, compute};

/// Field manager of Provider status.
pub(crate) const FIELD_MANAGER: &str = "banlieue-provider";

pub(crate) async fn run(
    ctx: Arc<Context>,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let api = watch::namespaced::<Provider>(&ctx.client, &ctx.settings);
    let controller = watch::controller(api, watch::unfiltered())
        .with_config(ControllerConfig::default().concurrency(ctx.settings.concurrency.provider));
    let providers = controller.store();
    let by_secret = providers.clone();
    let by_config_map = providers.clone();
    // Secrets are watched for their metadata only (a change bumps resourceVersion):
    // the operator never lists or watches any Secret's content, and reads only the
    // Secrets a Provider names, one GET each when it reconciles that Provider.
    let secret_changes = kube::runtime::watcher(
        watch::namespaced::<PartialObjectMeta<Secret>>(&ctx.client, &ctx.settings),
        watch::unfiltered(),
    )
    .backoff(watch::backoff())
    .touched_objects()
    .filter_map(|secret| futures::future::ready(secret.ok()))
    .flat_map(move |secret| {
        futures::stream::iter(referencing(
            &by_secret,
            &secret.namespace().unwrap_or_default(),
            &secret.name_any(),
            true,
        ))
    });
    let controller = controller.reconcile_on(secret_changes).watches(
        watch::namespaced::<ConfigMap>(&ctx.client, &ctx.settings),
        watch::unfiltered(),
        move |map| {
            referencing(
                &by_config_map,
                &map.namespace().unwrap_or_default(),
                &map.name_any(),
                false,
            )
        },
    );
    kernel::drive(Providers, controller, ctx, shutdown).await;
}

/// Providers that read a Secret (credentials or CA) or a ConfigMap (CA) of this name.
fn referencing(
    store: &Store<Provider>,
    namespace: &str,
    name: &str,
    secret: bool,
) -> Vec<ObjectRef<Provider>> {
    store
        .state()
        .into_iter()
        .filter(|p| p.namespace().as_deref() == Some(namespace))
        .filter(|p| {
            let c = &p.spec.connection;
            let ca = c.ca_bundle.as_ref();
            if secret {
                c.credentials_ref.as_ref().is_some_and(|r| r.name == name)
                    || ca
                        .and_then(|b| b.secret_ref.as_ref())
                        .is_some_and(|r| r.name == name)
            } else {
                ca.and_then(|b| b.config_map_ref.as_ref())
                    .is_some_and(|r| r.name == name)
            }
        })
        .map(|p| ObjectRef::from_obj(p.as_ref()))
        .collect()
}

const FINALIZER: &str = "banlieue.io/provider";

/// The Provider controller.
struct Providers;

/// What a Provider's reconcile decides from.
#[derive(Debug, Clone)]
enum Facts {
    /// A live Provider, checked just now through its backend.
    Live {
        /// Its status as this process knows it last.
        known: Option<ProviderStatus>,
        /// What the check found.
        check: Check,
        /// The operator's sync period.
        sync_period: Duration,
        now: Time,
    },
    /// A Provider being deleted (never checked: it may be gone from its backend).
    Deleting {
        /// Its status as this process knows it last.
        known: Option<ProviderStatus>,
        /// Whether the machine caches have listed: before that, "no machines" means
        /// "not known yet".
        synced: bool,
        /// The machines on it (`Kind/name`).
        holders: Vec<String>,
        /// The backend VMs those machines would leave behind.
        left: Vec<LeftBehind>,
        now: Time,
    },
}

/// What checking a Provider found.
#[derive(Debug, Clone)]
enum Check {
    /// It answered: its inventory, and what its backend declares it can do.
    Answered(Box<(Inventory, BackendCapabilities)>),
    /// It could not be checked; `transient`: worth retrying with backoff (the
    /// backend said so), else it is looked at again on the unready recheck period.
    Unreachable {
        /// Why.
        why: Unreachable,
        /// Whether the backend classed the failure as transient.
        transient: bool,
    },
}

impl Reconciler for Providers {
    type Object = Provider;
    type Facts = Facts;
    type Status = ProviderStatus;

    const FIELD_MANAGER: &'static str = FIELD_MANAGER;
    const FINALIZER: Option<&'static str> = Some(FINALIZER);

    fn name(&self) -> &str {
        "provider"
    }

    fn ledger(ctx: &Context) -> Option<&Written<ProviderStatus>> {
        Some(&ctx.written.providers)
    }

    fn api(ctx: &Context, provider: &Provider) -> Api<Provider> {
        Api::namespaced(
            ctx.client.clone(),
            &provider.namespace().unwrap_or_default(),
        )
    }

    fn released(&self, ctx: &Context, provider: &Provider) {
        ctx.backends.forget(
            &provider.namespace().unwrap_or_default(),
            &provider.name_any(),
        );
    }

    async fn observe(&self, provider: &Arc<Provider>, ctx: &Arc<Context>) -> kube::Result<Facts> {
        let known = status_write::known(
            &ctx.written.providers,
            provider.as_ref(),
            provider.status.as_ref(),
        );
        let now = Time(k8s_openapi::jiff::Timestamp::now());
        if provider.metadata.deletion_timestamp.is_some() {
            let namespace = provider.namespace().unwrap_or_default();
            let name = provider.name_any();
            return Ok(Facts::Deleting {
                known,
                synced: ctx.stores_synced.is_synced(),
                holders: ctx.stores.machines_on(&namespace, &name),
                left: ctx.stores.left_on(&namespace, &name),
                now,
            });
        }
        let check = match ctx.backends.refresh(&ctx.client, provider).await {
            Err(why) => Check::Unreachable {
                why,
                transient: false,
            },
            Ok(backend) => match backend.check().await {
                Ok(inventory) => Check::Answered(Box::new((inventory, backend.capabilities()))),
                Err(error) => Check::Unreachable {
                    transient: error.is_transient(),
                    why: Unreachable {
                        reason: error.reason,
                        message: error.message,
                    },
                },
            },
        };
        Ok(Facts::Live {
            known,
            check,
            sync_period: ctx.settings.sync_period,
            now,
        })
    }

    fn plan(&self, provider: &Provider, facts: &Facts) -> Plan<ProviderStatus> {
        match facts {
            Facts::Live {
                known,
                check,
                sync_period,
                now,
            } => checked(provider, known.as_ref(), check, *sync_period, now),
            Facts::Deleting {
                known,
                synced,
                holders,
                left,
                now,
            } => deleting(provider, known.as_ref(), *synced, holders, left, now),
        }
    }
}

/// A live Provider's status from its check, the Event a change of `Ready` deserves,
/// and when to check again: a transient failure with backoff, a Ready Provider every
/// sync period, an unready one sooner, so a fixed backend is noticed quickly (but
/// never in a hot loop).
fn checked(
    provider: &Provider,
    known: Option<&ProviderStatus>,
    check: &Check,
    sync_period: Duration,
    now: &Time,
) -> Plan<ProviderStatus> {
    let generation = provider.metadata.generation;
    let result = match check {
        Check::Answered(answer) => Ok((&answer.0, &answer.1)),
        Check::Unreachable { why, .. } => Err(why),
    };
    let status = compute(known, &provider.spec, generation, result, now);
    let ready = conditions::is_true(&status.conditions, conditions::types::READY);
    let before = known.and_then(|s| conditions::get(&s.conditions, conditions::types::READY));
    let after = conditions::get(&status.conditions, conditions::types::READY);
    let events = match (known != Some(&status), announcement(before, after), after) {
        (true, Some(type_), Some(c)) => vec![Note {
            type_,
            reason: c.reason.clone(),
            action: "Check",
            note: c.message.clone(),
        }],
        _ => Vec::new(),
    };
    let next = match check {
        Check::Unreachable {
            transient: true, ..
        } => Next::Backoff { at_most: None },
        _ if ready => Next::SyncPeriod,
        _ => Next::After(sync_period.min(UNREADY_RECHECK)),
    };
    Plan {
        events,
        ..Plan::status(
            StatusChange::Merge {
                known: known.cloned(),
                next: status,
            },
            next,
        )
    }
}

/// How often an unready Provider is checked again (at most; the sync period if shorter).
const UNREADY_RECHECK: Duration = Duration::from_secs(30);

/// A Provider goes only once no machine is on it: each machine's backend VM is deleted
/// through it, and a Provider that went first would strand them. Until then `Ready`
/// says which machines hold it, and a Warning Event says so once. The escape hatch:
/// annotated, every VM left behind is named, then the Provider goes.
fn deleting(
    provider: &Provider,
    known: Option<&ProviderStatus>,
    synced: bool,
    holders: &[String],
    left: &[LeftBehind],
    now: &Time,
) -> Plan<ProviderStatus> {
    if synced && !holders.is_empty() && orphan_backend::requested(&provider.metadata) {
        let name = provider.name_any();
        return Plan {
            edits: left
                .iter()
                .map(|vm| Edit::Abandon {
                    left: vm.clone(),
                    note: orphan_backend::provider_note(&name, vm),
                })
                .collect(),
            ..Plan::release()
        };
    }
    if synced && holders.is_empty() {
        return Plan::release();
    }
    let message = deletion_blocked(holders, synced);
    let mut status = known.cloned().unwrap_or_default();
    conditions::set(
        &mut status.conditions,
        conditions::Desired::new(
            conditions::types::READY,
            conditions::Status::False,
            DELETION_BLOCKED,
        )
        .message(&message),
        provider.metadata.generation,
        now,
    );
    let first = known.is_none_or(|s| {
        conditions::get(&s.conditions, conditions::types::READY)
            .is_none_or(|c| c.reason != DELETION_BLOCKED)
    });
    let events = if known != Some(&status) && first && synced {
        vec![Note {
            type_: EventType::Warning,
            reason: DELETION_BLOCKED.into(),
            action: "Delete",
            note: message,
        }]
    } else {
        Vec::new()
    };
    Plan {
        events,
        // The machines' deletions are not watched here: look again soon (a cache scan).
        ..Plan::status(
            StatusChange::Merge {
                known: known.cloned(),
                next: status,
            },
            Next::After(Duration::from_secs(2)),
        )
    }
}

/// `Ready`'s reason while a Provider being deleted still has machines.
pub(crate) const DELETION_BLOCKED: &str = "DeletionBlocked";

/// How many machines to name in the message; the count covers the rest.
const NAMED_HOLDERS: usize = 5;

/// What a Provider being deleted waits for, for humans.
fn deletion_blocked(holders: &[String], synced: bool) -> String {
    if !synced {
        return "deletion waits until the operator has listed the machines that may use this Provider".into();
    }
    let mut named = holders
        .iter()
        .take(NAMED_HOLDERS)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    if holders.len() > NAMED_HOLDERS {
        named.push_str(&format!(" and {} more", holders.len() - NAMED_HOLDERS));
    }
    format!(
        "deletion waits for {} machine(s) still on this Provider: {named}. Delete their VirtualMachines (or Cluster API Machines) first: their backend VMs are deleted through this Provider. To let it go now and leave their backend VMs behind, annotate it {}=true",
        holders.len(),
        super::ORPHAN_BACKEND_ANNOTATION
    )
}

/// The Event a change of `Ready` from `before` to `after` deserves: `Normal` when the
/// Provider becomes Ready, `Warning` when it stops being Ready, when its very first
/// check finds it unready, or when it stays unready for another reason. `None` for a
/// recheck that finds what the last one found (an unready Provider is not announced
/// again every 30 s).
fn announcement(before: Option<&Condition>, after: Option<&Condition>) -> Option<EventType> {
    let after = after?;
    let ready = after.status == "True";
    match before {
        None if ready => Some(EventType::Normal),
        None => Some(EventType::Warning),
        Some(b) if (b.status == "True") != ready => Some(if ready {
            EventType::Normal
        } else {
            EventType::Warning
        }),
        Some(b) if !ready && b.reason != after.reason => Some(EventType::Warning),
        Some(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_blocked_deletion_names_the_machines_and_counts_the_rest() {
        let few: Vec<String> = vec!["LibvirtMachine/a".into(), "CloudHypervisorMachine/b".into()];
        let message = deletion_blocked(&few, true);
        assert!(message.starts_with("deletion waits for 2 machine(s) still on this Provider: LibvirtMachine/a, CloudHypervisorMachine/b."), "{message}");
        assert!(!message.contains("more"), "{message}");
        assert!(
            message.contains("annotate it banlieue.io/orphan-backend=true"),
            "the way out: {message}"
        );
        let many: Vec<String> = (0..8).map(|i| format!("VSphereMachine/m{i}")).collect();
        let message = deletion_blocked(&many, true);
        assert!(
            message.contains("VSphereMachine/m4 and 3 more."),
            "{message}"
        );
        assert!(!message.contains("m5"), "{message}");
    }

    #[test]
    fn before_the_caches_list_the_message_says_so() {
        assert!(deletion_blocked(&[], false).contains("has listed the machines"));
    }
}

#[cfg(test)]
mod plan_tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time as MetaTime;
    use serde_json::json;

    use super::*;
    use crate::backend::FailureDomainInventory;

    fn provider(deleting: bool, annotations: serde_json::Value) -> Provider {
        let mut metadata = json!({"name": "vc-a", "namespace": "ns", "generation": 4,
                                  "annotations": annotations});
        if deleting {
            metadata["deletionTimestamp"] = json!("2026-12-07T00:00:00Z");
        }
        serde_json::from_value(json!({
            "apiVersion": "banlieue.io/v1alpha1", "kind": "Provider", "metadata": metadata,
            "spec": {"class": "sim", "connection": {"endpoint": "sim://a"}}
        }))
        .expect("a Provider")
    }

    fn now() -> MetaTime {
        MetaTime(k8s_openapi::jiff::Timestamp::UNIX_EPOCH)
    }

    fn answered() -> Check {
        let inventory = Inventory {
            version: "sim 1".into(),
            failure_domains: vec![FailureDomainInventory {
                name: "a".into(),
                ..Default::default()
            }],
        };
        Check::Answered(Box::new((inventory, BackendCapabilities::conservative())))
    }

    fn unreachable(transient: bool) -> Check {
        Check::Unreachable {
            why: Unreachable {
                reason: "Unreachable".into(),
                message: "connection refused".into(),
            },
            transient,
        }
    }

    fn next_status(plan: &Plan<ProviderStatus>) -> ProviderStatus {
        match &plan.status {
            StatusChange::Merge { next, .. } => next.clone(),
            other => panic!("expected a status, got {other:?}"),
        }
    }

    fn ready(plan: &Plan<ProviderStatus>) -> (String, String) {
        let status = next_status(plan);
        let c = conditions::get(&status.conditions, conditions::types::READY).expect("Ready");
        (c.status.clone(), c.reason.clone())
    }

    fn events(plan: &Plan<ProviderStatus>) -> Vec<(EventType, String)> {
        plan.events
            .iter()
            .map(|n| (n.type_, n.reason.clone()))
            .collect()
    }

    #[test]
    fn a_checked_provider_plans_its_status_event_and_next_look() {
        let sync = Duration::from_secs(600);
        let live = provider(false, json!({}));
        // (check, ready, event, next)
        let cases = [
            (
                answered(),
                "True",
                Some(EventType::Normal),
                Next::SyncPeriod,
            ),
            (
                unreachable(true),
                "False",
                Some(EventType::Warning),
                Next::Backoff { at_most: None },
            ),
            (
                unreachable(false),
                "False",
                Some(EventType::Warning),
                Next::After(UNREADY_RECHECK),
            ),
        ];
        for (check, want_ready, event, next) in cases {
            let first = checked(&live, None, &check, sync, &now());
            assert_eq!(ready(&first).0, want_ready, "{check:?}");
            assert_eq!(
                events(&first).into_iter().map(|e| e.0).collect::<Vec<_>>(),
                event.into_iter().collect::<Vec<_>>(),
                "{check:?}"
            );
            assert_eq!(first.next, next, "{check:?}");
            assert!(!first.release, "a live Provider keeps its finalizer");
            // The same check again: the same status, and no second Event.
            let written = next_status(&first);
            let again = checked(&live, Some(&written), &check, sync, &now());
            assert_eq!(next_status(&again), written, "{check:?}");
            assert_eq!(events(&again), vec![], "{check:?}");
        }
        // A sync period shorter than the unready recheck bounds it.
        let short = checked(
            &live,
            None,
            &unreachable(false),
            Duration::from_secs(5),
            &now(),
        );
        assert_eq!(short.next, Next::After(Duration::from_secs(5)));
        // Fixed: Normal, once.
        let down = next_status(&checked(&live, None, &unreachable(false), sync, &now()));
        let up = checked(&live, Some(&down), &answered(), sync, &now());
        assert_eq!(events(&up), vec![(EventType::Normal, ready(&up).1)]);
    }

    fn left(name: &str, deleting: bool) -> LeftBehind {
        LeftBehind {
            kind: "LibvirtMachine".into(),
            namespace: "ns".into(),
            name: name.into(),
            uid: format!("u-{name}"),
            provider_id: Some(format!("libvirt://u-{name}")),
            backend_ref: None,
            provider: "vc-a".into(),
            deleting,
        }
    }

    #[test]
    fn a_deleted_provider_goes_only_when_no_machine_is_on_it_or_when_told_to_leave_them() {
        let gone = provider(true, json!({}));
        let told = provider(
            true,
            json!({crate::controllers::ORPHAN_BACKEND_ANNOTATION: "true"}),
        );
        let holders = vec!["LibvirtMachine/web-1".to_string()];
        let vms = vec![left("web-1", true)];

        // No machine on it: the finalizer goes, nothing else.
        assert_eq!(
            deleting(&gone, None, true, &[], &[], &now()),
            Plan::release()
        );

        // Machines on it: Ready=False DeletionBlocked naming them, one Warning, kept.
        let blocked = deleting(&gone, None, true, &holders, &vms, &now());
        assert!(!blocked.release);
        assert_eq!(ready(&blocked), ("False".into(), DELETION_BLOCKED.into()));
        assert_eq!(
            events(&blocked),
            vec![(EventType::Warning, DELETION_BLOCKED.into())]
        );
        assert_eq!(blocked.next, Next::After(Duration::from_secs(2)));
        assert!(blocked.edits.is_empty(), "nothing is abandoned unasked");
        let again = deleting(
            &gone,
            Some(&next_status(&blocked)),
            true,
            &holders,
            &vms,
            &now(),
        );
        assert_eq!(events(&again), vec![], "the Warning is not repeated");

        // Caches not listed yet: blocked (not released), no Event, even with no holders.
        let unlisted = deleting(&gone, None, false, &[], &[], &now());
        assert!(!unlisted.release);
        assert!(ready(&unlisted).1 == DELETION_BLOCKED);
        assert_eq!(events(&unlisted), vec![]);
        // ... and the escape hatch waits for the listing too.
        assert!(!deleting(&told, None, false, &holders, &vms, &now()).release);

        // Annotated: every VM left is named, then the finalizer goes.
        let abandoned = deleting(&told, None, true, &holders, &vms, &now());
        assert!(abandoned.release);
        assert_eq!(abandoned.edits.len(), 1);
        let Edit::Abandon { left: vm, note } = &abandoned.edits[0] else {
            panic!("{abandoned:?}");
        };
        assert_eq!(vm.name, "web-1");
        assert_eq!(note, &orphan_backend::provider_note("vc-a", &vms[0]));
    }
}

#[cfg(test)]
mod announcement_tests {
    use super::*;

    fn ready(status: &str, reason: &str) -> Condition {
        Condition {
            type_: "Ready".into(),
            status: status.into(),
            reason: reason.into(),
            message: String::new(),
            observed_generation: None,
            last_transition_time: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
        }
    }

    #[test]
    fn an_unready_provider_is_announced_once_per_cause() {
        let down = ready("False", "Unreachable");
        let denied = ready("False", "Unauthorized");
        let up = ready("True", "Ready");
        let table = [
            (
                None,
                Some(&down),
                Some(EventType::Warning),
                "unready from its first check",
            ),
            (Some(&down), Some(&down), None, "the same on every recheck"),
            (
                Some(&down),
                Some(&denied),
                Some(EventType::Warning),
                "another cause",
            ),
            (Some(&down), Some(&up), Some(EventType::Normal), "fixed"),
            (None, Some(&up), Some(EventType::Normal), "ready at once"),
            (Some(&up), Some(&up), None, "stays ready"),
            (
                Some(&up),
                Some(&down),
                Some(EventType::Warning),
                "goes down",
            ),
            (Some(&up), None, None, "no Ready condition"),
        ];
        for (before, after, want, case) in table {
            assert_eq!(announcement(before, after), want, "{case}");
        }
    }
}
