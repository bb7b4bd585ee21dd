//! `LabMachine`: the embedding operator's own infrastructure machine kind, declared
//! here and nowhere in banlieue. Registered with the `lab` class
//! ([`banlieue_sdk::backend::BackendRegistry::register_kind`]), it gets banlieue's
//! machine controller (finalizer, backend calls, providerID, conditions), the
//! VirtualMachine controller builds it for VMs placed on `lab` Providers, and nothing
//! of banlieue's had to change for it.

use banlieue_sdk::api::common::{LocalObjectReference, PowerState};
use banlieue_sdk::api::infra::{BootstrapDataRef, MachineStatus};
use banlieue_sdk::backend::{CustomSpec, MachineSpec};
use banlieue_sdk::builder::{BuildError, Parts};
use banlieue_sdk::contract::{InfraMachineKind, InfraMachineRead, MachineKind};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A machine in the lab.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "infrastructure.banlieue.io",
    version = "v1alpha1",
    kind = "LabMachine",
    namespaced,
    status = "MachineStatus",
    derive = "PartialEq",
    category = "banlieue"
)]
#[serde(rename_all = "camelCase")]
pub struct LabMachineSpec {
    /// The Provider it runs on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider_ref: Option<LocalObjectReference>,
    /// `lab://<uid>`, once the lab made it.
    #[serde(
        default,
        rename = "providerID",
        skip_serializing_if = "Option::is_none"
    )]
    pub provider_id: Option<String>,
    /// Desired power state.
    #[serde(default)]
    pub power_state: PowerState,
    /// Bootstrap data, for machines no CAPI Machine owns.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bootstrap: Option<BootstrapDataRef>,
    /// Virtual CPUs.
    pub cpus: u32,
    /// Memory in MiB.
    #[serde(rename = "memoryMiB")]
    pub memory_mib: u64,
    /// The lab volume it boots from (the image's `sources.other.lab.volume`).
    pub volume: String,
    /// The bench it sits on (the failure domain's `bench` location).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bench: Option<String>,
}

impl InfraMachineRead for LabMachine {
    const KIND: InfraMachineKind = InfraMachineKind::new("LabMachine", "labmachines", "lab://");

    fn provider_ref(&self) -> Option<&LocalObjectReference> {
        self.spec.provider_ref.as_ref()
    }
    fn provider_id(&self) -> Option<&str> {
        self.spec.provider_id.as_deref()
    }
    fn desired_power_state(&self) -> PowerState {
        self.spec.power_state
    }
    fn bootstrap(&self) -> Option<&BootstrapDataRef> {
        self.spec.bootstrap.as_ref()
    }
    fn machine_status(&self) -> Option<&MachineStatus> {
        self.status.as_ref()
    }
    fn backend_spec(&self) -> MachineSpec {
        MachineSpec::Custom(CustomSpec {
            kind: Self::KIND,
            cpus: self.spec.cpus,
            memory_mib: self.spec.memory_mib,
            power_state: self.spec.power_state,
            spec: serde_json::to_value(&self.spec).unwrap_or_default(),
        })
    }
}

impl MachineKind for LabMachine {
    fn build(parts: &Parts<'_>) -> Result<Self, BuildError> {
        let input = parts.input;
        let volume = input
            .image
            .spec
            .sources
            .other
            .get(crate::CLASS)
            .and_then(|source| source.get("volume"))
            .cloned()
            .ok_or_else(|| {
                BuildError::new(
                    "ImageSourceUnsupported",
                    "the image's sources.other.lab has no volume",
                )
            })?;
        Ok(LabMachine {
            metadata: parts.metadata.clone(),
            spec: LabMachineSpec {
                provider_ref: parts.provider_ref.clone(),
                provider_id: None,
                power_state: parts.power_state,
                bootstrap: parts.bootstrap.clone(),
                cpus: input.class.cpus,
                memory_mib: input.class.memory_mib,
                volume,
                bench: parts.location("bench"),
            },
            status: None,
        })
    }
}
