//! The checks, in order, against one target.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use banlieue_sdk::api::common::PowerState;
use banlieue_sdk::api::resources::{ChangeMode, ChangeRule, MachineField};
use banlieue_sdk::backend::{
    BACKEND_VM_MISSING, Backend, ErrorClass, MachineIdentity, MachineRequest, MadeFor,
};

use crate::Target;
use crate::driver::{self, Effort};
use crate::report::{Outcome, Report};

/// The namespace recorded on the machines the suite makes.
const NAMESPACE: &str = "conformance";

/// A fresh UID shaped like a Kubernetes one (some backends derive names or UUIDs from
/// it): unique per process and call, no randomness crate needed.
fn uid() -> String {
    static COUNT: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    let n = COUNT.fetch_add(1, Ordering::Relaxed);
    let a = (nanos as u64) ^ (u64::from(std::process::id()) << 32);
    let b = n.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ (nanos >> 64) as u64;
    format!(
        "{:08x}-{:04x}-4{:03x}-8{:03x}-{:012x}",
        a >> 32,
        (a >> 16) & 0xffff,
        a & 0xfff,
        b >> 52,
        b & 0xffff_ffff_ffff
    )
}

fn identity(uid: &str, what: &str) -> MachineIdentity {
    MachineIdentity::new(uid, NAMESPACE, format!("conf-{what}-{}", &uid[..8]))
}

/// The order the change rows are exercised in: what a later row needs first (a data
/// disk exists before it grows; a device added before one is removed), grows before
/// shrinks. `(field, grow)`, with the table's mode.
fn row_plan(table: &[ChangeRule]) -> Vec<(MachineField, bool, ChangeMode)> {
    use MachineField as F;
    let order = [
        (F::Cpus, true),
        (F::CoresPerSocket, true),
        (F::MemoryMib, true),
        (F::OsDiskSize, true),
        (F::DataDisks, true),
        (F::DataDiskSize, true),
        (F::Networks, true),
        (F::Firmware, true),
        (F::Networks, false),
        (F::DataDisks, false),
        (F::MemoryMib, false),
        (F::CoresPerSocket, false),
        (F::Cpus, false),
    ];
    order
        .into_iter()
        .filter_map(|(field, grow)| {
            let mode = banlieue_sdk::changes::mode(table, field, grow);
            // Disks never shrink (admission refuses it), whatever a row says; a
            // firmware change is one edit, listed once.
            let shrinks_a_size =
                !grow && matches!(field, F::OsDiskSize | F::DataDiskSize | F::Firmware);
            (mode != ChangeMode::Never && !shrinks_a_size).then_some((field, grow, mode))
        })
        .collect()
}

/// Whether an inventory is one the scheduler can place on: at least one failure
/// domain, each named and reporting its hosts' architecture. What it found, or what is
/// missing.
fn inventory_verdict(inventory: &banlieue_sdk::backend::Inventory) -> Result<String, String> {
    if inventory.failure_domains.is_empty() {
        return Err("check reports no failure domain".into());
    }
    let mut found = Vec::new();
    let mut missing = Vec::new();
    for fd in &inventory.failure_domains {
        match (fd.name.is_empty(), fd.architecture) {
            (true, _) => missing.push("a failure domain without a name".to_owned()),
            (false, Some(arch)) => found.push(format!("{} {arch}", fd.name)),
            (false, None) => missing.push(format!(
                "failure domain {} reports no architecture (FailureDomainInventory::architecture): \
                 no VM would be placed there",
                fd.name
            )),
        }
    }
    if missing.is_empty() {
        Ok(found.join(", "))
    } else {
        Err(missing.join("; "))
    }
}

/// Runs every check against `target` and reports each. It never panics on the
/// backend's behalf: see [`Report::assert_complete`] and [`Report::assert_passed`].
/// Every machine it made is deleted at the end, whatever failed.
pub async fn run(target: &dyn Target) -> Report {
    let mut report = Report::new(target.name());
    let patience = target.patience();
    let backend = match target.connect().await {
        Ok(b) => b,
        Err(e) => {
            report.record("connect", Outcome::Failed(e.to_string()));
            return report;
        }
    };
    // 0. What the backend reports: every failure domain with its hosts' architecture,
    // without which the scheduler places no VM there.
    let mut effort = Effort::default();
    let inventory = driver::check(&*backend, patience, &mut effort)
        .await
        .and_then(|inventory| inventory_verdict(&inventory));
    report.result(
        "inventory",
        inventory.map(|seen| format!("{seen}{}", effort.note())),
    );

    let made = identity(&uid(), "made");
    let mut request = target.request(made.clone());
    request.identity = made.clone();
    request.spec.set_power_state(PowerState::PoweredOn);
    let kind = request.spec.kind();

    // 1. Create.
    let mut effort = Effort::default();
    let provider_id = match driver::settle(&*backend, &request, patience, &mut effort).await {
        Ok(seen) => match seen.provider_id.clone() {
            Some(id) => {
                report.record(
                    "create",
                    Outcome::Passed(format!("{id}, {kind} running{}", effort.note())),
                );
                id
            }
            None => {
                report.record(
                    "create",
                    Outcome::Failed("settled without a provider ID".into()),
                );
                return report;
            }
        },
        Err(why) => {
            report.record("create", Outcome::Failed(why));
            // What a half-made machine left behind.
            let _ = driver::delete(&*backend, &made, patience, &mut effort).await;
            return report;
        }
    };

    // 2. Ensure again.
    let again = async {
        let mut effort = Effort::default();
        let seen = driver::settle(&*backend, &request, patience, &mut effort).await?;
        same_id(&seen.provider_id, &provider_id)?;
        let count = one_made_for(&*backend, kind, &made, &provider_id).await?;
        Ok(format!("same provider ID, {count}"))
    };
    report.result("ensure again", again.await);

    // 3. A new connection (an operator restart) finds it by its UID.
    let restart = async {
        let fresh = target
            .connect()
            .await
            .map_err(|e| format!("connect: {e}"))?;
        let seen = fresh
            .observe(&made)
            .await
            .map_err(|e| format!("observe: {e}"))?
            .ok_or("a new connection does not find the machine by its UID")?;
        same_id(&seen.provider_id, &provider_id)?;
        let mut effort = Effort::default();
        let ensured = driver::settle(&*fresh, &request, patience, &mut effort).await?;
        same_id(&ensured.provider_id, &provider_id)?;
        let count = one_made_for(&*fresh, kind, &made, &provider_id).await?;
        Ok(format!(
            "observe and ensure by UID: same provider ID, {count}"
        ))
    };
    report.result("found after a restart", restart.await);

    // 4. Adopted under a new UID by its provider ID (clusterctl move, a restore).
    let moved = MachineIdentity {
        uid: uid(),
        ..made.clone()
    }
    .with_provider_id(provider_id.clone());
    let mut adopted_request = request.clone();
    adopted_request.identity = moved.clone();
    let adopt = async {
        let mut effort = Effort::default();
        let seen = driver::settle(&*backend, &adopted_request, patience, &mut effort).await?;
        same_id(&seen.provider_id, &provider_id)?;
        let found = recorded(&*backend, kind, &moved).await?;
        match found.as_slice() {
            [one] if one.provider_id == provider_id => match &one.uid {
                Some(uid) if *uid == moved.uid => {
                    Ok("same machine, retagged with the new UID".into())
                }
                Some(uid) => Err(format!(
                    "adopted but still tagged with UID {uid}, not {}",
                    moved.uid
                )),
                None => Ok("same machine (this backend records no UID)".into()),
            },
            other => Err(format!(
                "made_for lists {other:?}, not the one adopted machine"
            )),
        }
    };
    report.result("adopted under a new UID", adopt.await);
    // From here on the machine is the adopted object's, as after a move.
    request = adopted_request;

    // 5. A provider ID that answers nothing: terminal, nothing created.
    report.result(
        "missing provider ID",
        missing(target, &*backend, &request, kind, &provider_id, patience).await,
    );

    // 6. Power.
    let power = async {
        let mut effort = Effort::default();
        let mut off = request.clone();
        off.spec.set_power_state(PowerState::PoweredOff);
        driver::settle(&*backend, &off, patience, &mut effort).await?;
        let seen = driver::observe(&*backend, &off.identity, patience, &mut effort).await?;
        if seen.power_state != Some(PowerState::PoweredOff) {
            return Err(format!(
                "observed {:?} after powering off",
                seen.power_state
            ));
        }
        let on = driver::settle(&*backend, &request, patience, &mut effort).await?;
        same_id(&on.provider_id, &provider_id)?;
        Ok(format!("off, then on{}", effort.note()))
    };
    report.result("power off and on", power.await);

    // 7. The change table.
    change_rows(target, &*backend, &mut request, patience, &mut report).await;

    // 8. An outage.
    outage(
        target,
        &*backend,
        &request,
        kind,
        &provider_id,
        patience,
        &mut report,
    )
    .await;

    // 9. Delete, delete again, delete what was never made.
    let delete = async {
        let mut effort = Effort::default();
        let calls = driver::delete(&*backend, &request.identity, patience, &mut effort).await?;
        if let Some(seen) = backend
            .observe(&request.identity)
            .await
            .map_err(|e| format!("observe after delete: {e}"))?
        {
            return Err(format!("deleted, yet observed: {seen:?}"));
        }
        let left = recorded(&*backend, kind, &request.identity).await?;
        if !left.is_empty() {
            return Err(format!("deleted, yet made_for lists {left:?}"));
        }
        Ok(format!("gone after {calls} call(s){}", effort.note()))
    };
    let deleted = delete.await;
    let was_deleted = deleted.is_ok();
    report.result("delete", deleted);
    if !was_deleted {
        // Whatever failed, the target is left as found where it can be.
        let _ = driver::delete(
            &*backend,
            &request.identity,
            patience,
            &mut Effort::default(),
        )
        .await;
    }
    let twice = async {
        let mut effort = Effort::default();
        match driver::delete(&*backend, &request.identity, patience, &mut effort).await? {
            1 => Ok("Gone at once".to_owned()),
            n => Err(format!(
                "a deleted machine took {n} delete calls to be Gone"
            )),
        }
    };
    report.result("delete again", twice.await);
    let never = async {
        let ghost = identity(&uid(), "never");
        let mut effort = Effort::default();
        match driver::delete(&*backend, &ghost, patience, &mut effort).await? {
            1 => Ok("Gone at once".to_owned()),
            n => Err(format!(
                "a machine never made took {n} delete calls to be Gone"
            )),
        }
    };
    report.result("delete of a machine never made", never.await);
    report
}

/// What the backend records as made for the object `identity` names (by namespace and
/// name, whatever its UID and provider ID).
async fn recorded(
    backend: &dyn Backend,
    kind: &str,
    identity: &MachineIdentity,
) -> Result<Vec<MadeFor>, String> {
    let by_name = MachineIdentity {
        provider_id: None,
        ..identity.clone()
    };
    backend
        .made_for(kind, &by_name)
        .await
        .map_err(|e| format!("made_for: {e}"))
}

fn same_id(seen: &Option<String>, provider_id: &str) -> Result<(), String> {
    match seen.as_deref() {
        Some(id) if id == provider_id => Ok(()),
        other => Err(format!("provider ID {other:?}, not {provider_id}")),
    }
}

/// Exactly one machine is recorded for the object: the one made.
async fn one_made_for(
    backend: &dyn Backend,
    kind: &str,
    identity: &MachineIdentity,
    provider_id: &str,
) -> Result<String, String> {
    let found = recorded(backend, kind, identity).await?;
    match found.as_slice() {
        [one] if one.provider_id == provider_id && !one.deleting => {
            Ok("one machine made for the object".to_owned())
        }
        other => Err(format!(
            "made_for lists {other:?}, not one machine {provider_id}"
        )),
    }
}

async fn missing(
    target: &dyn Target,
    backend: &dyn Backend,
    request: &MachineRequest,
    kind: &str,
    provider_id: &str,
    patience: Duration,
) -> Result<String, String> {
    let absent = target.missing_provider_id(provider_id);
    if absent == provider_id {
        return Err("the target's missing_provider_id returned the machine's own".into());
    }
    let ghost = identity(&uid(), "ghost").with_provider_id(absent.clone());
    let mut asked = request.clone();
    asked.identity = ghost.clone();
    match backend.ensure(&asked).await {
        Err(e) if e.reason == BACKEND_VM_MISSING && e.class == ErrorClass::Terminal => {}
        Err(e) => {
            return Err(format!(
                "ensure of {absent} failed with {:?} {e}, not a terminal {BACKEND_VM_MISSING}",
                e.class
            ));
        }
        Ok(seen) => return Err(format!("ensure of {absent} answered {seen:?}")),
    }
    if let Some(seen) = backend
        .observe(&ghost)
        .await
        .map_err(|e| format!("observe: {e}"))?
    {
        return Err(format!("observe of {absent} found {seen:?}"));
    }
    let made = recorded(backend, kind, &ghost).await?;
    if !made.is_empty() {
        return Err(format!("ensure of {absent} made {made:?}"));
    }
    let calls = driver::delete(backend, &ghost, patience, &mut Effort::default()).await?;
    if calls != 1 {
        return Err(format!("delete of {absent} took {calls} calls"));
    }
    Ok(format!(
        "{absent}: terminal {BACKEND_VM_MISSING}, nothing made, delete Gone"
    ))
}

async fn change_rows(
    target: &dyn Target,
    backend: &dyn Backend,
    request: &mut MachineRequest,
    patience: Duration,
    report: &mut Report,
) {
    let table = backend.capabilities().changes;
    let never: Vec<&str> = MachineField::ALL
        .iter()
        .filter(|f| {
            banlieue_sdk::changes::mode(&table, **f, true) == ChangeMode::Never
                && banlieue_sdk::changes::mode(&table, **f, false) == ChangeMode::Never
        })
        .map(|f| f.as_str())
        .collect();
    report.record(
        "change table",
        Outcome::Passed(format!(
            "{} row(s); Never (not asked of the backend: the controller refuses them): {}",
            table.len(),
            if never.is_empty() {
                "none".to_owned()
            } else {
                never.join(", ")
            }
        )),
    );
    for (field, grow, mode) in row_plan(&table) {
        let name = format!(
            "change {} {} ({})",
            field.as_str(),
            if grow { "grow" } else { "shrink" },
            mode.as_str()
        );
        let mut effort = Effort::default();
        let running = match driver::settle(backend, request, patience, &mut effort).await {
            Ok(seen) => seen.resources.unwrap_or_default(),
            Err(why) => {
                report.record(name, Outcome::Failed(why));
                continue;
            }
        };
        let mut desired = request.clone();
        if let Err(why) = target.edit(&mut desired.spec, &running, field, grow) {
            report.record(name, Outcome::NotExercised(why));
            continue;
        }
        match driver::change(backend, &desired, &table, patience, &mut effort).await {
            Ok(seen) => {
                report.record(name, Outcome::Passed(format!("{seen}{}", effort.note())));
                *request = desired;
            }
            Err(why) => {
                report.record(name, Outcome::Failed(why));
                // The next rows start from what runs, not from a spec half applied.
                if let Ok(seen) = driver::settle(backend, request, patience, &mut effort).await
                    && seen.power_state != Some(PowerState::PoweredOn)
                {
                    report.record(name_after(field), Outcome::Failed("not running".into()));
                }
            }
        }
    }
}

fn name_after(field: MachineField) -> String {
    format!("running after {}", field.as_str())
}

async fn outage(
    target: &dyn Target,
    backend: &dyn Backend,
    request: &MachineRequest,
    kind: &str,
    provider_id: &str,
    patience: Duration,
    report: &mut Report,
) {
    let name = "outage is transient";
    let outage = match target.outage().await {
        Ok(o) => o,
        Err(why) => {
            report.record(name, Outcome::NotExercised(why));
            return;
        }
    };
    // Calls during the outage, on the connection already made and on one made during
    // it (an operator that restarts then): each may fail, but only transiently.
    let mut errors = Vec::new();
    let mut terminal = Vec::new();
    let mut classify = |what: &str, e: banlieue_sdk::backend::BackendError| {
        if e.class == ErrorClass::Terminal {
            terminal.push(format!("{what}: {e}"));
        }
        errors.push(format!("{what}: {}", e.reason));
    };
    if let Err(e) = backend.observe(&request.identity).await {
        classify("observe", e);
    }
    if let Err(e) = backend.ensure(request).await {
        classify("ensure", e);
    }
    let fresh: Option<Arc<dyn Backend>> = match target.connect().await {
        Ok(b) => Some(b),
        Err(e) => {
            classify("connect", e);
            None
        }
    };
    if let Some(fresh) = &fresh {
        if let Err(e) = fresh.check().await {
            classify("check (new connection)", e);
        }
        if let Err(e) = fresh.observe(&request.identity).await {
            classify("observe (new connection)", e);
        }
    }
    outage.end().await;
    let verdict = async {
        if !terminal.is_empty() {
            return Err(format!(
                "an outage gave terminal errors (the controller would stop retrying): {}",
                terminal.join("; ")
            ));
        }
        if errors.is_empty() {
            return Err("every call succeeded during the outage: the target made none".into());
        }
        let mut effort = Effort::default();
        let seen = driver::settle(backend, request, patience, &mut effort).await?;
        same_id(&seen.provider_id, provider_id)?;
        let count = one_made_for(backend, kind, &request.identity, provider_id).await?;
        Ok(format!(
            "{} transient ({}); after it the same machine, running, {count}",
            errors.len(),
            errors.join(", ")
        ))
    };
    report.result(name, verdict.await);
}

#[cfg(test)]
mod tests {
    use super::*;
    use MachineField as F;
    use banlieue_sdk::api::resources::ChangeMode as M;

    #[test]
    fn an_inventory_without_an_architecture_fails() {
        use banlieue_sdk::backend::{Architecture, FailureDomainInventory, Inventory};
        let fd = |name: &str, architecture| FailureDomainInventory {
            name: name.into(),
            architecture,
            ..Default::default()
        };
        let of = |domains| Inventory {
            version: "v".into(),
            failure_domains: domains,
        };
        assert_eq!(
            inventory_verdict(&of(vec![
                fd("a", Some(Architecture::Amd64)),
                fd("b", Some(Architecture::Arm64))
            ])),
            Ok("a amd64, b arm64".into())
        );
        let unreported =
            inventory_verdict(&of(vec![fd("a", Some(Architecture::Amd64)), fd("b", None)]))
                .unwrap_err();
        assert!(
            unreported.contains("failure domain b reports no architecture"),
            "{unreported}"
        );
        assert!(inventory_verdict(&of(vec![])).is_err());
        assert!(inventory_verdict(&of(vec![fd("", Some(Architecture::Amd64))])).is_err());
    }

    #[test]
    fn uids_are_distinct_and_shaped_like_kubernetes_ones() {
        let a = uid();
        let b = uid();
        assert_ne!(a, b);
        assert_eq!(a.len(), 36);
        assert_eq!(a.matches('-').count(), 4);
    }

    #[test]
    fn rows_run_in_an_order_that_needs_nothing_not_yet_there() {
        let table = vec![
            ChangeRule::grow_shrink(F::Networks, M::Live, M::Live),
            ChangeRule::grow_shrink(F::DataDiskSize, M::Live, M::Never),
            ChangeRule::grow_shrink(F::DataDisks, M::Live, M::NextBoot),
            ChangeRule::grow_shrink(F::MemoryMib, M::Live, M::PowerOff),
            ChangeRule::both(F::Firmware, M::Never),
            ChangeRule::both(F::OsDiskSize, M::Live),
        ];
        let plan: Vec<(F, bool)> = row_plan(&table)
            .into_iter()
            .map(|(f, g, _)| (f, g))
            .collect();
        assert_eq!(
            plan,
            vec![
                (F::MemoryMib, true),
                (F::OsDiskSize, true),
                (F::DataDisks, true),
                (F::DataDiskSize, true),
                (F::Networks, true),
                (F::Networks, false),
                (F::DataDisks, false),
                (F::MemoryMib, false),
            ]
        );
    }
}
