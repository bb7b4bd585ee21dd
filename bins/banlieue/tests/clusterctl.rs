//! The real `clusterctl` (v1.14, from the CAPI rig) reads banlieue's release assets from
//! a local repository, configured by the seeds' `providers:` entry pointed at a
//! `file://` URL:
//!
//! - `clusterctl generate provider --infrastructure banlieue` accepts the components;
//! - `clusterctl generate cluster --flavor <f> --list-variables` works for every flavor,
//!   and each generated cluster passes a server-side dry run against the real CRDs and
//!   CAPI's webhooks;
//! - `clusterctl init --infrastructure banlieue` installs banlieue next to the running
//!   CAPI core (registered in clusterctl's inventory as the core provider).
//!
//! What a cluster without nodes cannot run: cert-manager. `clusterctl init` only checks
//! that cert-manager's API accepts an Issuer and a Certificate (it creates and deletes
//! test ones), so the test serves cert-manager's kinds as CRDs without its controller
//! (`banlieue_integration_tests::cert_stand_in::install_crds`, the test-only stand-in's;
//! banlieue's components contain no cert-manager objects). No pod runs:
//! banlieue's Deployment is installed but not started (`--wait-providers` is off), and the
//! kubeadm bootstrap/control-plane providers (clusterctl's defaults on a first init) are
//! not installed: the CAPI rig is registered as an already-installed core provider, so
//! this is not a first init.

use std::path::{Path, PathBuf};
use std::process::Command;

use banlieue_integration_tests::capi::{self, Capi};
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::core::GroupVersionKind;
use kube::discovery::{self, Scope};
use serde_json::{Value, json};

const VERSION: &str = concat!("v", env!("CARGO_PKG_VERSION"));
const FLAVORS: [&str; 5] = ["vsphere", "proxmox", "libvirt", "cloud-hypervisor", "sim"];

/// A local clusterctl repository and configuration in a temporary directory.
struct Repository {
    dir: tempfile::TempDir,
    config: PathBuf,
}

impl Repository {
    fn new(capi: &Capi) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let ours = dir
            .path()
            .join("repo/infrastructure-banlieue")
            .join(VERSION);
        let out = Command::new(env!("CARGO_BIN_EXE_banlieue"))
            .args(["bootstrap", "release", "--out-dir"])
            .arg(&ours)
            .args(["--version", env!("CARGO_PKG_VERSION")])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        // The core provider's release: the rig's CAPI metadata (contract per series) and
        // a components file (clusterctl reads metadata only, CAPI is already running).
        let core = dir.path().join("repo/cluster-api").join(capi.version());
        std::fs::create_dir_all(&core).unwrap();
        std::fs::copy(capi.rig().join("metadata.yaml"), core.join("metadata.yaml")).unwrap();
        std::fs::write(
            core.join("core-components.yaml"),
            "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: capi-system\n",
        )
        .unwrap();
        // The seeds' providers entry, pointed at the local repository.
        let config = dir.path().join("clusterctl.yaml");
        std::fs::write(
            &config,
            format!(
                "providers:\n  - name: banlieue\n    type: InfrastructureProvider\n    url: file://{ours}/infrastructure-components.yaml\n  - name: cluster-api\n    type: CoreProvider\n    url: file://{core}/core-components.yaml\n",
                ours = ours.display(),
                core = core.display(),
            ),
        )
        .unwrap();
        Self { dir, config }
    }

    /// Runs clusterctl with this configuration, a private HOME, no version check and no
    /// network; returns stdout, panicking with stderr on failure.
    fn clusterctl(&self, capi: &Capi, args: &[&str], env: &[(&str, &str)]) -> String {
        let out = self.run(capi, args, env);
        assert!(
            out.status.success(),
            "clusterctl {args:?} failed:\n{}\n{}",
            String::from_utf8_lossy(&out.stderr),
            String::from_utf8_lossy(&out.stdout)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn run(&self, capi: &Capi, args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
        let home = self.dir.path().join("home");
        Command::new(capi.clusterctl())
            .args(args)
            .arg("--config")
            .arg(&self.config)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("HOME", &home)
            .env("XDG_CONFIG_HOME", home.join(".config"))
            .env("CLUSTERCTL_DISABLE_VERSIONCHECK", "true")
            .env("GOPROXY", "off")
            .envs(env.iter().copied())
            .output()
            .expect("running clusterctl")
    }
}

fn documents(yaml: &str) -> Vec<Value> {
    let docs: Vec<Value> = serde_saphyr::from_multiple(yaml).expect("YAML");
    docs.into_iter().filter(|d| !d.is_null()).collect()
}

fn kubeconfig() -> &'static str {
    banlieue_testenv::kubeconfig_path().to_str().unwrap()
}

#[tokio::test]
async fn clusterctl_accepts_our_release() {
    let Some(capi) = Capi::start() else { return };
    let repo = Repository::new(capi);

    // generate provider: clusterctl parses, checks and relabels our components.
    let components = documents(&repo.clusterctl(
        capi,
        &["generate", "provider", "--infrastructure", "banlieue"],
        &[],
    ));
    let ours = documents(
        &std::fs::read_to_string(
            repo.dir
                .path()
                .join("repo/infrastructure-banlieue")
                .join(VERSION)
                .join("infrastructure-components.yaml"),
        )
        .unwrap(),
    );
    assert_eq!(components.len(), ours.len(), "every object survives");
    let namespaces: Vec<&Value> = components
        .iter()
        .filter(|o| o["kind"] == "Namespace")
        .collect();
    assert_eq!(namespaces.len(), 1);
    assert_eq!(namespaces[0]["metadata"]["name"], "banlieue-system");
    for object in &components {
        let labels = &object["metadata"]["labels"];
        assert_eq!(
            labels["cluster.x-k8s.io/provider"],
            "infrastructure-banlieue"
        );
        assert_eq!(labels["clusterctl.cluster.x-k8s.io"], "");
    }
    // The admission policies pass through. clusterctl v1.14 knows a fixed list of
    // cluster-scoped kinds (cmd/clusterctl/internal/util/objs.go) without them, so it
    // gives them the target namespace; the API server drops a namespace sent with a
    // cluster-scoped kind, and `clusterctl init` below installs them cluster-wide.
    let policies: Vec<&Value> = components
        .iter()
        .filter(|o| {
            o["kind"]
                .as_str()
                .is_some_and(|k| k.starts_with("ValidatingAdmissionPolicy"))
        })
        .collect();
    assert_eq!(
        policies.len(),
        2 * banlieue_sdk::admission::policies().len()
    );
    for policy in policies {
        let namespace = policy["metadata"]["namespace"].as_str();
        assert!(
            matches!(namespace, None | Some("banlieue-system")),
            "{}: {namespace:?}",
            policy["metadata"]["name"]
        );
    }
    let deployment = components
        .iter()
        .find(|o| o["kind"] == "Deployment")
        .unwrap();
    assert_eq!(
        deployment["spec"]["template"]["spec"]["containers"][0]["name"],
        "manager"
    );

    // --target-namespace: clusterctl moves every namespaced object and binding subject.
    let moved = documents(&repo.clusterctl(
        capi,
        &[
            "generate",
            "provider",
            "--infrastructure",
            "banlieue",
            "--target-namespace",
            "elsewhere",
        ],
        &[],
    ));
    for object in &moved {
        if let Some(ns) = object["metadata"]["namespace"].as_str() {
            assert_eq!(ns, "elsewhere", "{}", object["metadata"]["name"]);
        }
        for subject in object["subjects"].as_array().into_iter().flatten() {
            assert_eq!(subject["namespace"], "elsewhere");
        }
    }
}

/// Variables for generating each flavor.
fn variables(namespace: &str) -> Vec<(&'static str, String)> {
    [
        ("NAMESPACE", namespace),
        ("KUBERNETES_VERSION", "v1.36.3"),
        ("CONTROL_PLANE_MACHINE_COUNT", "3"),
        ("WORKER_MACHINE_COUNT", "2"),
        ("CONTROL_PLANE_ENDPOINT_IP", "192.0.2.10"),
        ("BANLIEUE_PROVIDER", "lab"),
        (
            "BANLIEUE_SSH_AUTHORIZED_KEY",
            "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBanlieueTestKeyNotARealOne test",
        ),
        ("BANLIEUE_VSPHERE_TEMPLATE", "ubuntu-2404-kube-v1.36.3"),
        ("BANLIEUE_PROXMOX_TEMPLATE_ID", "9000"),
        ("BANLIEUE_LIBVIRT_IMAGE", "ubuntu-2404.qcow2"),
        (
            "BANLIEUE_CH_DISK",
            "/var/lib/banlieue/images/ubuntu-2404.raw",
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k, v.to_owned()))
    .collect()
}

async fn install_crds(client: &kube::Client, dir: &Path) {
    let api: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &kube::api::ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("apiextensions.k8s.io", "v1", "CustomResourceDefinition"),
            "customresourcedefinitions",
        ),
    );
    for entry in std::fs::read_dir(dir).unwrap() {
        let text = std::fs::read_to_string(entry.unwrap().path()).unwrap();
        for crd in documents(&text) {
            let name = crd["metadata"]["name"].as_str().unwrap().to_owned();
            api.patch(
                &name,
                &PatchParams::apply("clusterctl-test").force(),
                &Patch::Apply(&crd),
            )
            .await
            .unwrap();
        }
    }
    // Discovery needs the new kinds; wait until they are served.
    for _ in 0..100 {
        if discovery::pinned_kind(
            client,
            &GroupVersionKind::gvk(
                "controlplane.cluster.x-k8s.io",
                "v1beta2",
                "KubeadmControlPlane",
            ),
        )
        .await
        .is_ok()
        {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// Server-side dry-run apply: the object is validated by its CRD schema, CEL rules and
/// admission webhooks (CAPI's for Cluster and MachineDeployment), and not stored.
async fn dry_run_apply(
    client: &kube::Client,
    namespace: &str,
    object: &Value,
) -> Result<(), String> {
    let api_version = object["apiVersion"].as_str().unwrap();
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
    let gvk = GroupVersionKind::gvk(group, version, object["kind"].as_str().unwrap());
    let (resource, caps) = discovery::pinned_kind(client, &gvk)
        .await
        .map_err(|e| format!("{gvk:?}: {e}"))?;
    let api: Api<DynamicObject> = match caps.scope {
        Scope::Namespaced => Api::namespaced_with(client.clone(), namespace, &resource),
        Scope::Cluster => Api::all_with(client.clone(), &resource),
    };
    let mut params = PatchParams::apply("clusterctl-test").dry_run();
    params.field_validation = Some(kube::api::ValidationDirective::Strict);
    api.patch(
        object["metadata"]["name"].as_str().unwrap(),
        &params,
        &Patch::Apply(object),
    )
    .await
    .map(drop)
    .map_err(|e| format!("{} {}: {e}", object["kind"], object["metadata"]["name"]))
}

#[tokio::test]
async fn every_flavor_lists_its_variables_and_generates_valid_objects() {
    let Some(capi) = Capi::start() else { return };
    let repo = Repository::new(capi);
    let client = banlieue_testenv::client().await;
    install_crds(&client, &capi.rig().join("crds-kubeadm")).await;
    let ns = banlieue_testenv::namespace("clusterctl").await;
    let vars = variables(&ns.name);
    let env: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let infrastructure = format!("banlieue:{VERSION}");
    for flavor in FLAVORS {
        let listed = repo.clusterctl(
            capi,
            &[
                "generate",
                "cluster",
                "workload",
                "--infrastructure",
                &infrastructure,
                "--flavor",
                flavor,
                "--list-variables",
                "--target-namespace",
                &ns.name,
            ],
            &[],
        );
        for variable in [
            "KUBERNETES_VERSION",
            "CONTROL_PLANE_MACHINE_COUNT",
            "WORKER_MACHINE_COUNT",
            "CONTROL_PLANE_ENDPOINT_IP",
        ] {
            assert!(
                listed.contains(variable),
                "{flavor}: {variable} in\n{listed}"
            );
        }
        let generated = documents(&repo.clusterctl(
            capi,
            &[
                "generate",
                "cluster",
                "workload",
                "--infrastructure",
                &infrastructure,
                "--flavor",
                flavor,
                "--target-namespace",
                &ns.name,
            ],
            &env,
        ));
        assert!(generated.len() >= 7, "{flavor}: {generated:?}");
        let mut failures = Vec::new();
        for object in &generated {
            if let Err(e) = dry_run_apply(&client, &ns.name, object).await {
                failures.push(e);
            }
        }
        assert!(failures.is_empty(), "{flavor}:\n{}", failures.join("\n"));
    }
}

#[tokio::test]
async fn clusterctl_init_installs_banlieue_next_to_capi() {
    let Some(capi) = Capi::start() else { return };
    let repo = Repository::new(capi);
    let client = banlieue_testenv::client().await;
    // clusterctl's inventory, with the running CAPI core registered in it.
    install_crds(&client, &capi.rig().join("crds-clusterctl")).await;
    let core = json!({
        "apiVersion": "clusterctl.cluster.x-k8s.io/v1alpha3",
        "kind": "Provider",
        "metadata": {
            "name": "cluster-api",
            "namespace": capi::NAMESPACE,
            "labels": {"clusterctl.cluster.x-k8s.io": "", "cluster.x-k8s.io/provider": "cluster-api"},
        },
        "providerName": "cluster-api",
        "type": "CoreProvider",
        "version": capi.version(),
    });
    banlieue_integration_tests::apply(&client, capi::NAMESPACE, &core)
        .await
        .expect("registering CAPI core in clusterctl's inventory");
    // cert-manager's API without its controller (see the module docs): the test-only
    // stand-in's CRDs, installed and Established.
    banlieue_integration_tests::cert_stand_in::install_crds(&client)
        .await
        .expect("cert-manager's CRDs (the test stand-in's)");

    let kubeconfig = kubeconfig();
    let out = repo.run(
        capi,
        &[
            "init",
            "--infrastructure",
            "banlieue",
            "--kubeconfig",
            kubeconfig,
        ],
        &[],
    );
    let log = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "clusterctl init failed:\n{log}");
    assert!(log.contains("Skipping installing cert-manager"), "{log}");
    assert!(
        log.contains("Installing provider=\"infrastructure-banlieue\""),
        "{log}"
    );

    // The components are installed with clusterctl's labels, and the inventory knows us.
    let deployments: Api<k8s_openapi::api::apps::v1::Deployment> =
        Api::namespaced(client.clone(), "banlieue-system");
    let deployment = deployments
        .get("banlieue-controller-manager")
        .await
        .expect("banlieue's Deployment");
    let labels = deployment.metadata.labels.unwrap_or_default();
    assert_eq!(
        labels
            .get("clusterctl.cluster.x-k8s.io")
            .map(String::as_str),
        Some("")
    );
    let providers = kube::api::ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("clusterctl.cluster.x-k8s.io", "v1alpha3", "Provider"),
        "providers",
    );
    let ours = Api::<DynamicObject>::namespaced_with(client.clone(), "banlieue-system", &providers)
        .get("infrastructure-banlieue")
        .await
        .expect("clusterctl's inventory entry for banlieue");
    assert_eq!(ours.data["version"], VERSION);
    assert_eq!(ours.data["type"], "InfrastructureProvider");

    // The admission policies came with the components: cluster-scoped, written by
    // clusterctl (its label; the test control plane's own copies carry none).
    use k8s_openapi::api::admissionregistration::v1::{
        ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
    };
    let policies = Api::<ValidatingAdmissionPolicy>::all(client.clone());
    let bindings = Api::<ValidatingAdmissionPolicyBinding>::all(client.clone());
    for (policy, binding) in banlieue_sdk::admission::policies()
        .iter()
        .zip(banlieue_sdk::admission::bindings())
    {
        let name = policy.metadata.name.as_deref().unwrap();
        let installed = policies.get(name).await.expect("the policy");
        // The apiserver defaults the match constraints (selectors, scope): compare
        // what the policy says.
        let (got, want) = (installed.spec.unwrap(), policy.spec.clone().unwrap());
        assert_eq!(got.match_conditions, want.match_conditions, "{name}");
        assert_eq!(got.variables, want.variables, "{name}");
        assert_eq!(got.validations, want.validations, "{name}");
        let labels = installed.metadata.labels.unwrap_or_default();
        assert_eq!(
            labels
                .get("clusterctl.cluster.x-k8s.io")
                .map(String::as_str),
            Some(""),
            "{name} written by clusterctl"
        );
        let installed = bindings
            .get(binding.metadata.name.as_deref().unwrap())
            .await
            .expect("the binding");
        let (got, want) = (installed.spec.unwrap(), binding.spec.unwrap());
        assert_eq!(got.policy_name, want.policy_name, "{name}");
        assert_eq!(got.validation_actions, want.validation_actions, "{name}");
    }
}
