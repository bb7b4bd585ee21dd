//! Connection handling without a daemon: endpoints and settings are checked before
//! any I/O, and an unreachable daemon is a transient error, never a missing image.

use std::collections::BTreeMap;

use banlieue_backend_libvirt::LibvirtFactory;
use banlieue_sdk::api::common::ProviderClass;
use banlieue_sdk::api::vm_image::{ImageSources, LibvirtImageSource, PoolVolume};
use banlieue_sdk::backend::{BackendFactory, Connection, ImageLookup};

fn connection(settings: &[(&str, &str)]) -> Connection {
    Connection {
        class: ProviderClass::Libvirt,
        endpoint: "test:///default".into(),
        credentials: BTreeMap::new(),
        ca_bundle: None,
        insecure_skip_tls_verify: false,
        settings: settings
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    }
}

#[test]
fn only_the_qemu_driver_is_accepted() {
    let err = LibvirtFactory::new()
        .connect(&connection(&[]))
        .err()
        .expect("refused");
    assert_eq!(err.reason, "InvalidEndpoint");
    assert!(!err.is_transient());
}

#[tokio::test]
async fn bad_settings_are_terminal_before_any_io() {
    let mut c = connection(&[("domainType", "xen")]);
    c.endpoint = "qemu:///system?socket=/nonexistent".into();
    let err = LibvirtFactory::new().connect(&c).err().expect("refused");
    assert_eq!(err.reason, "InvalidSettings");
}

#[tokio::test]
async fn image_lookup_on_a_host_without_the_pool_says_what_is_missing() {
    let mut c = connection(&[]);
    c.endpoint = "qemu:///system?socket=/nonexistent/libvirt-sock".into();
    let backend = LibvirtFactory::new().connect(&c).unwrap();
    let sources = ImageSources {
        libvirt: Some(LibvirtImageSource {
            volume: Some(PoolVolume {
                pool: "images".into(),
                name: "x.qcow2".into(),
            }),
            path: None,
            format: Default::default(),
        }),
        ..Default::default()
    };
    // No daemon: transient, never "missing".
    let err = backend.find_image(&sources).await.unwrap_err();
    assert!(err.is_transient(), "{err}");
    assert_eq!(err.reason, "Unreachable");
    // No libvirt source at all: missing, without touching the host.
    let none = backend.find_image(&ImageSources::default()).await.unwrap();
    assert!(matches!(none, ImageLookup::Missing { .. }), "{none:?}");
}
