//! The lab backend runs banlieue's backend conformance suite, as an out-of-tree backend
//! does against its own lab: every check, including its change table (CPUs and memory
//! live) and an outage (the factory's switch).

use std::sync::Arc;

use banlieue_conformance::{Outage, Target};
use banlieue_example_embedding::lab::LabFactory;
use banlieue_example_embedding::machine::LabMachine;
use banlieue_sdk::api::common::{PowerState, ProviderClass};
use banlieue_sdk::async_trait;
use banlieue_sdk::backend::{
    Backend, BackendError, BackendFactory, Connection, CustomSpec, MachineIdentity, MachineRequest,
    MachineSpec,
};
use banlieue_sdk::contract::InfraMachineRead;
use serde_json::json;

struct Lab(Arc<LabFactory>);

struct Down(Arc<LabFactory>);

#[async_trait]
impl Outage for Down {
    async fn end(self: Box<Self>) {
        self.0.set_reachable(true);
    }
}

#[async_trait]
impl Target for Lab {
    fn name(&self) -> String {
        "the embedding example's lab".into()
    }

    async fn connect(&self) -> Result<Arc<dyn Backend>, BackendError> {
        self.0.connect(&Connection {
            class: ProviderClass::new(banlieue_example_embedding::CLASS).expect("class"),
            endpoint: "lab://bench".into(),
            credentials: Default::default(),
            ca_bundle: None,
            insecure_skip_tls_verify: false,
            settings: Default::default(),
        })
    }

    fn request(&self, identity: MachineIdentity) -> MachineRequest {
        MachineRequest {
            identity,
            spec: MachineSpec::Custom(CustomSpec {
                kind: LabMachine::KIND,
                cpus: 2,
                memory_mib: 2048,
                power_state: PowerState::PoweredOn,
                spec: json!({"cpus": 2, "memoryMiB": 2048, "volume": "debian-13", "powerState": "PoweredOn"}),
            }),
            failure_domain: Some("lab".into()),
            bootstrap: None,
            instance_id: None,
            disks_imported: false,
        }
    }

    async fn outage(&self) -> Result<Box<dyn Outage>, String> {
        self.0.set_reachable(false);
        Ok(Box::new(Down(self.0.clone())))
    }
}

#[tokio::test]
async fn the_lab_conforms() {
    let report = banlieue_conformance::run(&Lab(Arc::default())).await;
    eprintln!("{report}");
    report.assert_complete();
}
