//! One generic reconciler for every machine template kind: it publishes
//! `status.capacity` and `status.nodeInfo` so the cluster autoscaler can scale a
//! node group up from zero. Pure in effect: the status follows the spec alone.

use std::marker::PhantomData;
use std::sync::Arc;

use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::controller::Config as ControllerConfig;

use super::context::Context;
use super::kernel::{self, Next, Plan, Reconciler, StatusChange};
use super::status_write;
use super::watch;
use super::written::Written;
use crate::api::infra::MachineTemplateStatus;
use crate::capi::capacity::template_status;
use crate::contract::InfraTemplateRead;
use crate::controllers::object::Namespaced;

/// The template controller of kind `K`.
struct Templates<K>(PhantomData<fn() -> K>);

impl<K: Namespaced + InfraTemplateRead> Reconciler for Templates<K> {
    type Object = K;
    /// The status this process knows last (see [`status_write::known`]).
    type Facts = Option<MachineTemplateStatus>;
    type Status = MachineTemplateStatus;

    fn name(&self) -> &str {
        "machinetemplate"
    }
    const FIELD_MANAGER: &'static str = "banlieue-template";

    fn ledger(ctx: &Context) -> Option<&Written<MachineTemplateStatus>> {
        Some(&ctx.written.templates)
    }

    fn api(ctx: &Context, template: &K) -> Api<K> {
        Api::namespaced(
            ctx.client.clone(),
            &template.namespace().unwrap_or_default(),
        )
    }

    async fn observe(&self, template: &Arc<K>, ctx: &Arc<Context>) -> kube::Result<Self::Facts> {
        Ok(status_write::known(
            &ctx.written.templates,
            template.as_ref(),
            template.template_status(),
        ))
    }

    fn plan(&self, template: &K, known: &Self::Facts) -> Plan<MachineTemplateStatus> {
        plan(template.sizing(), known)
    }
}

/// The capacity the template's sizing gives, over what is known; nothing else wakes
/// a template but a change to it.
fn plan(
    sizing: crate::capi::capacity::Sizing,
    known: &Option<MachineTemplateStatus>,
) -> Plan<MachineTemplateStatus> {
    Plan::status(
        StatusChange::Merge {
            known: known.clone(),
            next: template_status(known.as_ref(), sizing),
        },
        Next::AwaitChange,
    )
}

pub(crate) async fn run<K>(
    ctx: Arc<Context>,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) where
    K: Namespaced + InfraTemplateRead,
{
    let api = watch::namespaced::<K>(&ctx.client, &ctx.settings);
    let controller = watch::controller(api, watch::filtered(&ctx.settings))
        .with_config(ControllerConfig::default().concurrency(2));
    kernel::drive(Templates::<K>(PhantomData), controller, ctx, shutdown).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capi::capacity::Sizing;

    #[test]
    fn a_template_publishes_its_capacity_over_what_is_known_and_then_waits_for_a_change() {
        let sizing = Sizing {
            cpus: 2,
            memory_mib: 4096,
        };
        let fresh = plan(sizing, &None);
        let StatusChange::Merge { known, next } = &fresh.status else {
            panic!("a template's status is a merge: {fresh:?}");
        };
        assert_eq!(known, &None);
        assert_eq!(next, &template_status(None, sizing));
        assert_eq!(fresh.next, Next::AwaitChange);
        // Once written, the same sizing plans the same status (the write is skipped);
        // a resized template plans its new capacity.
        let again = plan(sizing, &Some(next.clone()));
        let StatusChange::Merge { known, next: same } = &again.status else {
            panic!("{again:?}");
        };
        assert_eq!(known.as_ref(), Some(same));
        let bigger = Sizing {
            cpus: 4,
            memory_mib: 4096,
        };
        let resized = plan(bigger, &Some(next.clone()));
        let StatusChange::Merge { known, next: grown } = &resized.status else {
            panic!("{resized:?}");
        };
        assert_ne!(known.as_ref(), Some(grown));
        assert_eq!(grown.capacity.get("cpu").map(|q| q.0.as_str()), Some("4"));
    }
}
