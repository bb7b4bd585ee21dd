//! IPAM for infrastructure machines: one `IPAddressClaim` per network device that
//! takes its address from a pool, owned by the machine; the backend is called only
//! once every claim has an address, with those devices made `static`. Claims are
//! deleted explicitly after the backend VM (garbage collection may not run, and the
//! address must not be reused while the VM still holds it).

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams};

use super::{Error, Machine};
use crate::backend::MachineSpec;
use crate::capi::ipam::{Allocation, build_claim, claim_name, pool_devices, resolve};
use crate::capi::metadata;
use crate::capi::objects::{IPAddress, IPAddressClaim};
use crate::controllers::context::Context;

/// Field manager of the claims banlieue makes.
const FIELD_MANAGER: &str = "banlieue-ipam";
/// How soon to look again at a claim the pool's provider has not fulfilled.
pub(super) const RECHECK: Duration = Duration::from_secs(3);

/// The spec for the backend, or why it cannot be had yet.
pub(super) enum Addresses {
    /// Every pool device has its address.
    Resolved(Box<MachineSpec>),
    /// Some claim is not fulfilled (or IPAM is not installed).
    Waiting {
        reason: &'static str,
        message: String,
    },
}

fn owner<K: Machine>(machine: &K) -> OwnerReference {
    OwnerReference {
        api_version: K::api_version(&()).into_owned(),
        kind: K::kind(&()).into_owned(),
        name: machine.name_any(),
        uid: machine.uid().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

/// Claims what the spec's pool devices need and resolves the spec once all are
/// fulfilled.
pub(super) async fn ensure<K: Machine>(
    machine: &K,
    ctx: &Context,
    spec: MachineSpec,
) -> Result<Addresses, Error> {
    let devices = pool_devices(&spec);
    if devices.is_empty() {
        return Ok(Addresses::Resolved(Box::new(spec)));
    }
    let namespace = machine.namespace().unwrap_or_default();
    let claims: Api<IPAddressClaim> = Api::namespaced(ctx.client.clone(), &namespace);
    let addresses: Api<IPAddress> = Api::namespaced(ctx.client.clone(), &namespace);
    let owner = owner(machine);
    let cluster = metadata::cluster_name(machine.meta());
    let mut allocations = BTreeMap::new();
    let mut pending = vec![];
    for (index, pool) in &devices {
        let name = claim_name(&owner.name, *index);
        let claim = match claims.get_opt(&name).await {
            Ok(Some(claim)) => claim,
            Ok(None) => {
                let built = build_claim(&owner, &namespace, cluster, *index, pool);
                match claims
                    .patch(
                        &name,
                        &PatchParams::apply(FIELD_MANAGER),
                        &Patch::Apply(&built),
                    )
                    .await
                {
                    Ok(claim) => claim,
                    Err(kube::Error::Api(status)) if status.code == 404 => {
                        return Ok(not_installed());
                    }
                    Err(error) => match super::super::expected::rejected(&error) {
                        Some(why) => {
                            return Ok(Addresses::Waiting {
                                reason: "IPAddressClaimRejected",
                                message: format!(
                                    "the API server refused IPAddressClaim {name} (pool {} {}): {why}",
                                    pool.kind, pool.name
                                ),
                            });
                        }
                        None => return Err(error.into()),
                    },
                }
            }
            Err(kube::Error::Api(status)) if status.code == 404 => return Ok(not_installed()),
            Err(error) => return Err(error.into()),
        };
        let address = match claim.status.as_ref().and_then(|s| s.address_ref.as_ref()) {
            Some(reference) => addresses.get_opt(&reference.name).await?,
            None => None,
        };
        match address {
            Some(a) => {
                allocations.insert(
                    *index,
                    Allocation {
                        address: a.spec.address,
                        prefix: a.spec.prefix,
                        gateway: a.spec.gateway,
                    },
                );
            }
            None => pending.push(format!("{name} (pool {} {})", pool.kind, pool.name)),
        }
    }
    Ok(match resolve(&spec, &allocations) {
        Some(resolved) if pending.is_empty() => Addresses::Resolved(Box::new(resolved)),
        _ => Addresses::Waiting {
            reason: "WaitingForIPAddress",
            message: format!(
                "waiting for the pool to fulfil IPAddressClaim {}",
                pending.join(", ")
            ),
        },
    })
}

fn not_installed() -> Addresses {
    Addresses::Waiting {
        reason: "IPAMNotInstalled",
        message: "a network device takes its address from a pool, but ipam.cluster.x-k8s.io/v1beta2 IPAddressClaims are not served".into(),
    }
}

/// Deletes the machine's claims (after its VM is gone).
pub(super) async fn release<K: Machine>(machine: &K, ctx: &Context) -> Result<(), Error> {
    let devices = pool_devices(&machine.backend_spec());
    let claims: Api<IPAddressClaim> =
        Api::namespaced(ctx.client.clone(), &machine.namespace().unwrap_or_default());
    for (index, _) in devices {
        match claims
            .delete(
                &claim_name(&machine.name_any(), index),
                &DeleteParams::background(),
            )
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(error) => return Err(error.into()),
        }
    }
    Ok(())
}
