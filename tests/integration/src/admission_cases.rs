//! Tables of admission cases: objects sent to the apiserver with what it must answer.
//!
//! A [`Case`] names one request sequence (a [`Step`]) and the answer to its last
//! request (a [`Want`]): a rejection (a 422 or 400) whose message contains a given
//! text, or success for a valid near-miss. [`run`] sends one case and says why it
//! failed; the suites keep their own tables and tally the results their own way.
//! The base objects below are valid starting points the tables mutate (with
//! [`with`](crate::with) and [`without`](crate::without)).

use serde_json::{Value, json};

use crate::{apply, apply_status, post};

/// How a case reaches the apiserver. Every object is sent under the name [`run`] is
/// given, whatever its `metadata.name`.
#[derive(Clone, Debug)]
pub enum Step {
    /// Server-side apply the object.
    Apply(Value),
    /// POST the object, as `kubectl create` does. For where server-side apply cannot
    /// even build its typed patch (duplicate list-map keys, wrong JSON types,
    /// undeclared fields) and answers with a 500 instead of the schema's 422.
    Post(Value),
    /// Apply `before` (must be accepted), then apply `after`.
    Update { before: Value, after: Value },
    /// Apply `object` (must be accepted), then its status `before` (must be accepted),
    /// then its status `after`.
    Status {
        object: Value,
        before: Value,
        after: Value,
    },
}

impl Step {
    /// The objects this step sends (for status steps, the object whose status it sets).
    pub fn objects(&self) -> Vec<&Value> {
        match self {
            Step::Apply(o) | Step::Post(o) | Step::Status { object: o, .. } => vec![o],
            Step::Update { before, after } => vec![before, after],
        }
    }
}

/// What the apiserver must answer to the last request of a case.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Want {
    /// A 422/400 whose message contains this text.
    Reject(&'static str),
    /// Success: a valid near-miss.
    Accept,
}

/// One row of a table: what it tries, how, and the answer it wants.
#[derive(Clone, Debug)]
pub struct Case {
    /// What the case tries, for failure messages.
    pub what: String,
    /// The requests it sends.
    pub step: Step,
    /// The answer the last request must get.
    pub want: Want,
}

/// Applying `object` must be rejected with a message containing `expect`.
pub fn reject(what: impl Into<String>, object: Value, expect: &'static str) -> Case {
    case(what, Step::Apply(object), Want::Reject(expect))
}

/// POSTing `object` must be rejected with a message containing `expect`.
pub fn reject_post(what: impl Into<String>, object: Value, expect: &'static str) -> Case {
    case(what, Step::Post(object), Want::Reject(expect))
}

/// Applying `object`, a valid near-miss, must be accepted.
pub fn accept(what: impl Into<String>, object: Value) -> Case {
    case(what, Step::Apply(object), Want::Accept)
}

/// Applying `before` must be accepted, then applying `after` rejected with a message
/// containing `expect`.
pub fn reject_update(
    what: impl Into<String>,
    before: Value,
    after: Value,
    expect: &'static str,
) -> Case {
    case(what, Step::Update { before, after }, Want::Reject(expect))
}

/// Applying `before`, then `after` (a valid near-miss), must both be accepted.
pub fn accept_update(what: impl Into<String>, before: Value, after: Value) -> Case {
    case(what, Step::Update { before, after }, Want::Accept)
}

/// Applying `object` and then the status `before` must be accepted, then the status
/// `after` rejected with a message containing `expect`.
pub fn reject_status(
    what: impl Into<String>,
    object: Value,
    before: Value,
    after: Value,
    expect: &'static str,
) -> Case {
    let step = Step::Status {
        object,
        before,
        after,
    };
    case(what, step, Want::Reject(expect))
}

/// Applying `object`, the status `before` and then the status `after` (a valid
/// near-miss) must all be accepted.
pub fn accept_status(what: impl Into<String>, object: Value, before: Value, after: Value) -> Case {
    let step = Step::Status {
        object,
        before,
        after,
    };
    case(what, step, Want::Accept)
}

fn case(what: impl Into<String>, step: Step, want: Want) -> Case {
    Case {
        what: what.into(),
        step,
        want,
    }
}

/// `object` with its `metadata.name` set to `name`.
pub fn named(mut object: Value, name: &str) -> Value {
    object["metadata"]["name"] = json!(name);
    object
}

/// Sends `case` into `namespace`, every object named `name`, and checks the answer to
/// its last request; `Err` says why the case failed (without its `what`).
pub async fn run(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    case: &Case,
) -> Result<(), String> {
    let outcome = match &case.step {
        Step::Apply(object) => apply(client, namespace, &named(object.clone(), name)).await,
        Step::Post(object) => post(client, namespace, &named(object.clone(), name)).await,
        Step::Update { before, after } => {
            apply(client, namespace, &named(before.clone(), name))
                .await
                .map_err(|e| format!("the valid starting object was rejected: {e}"))?;
            apply(client, namespace, &named(after.clone(), name)).await
        }
        Step::Status {
            object,
            before,
            after,
        } => {
            let object = named(object.clone(), name);
            apply(client, namespace, &object)
                .await
                .map_err(|e| format!("the valid object was rejected: {e}"))?;
            let mut status = json!({"apiVersion": object["apiVersion"], "kind": object["kind"],
                                    "metadata": {"name": name}});
            status["status"] = before.clone();
            apply_status(client, namespace, &status)
                .await
                .map_err(|e| format!("the valid starting status was rejected: {e}"))?;
            status["status"] = after.clone();
            apply_status(client, namespace, &status).await
        }
    };
    match (case.want, outcome) {
        (Want::Accept, Ok(_)) => Ok(()),
        (Want::Accept, Err(e)) => Err(format!("a valid near-miss was rejected: {e}")),
        (Want::Reject(expect), Ok(_)) => Err(format!(
            "accepted, expected a rejection mentioning {expect:?}"
        )),
        (Want::Reject(expect), Err(kube::Error::Api(status)))
            if status.is_invalid() || status.code == 422 || status.code == 400 =>
        {
            if status.message.contains(expect) {
                Ok(())
            } else {
                Err(format!(
                    "rejected, but the message lacks {expect:?}: {}",
                    status.message
                ))
            }
        }
        (Want::Reject(_), Err(other)) => Err(format!("unexpected error: {other}")),
    }
}

/// Fails the test, listing every failure (one a line), unless `failures`, the reasons
/// gathered from [`run`] over a table of `cases` cases, is empty.
#[track_caller]
pub fn assert_none_failed(failures: &[String], cases: usize) {
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        cases,
        failures.join("\n")
    );
}

// ---------------------------------------------------------------------------------
// Valid base objects.

/// A valid vsphere Provider `p` with a CA bundle from a ConfigMap, one storage class
/// and one network class.
pub fn provider() -> Value {
    json!({
        "apiVersion": "banlieue.io/v1alpha1", "kind": "Provider", "metadata": {"name": "p"},
        "spec": {
            "class": "vsphere",
            "connection": {
                "endpoint": "https://vc.example.com/sdk",
                "credentialsRef": {"name": "vc-credentials"},
                "caBundle": {"configMapRef": {"name": "vc-ca"}}
            },
            "capabilities": {
                "storageClasses": [{"name": "fast", "target": {"datastore": "ds1"}}],
                "networkClasses": [{"name": "frontend", "target": {"portGroup": "pg1"}}]
            }
        }
    })
}

/// A valid VMClass `c`: 2 CPUs, 2 GiB, a 10 GiB disk.
pub fn vm_class() -> Value {
    json!({
        "apiVersion": "banlieue.io/v1alpha1", "kind": "VMClass", "metadata": {"name": "c"},
        "spec": {"cpus": 2, "memoryMiB": 2048, "disk": {"sizeGiB": 10}}
    })
}

/// A valid VMImage `i` (Debian 13) with sim and proxmox sources.
pub fn vm_image() -> Value {
    json!({
        "apiVersion": "banlieue.io/v1alpha1", "kind": "VMImage", "metadata": {"name": "i"},
        "spec": {
            "os": {"family": "linux", "distribution": "debian", "version": "13"},
            "sources": {"sim": {"name": "debian"}, "proxmox": {"templateID": 9000}}
        }
    })
}

/// A valid VirtualMachine `v` with one interface `eth0` on network class `frontend`.
pub fn vm() -> Value {
    json!({
        "apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine", "metadata": {"name": "v"},
        "spec": {
            "classRef": {"name": "small"}, "imageRef": {"name": "ubuntu"},
            "networks": [{"name": "eth0", "networkClass": "frontend"}]
        }
    })
}
