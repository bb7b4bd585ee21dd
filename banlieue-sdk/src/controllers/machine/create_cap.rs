//! The machine controller's side of the per-Provider create cap
//! (`controllers::create_slots`): peek before reading what a create needs, take a
//! slot right before asking the backend for a machine that does not exist yet, give
//! it back once it does, or when the reconcile stops before the backend.

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

/// The Provider's cap, and the stop that says the setting is bad.
fn cap_of(provider: &Provider, backend: &Instrumented) -> Result<Option<usize>, plan::Stop> {
    create_slots::cap(
        &provider.spec.settings,
        backend.default_max_concurrent_creates(),
    )
    .map_err(|message| plan::Stop::Waiting {
        reason: "InvalidSettings",
        message: format!("Provider {}: {message}", provider.name_any()),
        retry: plan::Retry::Backoff,
    })
}

/// Whether the machine creates (it has no provider ID, or still holds a slot).
fn creates<K: Machine>(machine: &K, ctx: &Context, key: &str, uid: &str) -> bool {
    !machine.has_provider_id() || ctx.create_slots.holds(key, uid)
}

/// Queues the machine for a slot and says why it waits.
fn queued<K: Machine>(
    machine: &K,
    ctx: &Context,
    provider: &Provider,
    (key, uid): (&str, &str),
    (in_flight, cap): (usize, usize),
) -> plan::Stop {
    ctx.create_slots.wait(
        key,
        uid,
        create_slots::Waiter {
            kind: K::kind(&()).into_owned(),
            namespace: machine.namespace().unwrap_or_default(),
            name: machine.name_any(),
        },
    );
    plan::Stop::Waiting {
        reason: CREATE_QUEUED,
        message: format!(
            "{in_flight} machines are being created on Provider {}, its cap (spec.settings.{}: {cap}); this one starts when one of them is done",
            provider.name_any(),
            create_slots::MAX_CONCURRENT_CREATES_SETTING
        ),
        retry: plan::Retry::After(CREATE_QUEUE_RECHECK),
    }
}

/// Before anything a create needs is read: the stop of a machine that would create
/// but finds every slot taken (it is queued, and reads nothing), or a bad setting.
/// Takes no slot: that is [`admit_create`]'s, right before the backend.
pub(super) fn may_create<K: Machine>(
    machine: &K,
    ctx: &Context,
    provider: &Provider,
    backend: &Instrumented,
) -> Result<(), plan::Stop> {
    let key = provider_key(provider);
    let uid = machine.uid().unwrap_or_default();
    if !creates(machine, ctx, &key, &uid) {
        return Ok(());
    }
    let cap = cap_of(provider, backend)?;
    match ctx.create_slots.would_admit(&key, &uid, cap) {
        create_slots::Admission::Go => Ok(()),
        create_slots::Admission::Queued { in_flight, cap } => Err(queued(
            machine,
            ctx,
            provider,
            (&key, &uid),
            (in_flight, cap),
        )),
    }
}

/// Right before the backend is asked: whether this reconcile creates (a machine
/// without a provider ID, or one still holding a create slot), having taken a slot
/// under the Provider's cap; the stop that says why not when every slot is taken or
/// the setting is bad.
pub(super) fn admit_create<K: Machine>(
    machine: &K,
    ctx: &Context,
    provider: &Provider,
    backend: &Instrumented,
) -> Result<bool, plan::Stop> {
    let key = provider_key(provider);
    let uid = machine.uid().unwrap_or_default();
    if !creates(machine, ctx, &key, &uid) {
        return Ok(false);
    }
    let cap = cap_of(provider, backend)?;
    let admission = ctx.create_slots.admit(&key, &uid, cap);
    ctx.metrics.creates(&key, ctx.create_slots.in_flight(&key));
    match admission {
        create_slots::Admission::Go => Ok(true),
        create_slots::Admission::Queued { in_flight, cap } => Err(queued(
            machine,
            ctx,
            provider,
            (&key, &uid),
            (in_flight, cap),
        )),
    }
}

/// `Ready`'s reason while a machine waits for a create slot.
const CREATE_QUEUED: &str = "CreateQueued";

/// Whether `stop` is a machine waiting in the create queue (it holds no slot, and
/// keeps its place).
pub(super) fn is_queued(stop: &plan::Stop) -> bool {
    matches!(stop, plan::Stop::Waiting { reason, .. } if *reason == CREATE_QUEUED)
}

/// Gives back the machine's create slot, if it holds one.
pub(super) fn release_create<K: Machine>(machine: &K, ctx: &Context) {
    if let Some(key) = ctx.create_slots.release(&machine.uid().unwrap_or_default()) {
        ctx.metrics.creates(&key, ctx.create_slots.in_flight(&key));
    }
}
