//! Why a VirtualMachine is not Ready: the chain VM → class, image, Provider →
//! scheduling → infrastructure machine → power, each link judged from the objects
//! alone. The first link that is not OK is the answer.

use banlieue_sdk::api::common::Condition;
use banlieue_sdk::api::infra::MachineStatus;
use banlieue_sdk::api::{Provider, VMClass, VMImage, VirtualMachine};
use banlieue_sdk::conditions::{self, types};
use kube::ResourceExt;

use crate::table::class_name;

/// The infrastructure machine of a VM, kind-independent.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Machine {
    /// e.g. `LibvirtMachine`.
    pub kind: String,
    /// `metadata.name`.
    pub name: String,
    /// Its status, once the machine controller wrote one.
    pub status: Option<MachineStatus>,
    /// `metadata.deletionTimestamp` is set.
    pub deleting: bool,
}

/// Everything a diagnosis reads. `None` means "looked up, does not exist".
#[derive(Clone, Copy, Debug)]
pub struct Facts<'a> {
    /// The VM.
    pub vm: &'a VirtualMachine,
    /// Its VMClass.
    pub class: Option<&'a VMClass>,
    /// Its VMImage.
    pub image: Option<&'a VMImage>,
    /// The Provider it is placed on, or that `spec.placement.providerRef` names.
    pub provider: Option<&'a Provider>,
    /// Every Provider in the VM's namespace (to say which ones cannot be used).
    pub providers: &'a [Provider],
    /// Its infrastructure machine.
    pub machine: Option<&'a Machine>,
}

/// How a link of the chain stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    /// Fine.
    Ok,
    /// Not fine: this is (part of) why the VM is not Ready.
    NotOk,
}

/// One link of the chain.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Link {
    /// What the link is about, e.g. `Provider "pve"`.
    pub subject: String,
    /// How it stands.
    pub state: State,
    /// CamelCase reason, from a condition where there is one.
    pub reason: String,
    /// Details, from a condition's message where there is one.
    pub message: String,
    /// What to do about it.
    pub hint: Option<String>,
}

impl Link {
    fn ok(subject: String, message: impl Into<String>) -> Self {
        Self {
            subject,
            state: State::Ok,
            reason: String::new(),
            message: message.into(),
            hint: None,
        }
    }

    fn not_ok(
        subject: String,
        reason: impl Into<String>,
        message: impl Into<String>,
        hint: Option<String>,
    ) -> Self {
        Self {
            subject,
            state: State::NotOk,
            reason: reason.into(),
            message: message.into(),
            hint,
        }
    }
}

/// The chain, in order, and whether the VM is Ready.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Diagnosis {
    /// `Ready` is `True`.
    pub ready: bool,
    /// `Ready`'s own reason (`NotScheduled`, `InfrastructureNotReady`, ...).
    pub ready_reason: String,
    /// Every link, VM first.
    pub links: Vec<Link>,
}

impl Diagnosis {
    /// The first link that is not OK: why the VM is not Ready.
    pub fn culprit(&self) -> Option<&Link> {
        self.links.iter().find(|l| l.state == State::NotOk)
    }
}

/// Judges every link of `facts`.
pub fn diagnose(facts: &Facts<'_>) -> Diagnosis {
    let vm = facts.vm;
    let vm_conditions: &[Condition] = vm
        .status
        .as_ref()
        .map(|s| s.conditions.as_slice())
        .unwrap_or_default();
    let ready = conditions::get(vm_conditions, types::READY);
    let mut links = vec![vm_link(vm)];
    links.push(class_link(facts, vm_conditions));
    links.push(image_link(facts));
    if let Some(link) = provider_link(facts) {
        links.push(link);
    }
    links.push(scheduling_link(facts, vm_conditions));
    links.push(machine_link(facts, vm_conditions));
    if let Some(c) = conditions::get(vm_conditions, types::MIGRATING).filter(|c| c.status == "True")
    {
        links.push(Link::not_ok(
            "Migration".into(),
            &c.reason,
            &c.message,
            Some("a move to another Provider is in progress; it finishes on its own".into()),
        ));
    }
    links.push(power_link(vm_conditions));
    Diagnosis {
        ready: ready.is_some_and(|c| c.status == "True"),
        ready_reason: ready.map(|c| c.reason.clone()).unwrap_or_default(),
        links,
    }
}

fn vm_link(vm: &VirtualMachine) -> Link {
    let subject = format!("VirtualMachine {:?}", vm.name_any());
    if vm.metadata.deletion_timestamp.is_some() {
        return Link::not_ok(
            subject,
            "Deleting",
            "the VirtualMachine is being deleted",
            Some(
                "its finalizer goes once the infrastructure machine and the backend VM are gone; see the machine below"
                    .into(),
            ),
        );
    }
    match vm.status.as_ref().and_then(|s| s.phase) {
        None => Link::not_ok(
            subject,
            "NotReconciled",
            "no status yet",
            Some(NOT_RECONCILED_HINT.into()),
        ),
        Some(phase) => Link::ok(subject, format!("phase {phase:?}")),
    }
}

const NOT_RECONCILED_HINT: &str = "is the banlieue operator running, and watching this namespace? (kubectl -n banlieue-system get pods; banlieue run --namespace)";

fn class_link(facts: &Facts<'_>, vm_conditions: &[Condition]) -> Link {
    let name = &facts.vm.spec.class_ref.name;
    let subject = format!("VMClass {name:?}");
    match facts.class {
        Some(class) => Link::ok(
            subject,
            format!(
                "{} CPU, {} MiB, {} GiB disk",
                class.spec.cpus, class.spec.memory_mib, class.spec.disk.size_gib
            ),
        ),
        None => Link::not_ok(
            subject,
            "ClassNotFound",
            scheduled_message(vm_conditions, "ClassNotFound")
                .unwrap_or_else(|| format!("VMClass {name:?} not found")),
            Some(format!(
                "create VMClass {name:?} (cluster-scoped; kubectl get vmclasses) or point spec.classRef.name at an existing one"
            )),
        ),
    }
}

fn image_link(facts: &Facts<'_>) -> Link {
    let name = &facts.vm.spec.image_ref.name;
    let subject = format!("VMImage {name:?}");
    let Some(image) = facts.image else {
        return Link::not_ok(
            subject,
            "ImageNotFound",
            format!("VMImage {name:?} not found"),
            Some(format!(
                "create VMImage {name:?} (cluster-scoped; kubectl get vmimages) or point spec.imageRef.name at an existing one"
            )),
        );
    };
    let class = facts.provider.map(|p| p.spec.class);
    match class {
        Some(class) if !image.spec.sources.has(class) => Link::not_ok(
            subject,
            "ImageHasNoSource",
            format!(
                "VMImage {name:?} has no source for backend class {}",
                class_name(class)
            ),
            Some(format!(
                "add spec.sources.{} to the VMImage, or place the VM on another Provider",
                source_key(class)
            )),
        ),
        _ => Link::ok(
            subject,
            format!("{} {}", image.spec.os.distribution, image.spec.os.version),
        ),
    }
}

fn source_key(class: banlieue_sdk::api::common::ProviderClass) -> &'static str {
    match class_name(class) {
        "cloud-hypervisor" => "cloudHypervisor",
        other => other,
    }
}

/// The Provider's name: where the VM is placed, else where it is asked to go.
pub fn provider_name(vm: &VirtualMachine) -> Option<&str> {
    vm.status
        .as_ref()
        .and_then(|s| s.placement.as_ref())
        .map(|p| p.provider.as_str())
        .or_else(|| {
            vm.spec
                .placement
                .provider_ref
                .as_ref()
                .map(|r| r.name.as_str())
        })
}

fn provider_link(facts: &Facts<'_>) -> Option<Link> {
    let name = provider_name(facts.vm)?;
    let subject = format!("Provider {name:?}");
    let Some(provider) = facts.provider else {
        return Some(Link::not_ok(
            subject,
            "ProviderNotFound",
            format!("Provider {name:?} not found in this namespace"),
            Some(
                "create the Provider in the VirtualMachine's namespace, or change spec.placement"
                    .into(),
            ),
        ));
    };
    Some(match provider_problem(provider) {
        Some((reason, message, hint)) => Link::not_ok(subject, reason, message, Some(hint)),
        None => Link::ok(
            subject,
            format!(
                "{} at {}{}",
                class_name(provider.spec.class),
                provider.spec.connection.endpoint,
                provider
                    .status
                    .as_ref()
                    .and_then(|s| s.version.as_deref())
                    .map(|v| format!(", {v}"))
                    .unwrap_or_default()
            ),
        ),
    })
}

/// Why a Provider cannot take machines (reason, message, hint), or `None` when it can.
pub fn provider_problem(provider: &Provider) -> Option<(String, String, String)> {
    let found: &[Condition] = provider
        .status
        .as_ref()
        .map(|s| s.conditions.as_slice())
        .unwrap_or_default();
    let failing = conditions::get(found, types::REACHABLE)
        .filter(|c| c.status != "True")
        .or_else(|| conditions::get(found, types::READY).filter(|c| c.status != "True"));
    let Some(c) = failing else {
        return match conditions::get(found, types::READY) {
            Some(_) => None,
            None => Some((
                "NotChecked".into(),
                "the Provider has not been checked yet".into(),
                NOT_RECONCILED_HINT.into(),
            )),
        };
    };
    let endpoint = &provider.spec.connection.endpoint;
    let secret = provider
        .spec
        .connection
        .credentials_ref
        .as_ref()
        .map(|r| r.name.as_str());
    let secret_hint = |what: &str| match secret {
        Some(s) => format!("{what} Secret {s:?} (spec.connection.credentialsRef)"),
        None => "set spec.connection.credentialsRef to a Secret with the backend's credentials"
            .to_owned(),
    };
    let hint = match c.reason.as_str() {
        "CredentialsNotFound" => secret_hint("create the"),
        "Unauthorized" | "Forbidden" => secret_hint("check the credentials in the"),
        "CABundleNotFound" | "InvalidCABundle" | "InvalidTLSConfig" => {
            "fix spec.connection.caBundle (the referenced Secret or ConfigMap and its key)".into()
        }
        "Paused" => "the Provider is paused: set spec.paused to false".into(),
        "NoFailureDomains" => {
            "none of spec.failureDomains exists on the backend: fix their names, or remove them to discover the backend's".into()
        }
        "InvalidSettings" | "InvalidProviderSettings" => "fix spec.settings (see the message)".into(),
        _ => format!(
            "check that {endpoint} is reachable from the operator and its TLS settings (spec.connection.caBundle){}",
            secret
                .map(|s| format!(", and the credentials in Secret {s:?}"))
                .unwrap_or_default()
        ),
    };
    Some((c.reason.clone(), c.message.clone(), hint))
}

fn scheduled_message(vm_conditions: &[Condition], reason: &str) -> Option<String> {
    conditions::get(vm_conditions, types::SCHEDULED)
        .filter(|c| c.status != "True" && c.reason == reason && !c.message.is_empty())
        .map(|c| c.message.clone())
}

fn scheduling_link(facts: &Facts<'_>, vm_conditions: &[Condition]) -> Link {
    let subject = "Scheduling".to_owned();
    let Some(c) = conditions::get(vm_conditions, types::SCHEDULED) else {
        return Link::not_ok(
            subject,
            "NotReconciled",
            "no Scheduled condition yet",
            Some(NOT_RECONCILED_HINT.into()),
        );
    };
    if c.status == "True" {
        return Link::ok(subject, &c.message);
    }
    let hint = match c.reason.as_str() {
        "ClassNotFound" | "ImageNotFound" | "ProviderNotFound" => {
            "see the missing object above".to_owned()
        }
        "NoFeasibleProvider" | "ProviderNotReady" => {
            let unusable: Vec<String> = facts
                .providers
                .iter()
                .filter_map(|p| {
                    provider_problem(p).map(|(reason, _, _)| format!("{} ({reason})", p.name_any()))
                })
                .collect();
            if facts.providers.is_empty() {
                "there is no Provider in this namespace: create one".into()
            } else if unusable.is_empty() {
                "every Provider is Ready, but none matches the class, image and placement: see the message".into()
            } else {
                format!(
                    "Providers that are not Ready: {}; kubectl banlieue describe shows why on each (kubectl describe provider NAME)",
                    unusable.join(", ")
                )
            }
        }
        _ => "the scheduler's message says what does not fit; change spec.placement, the class or the Provider".into(),
    };
    Link::not_ok(subject, &c.reason, &c.message, Some(hint))
}

fn machine_link(facts: &Facts<'_>, vm_conditions: &[Condition]) -> Link {
    let vm_infra = conditions::get(vm_conditions, types::INFRASTRUCTURE_READY);
    let Some(machine) = facts.machine else {
        let subject = "Infrastructure machine".to_owned();
        let (reason, message) = vm_infra
            .map(|c| (c.reason.clone(), c.message.clone()))
            .unwrap_or_else(|| ("WaitingForInfrastructure".into(), String::new()));
        let hint = machine_hint(&reason, facts);
        let message = if message.is_empty() {
            "not created yet".into()
        } else {
            message
        };
        return Link::not_ok(subject, reason, message, hint);
    };
    let subject = format!("{} {:?}", machine.kind, machine.name);
    if machine.deleting {
        return Link::not_ok(
            subject,
            "Deleting",
            "the machine is being deleted (its backend VM goes first)",
            Some("a move or a deletion is in progress; if it hangs, the machine's Ready condition and the Provider say why".into()),
        );
    }
    let status = machine.status.as_ref();
    let ready = status.and_then(|s| conditions::get(&s.conditions, types::READY));
    match ready {
        None => Link::not_ok(
            subject,
            "NotObserved",
            "the machine has no Ready condition yet",
            Some(NOT_RECONCILED_HINT.into()),
        ),
        Some(c) if c.status == "True" => {
            let s = status.expect("a condition implies a status");
            let mut details = Vec::new();
            if let Some(backend) = &s.backend_ref {
                details.push(format!("backend {backend}"));
            }
            if let Some(fd) = &s.failure_domain {
                details.push(format!("failure domain {fd}"));
            }
            Link::ok(subject, details.join(", "))
        }
        Some(c) => {
            let hint = machine_hint(&c.reason, facts);
            Link::not_ok(subject, &c.reason, &c.message, hint)
        }
    }
}

fn machine_hint(reason: &str, facts: &Facts<'_>) -> Option<String> {
    let secret = || {
        facts
            .vm
            .spec
            .bootstrap
            .as_ref()
            .and_then(|b| b.user_data.as_ref().or(b.network_config.as_ref()))
            .map(|k| format!("Secret {:?}", k.name))
            .unwrap_or_else(|| "the bootstrap Secret".into())
    };
    Some(match reason {
        "TerminalFailure" => "retrying cannot help: fix what the message names (the VM's class, image or networks, or the backend), and banlieue tries again when the spec or Provider changes".into(),
        "BootstrapDataNotFound" => format!("create {} (spec.bootstrap) in the VirtualMachine's namespace", secret()),
        "ProviderNotFound" | "ProviderNotReady" => "see the Provider above".into(),
        "Paused" => "reconciliation is paused (the Provider's spec.paused, or a cluster.x-k8s.io/paused annotation)".into(),
        "WaitingForInfrastructure" => "the machine is made once the VM is scheduled; see the links above".into(),
        "PowerStateMismatch" => "banlieue is converging the backend's power state; if it stays, check the VM on the hypervisor".into(),
        "Unreachable" | "NodeUnreachable" | "VMMUnreachable" | "Busy" | "ServerError" => "a transient backend error; banlieue retries: if it persists, check the Provider's endpoint and the hypervisor".into(),
        _ => return None,
    })
}

fn power_link(vm_conditions: &[Condition]) -> Link {
    let subject = "Power state".to_owned();
    match conditions::get(vm_conditions, types::POWER_STATE) {
        Some(c) if c.status == "True" => Link::ok(subject, "matches spec.powerState"),
        Some(c) => Link::not_ok(
            subject,
            &c.reason,
            &c.message,
            Some(
                "the backend is still powering the machine; it follows the infrastructure machine"
                    .into(),
            ),
        ),
        None => Link::not_ok(
            subject,
            "NotReconciled",
            "no PowerState condition yet",
            None,
        ),
    }
}

#[cfg(test)]
#[path = "diagnose_tests.rs"]
mod tests;
