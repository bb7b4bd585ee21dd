//! Infra machines this process created that the cache has not shown yet, by VM UID, so
//! that a VM's deletion asks the API server only when the cache may hide a machine.
//!
//! A VM's finalizer must not go while one of its infra machines exists. The cache may
//! miss a machine only in two ways: the stores have not listed yet, or the machine was
//! created moments ago and its watch event is still on its way. The stores list after
//! this process became the leader, so every machine an earlier process made is in that
//! list; what remains is our own creates, which this set remembers. Every other
//! deletion trusts the cache: before, each one did a live GET per VM (the scale
//! benchmark's one read per VM in the delete phase).

use std::collections::HashMap;
use std::sync::Mutex;

use crate::contract::InfraMachineKind;

/// VM UIDs whose infra machine (of the kind given; it is named after the VM) was created
/// by this process and not yet seen cached.
#[derive(Debug, Default)]
pub(crate) struct UnseenMachines(Mutex<HashMap<String, Create>>);

/// One create of ours the cache has not shown yet.
#[derive(Debug, Clone, Copy)]
struct Create {
    kind: InfraMachineKind,
    /// Its `Scheduled` Event was recorded.
    announced: bool,
}

impl UnseenMachines {
    /// We are creating the VM `uid`'s infra machine of `kind`. Asking again for the
    /// same kind (a retry, or a reconcile that ran before the cache showed it) keeps
    /// what is known about the first ask.
    pub fn created(&self, uid: &str, kind: InfraMachineKind) {
        let mut map = self.0.lock().expect("unseen machines");
        match map.get(uid) {
            Some(c) if c.kind == kind => {}
            _ => {
                map.insert(
                    uid.to_owned(),
                    Create {
                        kind,
                        announced: false,
                    },
                );
            }
        }
    }

    /// Whether the create of the VM `uid`'s machine of `kind` is to be announced now:
    /// true once per create, so a VM reconciled again before the cache shows its new
    /// machine (its own status write's event can come first: the two are different
    /// watches) does not record a second `Scheduled` Event. A create not remembered
    /// (forgotten meanwhile) is announced.
    pub fn announce(&self, uid: &str, kind: InfraMachineKind) -> bool {
        let mut map = self.0.lock().expect("unseen machines");
        match map.get_mut(uid) {
            Some(c) if c.kind == kind => !std::mem::replace(&mut c.announced, true),
            _ => true,
        }
    }

    /// The cache shows the VM `uid`'s machines of `kinds`: a create of one of them is
    /// seen. (A CopyDisk's target is created while its source is cached; only the
    /// target's own kind counts.)
    pub fn seen(&self, uid: &str, kinds: impl IntoIterator<Item = InfraMachineKind>) {
        let mut map = self.0.lock().expect("unseen machines");
        if let Some(&Create { kind, .. }) = map.get(uid)
            && kinds.into_iter().any(|k| k == kind)
        {
            map.remove(uid);
        }
    }

    /// The VM `uid` lets go of its machines: nothing to remember.
    pub fn forget(&self, uid: &str) {
        self.0.lock().expect("unseen machines").remove(uid);
    }

    /// Whether the cache may be hiding a machine of the VM `uid` (`synced`: the stores
    /// have listed once since this process started).
    pub fn may_hide(&self, uid: &str, synced: bool) -> bool {
        cache_may_hide(
            synced,
            self.0.lock().expect("unseen machines").contains_key(uid),
        )
    }
}

/// The decision itself: the cache can be believed about a machine being absent only
/// after the first list, and only when no create of ours is still unseen.
fn cache_may_hide(synced: bool, created_unseen: bool) -> bool {
    !synced || created_unseen
}

#[cfg(test)]
mod tests {
    use super::{UnseenMachines, cache_may_hide};
    use crate::contract::InfraMachineKind;

    #[test]
    fn the_cache_is_believed_only_when_listed_and_no_create_of_ours_is_in_flight() {
        for (synced, unseen, hides) in [
            (false, false, true),
            (false, true, true),
            (true, true, true),
            (true, false, false),
        ] {
            assert_eq!(cache_may_hide(synced, unseen), hides, "{synced} {unseen}");
        }
    }

    #[test]
    fn a_create_is_remembered_until_the_cache_shows_it() {
        let unseen = UnseenMachines::default();
        assert!(!unseen.may_hide("a", true));
        unseen.created("a", InfraMachineKind::Libvirt);
        assert!(unseen.may_hide("a", true));
        assert!(
            !unseen.may_hide("b", true),
            "another VM's create hides nothing"
        );
        unseen.seen("a", [InfraMachineKind::VSphere]);
        assert!(
            unseen.may_hide("a", true),
            "a cached machine of another kind (a CopyDisk's source) is not the one made"
        );
        unseen.seen("a", [InfraMachineKind::VSphere, InfraMachineKind::Libvirt]);
        assert!(!unseen.may_hide("a", true));
        assert!(
            unseen.may_hide("a", false),
            "before the first list nothing is known"
        );
        unseen.created("c", InfraMachineKind::Proxmox);
        unseen.forget("c");
        assert!(!unseen.may_hide("c", true));
    }

    #[test]
    fn a_create_is_announced_once_however_often_it_is_asked_before_the_cache_shows_it() {
        let unseen = UnseenMachines::default();
        unseen.created("a", InfraMachineKind::Libvirt);
        assert!(unseen.announce("a", InfraMachineKind::Libvirt));
        unseen.created("a", InfraMachineKind::Libvirt);
        assert!(
            !unseen.announce("a", InfraMachineKind::Libvirt),
            "the same create, asked again before its watch event"
        );
        unseen.created("a", InfraMachineKind::Proxmox);
        assert!(
            unseen.announce("a", InfraMachineKind::Proxmox),
            "a machine of another kind is another create"
        );
        unseen.seen("a", [InfraMachineKind::Proxmox]);
        unseen.created("a", InfraMachineKind::Proxmox);
        assert!(
            unseen.announce("a", InfraMachineKind::Proxmox),
            "once seen and gone, a new create is new"
        );
        assert!(
            unseen.announce("b", InfraMachineKind::Libvirt),
            "a create not remembered is not silenced"
        );
    }
}
