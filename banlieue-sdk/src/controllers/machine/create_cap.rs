//! The machine controller's side of the per-Provider create cap
//! (`controllers::create_slots`): take a slot before asking the backend for a
//! machine that does not exist yet, give it back once it does.

use std::time::Duration;

use kube::ResourceExt;

use super::super::backends::Instrumented;
use super::super::context::Context;
use super::super::create_slots;
use super::{Machine, plan};
use crate::api::Provider;

/// How soon a machine queued behind its Provider's create cap looks again on its
/// own; it is woken sooner when a slot is given back for it.
const CREATE_QUEUE_RECHECK: Duration = Duration::from_secs(10);

fn provider_key(provider: &Provider) -> String {
    format!(
        "{}/{}",
        provider.namespace().unwrap_or_default(),
        provider.name_any()
    )
}

/// Whether this reconcile creates (a machine without a provider ID, or one still
/// holding a create slot), having taken a slot under the Provider's cap; the stop
/// that says why not when every slot is taken or the setting is bad.
pub(super) fn admit_create<K: Machine>(
    machine: &K,
    ctx: &Context,
    provider: &Provider,
    backend: &Instrumented,
) -> Result<bool, plan::Stop> {
    let key = provider_key(provider);
    let uid = machine.uid().unwrap_or_default();
    let has_vm = machine.has_provider_id();
    if has_vm && !ctx.create_slots.holds(&key, &uid) {
        return Ok(false);
    }
    let cap = create_slots::cap(
        &provider.spec.settings,
        backend.default_max_concurrent_creates(),
    )
    .map_err(|message| plan::Stop::Waiting {
        reason: "InvalidSettings",
        message: format!("Provider {}: {message}", provider.name_any()),
        retry: plan::Retry::Backoff,
    })?;
    let admission = ctx.create_slots.admit(&key, &uid, cap);
    ctx.metrics.creates(&key, ctx.create_slots.in_flight(&key));
    match admission {
        create_slots::Admission::Go => Ok(true),
        create_slots::Admission::Queued { in_flight, cap } => {
            ctx.create_slots.wait(
                &key,
                &uid,
                create_slots::Waiter {
                    kind: K::kind(&()).into_owned(),
                    namespace: machine.namespace().unwrap_or_default(),
                    name: machine.name_any(),
                },
            );
            Err(plan::Stop::Waiting {
                reason: "CreateQueued",
                message: format!(
                    "{in_flight} machines are being created on Provider {}, its cap (spec.settings.{}: {cap}); this one starts when one of them is done",
                    provider.name_any(),
                    create_slots::MAX_CONCURRENT_CREATES_SETTING
                ),
                retry: plan::Retry::After(CREATE_QUEUE_RECHECK),
            })
        }
    }
}

/// Gives back the machine's create slot, if it holds one.
pub(super) fn release_create<K: Machine>(machine: &K, ctx: &Context) {
    if let Some(key) = ctx.create_slots.release(&machine.uid().unwrap_or_default()) {
        ctx.metrics.creates(&key, ctx.create_slots.in_flight(&key));
    }
}
