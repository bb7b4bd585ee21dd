//! The pure decision functions never panic, whatever they are given: objects whose
//! fields hold unicode, control characters, empty or huge strings and numbers far
//! outside what admission allows (objects written before a schema tightened, or by
//! a client that skipped validation), run through the whole chain the controllers
//! run: Provider status from an inventory, scheduling, building the infra machine,
//! IPAM resolution, and the VirtualMachine and machine statuses.

use std::collections::BTreeMap;
use std::time::Duration;

use banlieue_sdk::api::common::PowerState;
use banlieue_sdk::api::infra::{MachineAddress, MachineAddressType};
use banlieue_sdk::api::{Provider, VMClass, VMImage, VirtualMachine};
use banlieue_sdk::backend::{
    Architecture, BackendError, FailureDomainInventory, Inventory, MachineObservation, Pending,
};
#[allow(unused_imports)] // backend_spec() comes from this trait
use banlieue_sdk::contract::InfraMachineRead as _;
use banlieue_sdk::scheduling::{self, Decision, Sibling};
use banlieue_sdk::status::machine::Outcome;
use banlieue_sdk::status::provider::Unreachable;
use banlieue_sdk::status::virtual_machine::{Infra, Input as VmInput, Scheduling};
use banlieue_sdk::{builder, capi, status};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use proptest::prelude::*;
use serde_json::{Value, json};

/// Any text: unicode, control characters, newlines, empty.
fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => "(?s:.{0,12})",
        1 => Just(String::new()),
        1 => "[a-z0-9-]{1,8}",
        1 => Just("x".repeat(5000)),
    ]
}

/// Any integer: mostly plausible, sometimes zero, negative or at a type's limit.
fn number() -> impl Strategy<Value = Value> {
    prop_oneof![
        1 => Just(json!(0)),
        1 => Just(json!(-1)),
        1 => Just(json!(i64::MAX)),
        1 => Just(json!(i64::MIN)),
        1 => Just(json!(u32::MAX)),
        20 => (1i64..4096).prop_map(|n| json!(n)),
    ]
}

fn map() -> impl Strategy<Value = BTreeMap<String, String>> {
    proptest::collection::btree_map(text(), text(), 0..4)
}

const CLASSES: [&str; 5] = ["sim", "vsphere", "proxmox", "libvirt", "cloud-hypervisor"];
const KINDS: [&str; 6] = [
    "VSphereMachine",
    "ProxmoxMachine",
    "LibvirtMachine",
    "CloudHypervisorMachine",
    "",
    "Nonsense",
];

/// A world where the names mostly line up (so scheduling and building get far) but
/// every value may be hostile.
#[derive(Debug, Clone)]
struct World {
    vm: Value,
    class: Value,
    image: Value,
    provider: Value,
    inventory: Inventory,
    bootstrap_secret: Option<String>,
}

fn world() -> impl Strategy<Value = World> {
    let names = (text(), text(), text(), text()); // storage class, network class, zone, resource value
    let vm_bits = (
        text(),
        map(),
        proptest::sample::select(vec!["PoweredOn", "PoweredOff", "Suspended"]),
        proptest::option::of(text()),
        proptest::option::of(text()),
    );
    let class_bits = (number(), number(), number(), number());
    let provider_bits = (
        proptest::sample::select(CLASSES.to_vec()),
        proptest::sample::select(KINDS.to_vec()),
        text(),
        map(),
    );
    let inventory_bits = (
        text(),
        proptest::collection::vec((text(), map(), text()), 0..3),
        proptest::option::of(text()),
        any::<bool>(),
        // Mostly found, so that enough worlds get past scheduling.
        prop_oneof![4 => Just(Some(true)), 1 => Just(Some(false)), 1 => Just(None)],
        // The hosts' architecture: mostly the image's (amd64), so that enough worlds
        // get past scheduling; else another, or none reported.
        prop_oneof![
            4 => Just(Some(Architecture::Amd64)),
            1 => Just(Some(Architecture::Arm64)),
            1 => Just(None)
        ],
    );
    (names, vm_bits, class_bits, provider_bits, inventory_bits).prop_map(
        |(
            (storage, network, zone, resource),
            (name, labels, power, mac, address),
            (cpus, memory, disk, cores),
            (class, kind, endpoint, settings),
            (version, domains, bootstrap_secret, offered, image_found, architecture),
        )| {
            let mut networks = json!([{"name": "eth0", "networkClass": network}]);
            if let Some(mac) = mac {
                networks[0]["macAddress"] = json!(mac);
            }
            if let Some(address) = address {
                networks[0]["ipam"] = json!({"mode": "static", "addresses": [address], "gateway": address});
            }
            let vm = json!({
                "apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine",
                "metadata": {"name": name, "namespace": "ns", "uid": "u-1", "generation": 1, "labels": labels},
                "spec": {"classRef": {"name": "c"}, "imageRef": {"name": "i"}, "powerState": power,
                         "networks": networks,
                         "placement": {"providerRef": {"name": "p"},
                                       "failureDomainSelector": {"matchLabels": {"zone": zone.clone()}}},
                         "bootstrap": {"format": "cloud-config", "userData": {"name": "ud"}}}
            });
            let class_json = json!({
                "apiVersion": "banlieue.io/v1alpha1", "kind": "VMClass", "metadata": {"name": "c"},
                "spec": {"cpus": cpus, "memoryMiB": memory, "coresPerSocket": cores,
                         "disk": {"sizeGiB": disk, "storageClass": storage}}
            });
            let image = json!({
                "apiVersion": "banlieue.io/v1alpha1", "kind": "VMImage", "metadata": {"name": "i"},
                "spec": {"os": {"family": "linux", "distribution": resource, "version": resource},
                         "sources": {"sim": {"name": resource}, "vsphere": {"template": resource},
                                     "proxmox": {"templateID": 100},
                                     "libvirt": {"path": format!("/{resource}")},
                                     "cloudHypervisor": {"firmware": format!("/{resource}"),
                                                         "disk": format!("/{resource}.raw")}}}
            });
            let mut image = image;
            // Whether the VMImage controller found it on the Provider, or has not looked.
            if let Some(available) = image_found {
                image["status"] = json!({"providers": [{"namespace": "ns", "name": "p", "available": available}]});
            }
            let mut settings = settings;
            settings.insert("machineKind".into(), kind.into());
            let target = json!({"datastore": resource, "storage": resource, "pool": resource,
                                "portGroup": resource, "bridge": resource, "network": resource});
            let provider = json!({
                "apiVersion": "banlieue.io/v1alpha1", "kind": "Provider",
                "metadata": {"name": "p", "namespace": "ns", "uid": "p-1", "generation": 1},
                "spec": {"class": class, "connection": {"endpoint": endpoint},
                         "capabilities": {"storageClasses": [{"name": storage, "target": target}],
                                          "networkClasses": [{"name": network, "target": target}]},
                         "settings": settings}
            });
            let resources: BTreeMap<String, std::collections::BTreeSet<String>> = [
                "datastore", "storage", "pool", "portGroup", "bridge", "network",
            ]
            .iter()
            .map(|k| (k.to_string(), [resource.clone()].into()))
            .collect();
            let mut failure_domains: Vec<FailureDomainInventory> = domains
                .into_iter()
                .map(|(name, labels, _)| FailureDomainInventory {
                    name,
                    labels,
                    resources: resources.clone(),
                    architecture,
                    ..Default::default()
                })
                .collect();
            let named = FailureDomainInventory {
                labels: [("zone".to_string(), zone.clone())].into(),
                name: zone,
                resources,
                architecture,
                ..Default::default()
            };
            // Without it the VM's failure domain exists nowhere: unschedulable.
            if offered {
                failure_domains.push(named);
            }
            let inventory = Inventory {
                version,
                failure_domains,
            };
            World {
                vm,
                class: class_json,
                image,
                provider,
                inventory,
                bootstrap_secret,
            }
        },
    )
}

fn now() -> Time {
    Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH)
}

fn backend_error() -> impl Strategy<Value = BackendError> {
    (
        any::<bool>(),
        text(),
        text(),
        proptest::option::of(0u64..u64::MAX),
    )
        .prop_map(|(transient, reason, message, after)| {
            let error = if transient {
                BackendError::transient(reason, message)
            } else {
                BackendError::terminal(reason, message)
            };
            match after {
                Some(ms) => error.retry_after(Duration::from_millis(ms)),
                None => error,
            }
        })
}

fn observation() -> impl Strategy<Value = MachineObservation> {
    (
        proptest::option::of(text()),
        proptest::option::of(proptest::sample::select(vec![
            PowerState::PoweredOn,
            PowerState::PoweredOff,
            PowerState::Suspended,
        ])),
        proptest::collection::vec(text(), 0..3),
        proptest::option::of(text()),
        proptest::option::of((text(), proptest::option::of(text()), 0u64..u64::MAX)),
    )
        .prop_map(|(id, power, addresses, fd, pending)| MachineObservation {
            provider_id: id,
            power_state: power,
            addresses: addresses
                .into_iter()
                .map(|a| MachineAddress {
                    type_: MachineAddressType::InternalIp,
                    address: a,
                })
                .collect(),
            failure_domain: fd,
            pending: pending.map(|(operation, task, ms)| Pending {
                operation,
                task,
                retry_after: Duration::from_millis(ms),
            }),
            ..Default::default()
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn the_whole_decision_chain_never_panics(w in world(), unreachable in (text(), text())) {
        chain(&w, unreachable);
    }

    #[test]
    fn machine_status_survives_any_sequence_of_outcomes(
        steps in proptest::collection::vec(
            prop_oneof![
                observation().prop_map(Ok),
                backend_error().prop_map(Err),
            ],
            1..6,
        ),
        power in proptest::sample::select(vec![PowerState::PoweredOn, PowerState::PoweredOff, PowerState::Suspended]),
        generation in proptest::option::of(any::<i64>()),
    ) {
        let mut previous = None;
        for step in &steps {
            let outcome = match step {
                Ok(observation) => Outcome::Observed(observation),
                Err(error) => Outcome::Failed(error),
            };
            let next = status::machine::compute(previous.as_ref(), power, generation, outcome, &now());
            // Deterministic: the same input gives the same status.
            let again = status::machine::compute(previous.as_ref(), power, generation, outcome_of(step), &now());
            prop_assert_eq!(&next, &again);
            previous = Some(next);
        }
    }

    #[test]
    fn failure_domain_names_never_panic(provider in text(), domain in text(), name in text()) {
        let qualified = capi::failure_domains::qualified_name(&provider, &domain);
        let _ = capi::failure_domains::split_name(&qualified);
        let _ = capi::failure_domains::split_name(&name);
    }
}

/// How far a world got through the chain.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Stage {
    /// serde refused a value (e.g. a negative CPU count into an unsigned field): such
    /// objects never reach these functions, the typed client fails reading them.
    Unreadable,
    Unschedulable,
    Kept,
    NotBuilt,
    Built,
}

/// Runs the chain the controllers run on one world.
fn chain(w: &World, unreachable: (String, String)) -> Stage {
    let vm: Result<VirtualMachine, _> = serde_json::from_value(w.vm.clone());
    let class: Result<VMClass, _> = serde_json::from_value(w.class.clone());
    let image: Result<VMImage, _> = serde_json::from_value(w.image.clone());
    let provider: Result<Provider, _> = serde_json::from_value(w.provider.clone());
    let (Ok(vm), Ok(class), Ok(image), Ok(mut provider)) = (vm, class, image, provider) else {
        return Stage::Unreadable;
    };
    let unreachable = Unreachable {
        reason: unreachable.0,
        message: unreachable.1,
    };
    let down = status::provider::compute(None, &provider.spec, Some(1), Err(&unreachable), &now());
    let up = status::provider::compute(
        Some(&down),
        &provider.spec,
        Some(2),
        Ok((
            &w.inventory,
            &banlieue_sdk::backend::BackendCapabilities::conservative(),
        )),
        &now(),
    );
    provider.status = Some(up);
    let kinds = banlieue_sdk::contract::KindTable::built_in();
    let _ = builder::machine_kind(&provider, &kinds);
    let providers = [provider];
    let siblings = [Sibling::of(&vm)];
    let loads = scheduling::Loads::of(&siblings, "");
    let decision = scheduling::schedule(&scheduling::Input {
        vm: &vm,
        class: &class.spec,
        image: &image,
        providers: &providers,
        current: None,
        basis: scheduling::Basis::Unrecorded,
        siblings: &siblings,
        loads: Some(&loads),
    });
    let target = match decision {
        Decision::Place(target) => target,
        Decision::Keep { .. } => return Stage::Kept,
        Decision::Unschedulable { reason, message } => {
            let s = status::virtual_machine::compute(
                None,
                &VmInput {
                    generation: Some(1),
                    desired_power: vm.spec.power_state,
                    scheduling: Scheduling::Unschedulable {
                        reason,
                        message: &message,
                    },
                    infra: None,
                    migration: None,
                    waiting: None,
                    deleting: false,
                    drift: Default::default(),
                    class: Default::default(),
                },
                &now(),
            );
            assert!(!s.conditions.is_empty());
            return Stage::Unschedulable;
        }
    };
    let placement = target.to_status(None);
    let built = builder::infra_machine(
        &builder::Input {
            vm: &vm,
            class: &class.spec,
            image: &image,
            provider: &providers[0],
            target: &target,
            bootstrap_secret: w.bootstrap_secret.as_deref(),
        },
        &kinds,
    );
    let Ok(machine) = built else {
        return Stage::NotBuilt;
    };
    let spec = machine.backend_spec();
    let _ = capi::ipam::static_addresses(&spec);
    let pools = capi::ipam::pool_devices(&spec);
    let _ = capi::ipam::resolve(&spec, &BTreeMap::new());
    for (index, _) in pools {
        let _ = capi::ipam::claim_name(&vm.metadata.name.clone().unwrap_or_default(), index);
    }
    let reference = banlieue_sdk::api::common::TypedLocalObjectReference {
        api_group: "infrastructure.banlieue.io".into(),
        kind: machine.kind().kind().into(),
        name: vm.metadata.name.clone().unwrap_or_default(),
    };
    let _ = status::virtual_machine::compute(
        None,
        &VmInput {
            generation: Some(1),
            desired_power: vm.spec.power_state,
            scheduling: Scheduling::Placed(&placement),
            infra: Some(Infra {
                reference: &reference,
                provider_id: None,
                status: None,
            }),
            migration: None,
            waiting: None,
            deleting: false,
            drift: Default::default(),
            class: Default::default(),
        },
        &now(),
    );
    Stage::Built
}

/// The fuzzing above means something only if worlds get through: enough of them
/// must reach every stage.
#[test]
fn generated_worlds_reach_every_stage() {
    const WORLDS: usize = 1024;
    use proptest::strategy::ValueTree;
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let mut reached: BTreeMap<String, usize> = BTreeMap::new();
    let strategy = (world(), (text(), text()));
    for _ in 0..WORLDS {
        let (w, unreachable) = strategy.new_tree(&mut runner).unwrap().current();
        *reached
            .entry(format!("{:?}", chain(&w, unreachable)))
            .or_default() += 1;
    }
    for stage in ["Unreadable", "Unschedulable", "NotBuilt", "Built"] {
        let n = reached.get(stage).copied().unwrap_or_default();
        assert!(
            n >= 10,
            "only {n} of {WORLDS} worlds reached {stage}: {reached:?}"
        );
    }
}

fn outcome_of(step: &Result<MachineObservation, BackendError>) -> Outcome<'_> {
    match step {
        Ok(observation) => Outcome::Observed(observation),
        Err(error) => Outcome::Failed(error),
    }
}
