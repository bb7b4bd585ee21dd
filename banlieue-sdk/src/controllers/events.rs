//! Recording Events: warnings through kube's `Recorder`, which counts repeats into a
//! series; one-shot lifecycle events (`Scheduled`, `Provisioned`, `Ready`, ...)
//! written directly.
//!
//! The `Recorder` keeps every Event it publishes for six minutes and scans that cache
//! on each publish. At the 1,000-VM benchmark that cache held 7 MB (three lifecycle
//! events per VM), growing linearly with VMs created per six minutes, with a scan per
//! event on top; the series it enables only pays off for events that repeat, which
//! lifecycle events do not.

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event as K8sEvent;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, PostParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};

/// Where the controllers' Events go.
pub(crate) struct Events {
    client: Client,
    reporter: Reporter,
    recorder: Recorder,
}

impl Events {
    pub(crate) fn new(client: Client, reporter: Reporter) -> Self {
        Self {
            recorder: Recorder::new(client.clone(), reporter.clone()),
            client,
            reporter,
        }
    }

    /// Publishes `event` about `reference`: a warning may repeat and is aggregated, a
    /// normal event is created as it is.
    pub(crate) async fn publish(
        &self,
        event: &Event,
        reference: &ObjectReference,
    ) -> Result<(), kube::Error> {
        match event.type_ {
            EventType::Warning => self.recorder.publish(event, reference).await,
            EventType::Normal => {
                let namespace = reference.namespace.as_deref().unwrap_or("default");
                Api::<K8sEvent>::namespaced(self.client.clone(), namespace)
                    .create(&PostParams::default(), &self.one_shot(event, reference))
                    .await
                    .map(drop)
            }
        }
    }

    /// The Event object, shaped as `Recorder` shapes a first occurrence.
    fn one_shot(&self, event: &Event, reference: &ObjectReference) -> K8sEvent {
        let now = Timestamp::now();
        let controller = &self.reporter.controller;
        K8sEvent {
            action: Some(event.action.clone()),
            reason: Some(event.reason.clone()),
            event_time: Some(MicroTime(now)),
            regarding: Some(reference.clone()),
            related: event.secondary.clone(),
            note: event.note.clone(),
            metadata: ObjectMeta {
                namespace: reference.namespace.clone(),
                name: Some(format!(
                    "{}.{:x}",
                    reference.name.as_deref().unwrap_or(controller),
                    now.as_nanosecond()
                )),
                ..ObjectMeta::default()
            },
            reporting_controller: Some(controller.clone()),
            reporting_instance: Some(
                self.reporter
                    .instance
                    .clone()
                    .unwrap_or_else(|| controller.clone()),
            ),
            type_: Some("Normal".to_owned()),
            ..K8sEvent::default()
        }
    }
}
