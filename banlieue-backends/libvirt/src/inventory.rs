//! What `check` reports: the libvirt host as one failure domain, its active storage
//! pools and networks as the targets storage and network classes map to, and versions.
//! Also image lookup.

use std::collections::{BTreeMap, BTreeSet};

use banlieue_sdk::backend::{
    Architecture, BackendError, FailureDomainInventory, ImageLookup, ImageSourceSet, Inventory,
};
use virt::connect::Connect;

use crate::client::Client;
use crate::domain::DomainType;
use crate::error::classify;
use crate::volumes;

/// `major.minor.micro` from libvirt's packed version number.
pub fn version_string(v: u32) -> String {
    format!("{}.{}.{}", v / 1_000_000, (v / 1000) % 1000, v % 1000)
}

/// The failure domain's name: the `failureDomain` setting, else the host's hostname.
pub fn failure_domain_name(client: &Client, conn: &Connect) -> Result<String, BackendError> {
    match &client.settings.failure_domain {
        Some(name) => Ok(name.clone()),
        None => conn
            .hostname()
            .map_err(|e| classify("reading the host's name", &e)),
    }
}

/// The host's CPU architecture as libvirt's capabilities name it (`host/cpu/arch`,
/// e.g. `x86_64`, `aarch64`), if the document has one.
pub fn host_arch(capabilities_xml: &str) -> Option<String> {
    let doc = roxmltree::Document::parse(capabilities_xml).ok()?;
    let host = doc
        .root_element()
        .children()
        .find(|n| n.has_tag_name("host"))?;
    let cpu = host.children().find(|n| n.has_tag_name("cpu"))?;
    let arch = cpu.children().find(|n| n.has_tag_name("arch"))?;
    arch.text().map(|t| t.trim().to_owned())
}

/// The architecture of the guests this backend runs on a host whose capabilities say
/// `host_arch`: amd64 on an `x86_64` host. The domains it defines are x86_64 ones
/// (`<type arch='x86_64'>`, ACPI and APIC: see `domain.rs`), so on any other host
/// (`aarch64` included) it reports none rather than its host's: reporting arm64 would
/// have arm64 images placed into x86_64 domains, which would not boot, and reporting
/// amd64 would run every guest emulated (TCG) without saying so. No image is placed
/// on such a host until this backend defines domains of its architecture.
pub fn guest_architecture(host_arch: Option<&str>) -> Option<Architecture> {
    host_arch
        .and_then(Architecture::from_machine)
        .filter(|a| *a == Architecture::Amd64)
}

/// Connects and describes the host.
pub fn check(client: &Client) -> Result<Inventory, BackendError> {
    let conn = client.conn()?;
    let hypervisor = conn
        .hyp_version()
        .map_err(|e| classify("reading the hypervisor version", &e))?;
    let library = conn
        .lib_version()
        .map_err(|e| classify("reading libvirt's version", &e))?;
    let hostname = conn
        .hostname()
        .map_err(|e| classify("reading the host's name", &e))?;
    let name = failure_domain_name(client, &conn)?;
    let pools = conn
        .list_all_storage_pools(virt::sys::VIR_CONNECT_LIST_STORAGE_POOLS_ACTIVE)
        .map_err(|e| classify("listing storage pools", &e))?
        .iter()
        .filter_map(|p| p.name().ok())
        .collect::<BTreeSet<_>>();
    let networks = conn
        .list_all_networks(virt::sys::VIR_CONNECT_LIST_NETWORKS_ACTIVE)
        .map_err(|e| classify("listing networks", &e))?
        .iter()
        .filter_map(|n| n.name().ok())
        .collect::<BTreeSet<_>>();
    let domain_type = client.domain_type(&conn)?;
    let capabilities = conn
        .capabilities()
        .map_err(|e| classify("reading the host's capabilities", &e))?;
    let architecture = guest_architecture(host_arch(&capabilities).as_deref());
    let mut resources = BTreeMap::from([
        ("pool".to_string(), pools),
        ("network".to_string(), networks),
    ]);
    if !client.settings.bridges.is_empty() {
        resources.insert("bridge".into(), client.settings.bridges.clone());
    }
    let mut features = BTreeSet::new();
    if domain_type == DomainType::Kvm {
        features.insert("kvm".to_string());
    }
    Ok(Inventory {
        version: format!(
            "QEMU {} (libvirt {}, domain type {})",
            version_string(hypervisor),
            version_string(library),
            domain_type.as_str()
        ),
        failure_domains: vec![FailureDomainInventory {
            name: name.clone(),
            labels: BTreeMap::from([
                ("topology.kubernetes.io/zone".to_string(), name),
                ("banlieue.io/libvirt-host".to_string(), hostname.clone()),
            ]),
            location: BTreeMap::from([("host".to_string(), hostname)]),
            resources,
            features,
            architecture,
        }],
    })
}

/// Whether the image's volume (or path) exists on the host.
pub fn find_image(client: &Client, sources: &ImageSourceSet) -> Result<ImageLookup, BackendError> {
    let Some(source) = &sources.libvirt else {
        return Ok(ImageLookup::Missing {
            message: "the image has no sources.libvirt".into(),
        });
    };
    let conn = client.conn()?;
    if let Err(refused) = crate::paths::check_image(
        &conn,
        source,
        client.settings.image_dirs.as_deref(),
        client.endpoint.local,
    ) {
        return Ok(ImageLookup::Missing {
            message: format!("{}: {}", refused.reason, refused.message),
        });
    }
    Ok(match volumes::image(&conn, source)? {
        Some(image) => ImageLookup::Available {
            resolved: image.path,
        },
        None => ImageLookup::Missing {
            message: match (&source.volume, &source.path) {
                (Some(v), _) => format!("no volume {} in storage pool {}", v.name, v.pool),
                (None, Some(p)) => {
                    format!("{p} is not a volume of any storage pool on this host")
                }
                _ => "sources.libvirt names neither a volume nor a path".into(),
            },
        },
    })
}

#[cfg(test)]
mod tests {
    use banlieue_sdk::backend::Architecture;

    /// The host part of `virsh capabilities` on an x86_64 and an aarch64 host.
    fn caps(arch: &str) -> String {
        format!(
            "<capabilities>\n  <host>\n    <uuid>0</uuid>\n    <cpu>\n      <arch>{arch}</arch>\n      \
             <model>qemu64</model>\n    </cpu>\n  </host>\n  <guest><os_type>hvm</os_type>\
             <arch name='x86_64'><domain type='qemu'/></arch></guest>\n</capabilities>"
        )
    }

    #[test]
    fn the_hosts_architecture_from_its_capabilities() {
        let table = [
            (caps("x86_64"), Some("x86_64"), Some(Architecture::Amd64)),
            // Domains are x86_64 ones: an aarch64 host reports none (see guest_architecture).
            (caps("aarch64"), Some("aarch64"), None),
            (caps("ppc64le"), Some("ppc64le"), None),
            // A guest's arch is not the host's.
            (
                "<capabilities><host><cpu/></host><guest><arch name='x86_64'/></guest></capabilities>".into(),
                None,
                None,
            ),
            ("not xml".into(), None, None),
        ];
        for (xml, host, want) in table {
            assert_eq!(super::host_arch(&xml).as_deref(), host, "{xml}");
            assert_eq!(super::guest_architecture(host), want, "{xml}");
        }
    }

    #[test]
    fn versions_unpack() {
        assert_eq!(super::version_string(9_000_000), "9.0.0");
        assert_eq!(super::version_string(7_002_022), "7.2.22");
    }
}
