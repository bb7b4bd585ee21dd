//! The backends compiled into this binary (one Cargo feature each) and their
//! registration.

use banlieue_sdk::api::common::ProviderClass;
use banlieue_sdk::backend::BackendRegistry;

/// A backend compiled into the binary.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CompiledBackend {
    /// The Provider class it serves.
    pub class: ProviderClass,
    /// Whether its crate has a `BackendFactory` yet (registered by [`registry`]).
    pub has_adapter: bool,
}

/// Every backend compiled in, in `ProviderClass::ALL` order.
pub fn compiled() -> Vec<CompiledBackend> {
    let compiled: &[CompiledBackend] = &[
        #[cfg(feature = "vsphere")]
        CompiledBackend {
            class: banlieue_backend_vsphere::CLASS,
            has_adapter: true,
        },
        #[cfg(feature = "proxmox")]
        CompiledBackend {
            class: banlieue_backend_proxmox::CLASS,
            has_adapter: true,
        },
        #[cfg(feature = "libvirt")]
        CompiledBackend {
            class: banlieue_backend_libvirt::CLASS,
            has_adapter: true,
        },
        #[cfg(feature = "cloud-hypervisor")]
        CompiledBackend {
            class: banlieue_backend_cloud_hypervisor::CLASS,
            has_adapter: true,
        },
        #[cfg(feature = "sim")]
        CompiledBackend {
            class: banlieue_backend_sim::CLASS,
            has_adapter: true,
        },
    ];
    compiled.to_vec()
}

/// A registry with a factory for every compiled-in backend that has one.
pub fn registry() -> BackendRegistry {
    #[allow(unused_mut)]
    let mut registry = BackendRegistry::default();
    #[cfg(feature = "vsphere")]
    registry.register(
        banlieue_backend_vsphere::CLASS,
        std::sync::Arc::new(banlieue_backend_vsphere::VSphereFactory::new()),
    );
    #[cfg(feature = "proxmox")]
    registry.register(
        banlieue_backend_proxmox::CLASS,
        std::sync::Arc::new(banlieue_backend_proxmox::ProxmoxFactory::new()),
    );
    #[cfg(feature = "libvirt")]
    registry.register(
        banlieue_backend_libvirt::CLASS,
        std::sync::Arc::new(banlieue_backend_libvirt::LibvirtFactory::new()),
    );
    #[cfg(feature = "cloud-hypervisor")]
    registry.register(
        banlieue_backend_cloud_hypervisor::CLASS,
        std::sync::Arc::new(banlieue_backend_cloud_hypervisor::ChFactory::new()),
    );
    #[cfg(feature = "sim")]
    registry.register(
        banlieue_backend_sim::CLASS,
        std::sync::Arc::new(banlieue_backend_sim::SimFactory::new()),
    );
    registry
}

/// `vsphere(no adapter yet), ..., sim`, for the startup log.
pub fn summary(backends: &[CompiledBackend]) -> String {
    if backends.is_empty() {
        return "none".into();
    }
    backends
        .iter()
        .map(|b| {
            if b.has_adapter {
                b.class.as_str().to_string()
            } else {
                format!("{}(no adapter yet)", b.class.as_str())
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_registry_serves_exactly_the_backends_with_adapters() {
        let registered: Vec<_> = registry().classes().collect();
        let with_adapter: Vec<_> = compiled()
            .iter()
            .filter(|b| b.has_adapter)
            .map(|b| b.class)
            .collect();
        assert_eq!(registered, with_adapter);
    }

    #[test]
    fn summary_marks_backends_without_adapter() {
        let backends = [
            CompiledBackend {
                class: ProviderClass::Vsphere,
                has_adapter: false,
            },
            CompiledBackend {
                class: ProviderClass::Sim,
                has_adapter: true,
            },
        ];
        assert_eq!(summary(&backends), "vsphere(no adapter yet), sim");
        assert_eq!(summary(&[]), "none");
    }

    #[cfg(all(
        feature = "vsphere",
        feature = "proxmox",
        feature = "libvirt",
        feature = "cloud-hypervisor",
        feature = "sim"
    ))]
    #[test]
    fn default_features_compile_every_class_in() {
        let classes: Vec<_> = compiled().iter().map(|b| b.class).collect();
        assert_eq!(classes, ProviderClass::ALL);
    }
}
