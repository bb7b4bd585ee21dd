//! Table and golden tests of the install objects and release assets.

use std::collections::BTreeSet;

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use serde_json::Value;

use super::release::{FLAVORS, assets, metadata};
use super::*;

fn other() -> Options {
    Options {
        namespace: "other".to_owned(),
        image: "registry.example/banlieue:dev".to_owned(),
    }
}

fn of_kind<'a>(objects: &'a [Value], kind: &str) -> Vec<&'a Value> {
    objects.iter().filter(|o| o["kind"] == kind).collect()
}

#[test]
fn every_object_is_labelled_and_in_the_one_namespace() {
    for options in [Options::default(), other()] {
        let objects = components(&options);
        let namespaces = of_kind(&objects, "Namespace");
        assert_eq!(namespaces.len(), 1, "exactly one Namespace");
        assert_eq!(
            namespaces[0]["metadata"]["name"],
            options.namespace.as_str()
        );
        for object in &objects {
            let what = format!("{} {}", object["kind"], object["metadata"]["name"]);
            assert_eq!(
                object["metadata"]["labels"][PROVIDER_LABEL], PROVIDER,
                "{what}"
            );
            if let Some(ns) = object["metadata"]["namespace"].as_str() {
                assert_eq!(ns, options.namespace, "{what}");
            }
            for subject in object["subjects"].as_array().into_iter().flatten() {
                assert_eq!(subject["namespace"], options.namespace.as_str(), "{what}");
            }
        }
    }
}

#[test]
fn components_are_the_crds_policies_rbac_and_deployment_in_apply_order() {
    let objects = components(&Options::default());
    let kinds: Vec<&str> = objects
        .iter()
        .map(|o| o["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds[0], "Namespace");
    assert_eq!(
        kinds
            .iter()
            .filter(|k| **k == "CustomResourceDefinition")
            .count(),
        20
    );
    assert_eq!(
        &kinds[21..29],
        [
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding",
            "ValidatingAdmissionPolicyBinding",
            "ValidatingAdmissionPolicyBinding",
            "ValidatingAdmissionPolicyBinding",
        ]
    );
    assert_eq!(
        &kinds[29..],
        [
            "ServiceAccount",
            "ClusterRole",
            "ClusterRoleBinding",
            "Role",
            "RoleBinding",
            "ClusterRole",
            "ClusterRole",
            "Deployment"
        ]
    );
    for crd in of_kind(&objects, "CustomResourceDefinition") {
        assert_eq!(crd["metadata"]["labels"][CLUSTERCTL_LABEL], "");
        assert!(crd.get("status").is_none());
    }
}

/// The policies shipped are the SDK's, object for object (only the common labels
/// added), so the tests that install the SDK's policies test what users get.
#[test]
fn the_admission_policies_are_the_sdks() {
    let objects = components(&other());
    let shipped = |kind: &str| -> Vec<Value> {
        of_kind(&objects, kind)
            .into_iter()
            .map(|o| {
                let mut o = o.clone();
                o["metadata"].as_object_mut().unwrap().remove("labels");
                o
            })
            .collect()
    };
    let policies: Vec<Value> = banlieue_sdk::admission::policies()
        .into_iter()
        .map(|p| serde_json::to_value(p).unwrap())
        .collect();
    let bindings: Vec<Value> = banlieue_sdk::admission::bindings()
        .into_iter()
        .map(|b| serde_json::to_value(b).unwrap())
        .collect();
    assert_eq!(policies.len(), 4);
    assert_eq!(shipped("ValidatingAdmissionPolicy"), policies);
    assert_eq!(shipped("ValidatingAdmissionPolicyBinding"), bindings);
}

#[test]
fn objects_have_the_shapes_of_their_kinds() {
    for object in components(&other()) {
        let kind = object["kind"].as_str().unwrap().to_owned();
        let parsed = match kind.as_str() {
            "Namespace" => serde_json::from_value::<Namespace>(object).map(drop),
            "ServiceAccount" => serde_json::from_value::<ServiceAccount>(object).map(drop),
            "ClusterRole" => serde_json::from_value::<ClusterRole>(object).map(drop),
            "ClusterRoleBinding" => serde_json::from_value::<ClusterRoleBinding>(object).map(drop),
            "Role" => serde_json::from_value::<Role>(object).map(drop),
            "RoleBinding" => serde_json::from_value::<RoleBinding>(object).map(drop),
            "Deployment" => serde_json::from_value::<Deployment>(object).map(drop),
            "ValidatingAdmissionPolicy" => {
                serde_json::from_value::<ValidatingAdmissionPolicy>(object).map(drop)
            }
            "ValidatingAdmissionPolicyBinding" => {
                serde_json::from_value::<ValidatingAdmissionPolicyBinding>(object).map(drop)
            }
            _ => Ok(()),
        };
        parsed.unwrap_or_else(|e| panic!("{kind}: {e}"));
    }
}

#[test]
fn the_deployment_runs_banlieue_as_clusterctl_and_capi_expect() {
    let objects = components(&other());
    let deployment: Deployment =
        serde_json::from_value(of_kind(&objects, "Deployment")[0].clone()).unwrap();
    let pod = deployment.spec.unwrap().template.spec.unwrap();
    assert_eq!(pod.service_account_name.as_deref(), Some(CONTROLLER_NAME));
    assert_eq!(pod.containers.len(), 1);
    let manager = &pod.containers[0];
    assert_eq!(manager.name, "manager");
    assert_eq!(
        manager.image.as_deref(),
        Some("registry.example/banlieue:dev")
    );
    let args = manager.args.clone().unwrap();
    assert_eq!(args[0], "run");
    assert!(args.contains(&"--leader-elect".to_owned()), "{args:?}");
    assert!(args.contains(&"--health-addr=:9440".to_owned()), "{args:?}");
    assert!(
        !args.iter().any(|a| a.starts_with("--namespace")),
        "watches all namespaces"
    );
    for probe in [&manager.liveness_probe, &manager.readiness_probe] {
        let get = probe.as_ref().unwrap().http_get.as_ref().unwrap();
        assert_eq!(
            get.port,
            k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String("healthz".into())
        );
    }
    let ports: Vec<_> = manager
        .ports
        .iter()
        .flatten()
        .map(|p| (p.name.clone(), p.container_port))
        .collect();
    assert!(ports.contains(&(Some("healthz".into()), 9440)), "{ports:?}");
    let sc = manager.security_context.as_ref().unwrap();
    assert_eq!(sc.read_only_root_filesystem, Some(true));
    assert_eq!(sc.allow_privilege_escalation, Some(false));
    assert_eq!(
        sc.capabilities.as_ref().unwrap().drop,
        Some(vec!["ALL".to_owned()])
    );
    let pod_sc = pod.security_context.unwrap();
    assert_eq!(pod_sc.run_as_non_root, Some(true));
    assert_eq!(pod_sc.seccomp_profile.unwrap().type_, "RuntimeDefault");

    // The root is read-only: CopyDisk stages disks on an emptyDir, where --staging-dir says.
    assert!(
        args.contains(&"--staging-dir=/var/lib/banlieue/staging".to_owned()),
        "{args:?}"
    );
    let mounts = manager.volume_mounts.clone().unwrap_or_default();
    let mount = mounts
        .iter()
        .find(|m| m.mount_path == "/var/lib/banlieue/staging")
        .unwrap_or_else(|| panic!("no staging mount: {mounts:?}"));
    assert_eq!(mount.name, "staging");
    assert_ne!(mount.read_only, Some(true));
    let volumes = pod.volumes.unwrap_or_default();
    let staging = volumes
        .iter()
        .find(|v| v.name == "staging")
        .unwrap_or_else(|| panic!("no staging volume: {volumes:?}"));
    let empty_dir = staging.empty_dir.as_ref().expect("staging is an emptyDir");
    // Not tmpfs (it counts against memory), and no sizeLimit: see deployment::STAGING_DIR.
    assert_eq!(empty_dir.medium, None);
    assert_eq!(empty_dir.size_limit, None);
}

#[test]
fn the_default_image_is_this_version_under_the_repository_organisation() {
    let (repository, tag) = Options::default()
        .image
        .rsplit_once(':')
        .map(|(r, t)| (r.to_owned(), t.to_owned()))
        .unwrap();
    assert_eq!(tag, env!("CARGO_PKG_VERSION"));
    assert_eq!(repository, IMAGE_REPOSITORY);
    // ghcr.io/<org>/<name> links to github.com/<org>/<name>.
    let github = env!("CARGO_PKG_REPOSITORY")
        .trim_end_matches('/')
        .trim_end_matches(".git");
    assert_eq!(
        repository.strip_prefix("ghcr.io/"),
        github.strip_prefix("https://github.com/"),
        "the image lives under the repository in Cargo.toml"
    );
}

#[test]
fn components_need_no_clusterctl_variables_and_round_trip_through_yaml() {
    let objects = components(&Options::default());
    let yaml = to_yaml(&objects).unwrap();
    assert!(
        !yaml.contains("${"),
        "clusterctl would substitute variables"
    );
    let parsed: Vec<Value> = serde_saphyr::from_multiple(&yaml).unwrap();
    let parsed: Vec<Value> = parsed.into_iter().filter(|v| !v.is_null()).collect();
    assert_eq!(
        parsed, objects,
        "YAML keeps every value (and label strings stay strings)"
    );
}

fn rules(role: &Value) -> Vec<(BTreeSet<String>, BTreeSet<String>, BTreeSet<String>)> {
    let set = |v: &Value| -> BTreeSet<String> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|s| s.as_str().unwrap().to_owned())
            .collect()
    };
    role["rules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (set(&r["apiGroups"]), set(&r["resources"]), set(&r["verbs"])))
        .collect()
}

#[test]
fn the_aggregate_role_grants_exactly_the_infrastructure_kinds() {
    let role = aggregate_cluster_role();
    assert_eq!(role["metadata"]["name"], AGGREGATE_ROLE_NAME);
    let labels = &role["metadata"]["labels"];
    assert_eq!(labels["cluster.x-k8s.io/aggregate-to-manager"], "true");
    assert_eq!(
        labels["kubeadm.controlplane.cluster.x-k8s.io/aggregate-to-manager"],
        "true"
    );
    let rules = rules(&role);
    assert_eq!(rules.len(), 1);
    let (groups, resources, verbs) = &rules[0];
    assert_eq!(
        groups,
        &BTreeSet::from(["infrastructure.banlieue.io".to_owned()])
    );
    assert_eq!(
        verbs,
        &[
            "create", "delete", "get", "list", "patch", "update", "watch"
        ]
        .map(str::to_owned)
        .into()
    );
    let mut expected = BTreeSet::new();
    for crd in banlieue_sdk::crds::all() {
        if crd.spec.group != banlieue_sdk::api::INFRA_GROUP {
            continue;
        }
        let plural = crd.spec.names.plural.clone();
        if crd
            .spec
            .versions
            .iter()
            .any(|v| v.subresources.as_ref().is_some_and(|s| s.status.is_some()))
        {
            expected.insert(format!("{plural}/status"));
        }
        expected.insert(plural);
    }
    assert_eq!(resources, &expected);
    assert_eq!(resources.iter().filter(|r| !r.contains('/')).count(), 16);
    for forbidden in [
        "secrets",
        "events",
        "leases",
        "ipaddressclaims",
        "virtualmachines",
        "providers",
    ] {
        assert!(
            !resources.iter().any(|r| r.starts_with(forbidden)),
            "{forbidden}"
        );
    }
}

#[test]
fn the_controller_role_is_not_aggregated_and_has_no_wildcards() {
    let role = controller_cluster_role();
    let labels = role["metadata"]["labels"].as_object().unwrap();
    assert!(
        !labels.keys().any(|k| k.contains("aggregate")),
        "no aggregation label on the controller's role: {labels:?}"
    );
    let rules = rules(&role);
    for (groups, resources, verbs) in &rules {
        assert!(!groups.contains("*") && !resources.contains("*") && !verbs.contains("*"));
    }
    let grants = |group: &str, resource: &str, verb: &str| {
        rules
            .iter()
            .any(|(g, r, v)| g.contains(group) && r.contains(resource) && v.contains(verb))
    };
    let table = [
        // Users create VirtualMachines; the controllers patch them.
        ("banlieue.io", "virtualmachines", "create", false),
        ("banlieue.io", "virtualmachines", "patch", true),
        ("banlieue.io", "virtualmachines", "update", false),
        ("banlieue.io", "providers", "delete", false),
        ("banlieue.io", "virtualmachines/status", "patch", true),
        ("banlieue.io", "virtualmachines/status", "update", false),
        // Infrastructure machines are made for VirtualMachines; clusters are not.
        (
            "infrastructure.banlieue.io",
            "libvirtmachines",
            "create",
            true,
        ),
        (
            "infrastructure.banlieue.io",
            "libvirtmachines",
            "delete",
            true,
        ),
        (
            "infrastructure.banlieue.io",
            "libvirtclusters",
            "create",
            false,
        ),
        (
            "infrastructure.banlieue.io",
            "libvirtmachinetemplates",
            "create",
            false,
        ),
        ("banlieue.io", "virtualmachines/finalizers", "update", true),
        ("banlieue.io", "providers", "watch", true),
        (
            "infrastructure.banlieue.io",
            "vspheremachines/status",
            "patch",
            true,
        ),
        (
            "infrastructure.banlieue.io",
            "cloudhypervisorclusters/finalizers",
            "update",
            true,
        ),
        ("cluster.x-k8s.io", "machines", "get", true),
        ("cluster.x-k8s.io", "clusters", "watch", true),
        ("cluster.x-k8s.io", "machines", "delete", false),
        ("", "secrets", "create", true),
        ("", "secrets", "update", false),
        ("", "configmaps", "get", true),
        ("", "configmaps", "update", false),
        ("authentication.k8s.io", "tokenreviews", "create", true),
        (
            "authorization.k8s.io",
            "subjectaccessreviews",
            "create",
            true,
        ),
        ("", "events", "create", true),
        ("ipam.cluster.x-k8s.io", "ipaddressclaims", "delete", true),
        ("ipam.cluster.x-k8s.io", "ipaddresses", "list", true),
        ("ipam.cluster.x-k8s.io", "ipaddresses", "create", false),
        ("coordination.k8s.io", "leases", "get", false),
    ];
    for (group, resource, verb, expected) in table {
        assert_eq!(
            grants(group, resource, verb),
            expected,
            "{verb} {group}/{resource}"
        );
    }
    let lease_role = rbac::leader_election_role("x");
    assert_eq!(lease_role["metadata"]["namespace"], "x");
    assert!(rules_grant(
        &lease_role,
        "coordination.k8s.io",
        "leases",
        "update"
    ));
}

fn rules_grant(role: &Value, group: &str, resource: &str, verb: &str) -> bool {
    rules(role)
        .iter()
        .any(|(g, r, v)| g.contains(group) && r.contains(resource) && v.contains(verb))
}

#[test]
fn metadata_maps_every_minor_to_v1beta2() {
    let table = [
        ("0.1.0", vec![1]),
        ("0.4.2", vec![4, 3, 2, 1]),
        ("v1.2.0-rc.1", vec![2, 1, 0]),
    ];
    for (version, minors) in table {
        let metadata = metadata(version).unwrap();
        assert_eq!(
            metadata["apiVersion"],
            "clusterctl.cluster.x-k8s.io/v1alpha3"
        );
        assert_eq!(metadata["kind"], "Metadata");
        let series = metadata["releaseSeries"].as_array().unwrap();
        let got: Vec<u64> = series
            .iter()
            .map(|s| s["minor"].as_u64().unwrap())
            .collect();
        assert_eq!(got, minors, "{version}");
        assert!(series.iter().all(|s| s["contract"] == "v1beta2"));
    }
    assert!(metadata("latest").is_err());
}

#[test]
fn flavors_use_capi_standard_variables_and_our_kinds() {
    let kinds: BTreeSet<String> = banlieue_sdk::crds::all()
        .into_iter()
        .map(|crd| crd.spec.names.kind)
        .collect();
    for (flavor, template) in FLAVORS {
        for variable in [
            "${CLUSTER_NAME}",
            "${NAMESPACE}",
            "${KUBERNETES_VERSION}",
            "${CONTROL_PLANE_MACHINE_COUNT}",
            "${WORKER_MACHINE_COUNT}",
            "${CONTROL_PLANE_ENDPOINT_IP}",
        ] {
            assert!(template.contains(variable), "{flavor}: {variable}");
        }
        let documents: Vec<Value> =
            serde_saphyr::from_multiple(template).unwrap_or_else(|e| panic!("{flavor}: {e}"));
        let mut ours = 0;
        for doc in documents.iter().filter(|d| !d.is_null()) {
            let api_version = doc["apiVersion"].as_str().unwrap();
            if api_version.contains("banlieue.io") {
                ours += 1;
                assert!(
                    kinds.contains(doc["kind"].as_str().unwrap()),
                    "{flavor}: {doc}"
                );
            }
            for reference in [
                "/spec/infrastructureRef",
                "/spec/template/spec/infrastructureRef",
                "/spec/machineTemplate/spec/infrastructureRef",
            ] {
                if let Some(r) = doc.pointer(reference) {
                    assert_eq!(r["apiGroup"], "infrastructure.banlieue.io", "{flavor}");
                    assert!(kinds.contains(r["kind"].as_str().unwrap()), "{flavor}: {r}");
                }
            }
        }
        assert!(
            ours >= 3,
            "{flavor}: an InfraCluster and two machine templates"
        );
    }
}

#[test]
fn release_assets_are_components_metadata_and_one_template_per_flavor() {
    let files = assets(&Options::default(), "0.1.0").unwrap();
    let names: Vec<&str> = files.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names[0], "infrastructure-components.yaml");
    assert_eq!(names[1], "metadata.yaml");
    assert!(names.contains(&"cluster-template.yaml"));
    for flavor in ["vsphere", "proxmox", "libvirt", "cloud-hypervisor", "sim"] {
        assert!(
            names.contains(&format!("cluster-template-{flavor}.yaml").as_str()),
            "{flavor}"
        );
    }
    assert_eq!(
        files[0].1,
        to_yaml(&components(&Options::default())).unwrap()
    );
}

/// The committed `deploy/operator/` and `deploy/capi/` are what the code generates
/// (`make manifests` rewrites them; `make manifests-check` is the same check for CI).
#[test]
fn committed_manifests_are_up_to_date() {
    let deploy = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy");
    for (path, contents) in committed_manifests(&Options::default()).unwrap() {
        let committed = std::fs::read_to_string(deploy.join(&path)).unwrap_or_default();
        assert!(
            committed == contents,
            "deploy/{path} is stale: run `make manifests` and commit the result"
        );
    }
}

#[test]
fn the_deployment_args_are_accepted_by_banlieue_run() {
    use clap::Parser as _;
    let mut argv = vec!["banlieue".to_owned()];
    argv.extend(deployment::manager_args());
    let parsed = crate::cli::Cli::try_parse_from(&argv);
    assert!(
        matches!(
            parsed,
            Ok(crate::cli::Cli {
                command: crate::cli::Command::Run(_)
            })
        ),
        "{argv:?}: {:?}",
        parsed.err()
    );
}

#[test]
fn the_metrics_reader_may_get_metrics_and_nothing_else() {
    let objects = components(&Options::default());
    let reader = of_kind(&objects, "ClusterRole")
        .into_iter()
        .find(|r| r["metadata"]["name"] == super::METRICS_READER_NAME)
        .expect("the metrics reader role is installed");
    assert_eq!(
        reader["rules"],
        serde_json::json!([{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}])
    );
}
