//! One generic reconciler for every machine template kind: it publishes
//! `status.capacity` and `status.nodeInfo` so the cluster autoscaler can scale a
//! node group up from zero. Pure in effect: the status follows the spec alone.

use std::sync::Arc;

use futures::StreamExt;
use kube::api::Api;
use kube::runtime::controller::{Action, Config as ControllerConfig};

use super::context::{Context, key_of};
use super::status_write;
use super::watch;
use crate::capi::capacity::template_status;
use crate::contract::InfraTemplateRead;
use crate::controllers::object::Namespaced;
use kube::ResourceExt;

/// Field manager of template status.
const FIELD_MANAGER: &str = "banlieue-template";

pub(crate) async fn run<K>(
    ctx: Arc<Context>,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) where
    K: Namespaced + InfraTemplateRead,
{
    let api = watch::namespaced::<K>(&ctx.client, &ctx.settings);
    watch::controller(api, watch::filtered(&ctx.settings))
        .with_config(ControllerConfig::default().concurrency(2))
        .graceful_shutdown_on(shutdown)
        .run(
            |template: Arc<K>, ctx: Arc<Context>| async move {
                let written = &ctx.written.templates;
                let known =
                    status_write::known(written, template.as_ref(), template.template_status());
                let status = template_status(known.as_ref(), template.sizing());
                let api: Api<K> = Api::namespaced(
                    ctx.client.clone(),
                    &template.namespace().unwrap_or_default(),
                );
                let manager = (FIELD_MANAGER, "machinetemplate");
                status_write::write(
                    &ctx,
                    &api,
                    template.as_ref(),
                    written,
                    manager,
                    known.as_ref(),
                    status,
                )
                .await?;
                Ok::<_, kube::Error>(Action::await_change())
            },
            |template: Arc<K>, error: &kube::Error, ctx: Arc<Context>| {
                tracing::warn!(template = %key_of(template.as_ref()), %error, "reconcile failed");
                Action::requeue(ctx.backoff(&key_of(template.as_ref())))
            },
            ctx,
        )
        .for_each(|_| futures::future::ready(()))
        .await;
}
