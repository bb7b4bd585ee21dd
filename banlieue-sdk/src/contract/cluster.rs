//! [`InfraClusterRead`] and [`InfraTemplateRead`]: uniform access to every
//! InfraCluster kind and every machine template kind, so one controller of each
//! serves all backends.

use crate::api::common::{LabelSelector, LocalObjectReference};
use crate::api::infra::{
    ClusterStatus, MachineTemplateStatus, cloud_hypervisor, libvirt, proxmox, vsphere,
};
use crate::capi::capacity::Sizing;

use super::InfraMachineKind;

/// What every InfraCluster kind offers.
pub trait InfraClusterRead {
    /// The machine kind this cluster's machines are.
    const MACHINE_KIND: InfraMachineKind;
    /// `spec.providerRefs`.
    fn provider_refs(&self) -> &[LocalObjectReference];
    /// `spec.providerSelector`.
    fn provider_selector(&self) -> Option<&LabelSelector>;
    /// `spec.failureDomainSelector`.
    fn failure_domain_selector(&self) -> Option<&LabelSelector>;
    /// `spec.controlPlaneFailureDomainSelector`.
    fn control_plane_failure_domain_selector(&self) -> Option<&LabelSelector>;
    /// `status`, if written.
    fn cluster_status(&self) -> Option<&ClusterStatus>;
}

/// What every machine template kind offers.
pub trait InfraTemplateRead {
    /// The sizing of the machines it stamps out.
    fn sizing(&self) -> Sizing;
    /// `status`, if written.
    fn template_status(&self) -> Option<&MachineTemplateStatus>;
}

macro_rules! infra_cluster_read {
    ($ty:ty, $kind:expr) => {
        impl InfraClusterRead for $ty {
            const MACHINE_KIND: InfraMachineKind = $kind;
            fn provider_refs(&self) -> &[LocalObjectReference] {
                &self.spec.provider_refs
            }
            fn provider_selector(&self) -> Option<&LabelSelector> {
                self.spec.provider_selector.as_ref()
            }
            fn failure_domain_selector(&self) -> Option<&LabelSelector> {
                self.spec.failure_domain_selector.as_ref()
            }
            fn control_plane_failure_domain_selector(&self) -> Option<&LabelSelector> {
                self.spec.control_plane_failure_domain_selector.as_ref()
            }
            fn cluster_status(&self) -> Option<&ClusterStatus> {
                self.status.as_ref()
            }
        }
    };
}

infra_cluster_read!(vsphere::VSphereCluster, InfraMachineKind::VSphere);
infra_cluster_read!(proxmox::ProxmoxCluster, InfraMachineKind::Proxmox);
infra_cluster_read!(libvirt::LibvirtCluster, InfraMachineKind::Libvirt);
infra_cluster_read!(
    cloud_hypervisor::CloudHypervisorCluster,
    InfraMachineKind::CloudHypervisor
);

macro_rules! infra_template_read {
    ($ty:ty, |$spec:ident| $sizing:expr) => {
        impl InfraTemplateRead for $ty {
            fn sizing(&self) -> Sizing {
                let $spec = &self.spec.template.spec;
                $sizing
            }
            fn template_status(&self) -> Option<&MachineTemplateStatus> {
                self.status.as_ref()
            }
        }
    };
}

infra_template_read!(vsphere::VSphereMachineTemplate, |s| Sizing {
    cpus: s.num_cpus,
    memory_mib: s.memory_mib,
});
infra_template_read!(proxmox::ProxmoxMachineTemplate, |s| Sizing {
    cpus: s.sockets.max(1) * s.cores.max(1),
    memory_mib: s.memory_mib,
});
infra_template_read!(libvirt::LibvirtMachineTemplate, |s| Sizing {
    cpus: s.cpus,
    memory_mib: s.memory_mib,
});
infra_template_read!(cloud_hypervisor::CloudHypervisorMachineTemplate, |s| {
    Sizing {
        cpus: s.cpus,
        memory_mib: s.memory_mib,
    }
});
