//! Declares the kinds every backend has besides its machine: the machine template,
//! the InfraCluster and the InfraCluster template. Their shapes are identical across
//! backends, so one macro keeps the four sets from drifting apart.

/// The immutability rule for `spec.template` of every template kind. CAPI rolls out
/// changes by pointing at a new template, never by editing one.
pub(crate) const TEMPLATE_IMMUTABLE: &str = "self == oldSelf";

/// Declares a `<Backend>Machine` kind around its spec struct: the CAPI contract's
/// group, label, categories, printer columns, shared status and the rule that freezes
/// `spec.providerID` once set are the same for every backend.
macro_rules! infra_machine {
    (
        kind: $kind:tt, short: $short:tt, doc: $doc:tt,
        provider_ref_doc: $provider_ref_doc:tt,
        provider_id_scheme: $scheme:tt, provider_id_doc: $provider_id_doc:tt,
        bootstrap_doc: $bootstrap_doc:tt,
        $(#[$meta:meta])*
        pub struct $name:ident { $($body:tt)* }
    ) => {
        #[derive(kube::CustomResource, serde::Serialize, serde::Deserialize, Clone, Debug, PartialEq, kube::KubeSchema)]
        #[kube(
            group = "infrastructure.banlieue.io",
            version = "v1alpha1",
            kind = $kind,
            namespaced,
            status = "crate::api::infra::MachineStatus",
            derive = "PartialEq",
            doc = $doc,
            shortname = $short,
            category = "banlieue",
            category = "cluster-api",
            label("cluster.x-k8s.io/v1beta2", "v1alpha1"),
            printcolumn(name = "Provider", type_ = "string", json_path = ".spec.providerRef.name"),
            printcolumn(name = "FailureDomain", type_ = "string", json_path = ".status.failureDomain"),
            printcolumn(name = "Provisioned", type_ = "boolean", json_path = ".status.initialization.provisioned"),
            printcolumn(name = "ProviderID", type_ = "string", json_path = ".spec.providerID", priority = 1),
            printcolumn(name = "Ready", type_ = "string", json_path = ".status.conditions[?(@.type=='Ready')].status"),
            printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
        )]
        #[serde(rename_all = "camelCase")]
        #[x_kube(validation = Rule::new(crate::api::infra::machine::PROVIDER_ID_IMMUTABLE)
            .message(crate::api::infra::machine::PROVIDER_ID_IMMUTABLE_MSG))]
        $(#[$meta])*
        pub struct $name {
            #[doc = $provider_ref_doc]
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub provider_ref: Option<crate::api::common::LocalObjectReference>,
            #[doc = $provider_id_doc]
            #[serde(default, rename = "providerID", skip_serializing_if = "Option::is_none")]
            #[x_kube(validation = Rule::new(concat!("self.startsWith('", $scheme, "')"))
                .message(concat!("spec.providerID must start with ", $scheme)))]
            #[schemars(length(min = 1, max = 512))]
            pub provider_id: Option<String>,
            /// Desired power state (CAPI machines are always `PoweredOn`).
            #[serde(default)]
            pub power_state: crate::api::common::PowerState,
            /// What banlieue does with a change that waits for a power cycle: `Wait`
            /// (default; the machine runs on and reports `RestartRequired=True`) or
            /// `Restart` (banlieue powers it off, applies the change, powers it on).
            #[serde(default, skip_serializing_if = "crate::api::resources::ChangePolicy::is_wait")]
            pub change_policy: crate::api::resources::ChangePolicy,
            #[doc = $bootstrap_doc]
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub bootstrap: Option<crate::api::infra::BootstrapDataRef>,
            $($body)*
        }
    };
}

pub(crate) use infra_machine;

/// Declares `<Backend>MachineTemplate`, `<Backend>Cluster` and `<Backend>ClusterTemplate`.
macro_rules! infra_kinds {
    (
        machine_spec: $machine_spec:ident,
        machine_template: $mt_spec:ident / $mt_resource:ident, $mt_kind:tt, $mt_plural:tt, $mt_short:tt, $mt_doc:tt,
        cluster: $c_spec:ident, $c_kind:tt, $c_plural:tt, $c_short:tt, $c_doc:tt,
        cluster_template: $ct_spec:ident / $ct_resource:ident, $ct_kind:tt, $ct_plural:tt, $ct_short:tt, $ct_doc:tt $(,)?
    ) => {
        #[doc = concat!("Desired state of a ", $mt_kind, ".")]
        #[derive(kube::CustomResource, serde::Serialize, serde::Deserialize, Clone, Debug, PartialEq, kube::KubeSchema)]
        #[kube(
            group = "infrastructure.banlieue.io",
            version = "v1alpha1",
            kind = $mt_kind,
            plural = $mt_plural,
            namespaced,
            status = "crate::api::infra::MachineTemplateStatus",
            derive = "PartialEq",
            doc = $mt_doc,
            shortname = $mt_short,
            category = "banlieue",
            category = "cluster-api",
            label("cluster.x-k8s.io/v1beta2", "v1alpha1"),
            printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
        )]
        pub struct $mt_spec {
            /// The machine every copy is made from. Immutable: create a new template
            /// and point the MachineDeployment or control plane at it.
            #[x_kube(validation = Rule::new(crate::api::infra::kinds::TEMPLATE_IMMUTABLE)
                .message("spec.template is immutable: create a new template and roll out to it"))]
            pub template: $mt_resource,
        }

        #[doc = concat!("The machine inside a ", $mt_kind, ".")]
        #[derive(serde::Serialize, serde::Deserialize, Clone, Debug, PartialEq, schemars::JsonSchema)]
        pub struct $mt_resource {
            /// Labels and annotations for the machines.
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub metadata: Option<crate::api::common::ObjectMetaTemplate>,
            /// The machine spec.
            pub spec: $machine_spec,
        }

        #[doc = concat!("Desired state of a ", $c_kind, ".")]
        #[derive(kube::CustomResource, serde::Serialize, serde::Deserialize, Clone, Debug, Default, PartialEq, kube::KubeSchema)]
        #[kube(
            group = "infrastructure.banlieue.io",
            version = "v1alpha1",
            kind = $c_kind,
            plural = $c_plural,
            namespaced,
            status = "crate::api::infra::ClusterStatus",
            derive = "PartialEq",
            doc = $c_doc,
            shortname = $c_short,
            category = "banlieue",
            category = "cluster-api",
            label("cluster.x-k8s.io/v1beta2", "v1alpha1"),
            printcolumn(name = "Cluster", type_ = "string", json_path = ".metadata.labels['cluster\\.x-k8s\\.io/cluster-name']"),
            printcolumn(name = "Provisioned", type_ = "boolean", json_path = ".status.initialization.provisioned"),
            printcolumn(name = "Endpoint", type_ = "string", json_path = ".spec.controlPlaneEndpoint.host", priority = 1),
            printcolumn(name = "Ready", type_ = "string", json_path = ".status.conditions[?(@.type=='Ready')].status"),
            printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
        )]
        #[serde(rename_all = "camelCase")]
        #[x_kube(validation = Rule::new("!(has(self.providerRefs) && size(self.providerRefs) > 0 && has(self.providerSelector))")
            .message("set either providerRefs or providerSelector, not both"))]
        #[x_kube(validation = Rule::new("!has(oldSelf.controlPlaneEndpoint) || (has(self.controlPlaneEndpoint) && self.controlPlaneEndpoint == oldSelf.controlPlaneEndpoint)")
            .message("spec.controlPlaneEndpoint cannot be changed or removed once set"))]
        pub struct $c_spec {
            /// The endpoint of the workload cluster's API server, when banlieue's user
            /// supplies it (a VIP or load balancer). Leave empty when the control plane
            /// provider manages it. CAPI reads it from here, not from status.
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub control_plane_endpoint: Option<crate::api::infra::ApiEndpoint>,
            /// Providers (same namespace) whose failure domains the cluster spans.
            #[serde(default, skip_serializing_if = "Vec::is_empty")]
            #[x_kube(merge_strategy = ListMerge::Map(vec!["name".into()]))]
            #[schemars(length(max = 32))]
            pub provider_refs: Vec<crate::api::common::LocalObjectReference>,
            /// Selects Providers (same namespace) by label, instead of `providerRefs`.
            /// When both are empty, every Provider of this class in the namespace is used.
            #[serde(default, skip_serializing_if = "Option::is_none")]
            #[schemars(with = "Option<crate::api::common::LabelSelectorSchema>")]
            pub provider_selector: Option<crate::api::common::LabelSelector>,
            /// Selects which failure domains to publish, by their labels. Default: all.
            #[serde(default, skip_serializing_if = "Option::is_none")]
            #[schemars(with = "Option<crate::api::common::LabelSelectorSchema>")]
            pub failure_domain_selector: Option<crate::api::common::LabelSelector>,
            /// Selects which failure domains may host control-plane machines. Default: all.
            #[serde(default, skip_serializing_if = "Option::is_none")]
            #[schemars(with = "Option<crate::api::common::LabelSelectorSchema>")]
            pub control_plane_failure_domain_selector: Option<crate::api::common::LabelSelector>,
        }

        #[doc = concat!("Desired state of a ", $ct_kind, ".")]
        #[derive(kube::CustomResource, serde::Serialize, serde::Deserialize, Clone, Debug, PartialEq, kube::KubeSchema)]
        #[kube(
            group = "infrastructure.banlieue.io",
            version = "v1alpha1",
            kind = $ct_kind,
            plural = $ct_plural,
            namespaced,
            derive = "PartialEq",
            doc = $ct_doc,
            shortname = $ct_short,
            category = "banlieue",
            category = "cluster-api",
            label("cluster.x-k8s.io/v1beta2", "v1alpha1"),
            printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
        )]
        pub struct $ct_spec {
            /// The cluster every copy is made from. Immutable.
            #[x_kube(validation = Rule::new(crate::api::infra::kinds::TEMPLATE_IMMUTABLE)
                .message("spec.template is immutable: create a new template instead"))]
            pub template: $ct_resource,
        }

        #[doc = concat!("The cluster inside a ", $ct_kind, ".")]
        #[derive(serde::Serialize, serde::Deserialize, Clone, Debug, PartialEq, schemars::JsonSchema)]
        pub struct $ct_resource {
            /// Labels and annotations for the clusters.
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub metadata: Option<crate::api::common::ObjectMetaTemplate>,
            /// The cluster spec.
            pub spec: $c_spec,
        }
    };
}

pub(crate) use infra_kinds;
