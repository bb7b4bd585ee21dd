//! The simulator runs the backend conformance suite (`banlieue-conformance`) like every
//! backend: create, find again, adopt, power, each row of its change table, an outage
//! (a connection made while the world injects a transient fault into every call),
//! delete. Its lifecycle is tested there, not again here.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use banlieue_backend_sim::SimFactory;
use banlieue_conformance::{Outage, Target};
use banlieue_sdk::api::common::ProviderClass;
use banlieue_sdk::async_trait;
use banlieue_sdk::backend::{
    Backend, BackendError, BackendFactory, Connection, MachineIdentity, MachineRequest, MachineSpec,
};
use serde_json::json;

struct Sim {
    factory: SimFactory,
    down: Arc<AtomicBool>,
}

struct Down(Arc<AtomicBool>);

#[async_trait]
impl Outage for Down {
    async fn end(self: Box<Self>) {
        self.0.store(false, Ordering::SeqCst);
    }
}

#[async_trait]
impl Target for Sim {
    fn name(&self) -> String {
        "sim".into()
    }

    async fn connect(&self) -> Result<Arc<dyn Backend>, BackendError> {
        let mut settings = vec![("latency", "40ms")];
        // The sim's worlds are per endpoint: a connection made during the outage shares
        // the machines and fails every call with a transient fault.
        if self.down.load(Ordering::SeqCst) {
            settings.extend([("failureRate", "1.0"), ("failureKinds", "transient")]);
        }
        self.factory.connect(&Connection {
            class: ProviderClass::Sim,
            endpoint: "sim://conformance".into(),
            credentials: Default::default(),
            ca_bundle: None,
            insecure_skip_tls_verify: false,
            settings: settings
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect(),
        })
    }

    fn request(&self, identity: MachineIdentity) -> MachineRequest {
        let spec = serde_json::from_value(json!({
            "template": "ubuntu-2404", "numCPUs": 2, "numCoresPerSocket": 1, "memoryMiB": 2048,
            "diskGiB": 20, "powerState": "PoweredOn",
            "network": [{"networkName": "VM Network"}],
        }))
        .expect("a valid VSphereMachine spec");
        MachineRequest {
            identity,
            spec: MachineSpec::VSphere(spec),
            failure_domain: None,
            bootstrap: None,
            instance_id: None,
            disks_imported: false,
        }
    }

    async fn outage(&self) -> Result<Box<dyn Outage>, String> {
        self.down.store(true, Ordering::SeqCst);
        Ok(Box::new(Down(self.down.clone())))
    }
}

#[tokio::test]
async fn the_simulator_conforms() {
    let target = Sim {
        factory: SimFactory::new(),
        down: Arc::default(),
    };
    let report = banlieue_conformance::run(&target).await;
    eprintln!("{report}");
    report.assert_complete();
    // The suite ran every row of the sim's table (nothing left not exercised) and left
    // nothing behind.
    assert!(report.checks.len() >= 20, "{report}");
    assert_eq!(target.factory.machines("sim://conformance"), []);
}

/// A backend that lies in one way, to show the suite sees it.
#[derive(Clone, Copy, Debug)]
enum Lie {
    /// `apply_changes` answers as if it had applied, and applies nothing.
    AppliesNothing,
    /// `delete` answers `Gone` and deletes nothing.
    DeletesNothing,
    /// A new connection no longer finds machines by their UID (it would make a second).
    ForgetsOnRestart,
}

struct Liar {
    inner: Arc<dyn Backend>,
    lie: Lie,
    fresh: bool,
}

#[async_trait]
impl Backend for Liar {
    async fn check(&self) -> Result<banlieue_sdk::backend::Inventory, BackendError> {
        self.inner.check().await
    }
    async fn find_image(
        &self,
        s: &banlieue_sdk::backend::ImageSourceSet,
    ) -> Result<banlieue_sdk::backend::ImageLookup, BackendError> {
        self.inner.find_image(s).await
    }
    async fn ensure(
        &self,
        r: &MachineRequest,
    ) -> Result<banlieue_sdk::backend::MachineObservation, BackendError> {
        self.inner.ensure(r).await
    }
    async fn observe(
        &self,
        i: &MachineIdentity,
    ) -> Result<Option<banlieue_sdk::backend::MachineObservation>, BackendError> {
        if matches!(self.lie, Lie::ForgetsOnRestart) && self.fresh && i.provider_id.is_none() {
            return Ok(None);
        }
        self.inner.observe(i).await
    }
    async fn delete(
        &self,
        i: &MachineIdentity,
    ) -> Result<banlieue_sdk::backend::Deletion, BackendError> {
        if matches!(self.lie, Lie::DeletesNothing) {
            return Ok(banlieue_sdk::backend::Deletion::Gone);
        }
        self.inner.delete(i).await
    }
    async fn made_for(
        &self,
        kind: &str,
        i: &MachineIdentity,
    ) -> Result<Vec<banlieue_sdk::backend::MadeFor>, BackendError> {
        self.inner.made_for(kind, i).await
    }
    async fn apply_changes(
        &self,
        r: &MachineRequest,
        fields: &[banlieue_sdk::api::resources::MachineField],
    ) -> Result<banlieue_sdk::backend::MachineObservation, BackendError> {
        if matches!(self.lie, Lie::AppliesNothing) {
            return Ok(self.inner.observe(&r.identity).await?.unwrap_or_default());
        }
        self.inner.apply_changes(r, fields).await
    }
    fn capabilities(&self) -> banlieue_sdk::backend::BackendCapabilities {
        self.inner.capabilities()
    }
}

struct Lying {
    sim: Sim,
    lie: Lie,
    connections: std::sync::atomic::AtomicU32,
}

#[async_trait]
impl Target for Lying {
    fn name(&self) -> String {
        format!("sim that lies: {:?}", self.lie)
    }
    async fn connect(&self) -> Result<Arc<dyn Backend>, BackendError> {
        let fresh = self.connections.fetch_add(1, Ordering::SeqCst) > 0;
        Ok(Arc::new(Liar {
            inner: self.sim.connect().await?,
            lie: self.lie,
            fresh,
        }))
    }
    fn request(&self, identity: MachineIdentity) -> MachineRequest {
        self.sim.request(identity)
    }
    async fn outage(&self) -> Result<Box<dyn Outage>, String> {
        self.sim.outage().await
    }
}

#[tokio::test]
async fn the_suite_sees_a_backend_that_lies() {
    // (the lie, the checks that must fail)
    let cases: [(Lie, &[&str]); 3] = [
        (
            Lie::AppliesNothing,
            &["change cpus grow (Live)", "change memoryMiB grow (Live)"],
        ),
        (Lie::DeletesNothing, &["delete"]),
        (Lie::ForgetsOnRestart, &["found after a restart"]),
    ];
    for (lie, failing) in cases {
        let target = Lying {
            sim: Sim {
                factory: SimFactory::new(),
                down: Arc::default(),
            },
            lie,
            connections: Default::default(),
        };
        let report = banlieue_conformance::run(&target).await;
        for name in failing {
            let check = report
                .check(name)
                .unwrap_or_else(|| panic!("{name} ran\n{report}"));
            assert!(
                matches!(check.outcome, banlieue_conformance::Outcome::Failed(_)),
                "{lie:?}: {name} should fail\n{report}"
            );
        }
        assert!(
            std::panic::catch_unwind(|| report.assert_passed()).is_err(),
            "{lie:?}"
        );
    }
}
