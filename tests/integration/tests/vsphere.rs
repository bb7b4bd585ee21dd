//! The vSphere backend end to end: banlieue's controllers against a real apiserver,
//! the backend against vcsim (govmomi's vCenter simulator, a project-owned main run as
//! a separate process on loopback with TLS). Each test starts its own vcsim(s).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use banlieue_backend_sim::SimFactory;
use banlieue_backend_vsphere::VSphereFactory;
use banlieue_integration_tests::apply;
use banlieue_integration_tests::operator::{Operator, wait_for, wait_gone};
use banlieue_integration_tests::vcsim::Vcsim;
use banlieue_sdk::api::common::{BootstrapFormat, PowerState, ProviderClass};
use banlieue_sdk::api::infra::vsphere::VSphereMachine;
use banlieue_sdk::api::{Provider, VirtualMachine};
use banlieue_sdk::backend::{
    Backend, BackendRegistry, BootstrapData, Connection, Deletion, MachineIdentity, MachineRequest,
    MachineSpec, SecretValue,
};
use banlieue_sdk::conditions;
use banlieue_testenv::TestNamespace;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(60);

fn connection(sim: &Vcsim, password: &str) -> Connection {
    Connection {
        class: ProviderClass::Vsphere,
        endpoint: format!("{}/sdk", sim.ready.endpoint),
        credentials: [
            (
                "username".to_string(),
                SecretValue::new(sim.ready.username.clone()),
            ),
            ("password".to_string(), SecretValue::new(password)),
        ]
        .into(),
        ca_bundle: Some(sim.ready.ca_pem.clone()),
        insecure_skip_tls_verify: false,
        settings: [("taskPollInterval".to_string(), "50ms".to_string())].into(),
    }
}

fn request(uid: &str, template: &str, linked: bool) -> MachineRequest {
    let spec = serde_json::from_value(json!({
        "template": template, "numCPUs": 2, "memoryMiB": 2048,
        "cloneMode": if linked { "LinkedClone" } else { "FullClone" },
    }))
    .unwrap();
    MachineRequest {
        identity: MachineIdentity {
            uid: uid.into(),
            namespace: "direct".into(),
            name: format!("m-{}", &uid[..8]),
        },
        spec: MachineSpec::VSphere(spec),
        failure_domain: Some("DC0/DC0_C1".into()),
        bootstrap: Some(BootstrapData {
            format: BootstrapFormat::CloudConfig,
            user_data: SecretValue::new("#cloud-config\nruncmd: [echo hi]\n"),
            network_config: None,
        }),
    }
}

fn decoded(vm: &Value, key: &str) -> String {
    let v = vm["extraConfig"][key].as_str().unwrap_or_default();
    String::from_utf8(STANDARD.decode(v).unwrap()).unwrap()
}

async fn settle(
    backend: &dyn Backend,
    req: &MachineRequest,
) -> banlieue_sdk::backend::MachineObservation {
    for _ in 0..400 {
        match backend.ensure(req).await {
            Ok(o) if o.settled_at(req.spec.power_state()) => return o,
            Ok(_) => {}
            Err(e) if e.is_transient() => {}
            Err(e) => panic!("{e}"),
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("machine did not settle")
}

/// The backend alone against vcsim: inventory, clone (full and linked) with guestinfo,
/// power, addresses, delete, one session throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_backend_clones_configures_powers_and_deletes_on_vcsim() {
    let Some(sim) = Vcsim::start() else { return };
    let backend = VSphereFactory::new()
        .connect_vsphere(&connection(&sim, &sim.ready.password))
        .unwrap();
    let inventory = backend.check().await.unwrap();
    assert_eq!(inventory.version, sim.ready.version);
    let names: Vec<&str> = inventory
        .failure_domains
        .iter()
        .map(|f| f.name.as_str())
        .collect();
    assert_eq!(names, ["DC0/DC0_C0", "DC0/DC0_C1"]);
    let fd = &inventory.failure_domains[1];
    assert_eq!(fd.labels["topology.kubernetes.io/zone"], "DC0_C1");
    assert_eq!(fd.labels["topology.kubernetes.io/region"], "DC0");
    assert_eq!(fd.location["cluster"], "DC0_C1");
    assert!(fd.resources["datastore"].contains("LocalDS_0"), "{fd:?}");
    assert!(fd.resources["portGroup"].contains("VM Network"), "{fd:?}");

    for (i, linked) in [(1, false), (2, true)] {
        let uid = format!("{i:08x}-1111-4000-8000-000000000000");
        let req = request(&uid, &sim.ready.template, linked);
        let started = Instant::now();
        let o = settle(backend.as_ref(), &req).await;
        eprintln!(
            "clone (linked: {linked}) to running with an IP: {:?}",
            started.elapsed()
        );
        let vm = sim.vm(&req.identity.name).expect("the clone");
        assert_eq!(
            o.provider_id.as_deref(),
            Some(format!("vsphere://{}", vm["biosUUID"].as_str().unwrap()).as_str())
        );
        assert_eq!(vm["power"], "poweredOn");
        assert_eq!(
            (vm["cpus"].as_i64(), vm["memoryMB"].as_i64()),
            (Some(2), Some(2048))
        );
        assert_eq!(vm["extraConfig"]["banlieue.uid"], uid.as_str());
        assert_eq!(vm["extraConfig"]["guestinfo.userdata.encoding"], "base64");
        assert_eq!(
            decoded(&vm, "guestinfo.userdata"),
            "#cloud-config\nruncmd: [echo hi]\n"
        );
        assert!(decoded(&vm, "guestinfo.metadata").contains(&uid));
        assert_eq!(o.failure_domain.as_deref(), Some("DC0/DC0_C1"));
        let ip = vm["ip"].as_str().unwrap();
        assert!(
            o.addresses.iter().any(|a| a.address == ip),
            "{:?}",
            o.addresses
        );
        // Observing again clones nothing more.
        backend.ensure(&req).await.unwrap();
        assert_eq!(
            sim.vms()
                .iter()
                .filter(|v| v["name"] == req.identity.name.as_str())
                .count(),
            1
        );
    }
    for i in [1, 2] {
        let id = request(&format!("{i:08x}-1111-4000-8000-000000000000"), "", false).identity;
        let mut gone = false;
        for _ in 0..200 {
            if backend.delete(&id).await.unwrap() == Deletion::Gone {
                gone = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        assert!(gone);
        assert!(sim.vm(&id.name).is_none());
        assert!(backend.observe(&id).await.unwrap().is_none());
    }
    let sessions = sim.sessions();
    assert_eq!(sessions.len(), 1, "{sessions:?}");
    assert_eq!(backend.client().logins(), 1);
}
