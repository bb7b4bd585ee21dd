//! Recording Events: warnings through kube's `Recorder`, which counts repeats into a
//! series; one-shot lifecycle events (`Scheduled`, `Provisioned`, `Ready`, ...)
//! written directly.
//!
//! The `Recorder` keeps every Event it publishes for six minutes and scans that cache
//! on each publish. At the 1,000-VM benchmark that cache held 7 MB (three lifecycle
//! events per VM), growing linearly with VMs created per six minutes, with a scan per
//! event on top; the series it enables only pays off for events that repeat, which
//! lifecycle events do not.
//!
//! Every Event's note passes through the [`scrub::global`] scrubber here, the one
//! place all Events go through, so no credential reaches an Event; then it is cut to
//! the apiserver's limit (a longer note gets the whole Event refused).

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event as K8sEvent;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, PostParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};

use crate::scrub;

/// Where the controllers' Events go.
pub(crate) struct Events {
    client: Client,
    reporter: Reporter,
    recorder: Recorder,
}

/// The longest note `events.k8s.io/v1` accepts, in bytes.
const NOTE_LIMIT: usize = 1024;

/// `note` cut to [`NOTE_LIMIT`] bytes (on a character boundary), ending in `...` when cut.
fn truncated(mut note: String) -> String {
    if note.len() <= NOTE_LIMIT {
        return note;
    }
    let mut end = NOTE_LIMIT - 3;
    while !note.is_char_boundary(end) {
        end -= 1;
    }
    note.truncate(end);
    note.push_str("...");
    note
}

impl Events {
    pub(crate) fn new(client: Client, reporter: Reporter) -> Self {
        Self {
            recorder: Recorder::new(client.clone(), reporter.clone()),
            client,
            reporter,
        }
    }

    /// Publishes `event` about `reference`, its note scrubbed: a warning may repeat
    /// and is aggregated, a normal event is created as it is.
    pub(crate) async fn publish(
        &self,
        event: &Event,
        reference: &ObjectReference,
    ) -> Result<(), kube::Error> {
        let event = &Event {
            type_: event.type_,
            reason: event.reason.clone(),
            note: event
                .note
                .clone()
                .map(|n| truncated(scrub::global().scrub_owned(n))),
            action: event.action.clone(),
            secondary: event.secondary.clone(),
        };
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
                // Shortened for a long object name: the Event must still be a name.
                name: Some(crate::builder::suffixed_name(
                    reference.name.as_deref().unwrap_or(controller),
                    &format!(".{:x}", now.as_nanosecond()),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_notes_are_cut_to_the_apiserver_limit_on_a_character_boundary() {
        assert_eq!(truncated("short".into()), "short");
        let exact = "a".repeat(NOTE_LIMIT);
        assert_eq!(truncated(exact.clone()), exact);
        let long = "é".repeat(NOTE_LIMIT);
        let cut = truncated(long);
        assert!(
            cut.len() <= NOTE_LIMIT && cut.ends_with("..."),
            "{}",
            cut.len()
        );
    }
}
