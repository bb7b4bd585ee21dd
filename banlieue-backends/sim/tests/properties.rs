//! Properties of the simulator over arbitrary sequences of calls.

mod support;

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::time::Duration;

use banlieue_backend_sim::{SimBackend, SimFactory};
use banlieue_sdk::api::common::PowerState;
use banlieue_sdk::backend::{Backend, Deletion};
use proptest::prelude::*;
use support::*;

#[derive(Clone, Debug)]
enum Call {
    Ensure(u8, PowerState),
    Delete(u8),
    Observe(u8),
    /// Let this many milliseconds pass.
    Wait(u16),
}

fn power() -> impl Strategy<Value = PowerState> {
    prop_oneof![
        Just(PowerState::PoweredOn),
        Just(PowerState::PoweredOff),
        Just(PowerState::Suspended),
    ]
}

fn call() -> impl Strategy<Value = Call> {
    prop_oneof![
        4 => (0u8..8, power()).prop_map(|(u, p)| Call::Ensure(u, p)),
        3 => (0u8..8).prop_map(Call::Delete),
        1 => (0u8..8).prop_map(Call::Observe),
        2 => (0u16..400).prop_map(Call::Wait),
    ]
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap()
}

fn uid(u: u8) -> String {
    format!("m{u}")
}

/// Machines on `endpoint` never share a UID, an address or a provider ID, and only
/// UIDs that were ensured ever have one.
fn check_invariants(sim: &SimFactory, endpoint: &str, ensured: &BTreeSet<String>) {
    let machines = sim.machines(endpoint);
    let uids: HashSet<_> = machines.iter().map(|m| &m.identity.uid).collect();
    let addresses: HashSet<_> = machines.iter().map(|m| m.address).collect();
    let ids: HashSet<_> = machines.iter().map(|m| &m.provider_id).collect();
    assert_eq!(uids.len(), machines.len());
    assert_eq!(addresses.len(), machines.len());
    assert_eq!(ids.len(), machines.len());
    assert!(uids.iter().all(|u| ensured.contains(*u)));
    assert_eq!(sim.stats(endpoint).machines, machines.len() as u64);
}

/// Drives one machine the way the operator does: ensure (or delete) until settled.
async fn converge(backend: &SimBackend, u: &str, want: Option<PowerState>) {
    for _ in 0..100 {
        let wait = match want {
            Some(p) => {
                let o = backend.ensure(&request(u, vsphere(p))).await.unwrap();
                if o.settled_at(p) {
                    return;
                }
                o.pending.map(|p| p.retry_after).unwrap_or(Duration::ZERO)
            }
            None => match backend.delete(&identity(u)).await.unwrap() {
                Deletion::Gone => return,
                Deletion::InProgress { retry_after } => retry_after,
            },
        };
        tokio::time::advance(wait).await;
    }
    panic!("{u} did not converge to {want:?}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// Without latency, the machines are exactly the UIDs ensured and not deleted since,
    /// each in the power state last asked for, after every single call.
    #[test]
    fn machines_are_the_uids_ensured_and_not_deleted(calls in prop::collection::vec(call(), 0..60)) {
        runtime().block_on(async {
            let sim = SimFactory::new();
            let endpoint = "sim://prop-instant";
            let backend = connect(&sim, endpoint, &[]);
            let mut model: BTreeMap<String, PowerState> = BTreeMap::new();
            for call in calls {
                match call {
                    Call::Ensure(u, p) => {
                        let o = backend.ensure(&request(&uid(u), vsphere(p))).await.unwrap();
                        assert!(o.settled_at(p), "{o:?}");
                        model.insert(uid(u), p);
                    }
                    Call::Delete(u) => {
                        assert_eq!(backend.delete(&identity(&uid(u))).await.unwrap(), Deletion::Gone);
                        model.remove(&uid(u));
                    }
                    Call::Observe(u) => {
                        let o = backend.observe(&identity(&uid(u))).await.unwrap();
                        assert_eq!(o.and_then(|o| o.power_state), model.get(&uid(u)).copied());
                    }
                    Call::Wait(ms) => tokio::time::advance(Duration::from_millis(ms.into())).await,
                }
                let machines: BTreeMap<String, PowerState> = sim
                    .machines(endpoint)
                    .into_iter()
                    .map(|m| (m.identity.uid, m.power_state.expect("created")))
                    .collect();
                assert_eq!(machines, model);
            }
        });
    }

    /// With latency, any interleaving keeps machines unique, and once every machine is
    /// driven to its last wish the simulator holds exactly the machines wanted, each in
    /// its wanted power state; deleting them all leaves nothing behind.
    #[test]
    fn any_interleaving_converges_without_leaks(
        calls in prop::collection::vec(call(), 0..60),
        latency in 1u64..300,
    ) {
        runtime().block_on(async {
            let sim = SimFactory::new();
            let endpoint = "sim://prop-latency";
            let latency = format!("{latency}ms");
            let backend = connect(&sim, endpoint, &[("latency", latency.as_str())]);
            let mut wanted: BTreeMap<String, Option<PowerState>> = BTreeMap::new();
            let mut ensured = BTreeSet::new();
            for call in calls {
                match call {
                    Call::Ensure(u, p) => {
                        backend.ensure(&request(&uid(u), vsphere(p))).await.unwrap();
                        wanted.insert(uid(u), Some(p));
                        ensured.insert(uid(u));
                    }
                    Call::Delete(u) => {
                        backend.delete(&identity(&uid(u))).await.unwrap();
                        wanted.insert(uid(u), None);
                    }
                    Call::Observe(u) => {
                        backend.observe(&identity(&uid(u))).await.unwrap();
                    }
                    Call::Wait(ms) => tokio::time::advance(Duration::from_millis(ms.into())).await,
                }
                check_invariants(&sim, endpoint, &ensured);
            }

            for (u, want) in &wanted {
                converge(&backend, u, *want).await;
            }
            let machines: BTreeMap<String, Option<PowerState>> = sim
                .machines(endpoint)
                .into_iter()
                .map(|m| (m.identity.uid, m.power_state))
                .collect();
            let expected: BTreeMap<String, Option<PowerState>> =
                wanted.iter().filter(|(_, w)| w.is_some()).map(|(u, w)| (u.clone(), *w)).collect();
            assert_eq!(machines, expected);
            check_invariants(&sim, endpoint, &ensured);

            for u in wanted.keys() {
                converge(&backend, u, None).await;
            }
            assert_eq!(sim.machines(endpoint), []);
            let stats = sim.stats(endpoint);
            assert_eq!(stats.machines_created, stats.machines_deleted, "no machine leaked");
        });
    }
}
