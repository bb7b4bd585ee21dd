//! Admission rules the CRD schemas cannot carry, as ValidatingAdmissionPolicies: the
//! objects every install ships next to the CRDs (`banlieue bootstrap operator`,
//! clusterctl's `infrastructure-components.yaml`, `deploy/operator/`), generated here
//! so that the field lists follow the types (docs/adr/0023).
//!
//! One rule today: **a Cluster API machine's hardware is immutable.** An
//! infrastructure machine owned by a Cluster API `Machine` keeps the spec it was cloned
//! with; a change goes through a new machine template and a rollout, as Cluster API
//! expects of every provider. A CRD rule cannot say this (it sees `spec`, not
//! `metadata.ownerReferences`), and a webhook would need a serving certificate and an
//! exposed endpoint; a policy is evaluated by the apiserver itself.
//!
//! Standalone machines and machines of a banlieue `VirtualMachine` stay editable:
//! banlieue applies their changes (live, at the next boot, or with a power cycle).
//!
//! ```
//! let policies = banlieue_sdk::admission::policies();
//! let bindings = banlieue_sdk::admission::bindings();
//! assert_eq!(policies.len(), 4);
//! assert_eq!(bindings.len(), policies.len());
//! ```

use k8s_openapi::api::admissionregistration::v1::{
    MatchCondition, MatchResources, NamedRuleWithOperations, ValidatingAdmissionPolicy,
    ValidatingAdmissionPolicyBinding, ValidatingAdmissionPolicyBindingSpec,
    ValidatingAdmissionPolicySpec, Validation, Variable,
};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, CustomResourceDefinitionVersion,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::CustomResourceExt;

use crate::api::infra::{cloud_hypervisor as ch, libvirt as lv, proxmox as px, vsphere as vs};

/// When a field of an owned machine's spec may still change.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exempt {
    /// Always (what banlieue or Cluster API write on a running machine).
    Always,
    /// Only while the machine is being deleted (`metadata.deletionTimestamp` set): an
    /// escape hatch that finishes a deletion, never a change to a running machine.
    WhileDeleting,
}

/// The fields of an infrastructure machine's spec that stay writable on a Cluster API
/// machine, when, and why. Every other field of the spec is compared, so a field added
/// to a machine kind is immutable on Cluster API machines unless it is listed here.
pub const EXEMPT: [(&str, Exempt, &str); 2] = [
    (
        "providerID",
        Exempt::Always,
        "banlieue's machine controller sets it once the VM exists (the contract's \
         write-back); the CRD rule freezes it once set",
    ),
    (
        "providerRef",
        Exempt::WhileDeleting,
        "a deleting machine whose Provider is gone is told to name the recreated \
         Provider to finish its deletion",
    ),
];

/// The owner reference a Cluster API machine carries (any `cluster.x-k8s.io`
/// version: v1beta1 and v1beta2 Machines alike), as a CEL predicate over `r`.
const IS_CAPI_MACHINE: &str = "r.kind == 'Machine' && r.apiVersion.startsWith('cluster.x-k8s.io/')";

/// The prefix of every policy and binding name (`<prefix><plural>`).
pub const NAME_PREFIX: &str = "banlieue-capi-hardware-";

/// The machine kinds Cluster API creates from templates: banlieue's four (an
/// out-of-tree kind has no template kind, so Cluster API cannot own one).
fn machine_crds() -> [CustomResourceDefinition; 4] {
    [
        vs::VSphereMachine::crd(),
        px::ProxmoxMachine::crd(),
        lv::LibvirtMachine::crd(),
        ch::CloudHypervisorMachine::crd(),
    ]
}

/// The ValidatingAdmissionPolicy of every machine kind, in the order of
/// [`bindings`]: an update of a Cluster API machine's spec is refused unless it only
/// touches an [`EXEMPT`] field.
pub fn policies() -> Vec<ValidatingAdmissionPolicy> {
    machine_crds().iter().map(policy).collect()
}

/// The binding of each of [`policies`]: every namespace, `Deny`.
pub fn bindings() -> Vec<ValidatingAdmissionPolicyBinding> {
    machine_crds()
        .iter()
        .map(|crd| ValidatingAdmissionPolicyBinding {
            metadata: ObjectMeta {
                name: Some(name(crd)),
                ..ObjectMeta::default()
            },
            spec: Some(ValidatingAdmissionPolicyBindingSpec {
                policy_name: Some(name(crd)),
                validation_actions: Some(vec!["Deny".to_owned()]),
                ..ValidatingAdmissionPolicyBindingSpec::default()
            }),
        })
        .collect()
}

fn name(crd: &CustomResourceDefinition) -> String {
    format!("{NAME_PREFIX}{}", crd.spec.names.plural)
}

/// The served version whose schema the field list is read from (each machine CRD has
/// one); requests in another version are converted to it (`matchPolicy: Equivalent`).
fn version(crd: &CustomResourceDefinition) -> &CustomResourceDefinitionVersion {
    crd.spec
        .versions
        .iter()
        .find(|v| v.storage)
        .expect("a CRD has a storage version")
}

/// The top-level fields of the kind's `spec`, as its CRD schema declares them.
fn spec_fields(crd: &CustomResourceDefinition) -> Vec<String> {
    version(crd)
        .schema
        .as_ref()
        .and_then(|s| s.open_api_v3_schema.as_ref())
        .and_then(|s| s.properties.as_ref())
        .and_then(|p| p.get("spec"))
        .and_then(|s| s.properties.as_ref())
        .map(|p| p.keys().cloned().collect())
        .unwrap_or_default()
}

/// A CEL expression that is true when `field` of `spec` differs between the old and
/// the new object (set, unset, or another value; lists and objects compared whole).
fn field_changed(field: &str) -> String {
    format!(
        "has(object.spec.{field}) != has(oldObject.spec.{field}) || \
         (has(object.spec.{field}) && object.spec.{field} != oldObject.spec.{field})"
    )
}

/// The CEL list of the `spec.<field>` names that changed, one term per field not
/// exempt (a field exempt while deleting is compared unless the machine is deleting).
/// CEL has no "map minus keys", so the comparison is spelled out field by field.
fn changed_fields(fields: &[String]) -> String {
    let terms: Vec<String> = fields
        .iter()
        .filter_map(|field| {
            let exempt = EXEMPT
                .iter()
                .find(|(f, _, _)| f == field)
                .map(|(_, e, _)| *e);
            let changed = field_changed(field);
            let condition = match exempt {
                Some(Exempt::Always) => return None,
                Some(Exempt::WhileDeleting) => {
                    format!("!has(oldObject.metadata.deletionTimestamp) && ({changed})")
                }
                None => changed,
            };
            Some(format!("(({condition}) ? ['spec.{field}'] : [])"))
        })
        .collect();
    if terms.is_empty() {
        "[]".to_owned()
    } else {
        // One term a line, for whoever reads the installed policy.
        terms.join(" +\n")
    }
}

/// True when `var` (`object` or `oldObject`) is owned by a Cluster API Machine.
fn owned(var: &str) -> String {
    format!(
        "has({var}.metadata.ownerReferences) && \
         {var}.metadata.ownerReferences.exists(r, {IS_CAPI_MACHINE})"
    )
}

/// The name of the owning Machine (from the new object, else the old one).
fn machine_name() -> String {
    format!(
        "({new}) ? object.metadata.ownerReferences.filter(r, {IS_CAPI_MACHINE})[0].name : \
         oldObject.metadata.ownerReferences.filter(r, {IS_CAPI_MACHINE})[0].name",
        new = owned("object")
    )
}

fn policy(crd: &CustomResourceDefinition) -> ValidatingAdmissionPolicy {
    let kind = &crd.spec.names.kind;
    let template = format!("{kind}Template");
    let advice = format!(
        "its hardware is immutable (Cluster API convention); create a new {template}, \
         point the MachineDeployment or control plane at it and let Cluster API roll out \
         instead"
    );
    let fields = spec_fields(crd);
    ValidatingAdmissionPolicy {
        metadata: ObjectMeta {
            name: Some(name(crd)),
            ..ObjectMeta::default()
        },
        spec: Some(ValidatingAdmissionPolicySpec {
            failure_policy: Some("Fail".to_owned()),
            match_constraints: Some(MatchResources {
                match_policy: Some("Equivalent".to_owned()),
                resource_rules: Some(vec![NamedRuleWithOperations {
                    api_groups: Some(vec![crd.spec.group.clone()]),
                    api_versions: Some(vec![version(crd).name.clone()]),
                    // Creates are free (clusterctl move creates, CAPI clones); the
                    // status subresource is another resource and is not matched.
                    operations: Some(vec!["UPDATE".to_owned()]),
                    resources: Some(vec![crd.spec.names.plural.clone()]),
                    ..NamedRuleWithOperations::default()
                }]),
                ..MatchResources::default()
            }),
            // Only Cluster API machines are evaluated at all: a standalone or
            // VirtualMachine-owned machine never meets this policy, so no mistake in it
            // can block banlieue's own writes to them. Owned before or after the update:
            // dropping the owner in the same write does not lift the rule.
            match_conditions: Some(vec![MatchCondition {
                name: "owned-by-a-cluster-api-machine".to_owned(),
                expression: format!("({}) || ({})", owned("object"), owned("oldObject")),
            }]),
            variables: Some(vec![
                Variable {
                    name: "changed".to_owned(),
                    expression: changed_fields(&fields),
                },
                Variable {
                    name: "machine".to_owned(),
                    expression: machine_name(),
                },
            ]),
            validations: Some(vec![Validation {
                expression: "size(variables.changed) == 0".to_owned(),
                message: Some(format!(
                    "this {kind} is owned by a Cluster API Machine: {advice}"
                )),
                message_expression: Some(format!(
                    "'{kind} ' + object.metadata.name + ' is owned by Machine ' + \
                     variables.machine + ': {advice} (changed: ' + \
                     variables.changed.join(', ') + ')'"
                )),
                reason: Some("Invalid".to_owned()),
            }]),
            ..ValidatingAdmissionPolicySpec::default()
        }),
        status: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_exempt_field_exists_on_every_machine_kind() {
        for crd in machine_crds() {
            let fields = spec_fields(&crd);
            for (field, _, _) in EXEMPT {
                assert!(
                    fields.iter().any(|f| f == field),
                    "{} has no spec.{field}",
                    crd.spec.names.kind
                );
            }
        }
    }

    /// Every spec field but the exempt ones is compared: the list is the schema's,
    /// so a field added to a kind is immutable on Cluster API machines by default.
    #[test]
    fn every_other_spec_field_is_compared() {
        for crd in machine_crds() {
            let fields = spec_fields(&crd);
            assert!(fields.len() > 10, "{}: {fields:?}", crd.spec.names.kind);
            let changed = changed_fields(&fields);
            for field in &fields {
                let named = changed.contains(&format!("['spec.{field}']"));
                match EXEMPT.iter().find(|(f, _, _)| f == field) {
                    Some((_, Exempt::Always, _)) => assert!(!named, "{field}"),
                    _ => assert!(
                        named,
                        "{} spec.{field} is not compared",
                        crd.spec.names.kind
                    ),
                }
            }
        }
        let vsphere = spec_fields(&vs::VSphereMachine::crd());
        for hardware in ["numCPUs", "memoryMiB", "diskGiB", "network", "template"] {
            assert!(vsphere.iter().any(|f| f == hardware), "{hardware}");
        }
    }

    #[test]
    fn the_comparison_is_spelled_field_by_field() {
        let table: [(&[&str], &str); 4] = [
            (&[], "[]"),
            (&["providerID"], "[]"),
            (
                &["cpus"],
                "((has(object.spec.cpus) != has(oldObject.spec.cpus) || \
                 (has(object.spec.cpus) && object.spec.cpus != oldObject.spec.cpus)) ? ['spec.cpus'] : [])",
            ),
            (
                &["providerRef", "providerID"],
                "((!has(oldObject.metadata.deletionTimestamp) && (has(object.spec.providerRef) != \
                 has(oldObject.spec.providerRef) || (has(object.spec.providerRef) && \
                 object.spec.providerRef != oldObject.spec.providerRef))) ? ['spec.providerRef'] : [])",
            ),
        ];
        for (fields, want) in table {
            let fields: Vec<String> = fields.iter().map(|f| (*f).to_owned()).collect();
            assert_eq!(changed_fields(&fields), want, "{fields:?}");
        }
    }

    #[test]
    fn one_policy_and_binding_per_machine_kind_updates_only() {
        let policies = policies();
        let bindings = bindings();
        let names: Vec<String> = policies
            .iter()
            .map(|p| p.metadata.name.clone().unwrap())
            .collect();
        assert_eq!(
            names,
            [
                "banlieue-capi-hardware-vspheremachines",
                "banlieue-capi-hardware-proxmoxmachines",
                "banlieue-capi-hardware-libvirtmachines",
                "banlieue-capi-hardware-cloudhypervisormachines",
            ]
        );
        for (policy, binding) in policies.iter().zip(&bindings) {
            let spec = policy.spec.as_ref().unwrap();
            let binding = binding.spec.as_ref().unwrap();
            assert_eq!(binding.policy_name, policy.metadata.name);
            assert_eq!(
                binding.validation_actions.as_deref(),
                Some(&["Deny".to_owned()][..])
            );
            assert_eq!(spec.failure_policy.as_deref(), Some("Fail"));
            let rules = spec
                .match_constraints
                .as_ref()
                .unwrap()
                .resource_rules
                .as_ref()
                .unwrap();
            assert_eq!(rules.len(), 1);
            assert_eq!(
                rules[0].operations.as_deref(),
                Some(&["UPDATE".to_owned()][..])
            );
            assert_eq!(
                rules[0].api_groups.as_deref(),
                Some(&[crate::api::INFRA_GROUP.to_owned()][..])
            );
            let message = spec.validations.as_ref().unwrap()[0]
                .message_expression
                .as_ref()
                .unwrap();
            assert!(!message.contains('\n'));
            assert!(message.contains("its hardware is immutable (Cluster API convention)"));
        }
    }
}
