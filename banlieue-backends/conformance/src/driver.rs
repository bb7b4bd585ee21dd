//! Driving a backend as the controllers do: call, and when it answers `Pending` or a
//! transient error, come back later — within a deadline instead of forever.

use std::time::Duration;

use banlieue_sdk::api::common::PowerState;
use banlieue_sdk::api::resources::{ChangeRule, MachineField};
use banlieue_sdk::backend::{
    Backend, Deletion, MachineIdentity, MachineObservation, MachineRequest,
};
use banlieue_sdk::changes;
use tokio::time::Instant;

/// The longest the suite waits between two looks, whatever the backend asks: a
/// simulator that answers at once is not made to wait.
const MOST: Duration = Duration::from_secs(2);
const LEAST: Duration = Duration::from_millis(20);

async fn pause(after: Option<Duration>) {
    tokio::time::sleep(after.unwrap_or(LEAST).clamp(LEAST, MOST)).await;
}

/// What driving a machine took: transient errors retried on the way.
#[derive(Default)]
pub(crate) struct Effort {
    pub transients: u32,
}

impl Effort {
    pub fn note(&self) -> String {
        match self.transients {
            0 => String::new(),
            n => format!(" ({n} transient error(s) retried)"),
        }
    }
}

/// Calls `check` until it answers (transient errors retried within `patience`).
pub(crate) async fn check(
    backend: &dyn Backend,
    patience: Duration,
    effort: &mut Effort,
) -> Result<banlieue_sdk::backend::Inventory, String> {
    let deadline = Instant::now() + patience;
    loop {
        match backend.check().await {
            Ok(inventory) => return Ok(inventory),
            Err(e) if e.is_transient() && Instant::now() <= deadline => {
                effort.transients += 1;
                pause(e.retry_after).await;
            }
            Err(e) => return Err(format!("check: {e}")),
        }
    }
}

/// Calls `ensure` until the machine exists, nothing is in flight and it is at the
/// power state `request` asks.
pub(crate) async fn settle(
    backend: &dyn Backend,
    request: &MachineRequest,
    patience: Duration,
    effort: &mut Effort,
) -> Result<MachineObservation, String> {
    let want = request.spec.power_state();
    let deadline = Instant::now() + patience;
    let mut last;
    loop {
        match backend.ensure(request).await {
            Ok(seen) if seen.settled_at(want) => return Ok(seen),
            Ok(seen) => {
                let after = seen.pending.as_ref().map(|p| p.retry_after);
                last = format!("{seen:?}");
                if Instant::now() > deadline {
                    break;
                }
                pause(after).await;
            }
            Err(e) if e.is_transient() => {
                effort.transients += 1;
                last = format!("transient {e}");
                if Instant::now() > deadline {
                    break;
                }
                pause(e.retry_after).await;
            }
            Err(e) => return Err(format!("ensure: terminal {e}")),
        }
    }
    Err(format!(
        "not {want:?} and settled after {patience:?}; last: {last}"
    ))
}

/// Observes until nothing is in flight; the machine must exist.
pub(crate) async fn observe(
    backend: &dyn Backend,
    identity: &MachineIdentity,
    patience: Duration,
    effort: &mut Effort,
) -> Result<MachineObservation, String> {
    let deadline = Instant::now() + patience;
    loop {
        match backend.observe(identity).await {
            Ok(Some(seen)) if seen.pending.is_none() => return Ok(seen),
            Ok(Some(seen)) => {
                if Instant::now() > deadline {
                    return Err(format!("still in flight after {patience:?}: {seen:?}"));
                }
                pause(seen.pending.map(|p| p.retry_after)).await;
            }
            Ok(None) => return Err(format!("observe found no machine for {identity:?}")),
            Err(e) if e.is_transient() && Instant::now() < deadline => {
                effort.transients += 1;
                pause(e.retry_after).await;
            }
            Err(e) => return Err(format!("observe: {e}")),
        }
    }
}

/// Hands `fields` to `apply_changes`, then waits until nothing is in flight.
pub(crate) async fn apply(
    backend: &dyn Backend,
    request: &MachineRequest,
    fields: &[MachineField],
    patience: Duration,
    effort: &mut Effort,
) -> Result<MachineObservation, String> {
    let deadline = Instant::now() + patience;
    loop {
        match backend.apply_changes(request, fields).await {
            Ok(seen) if seen.pending.is_none() => return Ok(seen),
            // A long change (a reconfigure task) in flight: the controller comes back
            // with `ensure`, which follows the backend's operation in flight.
            Ok(_) => return settle(backend, request, patience, effort).await,
            Err(e) if e.is_transient() && Instant::now() < deadline => {
                effort.transients += 1;
                pause(e.retry_after).await;
            }
            Err(e) => return Err(format!("apply_changes({}): {e}", names(fields))),
        }
    }
}

/// Deletes until the backend says `Gone`.
pub(crate) async fn delete(
    backend: &dyn Backend,
    identity: &MachineIdentity,
    patience: Duration,
    effort: &mut Effort,
) -> Result<u32, String> {
    let deadline = Instant::now() + patience;
    let mut calls = 0;
    loop {
        calls += 1;
        match backend.delete(identity).await {
            Ok(Deletion::Gone) => return Ok(calls),
            Ok(Deletion::InProgress { retry_after }) => {
                if Instant::now() > deadline {
                    return Err(format!("still deleting after {patience:?}"));
                }
                pause(Some(retry_after)).await;
            }
            Err(e) if e.is_transient() && Instant::now() < deadline => {
                effort.transients += 1;
                pause(e.retry_after).await;
            }
            Err(e) => return Err(format!("delete: {e}")),
        }
    }
}

pub(crate) fn names(fields: &[MachineField]) -> String {
    fields
        .iter()
        .map(|f| f.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Takes a running machine from what it runs with to what `desired` asks, as the
/// controller does with `changePolicy: Restart`: what the table says is live is applied
/// and must read back at once; what waits for a power cycle must still read back as it
/// was (nothing is reported applied before it is) and read back applied after one.
///
/// What the machine runs with is read as the controller reads it: from `ensure` with
/// the desired spec (which must not apply the change by itself: that is
/// `apply_changes`'s job, once the controller decided).
pub(crate) async fn change(
    backend: &dyn Backend,
    desired: &MachineRequest,
    table: &[ChangeRule],
    patience: Duration,
    effort: &mut Effort,
) -> Result<String, String> {
    let asked = desired.spec.resources();
    let seen = settle(backend, desired, patience, effort).await?;
    let running = seen.resources.clone().ok_or(
        "the machine's resources are not read back (a backend with a change table must read them)",
    )?;
    let first = changes::assess(
        &asked,
        &running,
        seen.next_boot.as_ref(),
        table,
        seen.power_state,
    );
    if first.differences.is_empty() {
        return Err(format!(
            "the edit makes no difference the backend reads back (it runs with {running:?})"
        ));
    }
    let refused: Vec<_> = first.refused().cloned().collect();
    if !refused.is_empty() {
        return Err(format!(
            "the table refuses it: {}",
            changes::describe(&refused)
        ));
    }
    let waits: Vec<MachineField> = first.pending.iter().map(|p| p.field).collect();
    let live: Vec<MachineField> = first
        .differences
        .iter()
        .map(|d| d.field)
        .filter(|f| !waits.contains(f))
        .collect();
    if !first.apply.is_empty() {
        apply(backend, desired, &first.apply, patience, effort).await?;
    }
    let after = settle(backend, desired, patience, effort).await?;
    let after_resources = after.resources.clone().unwrap_or_default();
    let left: Vec<MachineField> = changes::differences(&asked, &after_resources)
        .into_iter()
        .map(|d| d.field)
        .collect();
    if let Some(f) = live.iter().find(|f| left.contains(f)) {
        return Err(format!(
            "{} is Live here but reads back unchanged after apply_changes: {after_resources:?}",
            f.as_str()
        ));
    }
    if let Some(f) = waits.iter().find(|f| !left.contains(f)) {
        return Err(format!(
            "{} waits for a power cycle, yet reads back applied before one: {after_resources:?}",
            f.as_str()
        ));
    }
    if after.power_state != seen.power_state {
        return Err(format!(
            "applying {} changed the power state {:?} → {:?}",
            names(&first.apply),
            seen.power_state,
            after.power_state
        ));
    }
    if waits.is_empty() {
        return Ok(format!("{} applied live and read back", names(&live)));
    }

    // The power cycle the controller makes with `changePolicy: Restart`.
    let mut off = desired.clone();
    off.spec.set_power_state(PowerState::PoweredOff);
    let stopped = settle(backend, &off, patience, effort).await?;
    let resources = stopped.resources.clone().unwrap_or_default();
    let while_off = changes::assess(
        &asked,
        &resources,
        stopped.next_boot.as_ref(),
        table,
        stopped.power_state,
    );
    if !while_off.apply.is_empty() {
        apply(backend, &off, &while_off.apply, patience, effort).await?;
    }
    let mut on = desired.clone();
    on.spec.set_power_state(PowerState::PoweredOn);
    let cycled = settle(backend, &on, patience, effort).await?;
    let cycled_resources = cycled.resources.clone().unwrap_or_default();
    let still = changes::differences(&asked, &cycled_resources);
    if !still.is_empty() {
        return Err(format!(
            "after a power cycle it still runs with {cycled_resources:?}, not {asked:?}"
        ));
    }
    let how = first
        .pending
        .iter()
        .map(|p| format!("{} {}", p.field.as_str(), p.waits_for.as_str()))
        .collect::<Vec<_>>()
        .join(", ");
    let live = if live.is_empty() {
        String::new()
    } else {
        format!("{} applied live; ", names(&live))
    };
    Ok(format!(
        "{live}{how}: unchanged until a power cycle, then read back applied"
    ))
}
