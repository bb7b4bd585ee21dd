//! What a machine without a provider ID does with the backend machines made for its
//! namespace, kind and name ([`Backend::made_for`](crate::backend::Backend::made_for)):
//! an object restored from a backup has a new UID and no status, and a VirtualMachine
//! restored alone gets a freshly built machine with no `spec.providerID`. Creating
//! would make a second VM; this decides between creating, adopting the one VM it
//! finds, and waiting for a human.
//!
//! The rule, and why:
//! - Only the machine's own (its UID recorded) or nothing: create (or go on creating).
//! - One, not being deleted, that no other live object holds (by recorded UID or by
//!   `spec.providerID`): adopt it by its provider ID; the backend retags it with the new
//!   UID, as for `clusterctl move`.
//! - One being deleted: wait until it is gone, then create. A user who deleted VM `X`
//!   and made a new `X` gets a new VM, never the one whose deletion they asked for (the
//!   finalizers keep the old objects until the backend VM is gone, so this is seen
//!   only when they were removed by hand).
//! - One another live object holds, or several: wait, `RestorePending`, naming them and
//!   saying how to adopt one (`spec.providerID`) or release them (delete on the
//!   backend).

use std::time::Duration;

use crate::backend::MadeFor;

/// Reason of a machine that waits for a human to pick its backend VM.
pub(crate) const RESTORE_PENDING: &str = "RestorePending";

/// How soon a machine waiting on [`RESTORE_PENDING`] looks again (a backend deletion
/// finishing, or a VM deleted by hand, wakes no watch).
pub(crate) const RESTORE_RECHECK: Duration = Duration::from_secs(30);

/// What a machine without a provider ID does before the backend is asked to ensure it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Restore {
    /// Ensure as usual (creating when the backend has nothing for its UID).
    Ensure,
    /// Ensure with this provider ID: adopt the VM made for a previous incarnation.
    Adopt { provider_id: String, from: String },
    /// Create nothing; say why and look again later.
    Wait(String),
}

/// Decides, from the backend machines made for `name` and who holds each.
///
/// `uid` is the machine's; `holder` names the live object (other than this machine)
/// that holds a candidate, by its recorded UID or its provider ID, if any.
pub(crate) fn decide(
    uid: &str,
    what: &str,
    found: &[MadeFor],
    holder: impl Fn(&MadeFor) -> Option<String>,
) -> Restore {
    if found.is_empty() || found.iter().any(|m| m.uid.as_deref() == Some(uid)) {
        // Its own machine (a create in flight, or made and not yet recorded): the
        // backend finds it by the UID.
        return Restore::Ensure;
    }
    let describe = |m: &MadeFor| {
        let recorded = m
            .uid
            .as_deref()
            .map(|u| format!(", made for UID {u}"))
            .unwrap_or_default();
        format!("{} ({}{recorded})", m.backend_ref, m.provider_id)
    };
    let how = "To keep one, set this machine's spec.providerID to its provider ID \
               (kubectl patch --type merge -p '{\"spec\":{\"providerID\":\"<id>\"}}'); \
               to release them, delete them on the backend, and this machine creates its own";
    if let [only] = found {
        if only.deleting {
            return Restore::Wait(format!(
                "the backend VM {} made for {what} by an earlier object is being deleted; \
                 this machine creates its own once it is gone",
                describe(only)
            ));
        }
        return match holder(only) {
            None => Restore::Adopt {
                provider_id: only.provider_id.clone(),
                from: describe(only),
            },
            Some(holder) => Restore::Wait(format!(
                "the backend VM {} was made for {what}, but {holder} holds it and is \
                 alive, and one VM cannot belong to two objects: banlieue neither adopts \
                 it nor creates a second one. Delete this object if it is the copy; to keep \
                 this one instead, release the VM from the other (remove its finalizer \
                 {finalizer}, then delete it: the VM stays) and this machine adopts it",
                describe(only),
                finalizer = crate::controllers::MACHINE_FINALIZER,
            )),
        };
    }
    let all: Vec<String> = found.iter().map(describe).collect();
    Restore::Wait(format!(
        "{} backend VMs were made for {what}: {}; banlieue cannot tell which is this \
         object's, and creates none. {how}",
        found.len(),
        all.join(", ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn made(provider_id: &str, uid: Option<&str>, deleting: bool) -> MadeFor {
        MadeFor {
            provider_id: provider_id.into(),
            uid: uid.map(str::to_owned),
            backend_ref: format!("vm-{provider_id}"),
            deleting,
        }
    }

    #[test]
    fn a_restored_machine_adopts_one_free_vm_and_waits_otherwise() {
        let nobody = |_: &MadeFor| None;
        let what = "LibvirtMachine ns/web";
        // Nothing made for it: create.
        assert_eq!(decide("new", what, &[], nobody), Restore::Ensure);
        // Its own (a create in flight): go on.
        let own = [made("sim://1", Some("new"), false)];
        assert_eq!(decide("new", what, &own, nobody), Restore::Ensure);
        // One made for an earlier incarnation, held by nobody: adopt.
        let old = [made("sim://1", Some("old"), false)];
        assert!(matches!(
            decide("new", what, &old, nobody),
            Restore::Adopt { provider_id, .. } if provider_id == "sim://1"
        ));
        // One made before UIDs were recorded: adopt too.
        let legacy = [made("sim://1", None, false)];
        assert!(matches!(
            decide("new", what, &legacy, nobody),
            Restore::Adopt { .. }
        ));
        // Being deleted: wait, never adopt.
        let going = [made("sim://1", Some("old"), true)];
        let Restore::Wait(message) = decide("new", what, &going, nobody) else {
            panic!("a VM being deleted is adopted");
        };
        assert!(message.contains("being deleted") && message.contains("vm-sim://1"));
        // Held by a live object: wait, naming it.
        let held = |_: &MadeFor| Some("LibvirtMachine ns/other".to_owned());
        let Restore::Wait(message) = decide("new", what, &old, held) else {
            panic!("a VM another live object holds is adopted");
        };
        assert!(message.contains("LibvirtMachine ns/other"), "{message}");
        // Several: wait, naming each and how to pick.
        let two = [
            made("sim://1", Some("a"), false),
            made("sim://2", Some("b"), false),
        ];
        let Restore::Wait(message) = decide("new", what, &two, nobody) else {
            panic!("one of several is adopted");
        };
        assert!(
            message.contains("sim://1")
                && message.contains("sim://2")
                && message.contains("spec.providerID"),
            "{message}"
        );
    }
}
