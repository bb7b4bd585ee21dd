//! The VM scheduler's memory: placements decided but not visible in the cache yet,
//! and each namespace's spread counts.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::api::VirtualMachine;
use crate::api::virtual_machine::ScheduledPlacement;
use crate::scheduling::Loads;

/// How long spread counts are trusted before they are counted again from the cache.
///
/// Between two counts, each decision adds its own placement, so VMs placed together
/// spread exactly; what the counts miss for up to this long is VMs deleted, or placed
/// by someone else. Spread is a preference: that is worth one scan of the namespace's
/// VMs a second instead of one per placement.
const RECOUNT: Duration = Duration::from_secs(1);

/// Behind the context's mutex: decisions are taken one at a time.
#[derive(Default)]
pub(crate) struct Placements {
    /// Placements decided, by VM uid, until the cache shows them.
    decided: HashMap<String, ScheduledPlacement>,
    /// Spread counts by namespace, with when they were counted.
    loads: HashMap<String, (Instant, Loads)>,
}

impl Placements {
    /// The placement decided for `uid`, if the cache may not show it yet.
    pub fn decided(&self, uid: &str) -> Option<&ScheduledPlacement> {
        self.decided.get(uid)
    }

    /// The cache shows `uid`'s placement (or the VM is going): forget the decision.
    pub fn forget(&mut self, uid: &str) -> Option<ScheduledPlacement> {
        self.decided.remove(uid)
    }

    /// Remembers a decision and counts it in its namespace's spread.
    pub fn decide(&mut self, namespace: &str, uid: String, placement: ScheduledPlacement) {
        if let Some((_, loads)) = self.loads.get_mut(namespace) {
            loads.add(&placement);
        }
        self.decided.insert(uid, placement);
    }

    /// The spread counts of `namespace`, counted again from `cached` (the VM cache)
    /// when older than [`RECOUNT`].
    pub fn loads(
        &mut self,
        namespace: &str,
        cached: impl FnOnce() -> Vec<Arc<VirtualMachine>>,
    ) -> &Loads {
        let fresh = self
            .loads
            .get(namespace)
            .is_some_and(|(at, _)| at.elapsed() < RECOUNT);
        if !fresh {
            let counted = count(&self.decided, namespace, &cached());
            self.loads
                .insert(namespace.to_owned(), (Instant::now(), counted));
        }
        &self.loads[namespace].1
    }

    /// Where `vm` is placed: as its status says, or as decided here when the cached
    /// status does not show it yet.
    pub fn placed<'a>(&'a self, vm: &'a VirtualMachine) -> Option<&'a ScheduledPlacement> {
        placement_of(&self.decided, vm)
    }
}

fn count(
    decided: &HashMap<String, ScheduledPlacement>,
    namespace: &str,
    cached: &[Arc<VirtualMachine>],
) -> Loads {
    let mut loads = Loads::default();
    for vm in cached
        .iter()
        .filter(|vm| vm.metadata.namespace.as_deref() == Some(namespace))
    {
        if let Some(placement) = placement_of(decided, vm) {
            loads.add(placement);
        }
    }
    loads
}

/// Where `vm` is placed: its status, else a decision the status does not show yet.
fn placement_of<'a>(
    decided: &'a HashMap<String, ScheduledPlacement>,
    vm: &'a VirtualMachine,
) -> Option<&'a ScheduledPlacement> {
    vm.status
        .as_ref()
        .and_then(|s| s.placement.as_ref())
        .or_else(|| vm.metadata.uid.as_deref().and_then(|uid| decided.get(uid)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::virtual_machine::VirtualMachineStatus;

    fn at(fd: &str) -> ScheduledPlacement {
        ScheduledPlacement {
            provider: "p".into(),
            failure_domain: Some(fd.into()),
            ..Default::default()
        }
    }

    fn vm(namespace: &str, uid: &str, placed: Option<&str>) -> Arc<VirtualMachine> {
        let mut vm: VirtualMachine = serde_json::from_value(serde_json::json!({
            "apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine",
            "metadata": {"name": uid, "namespace": namespace, "uid": uid},
            "spec": {"classRef": {"name": "c"}, "imageRef": {"name": "i"}}
        }))
        .expect("a VirtualMachine");
        vm.status = placed.map(|fd| VirtualMachineStatus {
            placement: Some(at(fd)),
            ..Default::default()
        });
        Arc::new(vm)
    }

    #[test]
    fn counts_status_then_decisions_once_each_and_adds_new_decisions() {
        let mut book = Placements::default();
        book.decide("ns", "b".into(), at("a"));
        // "c" was decided and its status shows it now: counted once.
        book.decide("ns", "c".into(), at("b"));
        let cached = vec![
            vm("ns", "a", Some("a")),
            vm("ns", "b", None),
            vm("ns", "c", Some("b")),
            vm("other", "d", Some("a")),
        ];
        let loads = book.loads("ns", || cached.clone()).clone();
        assert_eq!(loads.get("p", Some("a")), 2);
        assert_eq!(loads.get("p", Some("b")), 1);
        book.decide("ns", "e".into(), at("b"));
        let again = book.loads("ns", || panic!("counted again within RECOUNT"));
        assert_eq!(again.get("p", Some("b")), 2);
        assert_eq!(
            book.forget("e").map(|p| p.failure_domain),
            Some(Some("b".into()))
        );
        assert!(book.decided("e").is_none());
    }
}
