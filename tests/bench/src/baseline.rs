//! The floor: a plain client performing only the writes the flow cannot do without, for
//! N VirtualMachines, against a control plane of its own, built and configured like the operator's.
//!
//! Each VirtualMachine is a chain of dependent writes (each needs the previous one's
//! result); `concurrency` chains run at once, the same number of requests in flight as
//! the benchmark's client uses to create and delete VirtualMachines. The client has no
//! rate limit.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use anyhow::Context as _;
use banlieue_sdk::api::VirtualMachine;
use banlieue_sdk::api::infra::libvirt::LibvirtMachine;
use futures::{StreamExt as _, TryStreamExt as _};
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::workload::{self, Curve, TICK};

/// One write of the minimal flow.
#[derive(Clone, Copy, Debug)]
pub struct MinimalWrite {
    /// `create` or `delete`: the phase it belongs to.
    pub phase: &'static str,
    /// `user` (the benchmark) or `operator`.
    pub actor: &'static str,
    /// The request as the audit log names it (`"<verb> <resource>"`), as banlieue issues
    /// it (banlieue creates infra machines with a server-side apply: `patch`).
    pub key: &'static str,
    /// Why it cannot be avoided.
    pub why: &'static str,
}

/// The writes one VirtualMachine needs, from creation to Ready and from deletion to gone.
/// Events, and reads, are not part of the minimum. Without kube-controller-manager there
/// is no garbage collector: the operator deletes the infra machine itself.
pub const MINIMUM: &[MinimalWrite] = &[
    MinimalWrite {
        phase: "create",
        actor: "user",
        key: "create virtualmachines",
        why: "the user creates the VirtualMachine",
    },
    MinimalWrite {
        phase: "create",
        actor: "operator",
        key: "patch virtualmachines",
        why: "VM finalizer, added before anything exists that would need cleaning up",
    },
    MinimalWrite {
        phase: "create",
        actor: "operator",
        key: "patch libvirtmachines",
        why: "create the infra machine (owner reference, spec from class/image/Provider)",
    },
    MinimalWrite {
        phase: "create",
        actor: "operator",
        key: "patch libvirtmachines",
        why: "infra machine finalizer, added before the backend VM is created",
    },
    MinimalWrite {
        phase: "create",
        actor: "operator",
        key: "patch libvirtmachines",
        why: "spec.providerID (CAPI contract; spec, so not mergeable with the status write)",
    },
    MinimalWrite {
        phase: "create",
        actor: "operator",
        key: "patch libvirtmachines/status",
        why: "infra status: provisioned, addresses, failure domain, Ready",
    },
    MinimalWrite {
        phase: "create",
        actor: "operator",
        key: "patch virtualmachines/status",
        why: "VM status, written once: placement, providerID, addresses, Ready",
    },
    MinimalWrite {
        phase: "delete",
        actor: "user",
        key: "delete virtualmachines",
        why: "the user deletes the VirtualMachine (it stays, finalized)",
    },
    MinimalWrite {
        phase: "delete",
        actor: "operator",
        key: "delete libvirtmachines",
        why: "delete the infra machine (no garbage collector; the backend VM must go first)",
    },
    MinimalWrite {
        phase: "delete",
        actor: "operator",
        key: "patch libvirtmachines",
        why: "remove the infra finalizer once the backend VM is gone",
    },
    MinimalWrite {
        phase: "delete",
        actor: "operator",
        key: "patch virtualmachines",
        why: "remove the VM finalizer once the infra machine is gone",
    },
];

/// How many operator writes per VirtualMachine the minimal flow has in `phase`.
pub fn operator_minimum(phase: &str) -> usize {
    MINIMUM
        .iter()
        .filter(|w| w.phase == phase && w.actor == "operator")
        .count()
}

/// The baseline's timings.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Baseline {
    /// VirtualMachines whose VM status write is done, over time.
    pub ready: Curve,
    /// VirtualMachines gone, over time.
    pub gone: Curve,
}

/// One half of the minimal flow.
#[derive(Clone, Copy, Debug)]
pub enum Flow {
    /// Create `n` VirtualMachines and take each to Ready; the curve counts VMs whose VM
    /// status write is done.
    Create,
    /// Delete the `n` VirtualMachines `Create` made; the curve counts VMs gone.
    Delete,
}

/// Runs `flow` for `n` VirtualMachines in namespace `ns`, `concurrency` chains at once.
pub async fn run(
    client: &Client,
    ns: &str,
    n: usize,
    concurrency: usize,
    flow: Flow,
) -> anyhow::Result<Curve> {
    let vms: Api<VirtualMachine> = Api::namespaced(client.clone(), ns);
    let machines: Api<LibvirtMachine> = Api::namespaced(client.clone(), ns);
    drive(n, concurrency, |i| {
        let (vms, machines) = (vms.clone(), machines.clone());
        async move {
            match flow {
                Flow::Create => create_chain(vms, machines, i).await,
                Flow::Delete => delete_chain(vms, machines, i).await,
            }
        }
    })
    .await
}

/// Runs `chain(i)` for `0..n`, `concurrency` at once, recording completions over time.
async fn drive<F, Fut>(n: usize, concurrency: usize, chain: F) -> anyhow::Result<Curve>
where
    F: Fn(usize) -> Fut,
    Fut: Future<Output = anyhow::Result<()>>,
{
    let done = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let counter = done.clone();
    let sampler = tokio::spawn(async move {
        let mut curve = Curve::default();
        loop {
            let value = counter.load(Ordering::Relaxed);
            curve.record(started.elapsed().as_secs_f64(), value);
            if value >= n {
                return curve;
            }
            tokio::time::sleep(TICK).await;
        }
    });
    futures::stream::iter(0..n)
        .map(|i| {
            let done = done.clone();
            let run = chain(i);
            async move {
                run.await?;
                done.fetch_add(1, Ordering::Relaxed);
                anyhow::Ok(())
            }
        })
        .buffer_unordered(concurrency)
        .try_collect::<()>()
        .await?;
    let finished = started.elapsed().as_secs_f64();
    let mut curve = sampler.await?;
    curve.record(finished, n);
    curve.finish(finished);
    Ok(curve)
}

fn now() -> String {
    Timestamp::now().to_string()
}

/// The seven writes that take one VirtualMachine to Ready.
async fn create_chain(
    vms: Api<VirtualMachine>,
    machines: Api<LibvirtMachine>,
    i: usize,
) -> anyhow::Result<()> {
    let name = workload::vm_name(i);
    let pp = PostParams::default();
    let merge = PatchParams::default();
    let created = vms.create(&pp, &workload::vm(i)?).await.context("VM")?;
    vms.patch(
        &name,
        &merge,
        &Patch::Merge(json!({"metadata": {"finalizers": ["banlieue.io/virtual-machine"]}})),
    )
    .await?;
    let machine: LibvirtMachine = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"banlieue.io/virtual-machine": name, "app": "bench"},
            "ownerReferences": [{"apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine",
                "name": name, "uid": created.metadata.uid, "controller": true, "blockOwnerDeletion": true}]},
        "spec": {"providerRef": {"name": "bench"}, "cpus": 1, "memoryMiB": 512,
            "image": {"path": "/var/lib/banlieue/images/debian.qcow2"},
            "diskGiB": 5, "network": [{"network": "default"}]}
    }))?;
    machines
        .create(&pp, &machine)
        .await
        .context("infra machine")?;
    machines
        .patch(
            &name,
            &merge,
            &Patch::Merge(
                json!({"metadata": {"finalizers": ["infrastructure.banlieue.io/machine"]}}),
            ),
        )
        .await?;
    let provider_id = format!("libvirt://00000000-0000-4000-8000-{i:012}");
    machines
        .patch(
            &name,
            &merge,
            &Patch::Merge(json!({"spec": {"providerID": provider_id}})),
        )
        .await?;
    let ready = json!([{"type": "Ready", "status": "True", "reason": "Ready", "message": "",
                        "lastTransitionTime": now()}]);
    let address = format!("10.0.{}.{}", i / 250, i % 250 + 1);
    machines
        .patch_status(
            &name,
            &merge,
            &Patch::Merge(json!({"status": {"initialization": {"provisioned": true},
                "failureDomain": "sim-a",
                "addresses": [{"type": "InternalIP", "address": address}],
                "conditions": ready}})),
        )
        .await
        .context("infra status")?;
    vms.patch_status(
        &name,
        &merge,
        &Patch::Merge(
            json!({"status": {"providerID": provider_id, "phase": "Running",
            "addresses": [{"type": "InternalIP", "address": address}],
            "conditions": ready}}),
        ),
    )
    .await
    .context("VM status")?;
    Ok(())
}

/// The four writes that take one VirtualMachine from deleted to gone.
async fn delete_chain(
    vms: Api<VirtualMachine>,
    machines: Api<LibvirtMachine>,
    i: usize,
) -> anyhow::Result<()> {
    let name = workload::vm_name(i);
    let merge = PatchParams::default();
    let unfinalize = Patch::Merge(json!({"metadata": {"finalizers": null}}));
    vms.delete(&name, &DeleteParams::background()).await?;
    machines.delete(&name, &DeleteParams::background()).await?;
    machines.patch(&name, &merge, &unfinalize).await?;
    vms.patch(&name, &merge, &unfinalize).await?;
    Ok(())
}
