//! The hostile battery: bad input for every CRD banlieue ships, grouped by class, must
//! be refused at admission (CRD schema and CEL rules) with a message that says what to
//! fix; valid near-misses must be accepted, so the rules are not over-broad. Runs on the
//! real kube-apiserver + etcd of `banlieue_testenv` (missing binaries fail the test).
//!
//! At the end a table of passed/total per class is printed to stdout; any failed case
//! fails the test.

use std::collections::BTreeMap;
use std::fmt;

use banlieue_integration_tests::admission_cases::{
    self, Case, Want, accept, accept_status, accept_update, assert_none_failed, reject,
    reject_post, reject_status, reject_update, run, vm, vm_class, vm_image,
};
use banlieue_integration_tests::{with, without};
use serde_json::{Value, json};

/// The class of bad input a case belongs to (the rows of the summary table).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Class {
    Names,
    References,
    Labels,
    Sizes,
    Network,
    Selectors,
    Immutability,
    Endpoints,
    Enums,
}

impl fmt::Display for Class {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self {
            Class::Names => "names",
            Class::References => "references",
            Class::Labels => "label keys/values",
            Class::Sizes => "sizes",
            Class::Network => "network addresses",
            Class::Selectors => "selectors",
            Class::Immutability => "immutability",
            Class::Endpoints => "endpoints/URLs",
            Class::Enums => "enums",
        };
        f.write_str(name)
    }
}

use Class::*;

// The texts the apiserver's messages must contain. Ours come from the CEL rules'
// messages; the others are the apiserver's own schema messages, which name the bound.
const OBJECT_NAME: &str = "must be a Kubernetes object name";
const DISK_NAME: &str = "disk names must be DNS labels";
const LABEL_KEY: &str = "must be a label key";
const LABEL_KEYS: &str = "label keys must be an optional DNS subdomain prefix";
const MATCH_LABEL_KEYS: &str = "matchLabels keys must be label keys";
const ANNOTATION_KEYS: &str = "annotation keys must be an optional DNS subdomain prefix";
const LABEL_VALUE: &str = "label values must be empty or at most 63";
const MAC_FORMAT: &str = "macAddress must look like";
const MAC_UNICAST: &str = "macAddress must be a unicast address";
const MAC_TWICE: &str = "two network interfaces have the same macAddress";
const GATEWAY_FAMILY: &str = "ipam.gateway must be of the same IP family as an address";
const DHCP_EXTRAS: &str = "gateway and nameservers are not used with mode dhcp";
const HOST: &str = "controlPlaneEndpoint.host must be a DNS name or an IP address";
const ENDPOINT_UNICODE: &str =
    "connection.endpoint must not contain Unicode spaces or invisible characters";
const ENDPOINT_URL: &str = "connection.endpoint must be a URL";
const OPERATORS: &str = r#"supported values: "In", "NotIn", "Exists", "DoesNotExist""#;
const NEEDS_VALUES: &str = "operator In and NotIn need at least one entry in values";
const NO_VALUES: &str = "operator Exists and DoesNotExist take no values";
const TEMPLATE_IMMUTABLE: &str = "spec.template is immutable";
const PROVIDER_ID_IMMUTABLE: &str = "spec.providerID is immutable once set";
const ENDPOINT_IMMUTABLE: &str = "controlPlaneEndpoint cannot be changed or removed once set";
const TOO_LONG: &str = "Too long: may not be more than";

// ---------------------------------------------------------------------------------
// Valid base objects, one per kind; every case mutates one of them.

const BACKENDS: [&str; 4] = ["VSphere", "Proxmox", "Libvirt", "CloudHypervisor"];
const INFRA: &str = "infrastructure.banlieue.io/v1alpha1";

/// The shared vsphere Provider with a failure domain.
fn provider() -> Value {
    with(
        admission_cases::provider(),
        "/spec/failureDomains",
        json!([{"name": "east-a", "labels": {"topology.kubernetes.io/zone": "east-a"}}]),
    )
}

fn sim_provider() -> Value {
    json!({
        "apiVersion": "banlieue.io/v1alpha1", "kind": "Provider", "metadata": {"name": "p"},
        "spec": {"class": "sim", "connection": {"endpoint": "sim://local"}}
    })
}

/// The VM with a second interface.
fn vm2() -> Value {
    with(
        vm(),
        "/spec/networks/1",
        json!({"name": "eth1", "networkClass": "backend"}),
    )
}

fn machine_spec(backend: &str) -> Value {
    match backend {
        "VSphere" => json!({"template": "ubuntu", "numCPUs": 2, "memoryMiB": 2048,
                            "network": [{"networkName": "VM Network"}]}),
        "Proxmox" => json!({"templateID": 9000, "cores": 2, "memoryMiB": 2048,
                            "network": [{"bridge": "vmbr0"}]}),
        "Libvirt" => json!({"image": {"path": "/var/lib/libvirt/images/debian.qcow2"},
                            "cpus": 1, "memoryMiB": 512, "network": [{"network": "default"}]}),
        "CloudHypervisor" => {
            json!({"image": {"kernel": "/boot/vmlinuz", "disk": "/var/lib/ch/disk.raw"},
                                    "cpus": 1, "memoryMiB": 512, "network": [{"bridge": "br0"}]})
        }
        other => panic!("unknown backend {other}"),
    }
}

/// A second network interface of `backend`'s shape.
fn nic(backend: &str) -> Value {
    machine_spec(backend)["network"][0].clone()
}

fn machine(backend: &str) -> Value {
    json!({"apiVersion": INFRA, "kind": format!("{backend}Machine"), "metadata": {"name": "m"},
           "spec": machine_spec(backend)})
}

fn machine_template(backend: &str) -> Value {
    json!({"apiVersion": INFRA, "kind": format!("{backend}MachineTemplate"), "metadata": {"name": "t"},
           "spec": {"template": {"spec": machine_spec(backend)}}})
}

fn cluster(backend: &str) -> Value {
    json!({"apiVersion": INFRA, "kind": format!("{backend}Cluster"), "metadata": {"name": "k"},
           "spec": {"providerRefs": [{"name": "p1"}]}})
}

fn cluster_template(backend: &str) -> Value {
    json!({"apiVersion": INFRA, "kind": format!("{backend}ClusterTemplate"), "metadata": {"name": "t"},
           "spec": {"template": {"spec": {"providerRefs": [{"name": "p1"}]}}}})
}

fn scheme(backend: &str) -> &'static str {
    match backend {
        "VSphere" => "vsphere://",
        "Proxmox" => "proxmox://",
        "Libvirt" => "libvirt://",
        _ => "cloud-hypervisor://",
    }
}

fn disk(name: &str) -> Value {
    json!({"name": name, "sizeGiB": 10})
}

fn pool_ipam(pool_ref: Value) -> Value {
    json!({"mode": "pool", "poolRef": pool_ref})
}

fn pool_ref() -> Value {
    json!({"apiGroup": "ipam.cluster.x-k8s.io", "kind": "InClusterIPPool", "name": "lan"})
}

fn selector_expr(key: &str, operator: &str, values: Option<Value>) -> Value {
    let mut e = json!({"key": key, "operator": operator});
    if let Some(values) = values {
        e["values"] = values;
    }
    json!({"matchExpressions": [e]})
}

fn anti_affinity(selector: Value, topology_key: &str) -> Value {
    json!([{"labelSelector": selector, "topologyKey": topology_key}])
}

fn repeat(n: usize) -> String {
    "a".repeat(n)
}

/// A valid DNS subdomain of exactly `len` characters (labels of up to 63).
fn subdomain_of(len: usize) -> String {
    let mut out = String::new();
    while out.len() < len {
        if !out.is_empty() {
            out.push('.');
        }
        let room = (len - out.len()).min(63);
        // Never leave a 1-character remainder that would need a trailing '.'.
        let take = if len - out.len() - room == 1 {
            room - 1
        } else {
            room
        };
        out.push_str(&"b".repeat(take));
    }
    out
}

// ---------------------------------------------------------------------------------
// The cases, by class.

fn names() -> Vec<Case> {
    let mut c = vec![
        reject(
            "VM classRef with uppercase",
            with(vm(), "/spec/classRef/name", json!("Small")),
            OBJECT_NAME,
        ),
        reject(
            "VM imageRef with a '/'",
            with(vm(), "/spec/imageRef/name", json!("ubuntu/24.04")),
            OBJECT_NAME,
        ),
        reject(
            "VM imageRef starting with '-'",
            with(vm(), "/spec/imageRef/name", json!("-ubuntu")),
            OBJECT_NAME,
        ),
        reject(
            "VM classRef with '..'",
            with(vm(), "/spec/classRef/name", json!("small..v2")),
            OBJECT_NAME,
        ),
        reject(
            "VM classRef with a space",
            with(vm(), "/spec/classRef/name", json!("small ")),
            OBJECT_NAME,
        ),
        reject(
            "VM classRef of 254 characters",
            with(vm(), "/spec/classRef/name", json!(subdomain_of(254))),
            TOO_LONG,
        ),
        accept(
            "VM classRef with dots and dashes (near miss)",
            with(vm(), "/spec/classRef/name", json!("web.v2-small")),
        ),
        accept(
            "VM classRef of exactly 253 characters (near miss)",
            with(vm(), "/spec/classRef/name", json!(subdomain_of(253))),
        ),
        reject(
            "VM providerRef with an underscore",
            with(
                vm(),
                "/spec/placement/providerRef",
                json!({"name": "prod_provider"}),
            ),
            OBJECT_NAME,
        ),
        reject(
            "VM bootstrap Secret name with a space",
            with(
                vm(),
                "/spec/bootstrap/userData",
                json!({"name": "user data"}),
            ),
            OBJECT_NAME,
        ),
        reject(
            "VM bootstrap Secret key with a '/'",
            with(
                vm(),
                "/spec/bootstrap/userData",
                json!({"name": "s", "key": "a/b"}),
            ),
            "key must be a ConfigMap or Secret key",
        ),
        reject(
            "VM bootstrap Secret key '..'",
            with(
                vm(),
                "/spec/bootstrap/networkConfig",
                json!({"name": "s", "key": ".."}),
            ),
            "key must be a ConfigMap or Secret key",
        ),
        accept(
            "VM bootstrap Secret key with dots (near miss)",
            with(
                vm(),
                "/spec/bootstrap/userData",
                json!({"name": "s", "key": "user-data.yaml"}),
            ),
        ),
        reject(
            "Provider credentialsRef with uppercase and space",
            with(
                provider(),
                "/spec/connection/credentialsRef/name",
                json!("VC Credentials"),
            ),
            OBJECT_NAME,
        ),
        reject(
            "Provider CA ConfigMap name with an underscore",
            with(
                provider(),
                "/spec/connection/caBundle/configMapRef/name",
                json!("vc_ca"),
            ),
            OBJECT_NAME,
        ),
        reject(
            "Provider CA Secret key with a space",
            with(
                provider(),
                "/spec/connection/caBundle",
                json!({"secretRef": {"name": "vc-ca", "key": "ca crt"}}),
            ),
            "key must be a ConfigMap or Secret key",
        ),
        accept(
            "Provider credentialsRef with a dot (near miss)",
            with(
                provider(),
                "/spec/connection/credentialsRef/name",
                json!("vc-credentials.v2"),
            ),
        ),
        reject(
            "Provider storage class not a DNS label",
            with(
                provider(),
                "/spec/capabilities/storageClasses/0/name",
                json!("Fast_SSD"),
            ),
            "class names must be DNS labels",
        ),
        reject(
            "Provider network class starting with '-'",
            with(
                provider(),
                "/spec/capabilities/networkClasses/0/name",
                json!("-front"),
            ),
            "class names must be DNS labels",
        ),
        reject(
            "VM network interface name with an underscore",
            with(vm(), "/spec/networks/0/name", json!("eth_0")),
            "networks[].name must be a DNS label",
        ),
        reject(
            "VM networkClass with a space",
            with(vm(), "/spec/networks/0/networkClass", json!("front end")),
            "networkClass must name a Provider network class",
        ),
        accept(
            "VM networkClass with digits and '-' (near miss)",
            with(vm(), "/spec/networks/0/networkClass", json!("frontend-2")),
        ),
        reject(
            "VM data disk storageClass with uppercase",
            with(
                vm(),
                "/spec/disks",
                json!([{"name": "d", "sizeGiB": 1, "storageClass": "Fast"}]),
            ),
            "storageClass must name a Provider storage class",
        ),
        reject(
            "VMClass OS disk storageClass with a '/'",
            with(vm_class(), "/spec/disk/storageClass", json!("fast/ssd")),
            "storageClass must name a Provider storage class",
        ),
        reject(
            "VM data disk name with a '/'",
            with(vm(), "/spec/disks", json!([disk("data/1")])),
            DISK_NAME,
        ),
        reject(
            "VM data disk name '..'",
            with(vm(), "/spec/disks", json!([disk("..")])),
            DISK_NAME,
        ),
        reject(
            "VM data disk name with uppercase",
            with(vm(), "/spec/disks", json!([disk("Data")])),
            DISK_NAME,
        ),
        reject(
            "VM data disk name with a dot",
            with(vm(), "/spec/disks", json!([disk("data.img")])),
            DISK_NAME,
        ),
        accept(
            "VM data disk name 'data-1' (near miss)",
            with(vm(), "/spec/disks", json!([disk("data-1")])),
        ),
        reject(
            "VMImage sim name empty",
            with(vm_image(), "/spec/sources/sim/name", json!("")),
            "should be at least 1 chars long",
        ),
    ];
    let bad_disks = ["../etc", "scsi/1", "disk..img", "x y"];
    for (backend, bad) in BACKENDS.iter().zip(bad_disks) {
        c.push(reject(
            format!("{backend}Machine additional disk named {bad:?}"),
            with(
                machine(backend),
                "/spec/additionalDisks",
                json!([disk(bad)]),
            ),
            DISK_NAME,
        ));
        c.push(reject(
            format!("{backend}Machine bootstrap Secret name with uppercase"),
            with(
                machine(backend),
                "/spec/bootstrap",
                json!({"dataSecretName": "Bootstrap"}),
            ),
            "dataSecretName must be a Secret name",
        ));
        c.push(reject(
            format!("{backend}MachineTemplate additional disk named {bad:?}"),
            with(
                machine_template(backend),
                "/spec/template/spec/additionalDisks",
                json!([disk(bad)]),
            ),
            DISK_NAME,
        ));
    }
    c.push(accept(
        "LibvirtMachine additional disk 'logs' and bootstrap Secret 'm1-bootstrap' (near miss)",
        with(
            with(
                machine("Libvirt"),
                "/spec/additionalDisks",
                json!([disk("logs")]),
            ),
            "/spec/bootstrap",
            json!({"dataSecretName": "m1-bootstrap"}),
        ),
    ));
    c
}

fn references() -> Vec<Case> {
    let mut c = vec![
        reject(
            "poolRef apiGroup with a version",
            with(
                vm(),
                "/spec/networks/0/ipam",
                pool_ipam(with(
                    pool_ref(),
                    "/apiGroup",
                    json!("ipam.cluster.x-k8s.io/v1beta1"),
                )),
            ),
            "apiGroup must be an API group",
        ),
        reject(
            "poolRef kind as a plural resource",
            with(
                vm(),
                "/spec/networks/0/ipam",
                pool_ipam(with(pool_ref(), "/kind", json!("inclusterippools"))),
            ),
            "kind must be a kind in CamelCase",
        ),
        reject(
            "poolRef kind with a space",
            with(
                vm(),
                "/spec/networks/0/ipam",
                pool_ipam(with(pool_ref(), "/kind", json!("InCluster IPPool"))),
            ),
            "kind must be a kind in CamelCase",
        ),
        reject(
            "poolRef name with a space",
            with(
                vm(),
                "/spec/networks/0/ipam",
                pool_ipam(with(pool_ref(), "/name", json!("pool a"))),
            ),
            OBJECT_NAME,
        ),
        reject(
            "poolRef without kind",
            with(
                vm(),
                "/spec/networks/0/ipam",
                pool_ipam(without(pool_ref(), "/kind")),
            ),
            "poolRef.kind: Required value",
        ),
        reject(
            "poolRef with mode dhcp",
            with(
                vm(),
                "/spec/networks/0/ipam",
                json!({"mode": "dhcp", "poolRef": pool_ref()}),
            ),
            "poolRef is only allowed with mode pool",
        ),
        accept(
            "poolRef to an InClusterIPPool (near miss)",
            with(vm(), "/spec/networks/0/ipam", pool_ipam(pool_ref())),
        ),
        accept(
            "poolRef to a GlobalInClusterIPPool named with dots (near miss)",
            with(
                vm(),
                "/spec/networks/0/ipam",
                pool_ipam(
                    json!({"apiGroup": "ipam.cluster.x-k8s.io", "kind": "GlobalInClusterIPPool", "name": "lan.v4"}),
                ),
            ),
        ),
        reject(
            "VM classRef without name",
            with(vm(), "/spec/classRef", json!({})),
            "spec.classRef.name: Required value",
        ),
        reject(
            "VM imageRef missing",
            without(vm(), "/spec/imageRef"),
            "spec.imageRef: Required value",
        ),
        reject(
            "Provider credentialsRef with an empty name",
            with(
                provider(),
                "/spec/connection/credentialsRef/name",
                json!(""),
            ),
            "should be at least 1 chars long",
        ),
        reject(
            "vsphere Provider without credentialsRef",
            without(provider(), "/spec/connection/credentialsRef"),
            "credentialsRef is required for class vsphere and proxmox",
        ),
        reject(
            "Provider caBundle with two sources",
            with(
                provider(),
                "/spec/connection/caBundle/secretRef",
                json!({"name": "vc-ca"}),
            ),
            "set exactly one of inline, configMapRef or secretRef",
        ),
        reject(
            "VM placement with providerRef and providerSelector",
            with(
                vm(),
                "/spec/placement",
                json!({"providerRef": {"name": "p"}, "providerSelector": {"matchLabels": {"a": "b"}}}),
            ),
            "set either providerRef or providerSelector, not both",
        ),
    ];
    let bad_refs = ["P1", "p 1", "p_1", "p1."];
    for (backend, bad) in BACKENDS.iter().zip(bad_refs) {
        c.push(reject(
            format!("{backend}Cluster providerRefs name {bad:?}"),
            with(cluster(backend), "/spec/providerRefs/0/name", json!(bad)),
            OBJECT_NAME,
        ));
        c.push(reject(
            format!("{backend}ClusterTemplate providerRefs name {bad:?}"),
            with(
                cluster_template(backend),
                "/spec/template/spec/providerRefs/0/name",
                json!(bad),
            ),
            OBJECT_NAME,
        ));
        c.push(reject(
            format!("{backend}Machine providerRef name {bad:?}"),
            with(machine(backend), "/spec/providerRef", json!({"name": bad})),
            OBJECT_NAME,
        ));
        c.push(reject(
            format!("{backend}Machine network poolRef kind lowercase"),
            with(
                machine(backend),
                "/spec/network/0/ipam",
                pool_ipam(with(pool_ref(), "/kind", json!("inClusterIPPool"))),
            ),
            "kind must be a kind in CamelCase",
        ));
        c.push(reject(
            format!("{backend}Cluster with providerRefs and providerSelector"),
            with(
                cluster(backend),
                "/spec/providerSelector",
                json!({"matchLabels": {"a": "b"}}),
            ),
            "set either providerRefs or providerSelector, not both",
        ));
    }
    c.push(accept(
        "LibvirtCluster providerRefs with dots (near miss)",
        with(
            cluster("Libvirt"),
            "/spec/providerRefs/0/name",
            json!("p1.lab"),
        ),
    ));
    c.push(accept(
        "CloudHypervisorMachine with a providerRef and a pool IPAM (near miss)",
        with(
            with(
                machine("CloudHypervisor"),
                "/spec/providerRef",
                json!({"name": "ch-host-1"}),
            ),
            "/spec/network/0/ipam",
            pool_ipam(pool_ref()),
        ),
    ));
    c
}

fn labels() -> Vec<Case> {
    let bad_keys = [
        ("a space", "zone name"),
        ("an empty name after the prefix", "topology.kubernetes.io/"),
        ("an empty prefix", "/zone"),
        ("two slashes", "a/b/c"),
        ("an uppercase prefix", "Example.com/zone"),
        (
            "a name of 64 characters",
            "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
        ),
        ("a name ending in '-'", "zone-"),
        ("a prefix with '_'", "my_corp.io/zone"),
    ];
    let mut c = Vec::new();
    for (what, key) in bad_keys {
        c.push(reject(
            format!("anti-affinity topologyKey with {what}"),
            with(
                vm(),
                "/spec/placement/antiAffinity",
                anti_affinity(json!({}), key),
            ),
            "topologyKey must be a label key",
        ));
    }
    let long_prefix = format!("{}/zone", subdomain_of(254));
    c.push(reject(
        "anti-affinity topologyKey with a prefix of 254 characters",
        with(
            vm(),
            "/spec/placement/antiAffinity",
            anti_affinity(json!({}), &long_prefix),
        ),
        "topologyKey must be a label key",
    ));
    for key in [
        "topology.kubernetes.io/zone".to_string(),
        "banlieue.io/failure-domain".to_string(),
        "rack".to_string(),
        "Rack_1.A".to_string(),
        repeat(63),
        format!("{}/zone", subdomain_of(253)),
    ] {
        let shown = if key.len() > 40 {
            format!("{} characters", key.len())
        } else {
            key.clone()
        };
        c.push(accept(
            format!("anti-affinity topologyKey {shown} (near miss)"),
            with(
                vm(),
                "/spec/placement/antiAffinity",
                anti_affinity(json!({}), &key),
            ),
        ));
    }
    let fd = |labels: Value| with(provider(), "/spec/failureDomains/0/labels", labels);
    c.extend([
        reject(
            "Provider failure domain label key with a space",
            fd(json!({"zone name": "a"})),
            LABEL_KEYS,
        ),
        reject(
            "Provider failure domain label key with two slashes",
            fd(json!({"example.com/a/b": "a"})),
            LABEL_KEYS,
        ),
        reject(
            "Provider failure domain label value with a space",
            fd(json!({"zone": "zone a"})),
            LABEL_VALUE,
        ),
        reject(
            "Provider failure domain label value starting with '.'",
            fd(json!({"zone": ".a"})),
            LABEL_VALUE,
        ),
        reject(
            "Provider failure domain label value of 64 characters",
            fd(json!({"zone": repeat(64)})),
            TOO_LONG,
        ),
        accept(
            "Provider failure domain labels, one with an empty value (near miss)",
            fd(json!({"topology.kubernetes.io/zone": "zone-a", "rack": "", "tier": "Gold_1.x"})),
        ),
    ]);
    for backend in BACKENDS {
        c.push(reject(
            format!("{backend}MachineTemplate machine label key with a space"),
            with(
                machine_template(backend),
                "/spec/template/metadata",
                json!({"labels": {"bad key": "v"}}),
            ),
            LABEL_KEYS,
        ));
        c.push(reject(
            format!("{backend}MachineTemplate machine label value ending in '-'"),
            with(
                machine_template(backend),
                "/spec/template/metadata",
                json!({"labels": {"tier": "gold-"}}),
            ),
            LABEL_VALUE,
        ));
        c.push(reject(
            format!("{backend}MachineTemplate machine annotation key with a space"),
            with(
                machine_template(backend),
                "/spec/template/metadata",
                json!({"annotations": {"my annotation": "v"}}),
            ),
            ANNOTATION_KEYS,
        ));
        c.push(reject(
            format!("{backend}ClusterTemplate cluster label key with two slashes"),
            with(
                cluster_template(backend),
                "/spec/template/metadata",
                json!({"labels": {"x/y/z": "v"}}),
            ),
            LABEL_KEYS,
        ));
        c.push(reject(
            format!("{backend}ClusterTemplate cluster annotation key empty"),
            with(
                cluster_template(backend),
                "/spec/template/metadata",
                json!({"annotations": {"": "v"}}),
            ),
            ANNOTATION_KEYS,
        ));
        c.push(accept(
            format!("{backend}MachineTemplate valid labels and a free-text annotation (near miss)"),
            with(
                machine_template(backend),
                "/spec/template/metadata",
                json!({"labels": {"example.com/tier": "gold", "role": ""},
                       "annotations": {"example.com/owner": "Team A, room 2 / any text: ok"}}),
            ),
        ));
    }
    c
}

fn selectors() -> Vec<Case> {
    let vm_sel = |pointer: &str, selector: Value| with(vm(), pointer, selector);
    let mut c = vec![
        reject(
            "anti-affinity operator Equals (silently matched nothing)",
            with(
                vm(),
                "/spec/placement/antiAffinity",
                anti_affinity(
                    selector_expr("app", "Equals", Some(json!(["web"]))),
                    "topology.kubernetes.io/zone",
                ),
            ),
            OPERATORS,
        ),
        reject(
            "providerSelector operator in lowercase",
            vm_sel(
                "/spec/placement/providerSelector",
                selector_expr("region", "in", Some(json!(["eu"]))),
            ),
            OPERATORS,
        ),
        reject(
            "failureDomainSelector operator Gt",
            vm_sel(
                "/spec/placement/failureDomainSelector",
                selector_expr("gpus", "Gt", Some(json!(["1"]))),
            ),
            OPERATORS,
        ),
        reject(
            "failureDomainSelector operator '!='",
            vm_sel(
                "/spec/placement/failureDomainSelector",
                selector_expr("zone", "!=", Some(json!(["a"]))),
            ),
            OPERATORS,
        ),
        reject(
            "In without values",
            vm_sel(
                "/spec/placement/providerSelector",
                selector_expr("region", "In", None),
            ),
            NEEDS_VALUES,
        ),
        reject(
            "NotIn with empty values",
            vm_sel(
                "/spec/placement/providerSelector",
                selector_expr("region", "NotIn", Some(json!([]))),
            ),
            NEEDS_VALUES,
        ),
        reject(
            "Exists with a value",
            vm_sel(
                "/spec/placement/failureDomainSelector",
                selector_expr("gpu", "Exists", Some(json!(["true"]))),
            ),
            NO_VALUES,
        ),
        reject(
            "DoesNotExist with values",
            with(
                vm(),
                "/spec/placement/antiAffinity",
                anti_affinity(
                    selector_expr("app", "DoesNotExist", Some(json!(["a", "b"]))),
                    "rack",
                ),
            ),
            NO_VALUES,
        ),
        reject(
            "matchExpressions key with a space",
            vm_sel(
                "/spec/placement/providerSelector",
                selector_expr("my region", "Exists", None),
            ),
            LABEL_KEY,
        ),
        reject(
            "matchExpressions key empty",
            vm_sel(
                "/spec/placement/providerSelector",
                selector_expr("", "Exists", None),
            ),
            "should be at least 1 chars long",
        ),
        reject(
            "matchExpressions value with a space",
            vm_sel(
                "/spec/placement/providerSelector",
                selector_expr("region", "In", Some(json!(["eu west"]))),
            ),
            LABEL_VALUE,
        ),
        reject(
            "matchExpressions without operator",
            vm_sel(
                "/spec/placement/providerSelector",
                json!({"matchExpressions": [{"key": "region", "values": ["eu"]}]}),
            ),
            "operator: Required value",
        ),
        reject(
            "matchLabels key with a space",
            vm_sel(
                "/spec/placement/providerSelector",
                json!({"matchLabels": {"my region": "eu"}}),
            ),
            MATCH_LABEL_KEYS,
        ),
        reject(
            "matchLabels value with a space",
            vm_sel(
                "/spec/placement/failureDomainSelector",
                json!({"matchLabels": {"region": "eu west"}}),
            ),
            LABEL_VALUE,
        ),
        reject(
            "anti-affinity matchLabels key with two slashes",
            with(
                vm(),
                "/spec/placement/antiAffinity",
                anti_affinity(json!({"matchLabels": {"a/b/c": "x"}}), "rack"),
            ),
            MATCH_LABEL_KEYS,
        ),
        reject(
            "33 matchExpressions",
            vm_sel(
                "/spec/placement/providerSelector",
                json!({"matchExpressions": (0..33).map(|i| json!({"key": format!("k{i}"), "operator": "Exists"})).collect::<Vec<_>>()}),
            ),
            "must have at most 32 items",
        ),
        accept(
            "Exists without values, DoesNotExist with empty values (near miss)",
            vm_sel(
                "/spec/placement/failureDomainSelector",
                json!({"matchExpressions": [
                    {"key": "gpu", "operator": "Exists"},
                    {"key": "example.com/maintenance", "operator": "DoesNotExist", "values": []}
                ]}),
            ),
        ),
        accept(
            "In and NotIn with values, matchLabels (near miss)",
            vm_sel(
                "/spec/placement/providerSelector",
                json!({"matchExpressions": [
                    {"key": "region", "operator": "In", "values": ["eu", "us"]},
                    {"key": "tier", "operator": "NotIn", "values": [""]}
                ], "matchLabels": {"example.com/env": "prod"}}),
            ),
        ),
        accept(
            "anti-affinity with an In selector (near miss)",
            with(
                vm(),
                "/spec/placement/antiAffinity",
                anti_affinity(
                    selector_expr("app", "In", Some(json!(["web"]))),
                    "topology.kubernetes.io/zone",
                ),
            ),
        ),
    ];
    let fields = [
        "providerSelector",
        "failureDomainSelector",
        "controlPlaneFailureDomainSelector",
    ];
    for (i, backend) in BACKENDS.iter().enumerate() {
        let field = fields[i % 3];
        let base = if field == "providerSelector" {
            json!({"apiVersion": INFRA, "kind": format!("{backend}Cluster"), "metadata": {"name": "k"}, "spec": {}})
        } else {
            cluster(backend)
        };
        let pointer = format!("/spec/{field}");
        c.push(reject(
            format!("{backend}Cluster {field} operator Equals"),
            with(
                base.clone(),
                &pointer,
                selector_expr("zone", "Equals", Some(json!(["a"]))),
            ),
            OPERATORS,
        ));
        c.push(reject(
            format!("{backend}Cluster {field} In without values"),
            with(base.clone(), &pointer, selector_expr("zone", "In", None)),
            NEEDS_VALUES,
        ));
        c.push(reject(
            format!("{backend}Cluster {field} matchLabels key not a label key"),
            with(
                base.clone(),
                &pointer,
                json!({"matchLabels": {"zone/": "a"}}),
            ),
            MATCH_LABEL_KEYS,
        ));
        c.push(reject(format!("{backend}ClusterTemplate {field} Exists with values"),
            with(
                json!({"apiVersion": INFRA, "kind": format!("{backend}ClusterTemplate"), "metadata": {"name": "t"},
                       "spec": {"template": {"spec": {}}}}),
                &format!("/spec/template/spec/{field}"),
                selector_expr("zone", "Exists", Some(json!(["a"]))),
            ),
            NO_VALUES,
        ));
        c.push(accept(format!("{backend}Cluster {field} valid (near miss)"),
            with(
                base,
                &pointer,
                json!({"matchExpressions": [{"key": "topology.kubernetes.io/zone", "operator": "NotIn", "values": ["east-b"]}],
                       "matchLabels": {"tier": "gold"}}),
            ),
        ));
    }
    c
}

fn sizes() -> Vec<Case> {
    let mut c = vec![
        reject(
            "VMClass zero CPUs",
            with(vm_class(), "/spec/cpus", json!(0)),
            "should be greater than or equal to 1",
        ),
        reject(
            "VMClass negative CPUs",
            with(vm_class(), "/spec/cpus", json!(-2)),
            "should be greater than or equal to 1",
        ),
        reject(
            "VMClass 769 CPUs",
            with(vm_class(), "/spec/cpus", json!(769)),
            "should be less than or equal to 768",
        ),
        reject(
            "VMClass 127 MiB",
            with(vm_class(), "/spec/memoryMiB", json!(127)),
            "should be greater than or equal to 128",
        ),
        reject(
            "VMClass memory over 24 TiB",
            with(vm_class(), "/spec/memoryMiB", json!(25165825u64)),
            "should be less than or equal to 25165824",
        ),
        reject_post(
            "VMClass memory as a quantity string",
            with(vm_class(), "/spec/memoryMiB", json!("2Gi")),
            "spec.memoryMiB in body must be of type integer",
        ),
        reject_post(
            "VMClass fractional CPUs",
            with(vm_class(), "/spec/cpus", json!(1.5)),
            "spec.cpus in body must be of type integer",
        ),
        reject(
            "VMClass coresPerSocket 0",
            with(vm_class(), "/spec/coresPerSocket", json!(0)),
            "should be greater than or equal to 1",
        ),
        reject(
            "VMClass coresPerSocket 129",
            with(
                with(vm_class(), "/spec/cpus", json!(258)),
                "/spec/coresPerSocket",
                json!(129),
            ),
            "should be less than or equal to 128",
        ),
        reject(
            "VMClass cpus not a multiple of coresPerSocket",
            with(vm_class(), "/spec/coresPerSocket", json!(3)),
            "cpus must be a multiple of coresPerSocket",
        ),
        reject(
            "VMClass OS disk of 65537 GiB",
            with(vm_class(), "/spec/disk/sizeGiB", json!(65537)),
            "should be less than or equal to 65536",
        ),
        reject(
            "VMClass 33 required features",
            with(
                vm_class(),
                "/spec/requiredFeatures",
                json!((0..33).map(|i| format!("f{i}")).collect::<Vec<_>>()),
            ),
            "must have at most 32 items",
        ),
        reject(
            "VMClass empty required feature",
            with(vm_class(), "/spec/requiredFeatures", json!([""])),
            "should be at least 1 chars long",
        ),
        accept(
            "VMClass at every maximum (near miss)",
            with(
                with(
                    with(vm_class(), "/spec/cpus", json!(768)),
                    "/spec/memoryMiB",
                    json!(25165824u64),
                ),
                "/spec/disk/sizeGiB",
                json!(65536),
            ),
        ),
        reject(
            "VM data disk of 0 GiB",
            with(vm(), "/spec/disks", json!([{"name": "d", "sizeGiB": 0}])),
            "should be greater than or equal to 1",
        ),
        reject(
            "VM data disk of -5 GiB",
            with(vm(), "/spec/disks", json!([{"name": "d", "sizeGiB": -5}])),
            "should be greater than or equal to 1",
        ),
        reject(
            "VM data disk of 65537 GiB",
            with(
                vm(),
                "/spec/disks",
                json!([{"name": "d", "sizeGiB": 65537}]),
            ),
            "should be less than or equal to 65536",
        ),
        reject(
            "VM with 17 data disks",
            with(
                vm(),
                "/spec/disks",
                json!((0..17).map(|i| disk(&format!("d{i}"))).collect::<Vec<_>>()),
            ),
            "must have at most 16 items",
        ),
        reject(
            "VM with 11 network interfaces",
            with(
                vm(),
                "/spec/networks",
                json!(
                    (0..11)
                        .map(|i| json!({"name": format!("eth{i}"), "networkClass": "frontend"}))
                        .collect::<Vec<_>>()
                ),
            ),
            "must have at most 10 items",
        ),
        reject(
            "VM MTU 575",
            with(vm(), "/spec/networks/0/mtu", json!(575)),
            "should be greater than or equal to 576",
        ),
        reject(
            "VM MTU 9217",
            with(vm(), "/spec/networks/0/mtu", json!(9217)),
            "should be less than or equal to 9216",
        ),
        accept(
            "VM MTU 9000 and a 65536 GiB data disk (near miss)",
            with(
                with(vm(), "/spec/networks/0/mtu", json!(9000)),
                "/spec/disks",
                json!([{"name": "big", "sizeGiB": 65536}]),
            ),
        ),
        reject(
            "VM interface name of 16 characters",
            with(vm(), "/spec/networks/0/name", json!("ethernet01234567")),
            TOO_LONG,
        ),
        reject(
            "VM with 9 anti-affinity terms",
            with(
                vm(),
                "/spec/placement/antiAffinity",
                json!(
                    (0..9)
                        .map(|i| json!({"labelSelector": {}, "topologyKey": format!("k{i}")}))
                        .collect::<Vec<_>>()
                ),
            ),
            "must have at most 8 items",
        ),
        reject(
            "VMImage proxmox templateID 1000000000",
            with(
                vm_image(),
                "/spec/sources/proxmox/templateID",
                json!(1_000_000_000u64),
            ),
            "should be less than or equal to 999999999",
        ),
        reject(
            "VMImage proxmox templateID 99",
            with(vm_image(), "/spec/sources/proxmox/templateID", json!(99)),
            "should be greater than or equal to 100",
        ),
        reject(
            "VMImage empty distribution",
            with(vm_image(), "/spec/os/distribution", json!("")),
            "should be at least 1 chars long",
        ),
        reject(
            "VMImage version of 64 characters",
            with(vm_image(), "/spec/os/version", json!(repeat(64))),
            TOO_LONG,
        ),
        reject_post(
            "VMImage three bootstrap formats",
            with(
                vm_image(),
                "/spec/bootstrapFormats",
                json!(["cloud-config", "ignition", "cloud-config"]),
            ),
            "must have at most 2 items",
        ),
        reject(
            "Provider with 101 failure domains",
            with(
                provider(),
                "/spec/failureDomains",
                json!(
                    (0..101)
                        .map(|i| json!({"name": format!("fd{i}")}))
                        .collect::<Vec<_>>()
                ),
            ),
            "must have at most 100 items",
        ),
        reject(
            "Provider with 65 features",
            with(
                provider(),
                "/spec/capabilities/features",
                json!((0..65).map(|i| format!("f{i}")).collect::<Vec<_>>()),
            ),
            "must have at most 64 items",
        ),
        reject(
            "Provider failure domain with 65 labels",
            with(
                provider(),
                "/spec/failureDomains/0/labels",
                Value::Object((0..65).map(|i| (format!("k{i}"), json!("v"))).collect()),
            ),
            "must have at most 64 items",
        ),
        reject(
            "VSphereMachine 769 CPUs",
            with(machine("VSphere"), "/spec/numCPUs", json!(769)),
            "should be less than or equal to 768",
        ),
        reject(
            "VSphereMachine numCPUs not a multiple of numCoresPerSocket",
            with(machine("VSphere"), "/spec/numCoresPerSocket", json!(3)),
            "numCPUs must be a multiple of numCoresPerSocket",
        ),
        reject(
            "VSphereMachine 60 additional disks",
            with(
                machine("VSphere"),
                "/spec/additionalDisks",
                json!((0..60).map(|i| disk(&format!("d{i}"))).collect::<Vec<_>>()),
            ),
            "must have at most 59 items",
        ),
        reject(
            "ProxmoxMachine 5 sockets",
            with(machine("Proxmox"), "/spec/sockets", json!(5)),
            "should be less than or equal to 4",
        ),
        reject(
            "ProxmoxMachine 0 cores",
            with(machine("Proxmox"), "/spec/cores", json!(0)),
            "should be greater than or equal to 1",
        ),
        reject(
            "ProxmoxMachine VMID range starting at 99",
            with(
                machine("Proxmox"),
                "/spec/vmIDRange",
                json!({"start": 99, "end": 200}),
            ),
            "should be greater than or equal to 100",
        ),
        reject(
            "ProxmoxMachine inverted VMID range",
            with(
                machine("Proxmox"),
                "/spec/vmIDRange",
                json!({"start": 2000, "end": 1000}),
            ),
            "vmIDRange.end must not be below vmIDRange.start",
        ),
        reject(
            "ProxmoxMachine VLAN 0",
            with(machine("Proxmox"), "/spec/network/0/vlan", json!(0)),
            "should be greater than or equal to 1",
        ),
        reject(
            "ProxmoxMachine VLAN 4095",
            with(machine("Proxmox"), "/spec/network/0/vlan", json!(4095)),
            "should be less than or equal to 4094",
        ),
        accept(
            "ProxmoxMachine VMID range of one ID, VLAN 4094 (near miss)",
            with(
                with(
                    machine("Proxmox"),
                    "/spec/vmIDRange",
                    json!({"start": 100, "end": 100}),
                ),
                "/spec/network/0/vlan",
                json!(4094),
            ),
        ),
        reject(
            "LibvirtMachine 1025 CPUs",
            with(machine("Libvirt"), "/spec/cpus", json!(1025)),
            "should be less than or equal to 1024",
        ),
        reject(
            "LibvirtMachine 0 MiB",
            with(machine("Libvirt"), "/spec/memoryMiB", json!(0)),
            "should be greater than or equal to 128",
        ),
        reject(
            "LibvirtMachine empty storage pool",
            with(machine("Libvirt"), "/spec/storagePool", json!("")),
            "should be at least 1 chars long",
        ),
        reject(
            "CloudHypervisorMachine 255 CPUs",
            with(machine("CloudHypervisor"), "/spec/cpus", json!(255)),
            "should be less than or equal to 254",
        ),
        reject(
            "CloudHypervisorMachine maxCPUs below cpus",
            with(
                with(machine("CloudHypervisor"), "/spec/cpus", json!(4)),
                "/spec/maxCPUs",
                json!(2),
            ),
            "maxCPUs must be at least cpus",
        ),
        reject(
            "CloudHypervisorMachine 9 interfaces",
            with(
                machine("CloudHypervisor"),
                "/spec/network",
                json!((0..9).map(|_| json!({})).collect::<Vec<_>>()),
            ),
            "must have at most 8 items",
        ),
        reject(
            "CloudHypervisorMachine disk of 0 GiB",
            with(machine("CloudHypervisor"), "/spec/diskGiB", json!(0)),
            "should be greater than or equal to 1",
        ),
        accept(
            "CloudHypervisorMachine maxCPUs equal to cpus (near miss)",
            with(
                with(machine("CloudHypervisor"), "/spec/cpus", json!(254)),
                "/spec/maxCPUs",
                json!(254),
            ),
        ),
    ];
    for backend in BACKENDS {
        c.push(reject(
            format!("{backend}MachineTemplate memory 64 MiB"),
            with(
                machine_template(backend),
                "/spec/template/spec/memoryMiB",
                json!(64),
            ),
            "should be greater than or equal to 128",
        ));
        c.push(reject(
            format!("{backend}Machine additional disk of 0 GiB"),
            with(
                machine(backend),
                "/spec/additionalDisks",
                json!([{"name": "d", "sizeGiB": 0}]),
            ),
            "should be greater than or equal to 1",
        ));
        c.push(reject(
            format!("{backend}Cluster with 33 providerRefs"),
            with(
                cluster(backend),
                "/spec/providerRefs",
                json!(
                    (0..33)
                        .map(|i| json!({"name": format!("p{i}")}))
                        .collect::<Vec<_>>()
                ),
            ),
            "must have at most 32 items",
        ));
        c.push(reject(
            format!("{backend}Cluster endpoint port 65536"),
            with(
                cluster(backend),
                "/spec/controlPlaneEndpoint",
                json!({"host": "10.0.0.1", "port": 65536}),
            ),
            "should be less than or equal to 65535",
        ));
    }
    c
}

fn network() -> Vec<Case> {
    let ipam = |value: Value| with(vm(), "/spec/networks/0/ipam", value);
    let mac = |value: &str| with(vm(), "/spec/networks/0/macAddress", json!(value));
    let two_macs = |a: &str, b: &str| {
        with(
            with(vm2(), "/spec/networks/0/macAddress", json!(a)),
            "/spec/networks/1/macAddress",
            json!(b),
        )
    };
    let mut c = vec![
        reject("MAC with five octets", mac("52:54:00:12:34"), MAC_FORMAT),
        reject("MAC with dashes", mac("52-54-00-12-34-56"), MAC_FORMAT),
        reject(
            "MAC with a non-hex digit",
            mac("52:54:00:zz:00:01"),
            MAC_FORMAT,
        ),
        reject(
            "multicast MAC 01:00:5e:00:00:01",
            mac("01:00:5e:00:00:01"),
            MAC_UNICAST,
        ),
        reject(
            "multicast MAC 33:33:00:00:00:01",
            mac("33:33:00:00:00:01"),
            MAC_UNICAST,
        ),
        reject("broadcast MAC", mac("ff:ff:ff:ff:ff:ff"), MAC_UNICAST),
        reject("all-zero MAC", mac("00:00:00:00:00:00"), MAC_UNICAST),
        accept(
            "locally administered unicast MAC 02:00:00:00:00:01 (near miss)",
            mac("02:00:00:00:00:01"),
        ),
        accept(
            "uppercase MAC 52:54:00:AB:CD:EF (near miss)",
            mac("52:54:00:AB:CD:EF"),
        ),
        reject(
            "the same MAC on two VM interfaces",
            two_macs("52:54:00:00:00:01", "52:54:00:00:00:01"),
            MAC_TWICE,
        ),
        reject(
            "the same MAC on two VM interfaces, different case",
            two_macs("52:54:00:AB:00:01", "52:54:00:ab:00:01"),
            MAC_TWICE,
        ),
        accept(
            "two VM interfaces with different MACs (near miss)",
            two_macs("52:54:00:00:00:01", "52:54:00:00:00:02"),
        ),
        reject(
            "static address without prefix length",
            ipam(json!({"mode": "static", "addresses": ["10.0.0.5"]})),
            "must be CIDRs such as 10.0.0.5/24",
        ),
        reject(
            "static address with prefix /33",
            ipam(json!({"mode": "static", "addresses": ["10.0.0.5/33"]})),
            "must be CIDRs such as 10.0.0.5/24",
        ),
        reject(
            "static IPv6 address with prefix /129",
            ipam(json!({"mode": "static", "addresses": ["fd00::5/129"]})),
            "must be CIDRs such as 10.0.0.5/24",
        ),
        reject(
            "static address with a trailing space",
            ipam(json!({"mode": "static", "addresses": ["10.0.0.5/24 "]})),
            "must be CIDRs such as 10.0.0.5/24",
        ),
        reject(
            "static address octet 256",
            ipam(json!({"mode": "static", "addresses": ["10.0.256.5/24"]})),
            "must be CIDRs such as 10.0.0.5/24",
        ),
        reject(
            "static mode without addresses",
            ipam(json!({"mode": "static"})),
            "mode static needs at least one entry in addresses",
        ),
        reject(
            "addresses with mode dhcp",
            ipam(json!({"mode": "dhcp", "addresses": ["10.0.0.5/24"]})),
            "addresses are only allowed with mode static",
        ),
        reject(
            "IPv6 gateway for IPv4 addresses",
            ipam(json!({"mode": "static", "addresses": ["10.0.0.5/24"], "gateway": "fd00::1"})),
            GATEWAY_FAMILY,
        ),
        reject(
            "IPv4 gateway for IPv6 addresses",
            ipam(
                json!({"mode": "static", "addresses": ["fd00::5/64", "2001:db8::5/64"], "gateway": "10.0.0.1"}),
            ),
            GATEWAY_FAMILY,
        ),
        accept(
            "IPv6 gateway for dual-stack addresses (near miss)",
            ipam(
                json!({"mode": "static", "addresses": ["10.0.0.5/24", "fd00::5/64"], "gateway": "fd00::1"}),
            ),
        ),
        accept(
            "IPv4 gateway, IPv4 and IPv6 nameservers (near miss)",
            ipam(
                json!({"mode": "static", "addresses": ["10.0.0.5/24"], "gateway": "10.0.0.1",
                        "nameservers": ["10.0.0.53", "fd00::53"]}),
            ),
        ),
        reject(
            "gateway 0.0.0.0",
            ipam(json!({"mode": "static", "addresses": ["10.0.0.5/24"], "gateway": "0.0.0.0"})),
            "ipam.gateway must not be the unspecified address",
        ),
        reject(
            "gateway in CIDR notation",
            ipam(json!({"mode": "static", "addresses": ["10.0.0.5/24"], "gateway": "10.0.0.1/24"})),
            "ipam.gateway must be an IP address",
        ),
        reject(
            "gateway as a host name",
            ipam(json!({"mode": "static", "addresses": ["10.0.0.5/24"], "gateway": "router.lan"})),
            "ipam.gateway must be an IP address",
        ),
        reject(
            "gateway with mode dhcp",
            ipam(json!({"mode": "dhcp", "gateway": "10.0.0.1"})),
            DHCP_EXTRAS,
        ),
        reject(
            "nameservers with mode dhcp",
            ipam(json!({"mode": "dhcp", "nameservers": ["10.0.0.53"]})),
            DHCP_EXTRAS,
        ),
        reject(
            "gateway with the default mode (dhcp)",
            ipam(json!({"gateway": "10.0.0.1"})),
            DHCP_EXTRAS,
        ),
        accept(
            "nameservers and gateway with mode pool (near miss: the pool may not give them)",
            ipam(
                json!({"mode": "pool", "poolRef": pool_ref(), "gateway": "10.0.0.1", "nameservers": ["10.0.0.53"]}),
            ),
        ),
        reject(
            "nameserver as a host name",
            ipam(
                json!({"mode": "static", "addresses": ["10.0.0.5/24"], "nameservers": ["dns.google"]}),
            ),
            "ipam.nameservers must be IP addresses",
        ),
        reject(
            "9 nameservers",
            ipam(json!({"mode": "static", "addresses": ["10.0.0.5/24"],
                        "nameservers": (1..10).map(|i| format!("10.0.0.{i}")).collect::<Vec<_>>()})),
            "must have at most 8 items",
        ),
        reject(
            "17 static addresses",
            ipam(json!({"mode": "static",
                        "addresses": (1..18).map(|i| format!("10.0.0.{i}/24")).collect::<Vec<_>>()})),
            "must have at most 16 items",
        ),
        reject_post(
            "the same static address twice",
            ipam(json!({"mode": "static", "addresses": ["10.0.0.5/24", "10.0.0.5/24"]})),
            "Duplicate value",
        ),
        reject(
            "ProxmoxMachine bridge with a space",
            with(
                machine("Proxmox"),
                "/spec/network/0/bridge",
                json!("vmbr 0"),
            ),
            "bridge must be an interface name",
        ),
        reject(
            "ProxmoxMachine bridge with a ';'",
            with(
                machine("Proxmox"),
                "/spec/network/0/bridge",
                json!("vmbr0;"),
            ),
            "bridge must be an interface name",
        ),
        reject(
            "LibvirtMachine interface with network and bridge",
            with(machine("Libvirt"), "/spec/network/0/bridge", json!("br0")),
            "exactly one of network or bridge",
        ),
        reject(
            "CloudHypervisorMachine bridge of 16 characters",
            with(
                machine("CloudHypervisor"),
                "/spec/network/0/bridge",
                json!("bridge0123456789"),
            ),
            TOO_LONG,
        ),
    ];
    let multicast = [
        "01:50:56:00:00:01",
        "BD:24:11:00:00:01",
        "53:54:00:00:00:01",
        "ff:00:00:00:00:01",
    ];
    let unicast = [
        "00:50:56:00:00:01",
        "BC:24:11:00:00:01",
        "52:54:00:00:00:01",
        "fe:00:00:00:00:01",
    ];
    for ((backend, bad), good) in BACKENDS.iter().zip(multicast).zip(unicast) {
        let two = |a: &str, b: &str| {
            let mut m = machine(backend);
            m["spec"]["network"] = json!([
                with(nic(backend), "/macAddress", json!(a)),
                with(nic(backend), "/macAddress", json!(b)),
            ]);
            m
        };
        c.push(reject(
            format!("{backend}Machine multicast MAC {bad}"),
            with(machine(backend), "/spec/network/0/macAddress", json!(bad)),
            MAC_UNICAST,
        ));
        c.push(reject(
            format!("{backend}Machine the same MAC on two interfaces"),
            two(good, good),
            MAC_TWICE,
        ));
        c.push(accept(
            format!("{backend}Machine two interfaces with unicast MACs (near miss)"),
            two(good, &good.replace(":01", ":02")),
        ));
        c.push(reject(
            format!("{backend}Machine IPv6 gateway for an IPv4 address"),
            with(
                machine(backend),
                "/spec/network/0/ipam",
                json!({"mode": "static", "addresses": ["192.168.1.10/24"], "gateway": "fe80::1"}),
            ),
            GATEWAY_FAMILY,
        ));
        c.push(reject(
            format!("{backend}Machine nameservers with DHCP"),
            with(
                machine(backend),
                "/spec/network/0/ipam",
                json!({"nameservers": ["1.1.1.1"]}),
            ),
            DHCP_EXTRAS,
        ));
        c.push(reject(format!("{backend}MachineTemplate the same MAC on two interfaces"),
            json!({"apiVersion": INFRA, "kind": format!("{backend}MachineTemplate"), "metadata": {"name": "t"},
                   "spec": {"template": {"spec": two(good, good)["spec"].clone()}}}),
            MAC_TWICE,
        ));
    }
    c
}

fn endpoints() -> Vec<Case> {
    let endpoint = |value: &str| with(provider(), "/spec/connection/endpoint", json!(value));
    let mut c = Vec::new();
    for (name, ch) in [
        ("U+0085 NEXT LINE", '\u{0085}'),
        ("U+00A0 NO-BREAK SPACE", '\u{00A0}'),
        ("U+1680 OGHAM SPACE MARK", '\u{1680}'),
        ("U+2000 EN QUAD", '\u{2000}'),
        ("U+2007 FIGURE SPACE", '\u{2007}'),
        ("U+200A HAIR SPACE", '\u{200A}'),
        ("U+200B ZERO WIDTH SPACE", '\u{200B}'),
        ("U+2028 LINE SEPARATOR", '\u{2028}'),
        ("U+2029 PARAGRAPH SEPARATOR", '\u{2029}'),
        ("U+202F NARROW NO-BREAK SPACE", '\u{202F}'),
        ("U+205F MEDIUM MATHEMATICAL SPACE", '\u{205F}'),
        ("U+3000 IDEOGRAPHIC SPACE", '\u{3000}'),
        ("U+FEFF BYTE ORDER MARK", '\u{FEFF}'),
    ] {
        c.push(reject(
            format!("Provider endpoint with {name}"),
            endpoint(&format!("https://vc.example.com{ch}/sdk")),
            ENDPOINT_UNICODE,
        ));
    }
    c.extend([
        reject("Provider endpoint with a trailing U+00A0",
            endpoint("https://vc.example.com/sdk\u{00A0}"),
            ENDPOINT_UNICODE,
        ),
        reject("Provider endpoint with an ASCII space",
            endpoint("https://vc example.com/sdk"),
            ENDPOINT_URL,
        ),
        reject("Provider endpoint with a tab",
            endpoint("https://vc.example.com/\tsdk"),
            ENDPOINT_URL,
        ),
        reject("Provider endpoint without scheme",
            endpoint("vc.example.com/sdk"),
            ENDPOINT_URL,
        ),
        reject("Provider endpoint scheme-relative",
            endpoint("//vc.example.com/sdk"),
            ENDPOINT_URL,
        ),
        reject("Provider endpoint empty",
            endpoint(""),
            "should be at least 1 chars long",
        ),
        accept("Provider endpoint with a port (near miss)",
            endpoint("https://pve.example.com:8006"),
        ),
        accept("Provider endpoint with an internationalised host name (near miss)",
            endpoint("https://vcenter.bücher.example/sdk"),
        ),
        accept("Provider endpoint with an IPv6 literal (near miss)",
            endpoint("https://[fd00::10]:443/sdk"),
        ),
        accept("sim Provider endpoint sim://local (near miss)",
            sim_provider(),
        ),
        accept("libvirt Provider over qemu+ssh (near miss)",
            json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "Provider", "metadata": {"name": "p"},
                   "spec": {"class": "libvirt", "connection": {"endpoint": "qemu+ssh://root@host.lab/system"}}}),
        ),
        accept("cloud-hypervisor Provider over a unix socket (near miss)",
            json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "Provider", "metadata": {"name": "p"},
                   "spec": {"class": "cloud-hypervisor", "connection": {"endpoint": "unix:///run/banlieue/ch.sock"}}}),
        ),
        reject("Provider inline CA that is not PEM",
            with(
                provider(),
                "/spec/connection/caBundle",
                json!({"inline": "not a cert"}),
            ),
            "must hold PEM certificates",
        ),
        reject("Provider CA bundle and insecureSkipTLSVerify",
            with(
                provider(),
                "/spec/connection/insecureSkipTLSVerify",
                json!(true),
            ),
            "caBundle and insecureSkipTLSVerify are mutually exclusive",
        ),
        reject("VMImage libvirt path as a URL",
            with(
                vm_image(),
                "/spec/sources/libvirt",
                json!({"path": "https://example.com/debian.qcow2"}),
            ),
            "must be an absolute path on the host",
        ),
        reject("VMImage cloud-hypervisor relative kernel",
            with(
                vm_image(),
                "/spec/sources/cloudHypervisor",
                json!({"kernel": "vmlinuz", "disk": "/d"}),
            ),
            "kernel must be an absolute path",
        ),
        reject("VMImage cloud-hypervisor relative disk",
            with(
                vm_image(),
                "/spec/sources/cloudHypervisor",
                json!({"firmware": "/f", "disk": "disk.raw"}),
            ),
            "disk must be an absolute path",
        ),
        reject("VMImage proxmox volume without storage",
            with(
                vm_image(),
                "/spec/sources/proxmox",
                json!({"volume": ":import/noble.qcow2"}),
            ),
            "must look like <storage>:<path>",
        ),
        accept("VMImage proxmox volume local:import/noble.qcow2 (near miss)",
            with(
                vm_image(),
                "/spec/sources/proxmox",
                json!({"volume": "local:import/noble.qcow2"}),
            ),
        ),
        reject("LibvirtMachine relative image path",
            with(
                machine("Libvirt"),
                "/spec/image",
                json!({"path": "images/debian.qcow2"}),
            ),
            "must be an absolute path on the host",
        ),
    ]);
    let bad_hosts = [
        ("a scheme", "https://api.example.com"),
        ("a port", "api.example.com:6443"),
        ("a path", "api.example.com/healthz"),
        ("brackets around IPv6", "[fd00::10]"),
        ("an underscore", "api_server.example.com"),
        ("a leading '-'", "-api.example.com"),
        ("a trailing space", "api.example.com "),
        ("an invalid IPv4", "10.0.0.300"),
        ("three numeric labels", "10.0.1"),
        ("an empty label", "api..example.com"),
        (
            "a label of 64 characters",
            "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa.example.com",
        ),
        ("an IPv6 with a zone", "fe80::1%eth0"),
    ];
    for (i, (what, host)) in bad_hosts.iter().enumerate() {
        let backend = BACKENDS[i % 4];
        c.push(reject(
            format!("{backend}Cluster endpoint host with {what}"),
            with(
                cluster(backend),
                "/spec/controlPlaneEndpoint",
                json!({"host": host, "port": 6443}),
            ),
            HOST,
        ));
    }
    for backend in BACKENDS {
        c.push(reject(
            format!("{backend}ClusterTemplate endpoint host with a scheme and port"),
            with(
                cluster_template(backend),
                "/spec/template/spec/controlPlaneEndpoint",
                json!({"host": "https://10.0.0.10:6443", "port": 6443}),
            ),
            HOST,
        ));
        c.push(reject(
            format!("{backend}Cluster endpoint host 0.0.0.0"),
            with(
                cluster(backend),
                "/spec/controlPlaneEndpoint",
                json!({"host": "0.0.0.0", "port": 6443}),
            ),
            "controlPlaneEndpoint.host must not be the unspecified address",
        ));
        c.push(reject(
            format!("{backend}Machine providerID with another backend's scheme"),
            with(
                machine(backend),
                "/spec/providerID",
                json!(if backend == "VSphere" {
                    "proxmox://1"
                } else {
                    "vsphere://1"
                }),
            ),
            "spec.providerID must start with",
        ));
    }
    c.push(reject(
        "VSphereCluster endpoint host of 254 characters",
        with(
            cluster("VSphere"),
            "/spec/controlPlaneEndpoint",
            json!({"host": subdomain_of(254), "port": 6443}),
        ),
        TOO_LONG,
    ));
    for (i, host) in [
        "api.example.com",
        "10.0.0.10",
        "fd00::10",
        "API.Example.Com",
        "apiserver",
        "k8s-api.eu-west-1.example.com",
    ]
    .iter()
    .enumerate()
    {
        let backend = BACKENDS[i % 4];
        c.push(accept(
            format!("{backend}Cluster endpoint host {host} (near miss)"),
            with(
                cluster(backend),
                "/spec/controlPlaneEndpoint",
                json!({"host": host, "port": 6443}),
            ),
        ));
    }
    c
}

fn enums() -> Vec<Case> {
    let mut c = vec![
        // The class is open (any DNS label: an out-of-tree backend brings its own);
        // a class no backend serves is admitted and becomes a condition (operator.rs).
        reject(
            "Provider class in the wrong case",
            with(provider(), "/spec/class", json!("VSphere")),
            "class must be a lowercase DNS label (a-z, 0-9 and '-'): banlieue's own classes are vsphere, proxmox, libvirt, cloud-hypervisor and sim",
        ),
        reject(
            "Provider class that is not a DNS label",
            with(provider(), "/spec/class", json!("hyper_v")),
            "class must be a lowercase DNS label (a-z, 0-9 and '-'): banlieue's own classes are vsphere, proxmox, libvirt, cloud-hypervisor and sim",
        ),
        reject(
            "VMClass firmware UEFI",
            with(vm_class(), "/spec/firmware", json!("UEFI")),
            r#"supported values: "bios", "efi", "efi-secure""#,
        ),
        reject(
            "VMClass disk provisioning Thin",
            with(vm_class(), "/spec/disk/provisioning", json!("Thin")),
            r#"supported values: "thin", "thick", "eagerZeroed""#,
        ),
        reject(
            "VM powerState On",
            with(vm(), "/spec/powerState", json!("On")),
            r#"supported values: "PoweredOn", "PoweredOff", "Suspended""#,
        ),
        reject(
            "VM migration strategy LiveMigrate",
            with(vm(), "/spec/migration/strategy", json!("LiveMigrate")),
            r#"supported values: "Recreate", "CopyDisk""#,
        ),
        reject(
            "VM migration stopSourceFirst false",
            with(vm(), "/spec/migration/stopSourceFirst", json!(false)),
            "migration.stopSourceFirst: false is not supported yet",
        ),
        reject(
            "VM anti-affinity mode Soft",
            with(
                vm(),
                "/spec/placement/antiAffinity",
                json!([{"labelSelector": {}, "topologyKey": "rack", "mode": "Soft"}]),
            ),
            r#"supported values: "Required", "Preferred""#,
        ),
        reject(
            "VM bootstrap format cloud-init",
            with(
                vm(),
                "/spec/bootstrap",
                json!({"format": "cloud-init", "userData": {"name": "s"}}),
            ),
            r#"supported values: "cloud-config", "ignition""#,
        ),
        reject(
            "VM ignition with a network config",
            with(
                vm(),
                "/spec/bootstrap",
                json!({"format": "ignition", "userData": {"name": "s"}, "networkConfig": {"name": "s"}}),
            ),
            "networkConfig is cloud-init only",
        ),
        reject(
            "VM IPAM mode Static",
            with(vm(), "/spec/networks/0/ipam", json!({"mode": "Static"})),
            r#"supported values: "dhcp", "static", "pool""#,
        ),
        reject(
            "VMImage OS family Linux",
            with(vm_image(), "/spec/os/family", json!("Linux")),
            r#"supported values: "linux", "windows", "other""#,
        ),
        reject(
            "VMImage architecture x86_64",
            with(vm_image(), "/spec/architecture", json!("x86_64")),
            r#"supported values: "amd64", "arm64""#,
        ),
        reject(
            "VMImage libvirt format vmdk",
            with(
                vm_image(),
                "/spec/sources/libvirt",
                json!({"path": "/i.vmdk", "format": "vmdk"}),
            ),
            r#"supported values: "qcow2", "raw""#,
        ),
        reject(
            "VMImage bootstrap format sysprep",
            with(vm_image(), "/spec/bootstrapFormats", json!(["sysprep"])),
            "Unsupported value: \"sysprep\"",
        ),
        reject(
            "VMImage vsphere content-library item (refused at run time)",
            with(
                vm_image(),
                "/spec/sources/vsphere",
                json!({"contentLibraryItem": {"library": "images", "item": "ubuntu-2404"}}),
            ),
            "contentLibraryItem is not supported yet: use sources.vsphere.template",
        ),
        accept(
            "VMImage vsphere template (near miss)",
            with(
                vm_image(),
                "/spec/sources/vsphere",
                json!({"template": "/dc1/vm/templates/ubuntu-2404"}),
            ),
        ),
        reject(
            "VMImage vsphere template and content-library item",
            with(
                vm_image(),
                "/spec/sources/vsphere",
                json!({"template": "t", "contentLibraryItem": {"library": "l", "item": "i"}}),
            ),
            "set exactly one of template or contentLibraryItem",
        ),
        reject(
            "VMImage without sources",
            with(vm_image(), "/spec/sources", json!({})),
            "sources must name the image for at least one backend class",
        ),
        reject(
            "VSphereMachine clone mode instantClone",
            with(machine("VSphere"), "/spec/cloneMode", json!("instantClone")),
            r#"supported values: "FullClone", "LinkedClone""#,
        ),
        reject(
            "VSphereMachine disk provisioning lazy",
            with(machine("VSphere"), "/spec/diskProvisioning", json!("lazy")),
            "Unsupported value: \"lazy\"",
        ),
        reject(
            "ProxmoxMachine NIC model VirtIO",
            with(machine("Proxmox"), "/spec/network/0/model", json!("VirtIO")),
            r#"supported values: "virtio", "e1000", "vmxnet3", "rtl8139""#,
        ),
        reject(
            "ProxmoxMachine firmware ovmf",
            with(machine("Proxmox"), "/spec/firmware", json!("ovmf")),
            "Unsupported value: \"ovmf\"",
        ),
        reject(
            "LibvirtMachine CPU mode host_passthrough",
            with(
                machine("Libvirt"),
                "/spec/cpuMode",
                json!("host_passthrough"),
            ),
            r#"supported values: "host-passthrough", "host-model", "emulated""#,
        ),
        reject(
            "LibvirtMachine image format iso",
            with(machine("Libvirt"), "/spec/image/format", json!("iso")),
            "Unsupported value: \"iso\"",
        ),
        reject(
            "CloudHypervisorMachine image with kernel and firmware",
            with(
                machine("CloudHypervisor"),
                "/spec/image/firmware",
                json!("/f"),
            ),
            "set exactly one of kernel or firmware",
        ),
    ];
    for backend in BACKENDS {
        c.push(reject(
            format!("{backend}Machine power state Running"),
            with(machine(backend), "/spec/powerState", json!("Running")),
            r#"supported values: "PoweredOn", "PoweredOff", "Suspended""#,
        ));
        c.push(reject(
            format!("{backend}Machine bootstrap format ignition-v3"),
            with(
                machine(backend),
                "/spec/bootstrap",
                json!({"dataSecretName": "b", "format": "ignition-v3"}),
            ),
            "Unsupported value: \"ignition-v3\"",
        ));
        c.push(reject_post(
            format!("{backend}Machine failureDomain in spec"),
            with(machine(backend), "/spec/failureDomain", json!("east-a")),
            "unknown field \"spec.failureDomain\"",
        ));
        c.push(accept(
            format!("{backend}Machine PoweredOff with an ignition bootstrap (near miss)"),
            with(
                with(machine(backend), "/spec/powerState", json!("PoweredOff")),
                "/spec/bootstrap",
                json!({"dataSecretName": "b", "format": "ignition"}),
            ),
        ));
    }
    c
}

fn immutability() -> Vec<Case> {
    let mut c = vec![
        reject_update(
            "Provider class vsphere -> proxmox",
            provider(),
            with(provider(), "/spec/class", json!("proxmox")),
            "spec.class is immutable",
        ),
        reject_update(
            "Provider class sim -> libvirt",
            sim_provider(),
            with(sim_provider(), "/spec/class", json!("libvirt")),
            "spec.class is immutable",
        ),
        accept_update(
            "Provider endpoint changed (near miss: mutable)",
            provider(),
            with(
                provider(),
                "/spec/connection/endpoint",
                json!("https://vc2.example.com/sdk"),
            ),
        ),
        accept_update(
            "VM classRef changed (near miss: mutable, resize)",
            vm(),
            with(vm(), "/spec/classRef/name", json!("large")),
        ),
        reject_status(
            "LibvirtMachine provisioned flips back to false",
            machine("Libvirt"),
            json!({"initialization": {"provisioned": true}}),
            json!({"initialization": {"provisioned": false}}),
            "provisioned cannot go back to false once true",
        ),
        reject_status(
            "ProxmoxCluster provisioned flips back to false",
            cluster("Proxmox"),
            json!({"initialization": {"provisioned": true}}),
            json!({"initialization": {"provisioned": false}}),
            "provisioned cannot go back to false once true",
        ),
        accept_status(
            "VSphereMachine provisioned false -> true (near miss)",
            machine("VSphere"),
            json!({"initialization": {"provisioned": false}}),
            json!({"initialization": {"provisioned": true}}),
        ),
    ];
    for backend in BACKENDS {
        let id = |suffix: &str| json!(format!("{}{suffix}", scheme(backend)));
        c.push(reject_update(
            format!("{backend}Machine providerID changed"),
            with(machine(backend), "/spec/providerID", id("aaaa")),
            with(machine(backend), "/spec/providerID", id("bbbb")),
            PROVIDER_ID_IMMUTABLE,
        ));
        c.push(reject_update(
            format!("{backend}Machine providerID removed"),
            with(machine(backend), "/spec/providerID", id("aaaa")),
            machine(backend),
            PROVIDER_ID_IMMUTABLE,
        ));
        c.push(accept_update(
            format!("{backend}Machine providerID set for the first time (near miss)"),
            machine(backend),
            with(machine(backend), "/spec/providerID", id("aaaa")),
        ));
        let cpus = match backend {
            "VSphere" => "numCPUs",
            "Proxmox" => "cores",
            _ => "cpus",
        };
        c.push(reject_update(
            format!("{backend}MachineTemplate machine spec changed"),
            machine_template(backend),
            with(
                machine_template(backend),
                &format!("/spec/template/spec/{cpus}"),
                json!(4),
            ),
            TEMPLATE_IMMUTABLE,
        ));
        c.push(reject_update(
            format!("{backend}MachineTemplate machine labels added"),
            machine_template(backend),
            with(
                machine_template(backend),
                "/spec/template/metadata",
                json!({"labels": {"tier": "gold"}}),
            ),
            TEMPLATE_IMMUTABLE,
        ));
        c.push(accept_update(
            format!("{backend}MachineTemplate object labels changed (near miss)"),
            machine_template(backend),
            with(
                machine_template(backend),
                "/metadata/labels",
                json!({"tier": "gold"}),
            ),
        ));
        c.push(reject_update(
            format!("{backend}ClusterTemplate cluster spec changed"),
            cluster_template(backend),
            with(
                cluster_template(backend),
                "/spec/template/spec/providerRefs/0/name",
                json!("p2"),
            ),
            TEMPLATE_IMMUTABLE,
        ));
        let endpoint = |host: &str| {
            with(
                cluster(backend),
                "/spec/controlPlaneEndpoint",
                json!({"host": host, "port": 6443}),
            )
        };
        c.push(reject_update(
            format!("{backend}Cluster endpoint changed"),
            endpoint("10.0.0.10"),
            endpoint("10.0.0.11"),
            ENDPOINT_IMMUTABLE,
        ));
        c.push(reject_update(
            format!("{backend}Cluster endpoint removed"),
            endpoint("10.0.0.10"),
            cluster(backend),
            ENDPOINT_IMMUTABLE,
        ));
        c.push(accept_update(
            format!("{backend}Cluster endpoint set late and providerRefs changed (near miss)"),
            cluster(backend),
            with(
                endpoint("api.example.com"),
                "/spec/providerRefs/0/name",
                json!("p2"),
            ),
        ));
    }
    c
}

/// The cases of one class.
type Section = fn() -> Vec<Case>;

/// Every case, with its class, class by class.
fn cases() -> Vec<(Class, Case)> {
    let sections: [(Class, Section); 9] = [
        (Names, names),
        (References, references),
        (Labels, labels),
        (Selectors, selectors),
        (Sizes, sizes),
        (Network, network),
        (Endpoints, endpoints),
        (Enums, enums),
        (Immutability, immutability),
    ];
    sections
        .into_iter()
        .flat_map(|(class, section)| section().into_iter().map(move |case| (class, case)))
        .collect()
}

#[tokio::test]
async fn hostile_input_is_refused_at_admission_and_near_misses_are_accepted() {
    let ns = banlieue_testenv::namespace("hostile").await;
    let cases = cases();
    // class -> (passed, total, near misses)
    let mut table: BTreeMap<Class, (usize, usize, usize)> = BTreeMap::new();
    let mut failures = Vec::new();
    for (i, (class, case)) in cases.iter().enumerate() {
        let row = table.entry(*class).or_default();
        row.1 += 1;
        if matches!(case.want, Want::Accept) {
            row.2 += 1;
        }
        match run(&ns.client, &ns.name, &format!("h-{i}"), case).await {
            Ok(()) => row.0 += 1,
            Err(why) => failures.push(format!("[{class}] {}: {why}", case.what)),
        }
    }

    let passed: usize = table.values().map(|r| r.0).sum();
    let accepts: usize = table.values().map(|r| r.2).sum();
    println!("hostile battery: {} cases", cases.len());
    println!(
        "{:<20} {:>7} {:>7} {:>12}",
        "class", "passed", "total", "near misses"
    );
    for (class, (ok, total, near)) in &table {
        println!("{:<20} {ok:>7} {total:>7} {near:>12}", class.to_string());
    }
    println!("{:<20} {passed:>7} {:>7} {accepts:>12}", "all", cases.len());

    assert!(
        cases.len() >= 200,
        "the battery must keep at least 200 cases"
    );
    assert_eq!(
        table.len(),
        9,
        "every class must keep cases: {:?}",
        table.keys()
    );
    assert_none_failed(&failures, cases.len());
}

/// Every kind the battery covers is one banlieue ships, and every kind banlieue ships is
/// covered: a new CRD must bring its hostile cases.
#[test]
fn the_battery_covers_every_crd() {
    let mut shipped: Vec<String> = banlieue_sdk::crds::all()
        .iter()
        .map(|crd| crd.spec.names.kind.clone())
        .collect();
    shipped.sort();
    let mut covered: Vec<String> = cases()
        .iter()
        .flat_map(|(_, case)| case.step.objects())
        .map(|o| o["kind"].as_str().expect("kind").to_string())
        .collect();
    covered.sort();
    covered.dedup();
    assert_eq!(covered, shipped);
}
