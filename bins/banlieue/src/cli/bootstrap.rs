//! `banlieue bootstrap`: install banlieue (`operator`), render clusterctl's release
//! assets (`release`) and the manifests committed under `deploy/` (`manifests`). The
//! objects come from [`crate::install`]; this module only applies or writes them.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context as _;
use clap::{Args, Subcommand};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams};
use kube::core::GroupVersionKind;
use kube::runtime::wait::{await_condition, conditions};
use serde_json::Value;

use crate::install::{self, Options};
use banlieue_runtime::client::{self, ClientConfig};

/// The field manager of `bootstrap operator`'s server-side applies.
pub const FIELD_MANAGER: &str = "banlieue-bootstrap";

/// Options of `banlieue bootstrap`.
#[derive(Args, Debug)]
pub struct BootstrapCommand {
    #[command(subcommand)]
    what: What,
}

#[derive(Subcommand, Debug)]
enum What {
    /// Install or upgrade banlieue: Namespace, CRDs and their admission policies, RBAC
    /// (with Cluster API's aggregate role) and the Deployment, with server-side apply.
    /// `--dry-run` prints exactly the clusterctl `infrastructure-components.yaml`
    /// instead.
    Operator(OperatorArgs),
    /// Write the clusterctl release assets (infrastructure-components.yaml,
    /// metadata.yaml, cluster-template*.yaml) into a directory.
    Release(ReleaseArgs),
    /// Write the manifests committed under deploy/ (operator/operator.yaml without the
    /// CRDs, which are in crds/, and capi/clusterrole-aggregate.yaml).
    Manifests(ManifestsArgs),
}

/// What every install varies by.
#[derive(Args, Debug)]
struct InstallArgs {
    /// The operator image.
    #[arg(long, env = "BANLIEUE_IMAGE", default_value_t = install::default_image())]
    image: String,
    /// The namespace to run in (the only Namespace the install creates).
    #[arg(long, env = "BANLIEUE_INSTALL_NAMESPACE", default_value = install::DEFAULT_NAMESPACE)]
    namespace: String,
}

impl InstallArgs {
    fn options(&self) -> Options {
        Options {
            namespace: self.namespace.clone(),
            image: self.image.clone(),
        }
    }
}

#[derive(Args, Debug)]
struct OperatorArgs {
    #[command(flatten)]
    install: InstallArgs,
    /// Print the objects (clusterctl's infrastructure-components.yaml) instead of
    /// applying them.
    #[arg(long)]
    dry_run: bool,
    /// Path to a kubeconfig [default: in-cluster config, else $KUBECONFIG, else ~/.kube/config].
    #[arg(long, env = "BANLIEUE_KUBECONFIG", value_name = "PATH")]
    kubeconfig: Option<PathBuf>,
    /// How long to wait for the CRDs to be established.
    #[arg(long, default_value = "60", value_name = "SECONDS")]
    timeout: u64,
}

#[derive(Args, Debug)]
struct ReleaseArgs {
    #[command(flatten)]
    install: InstallArgs,
    /// Directory to write the assets into (created if missing).
    #[arg(long, value_name = "DIR")]
    out_dir: PathBuf,
    /// The release version metadata.yaml covers.
    #[arg(long, default_value = env!("CARGO_PKG_VERSION"))]
    version: String,
}

#[derive(Args, Debug)]
struct ManifestsArgs {
    /// The deploy/ directory to write operator/ and capi/ into.
    #[arg(long, value_name = "DIR", default_value = "deploy")]
    out_dir: PathBuf,
}

impl BootstrapCommand {
    /// Runs the subcommand.
    pub fn run(self) -> anyhow::Result<()> {
        match self.what {
            What::Operator(args) if args.dry_run => {
                let yaml = install::to_yaml(&install::components(&args.install.options()))?;
                super::output::print_stdout(yaml.as_bytes())
            }
            What::Operator(args) => {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()?;
                runtime.block_on(apply_all(&args))
            }
            What::Release(args) => {
                let files = install::release::assets(&args.install.options(), &args.version)?;
                write_files(&args.out_dir, &files)
            }
            What::Manifests(args) => {
                let files = install::committed_manifests(&Options::default())?;
                write_files(&args.out_dir, &files)
            }
        }
    }
}

fn write_files(dir: &Path, files: &[(String, String)]) -> anyhow::Result<()> {
    for (name, contents) in files {
        let path = dir.join(name);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("creating {}", parent.display()))?;
        }
        std::fs::write(&path, contents).with_context(|| format!("writing {}", path.display()))?;
    }
    eprintln!("wrote {} files to {}", files.len(), dir.display());
    Ok(())
}

/// The resource and scope of each kind an install has.
fn resource_of(object: &Value) -> anyhow::Result<(ApiResource, bool)> {
    let api_version = object["apiVersion"].as_str().unwrap_or_default();
    let kind = object["kind"].as_str().unwrap_or_default();
    let (plural, namespaced) = match kind {
        "Namespace" => ("namespaces", false),
        "CustomResourceDefinition" => ("customresourcedefinitions", false),
        "ValidatingAdmissionPolicy" => ("validatingadmissionpolicies", false),
        "ValidatingAdmissionPolicyBinding" => ("validatingadmissionpolicybindings", false),
        "ClusterRole" => ("clusterroles", false),
        "ClusterRoleBinding" => ("clusterrolebindings", false),
        "ServiceAccount" => ("serviceaccounts", true),
        "Role" => ("roles", true),
        "RoleBinding" => ("rolebindings", true),
        "Deployment" => ("deployments", true),
        other => anyhow::bail!("bootstrap does not know how to apply a {other}"),
    };
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
    let gvk = GroupVersionKind::gvk(group, version, kind);
    Ok((ApiResource::from_gvk_with_plural(&gvk, plural), namespaced))
}

async fn apply_all(args: &OperatorArgs) -> anyhow::Result<()> {
    let client = client::build(
        &ClientConfig {
            kubeconfig: args.kubeconfig.clone(),
            qps: 50.0,
            burst: 100,
        },
        &mut prometheus_client::registry::Registry::default(),
    )
    .await?;
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let objects = install::components(&args.install.options());
    for object in &objects {
        let (resource, namespaced) = resource_of(object)?;
        let name = object["metadata"]["name"].as_str().unwrap_or_default();
        let api: Api<DynamicObject> = if namespaced {
            let namespace = object["metadata"]["namespace"].as_str().unwrap_or_default();
            Api::namespaced_with(client.clone(), namespace, &resource)
        } else {
            Api::all_with(client.clone(), &resource)
        };
        let before = api
            .get_opt(name)
            .await
            .with_context(|| format!("reading {} {name}", resource.kind))?
            .and_then(|o| o.metadata.resource_version);
        let after = api
            .patch(name, &params, &Patch::Apply(object))
            .await
            .with_context(|| format!("applying {} {name}", resource.kind))?
            .metadata
            .resource_version;
        let outcome = match (before, after) {
            (None, _) => "created",
            (Some(b), Some(a)) if a == b => "unchanged",
            _ => "configured",
        };
        println!("{}/{name} {outcome}", resource.kind.to_lowercase());
    }
    wait_established(&client, &objects, Duration::from_secs(args.timeout)).await
}

async fn wait_established(
    client: &kube::Client,
    objects: &[Value],
    timeout: Duration,
) -> anyhow::Result<()> {
    let api = Api::<CustomResourceDefinition>::all(client.clone());
    for object in objects
        .iter()
        .filter(|o| o["kind"] == "CustomResourceDefinition")
    {
        let name = object["metadata"]["name"].as_str().unwrap_or_default();
        tokio::time::timeout(
            timeout,
            await_condition(api.clone(), name, conditions::is_crd_established()),
        )
        .await
        .with_context(|| format!("CRD {name} was not established within {timeout:?}"))?
        .with_context(|| format!("waiting for CRD {name}"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_component_kind_can_be_applied() {
        for object in install::components(&Options::default()) {
            let (resource, namespaced) = resource_of(&object).unwrap();
            assert_eq!(
                namespaced,
                object["metadata"]["namespace"].is_string(),
                "{}",
                resource.kind
            );
        }
    }
}
