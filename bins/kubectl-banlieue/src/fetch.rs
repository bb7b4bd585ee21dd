//! Everything the plugin reads from the API server. Reads only: the plugin never writes.

use banlieue_sdk::api::infra::MachineStatus;
use banlieue_sdk::api::{INFRA_GROUP, Provider, VERSION, VMClass, VMImage, VirtualMachine};
use kube::api::{Api, ApiResource, DynamicObject, ListParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::core::GroupVersion;
use kube::{Client, Config, ResourceExt};

use crate::diagnose::{Machine, provider_name};

/// Why the plugin could not do its job.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No usable kubeconfig (or in-cluster config).
    #[error("kubeconfig: {0}")]
    Config(String),
    /// The API server does not know VirtualMachines.
    #[error(
        "the API server does not serve banlieue.io/v1alpha1 VirtualMachines: are banlieue's CRDs installed? (banlieue crds | kubectl apply -f -)"
    )]
    CrdsMissing,
    /// The VM asked for does not exist.
    #[error("VirtualMachine {name:?} not found in namespace {namespace:?}")]
    NotFound {
        /// Its name.
        name: String,
        /// Where it was looked for.
        namespace: String,
    },
    /// Any other API error (connection, authorisation, ...).
    #[error("Kubernetes API: {0}")]
    Api(#[from] kube::Error),
}

/// Where to connect and which namespace to use.
#[derive(Clone, Debug, Default)]
pub struct Connection {
    /// A kubeconfig file instead of `$KUBECONFIG` / `~/.kube/config`.
    pub kubeconfig: Option<String>,
    /// A context instead of the current one.
    pub context: Option<String>,
    /// A namespace instead of the context's.
    pub namespace: Option<String>,
}

/// A client for `connection`, and the namespace to use: the flag's, else the
/// context's, else `default` (kubectl's rules).
pub async fn connect(connection: &Connection) -> Result<(Client, String), Error> {
    let options = KubeConfigOptions {
        context: connection.context.clone(),
        ..KubeConfigOptions::default()
    };
    let config = match &connection.kubeconfig {
        Some(path) => {
            let file = Kubeconfig::read_from(path).map_err(|e| Error::Config(e.to_string()))?;
            Config::from_custom_kubeconfig(file, &options)
                .await
                .map_err(|e| Error::Config(e.to_string()))?
        }
        None if connection.context.is_some() => Config::from_kubeconfig(&options)
            .await
            .map_err(|e| Error::Config(e.to_string()))?,
        None => Config::infer()
            .await
            .map_err(|e| Error::Config(e.to_string()))?,
    };
    let namespace = connection
        .namespace
        .clone()
        .unwrap_or_else(|| config.default_namespace.clone());
    let client = Client::try_from(config).map_err(|e| Error::Config(e.to_string()))?;
    Ok((client, namespace))
}

fn crds_missing(error: kube::Error) -> Error {
    match error {
        kube::Error::Api(ref s) if s.code == 404 => Error::CrdsMissing,
        other => Error::Api(other),
    }
}

/// VirtualMachines in `namespace` (every namespace when `None`), optionally one by
/// name, sorted by namespace and name.
pub async fn virtual_machines(
    client: &Client,
    namespace: Option<&str>,
    name: Option<&str>,
) -> Result<Vec<VirtualMachine>, Error> {
    let api: Api<VirtualMachine> = match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let mut vms = match (name, namespace) {
        (Some(name), Some(ns)) => match api.get_opt(name).await.map_err(crds_missing)? {
            Some(vm) => vec![vm],
            None => {
                return Err(Error::NotFound {
                    name: name.into(),
                    namespace: ns.into(),
                });
            }
        },
        (name, _) => {
            let mut params = ListParams::default();
            if let Some(name) = name {
                params = params.fields(&format!("metadata.name={name}"));
            }
            api.list(&params).await.map_err(crds_missing)?.items
        }
    };
    vms.sort_by_key(|vm| (vm.namespace(), vm.name_any()));
    Ok(vms)
}

/// What `describe` reads besides the VM: owned, so [`crate::diagnose::Facts`] can
/// borrow from it.
#[derive(Debug)]
pub struct Related {
    /// The VM's VMClass, if it exists.
    pub class: Option<VMClass>,
    /// The VM's VMImage, if it exists.
    pub image: Option<VMImage>,
    /// The Provider it is placed on or asks for, if it exists.
    pub provider: Option<Provider>,
    /// Every Provider in its namespace.
    pub providers: Vec<Provider>,
    /// Its infrastructure machine, if one exists.
    pub machine: Option<Machine>,
}

/// Reads everything the diagnosis of `vm` needs.
pub async fn related(client: &Client, vm: &VirtualMachine) -> Result<Related, Error> {
    let namespace = vm.namespace().unwrap_or_default();
    let classes: Api<VMClass> = Api::all(client.clone());
    let images: Api<VMImage> = Api::all(client.clone());
    let providers: Api<Provider> = Api::namespaced(client.clone(), &namespace);
    let class = classes.get_opt(&vm.spec.class_ref.name).await?;
    let image = images.get_opt(&vm.spec.image_ref.name).await?;
    let all_providers = providers.list(&ListParams::default()).await?.items;
    let provider = provider_name(vm)
        .and_then(|name| all_providers.iter().find(|p| p.name_any() == name).cloned());
    let machine = machine(client, vm, &namespace).await?;
    Ok(Related {
        class,
        image,
        provider,
        providers: all_providers,
        machine,
    })
}

/// The VM's infrastructure machine: the one its status names, else one of any kind
/// that it owns under its own name (made, but not yet mirrored into the VM's status).
/// Kinds are found by discovery, so a machine kind an embedding operator serves is
/// found like banlieue's own.
async fn machine(
    client: &Client,
    vm: &VirtualMachine,
    namespace: &str,
) -> Result<Option<Machine>, Error> {
    let named = vm
        .status
        .as_ref()
        .and_then(|s| s.infrastructure_ref.as_ref());
    let by_reference = named.is_some();
    let (name, kind) = match named {
        Some(reference) => (reference.name.clone(), Some(reference.kind.as_str())),
        None => (vm.name_any(), None),
    };
    let candidates = served_machine_kinds(client)
        .await?
        .into_iter()
        .filter(|r| kind.is_none_or(|k| r.kind == k));
    let uid = vm.uid().unwrap_or_default();
    for resource in candidates {
        let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, &resource);
        let Some(object) = api.get_opt(&name).await? else {
            continue;
        };
        if !by_reference && !object.owner_references().iter().any(|o| o.uid == uid) {
            continue;
        }
        let status = object
            .data
            .get("status")
            .cloned()
            .map(serde_json::from_value::<MachineStatus>)
            .transpose()
            .map_err(|e| Error::Api(kube::Error::SerdeError(e)))?;
        return Ok(Some(Machine {
            kind: resource.kind.clone(),
            name: name.clone(),
            status,
            deleting: object.metadata.deletion_timestamp.is_some(),
        }));
    }
    Ok(None)
}

/// The machine kinds the API server serves in banlieue's infrastructure group
/// (`<Something>Machine`, not the templates): banlieue's own, and those of backends
/// registered out of tree. None when the group is not served at all.
async fn served_machine_kinds(client: &Client) -> Result<Vec<ApiResource>, Error> {
    let group = GroupVersion::gv(INFRA_GROUP, VERSION);
    let served = match kube::discovery::pinned_group(client, &group).await {
        Ok(served) => served,
        Err(kube::Error::Api(ref s)) if s.code == 404 => return Ok(Vec::new()),
        Err(e) => return Err(e.into()),
    };
    Ok(served
        .versioned_resources(VERSION)
        .into_iter()
        .map(|(resource, _)| resource)
        .filter(|r| r.kind.ends_with("Machine"))
        .collect())
}
