//! Every CustomResourceDefinition banlieue serves, ready to install or print.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

use crate::api::infra::{cloud_hypervisor as ch, libvirt as lv, proxmox as px, vsphere as vs};
use crate::api::{Provider, VMClass, VMImage, VirtualMachine};

/// All CRDs of both groups (20), in a stable order: `banlieue.io` first, then
/// `infrastructure.banlieue.io`, each sorted by kind.
pub fn all() -> Vec<CustomResourceDefinition> {
    let mut crds = vec![
        Provider::crd(),
        VMClass::crd(),
        VMImage::crd(),
        VirtualMachine::crd(),
        vs::VSphereMachine::crd(),
        vs::VSphereMachineTemplate::crd(),
        vs::VSphereCluster::crd(),
        vs::VSphereClusterTemplate::crd(),
        px::ProxmoxMachine::crd(),
        px::ProxmoxMachineTemplate::crd(),
        px::ProxmoxCluster::crd(),
        px::ProxmoxClusterTemplate::crd(),
        lv::LibvirtMachine::crd(),
        lv::LibvirtMachineTemplate::crd(),
        lv::LibvirtCluster::crd(),
        lv::LibvirtClusterTemplate::crd(),
        ch::CloudHypervisorMachine::crd(),
        ch::CloudHypervisorMachineTemplate::crd(),
        ch::CloudHypervisorCluster::crd(),
        ch::CloudHypervisorClusterTemplate::crd(),
    ];
    crds.sort_by(|a, b| sort_key(a).cmp(&sort_key(b)));
    crds
}

fn sort_key(crd: &CustomResourceDefinition) -> (bool, &str) {
    (
        crd.spec.group != crate::api::GROUP,
        crd.spec.names.kind.as_str(),
    )
}

/// The file name `make crds` writes a CRD to: `<group>_<plural>.yaml`.
pub fn file_name(crd: &CustomResourceDefinition) -> String {
    format!("{}_{}.yaml", crd.spec.group, crd.spec.names.plural)
}

/// A CRD as YAML, the way `banlieue crds` prints it.
pub fn to_yaml(crd: &CustomResourceDefinition) -> Result<String, serde_saphyr::ser::Error> {
    serde_saphyr::to_string(crd)
}
