//! Helpers shared by the simulator's integration tests.
#![allow(dead_code)]

use std::sync::Arc;

use banlieue_backend_sim::{SimBackend, SimFactory};
use banlieue_sdk::api::common::{PowerState, ProviderClass};
use banlieue_sdk::backend::{Connection, MachineIdentity, MachineRequest, MachineSpec};
use serde_json::json;

pub fn connection(endpoint: &str, settings: &[(&str, &str)]) -> Connection {
    Connection {
        class: ProviderClass::Sim,
        endpoint: endpoint.to_string(),
        credentials: Default::default(),
        ca_bundle: None,
        insecure_skip_tls_verify: false,
        settings: settings
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    }
}

pub fn connect(factory: &SimFactory, endpoint: &str, settings: &[(&str, &str)]) -> Arc<SimBackend> {
    factory
        .connect_sim(&connection(endpoint, settings))
        .expect("valid settings")
}

pub fn identity(uid: &str) -> MachineIdentity {
    MachineIdentity {
        uid: uid.to_string(),
        namespace: "default".to_string(),
        name: format!("vm-{uid}"),
        provider_id: None,
    }
}

fn power(p: PowerState) -> serde_json::Value {
    serde_json::to_value(p).unwrap()
}

pub fn vsphere(p: PowerState) -> MachineSpec {
    MachineSpec::VSphere(
        serde_json::from_value(json!({
            "template": "ubuntu-2404", "numCPUs": 2, "memoryMiB": 4096, "powerState": power(p),
        }))
        .unwrap(),
    )
}

pub fn proxmox(p: PowerState) -> MachineSpec {
    MachineSpec::Proxmox(
        serde_json::from_value(json!({
            "templateID": 9000, "cores": 2, "memoryMiB": 2048, "powerState": power(p),
        }))
        .unwrap(),
    )
}

pub fn libvirt(p: PowerState) -> MachineSpec {
    MachineSpec::Libvirt(
        serde_json::from_value(json!({
            "image": {"path": "/var/lib/images/debian.qcow2"}, "cpus": 1, "memoryMiB": 1024,
            "powerState": power(p),
        }))
        .unwrap(),
    )
}

pub fn cloud_hypervisor(p: PowerState) -> MachineSpec {
    MachineSpec::CloudHypervisor(
        serde_json::from_value(json!({
            "image": {"firmware": "/usr/share/cloud-hypervisor/CLOUDHV.fd", "disk": "/var/lib/images/debian.raw"},
            "cpus": 1, "memoryMiB": 512, "powerState": power(p),
        }))
        .unwrap(),
    )
}

pub fn request(uid: &str, spec: MachineSpec) -> MachineRequest {
    MachineRequest {
        identity: identity(uid),
        spec,
        failure_domain: None,
        bootstrap: None,
        instance_id: None,
        disks_imported: false,
    }
}

pub fn on(uid: &str) -> MachineRequest {
    request(uid, vsphere(PowerState::PoweredOn))
}
