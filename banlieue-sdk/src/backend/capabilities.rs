//! What a backend can do, as data: firmware, bootstrap formats, power states, image
//! source kinds and disk transfer formats ([`BackendCapabilities`]).
//!
//! A backend declares them with [`Backend::capabilities`](super::Backend::capabilities)
//! (the default is [`BackendCapabilities::conservative`], so a backend written before
//! this existed keeps compiling and is asked for nothing it may not do). The Provider
//! controller publishes them in `status.backendCapabilities`, narrowed by the
//! Provider's `capabilities.*` settings ([`BackendCapabilities::narrowed`]); the
//! scheduler and the Cluster API machine gate then place a machine only where
//! everything it [`Wants`] is listed ([`BackendCapabilities::missing`]), else they
//! say, per Provider, what is missing — before anything is created.

use std::collections::BTreeMap;

use crate::api::common::{BootstrapFormat, Firmware, PowerState, ProviderClass};
use crate::api::resources::{ChangeMode, MachineField};
use crate::api::vm_image::ImageSources;

use super::MachineSpec;

pub use crate::api::provider::{BackendCapabilities, DiskTransferFormat, ImageSourceKind};

/// The Provider setting that removes `efi-secure` (`"false"`).
pub const SECURE_BOOT_SETTING: &str = "capabilities.secureBoot";
/// The Provider setting that removes `Suspended` (`"false"`).
pub const SUSPEND_SETTING: &str = "capabilities.suspend";
/// The Provider setting that removes `ignition` (`"false"`).
pub const IGNITION_SETTING: &str = "capabilities.ignition";

/// Every firmware, in a stable order.
pub const ALL_FIRMWARE: [Firmware; 3] = [Firmware::Bios, Firmware::Efi, Firmware::EfiSecure];
/// Every bootstrap format, in a stable order.
pub const ALL_BOOTSTRAP_FORMATS: [BootstrapFormat; 2] =
    [BootstrapFormat::CloudConfig, BootstrapFormat::Ignition];
/// Every power state, in a stable order.
pub const ALL_POWER_STATES: [PowerState; 3] = [
    PowerState::PoweredOn,
    PowerState::PoweredOff,
    PowerState::Suspended,
];

/// The image source kinds a class's VMImage source can have.
pub fn image_source_kinds(class: ProviderClass) -> &'static [ImageSourceKind] {
    use ImageSourceKind::*;
    match class {
        ProviderClass::Vsphere => &[Template, ContentLibraryItem],
        ProviderClass::Proxmox => &[TemplateId, Volume],
        ProviderClass::Libvirt => &[Volume, Path],
        ProviderClass::CloudHypervisor => &[Kernel, Firmware],
        ProviderClass::Sim => &[Name],
        _ => &[],
    }
}

/// The kind of the image's source for `class`, when it has one.
pub fn image_source_kind(sources: &ImageSources, class: ProviderClass) -> Option<ImageSourceKind> {
    use ImageSourceKind::*;
    match class {
        ProviderClass::Vsphere => sources.vsphere.as_ref().map(|s| {
            if s.content_library_item.is_some() && s.template.is_none() {
                ContentLibraryItem
            } else {
                Template
            }
        }),
        ProviderClass::Proxmox => sources.proxmox.as_ref().map(|s| {
            if s.volume.is_some() && s.template_id.is_none() {
                Volume
            } else {
                TemplateId
            }
        }),
        ProviderClass::Libvirt => sources
            .libvirt
            .as_ref()
            .map(|s| if s.volume.is_some() { Volume } else { Path }),
        ProviderClass::CloudHypervisor => sources
            .cloud_hypervisor
            .as_ref()
            .map(|s| if s.kernel.is_some() { Kernel } else { Firmware }),
        ProviderClass::Sim => sources.sim.as_ref().map(|_| Name),
        _ => None,
    }
}

/// A firmware's wire name (`bios`, `efi`, `efi-secure`).
pub fn firmware_name(f: Firmware) -> &'static str {
    f.as_str()
}

/// A bootstrap format's wire name (`cloud-config`, `ignition`).
pub fn bootstrap_format_name(f: BootstrapFormat) -> &'static str {
    match f {
        BootstrapFormat::CloudConfig => "cloud-config",
        BootstrapFormat::Ignition => "ignition",
    }
}

/// A power state's wire name (`PoweredOn`, `PoweredOff`, `Suspended`).
pub fn power_state_name(p: PowerState) -> &'static str {
    p.as_str()
}

/// A disk transfer format's name (`raw`, `qcow2`, `vmdk`).
pub fn disk_transfer_format_name(f: DiskTransferFormat) -> &'static str {
    match f {
        DiskTransferFormat::Raw => "raw",
        DiskTransferFormat::Qcow2 => "qcow2",
        DiskTransferFormat::Vmdk => "vmdk",
    }
}

impl From<super::DiskFormat> for DiskTransferFormat {
    fn from(f: super::DiskFormat) -> Self {
        match f {
            super::DiskFormat::Raw => Self::Raw,
            super::DiskFormat::Qcow2 => Self::Qcow2,
            super::DiskFormat::Vmdk => Self::Vmdk,
        }
    }
}

/// What one machine asks of its backend.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Wants {
    /// The firmware it boots with (`None`: the image's own, nothing asked).
    pub firmware: Option<Firmware>,
    /// The format of its bootstrap data, when it has any.
    pub bootstrap: Option<BootstrapFormat>,
    /// The power state it should be in.
    pub power_state: PowerState,
    /// The kind of image source it boots from (`None`: not known here).
    pub image_source: Option<ImageSourceKind>,
    /// The fields it asks room to grow while it runs (hot-add headroom: `cpus` for
    /// `maxCPUs`, `memoryMiB` for `maxMemoryMiB`): the backend's change table must
    /// grow them `Live`.
    pub grow_live: Vec<MachineField>,
}

/// The spec field that asks room to grow `field` live (`maxCPUs`, `maxMemoryMiB`).
pub fn headroom_field(field: MachineField) -> &'static str {
    match field {
        MachineField::Cpus => "maxCPUs",
        MachineField::MemoryMib => "maxMemoryMiB",
        other => other.as_str(),
    }
}

/// The fields a spec with these ceilings asks room to grow live.
pub fn grow_live(max_cpus: Option<u32>, max_memory_mib: Option<u64>) -> Vec<MachineField> {
    [
        max_cpus.map(|_| MachineField::Cpus),
        max_memory_mib.map(|_| MachineField::MemoryMib),
    ]
    .into_iter()
    .flatten()
    .collect()
}

impl Wants {
    /// What an infra machine's own spec asks (its image source kind included), with
    /// the format of its bootstrap data when it has any.
    pub fn of_machine(spec: &MachineSpec, bootstrap: Option<BootstrapFormat>) -> Self {
        use ImageSourceKind as K;
        let grow_live = match spec {
            MachineSpec::VSphere(s) => grow_live(s.max_cpus, s.max_memory_mib),
            MachineSpec::Libvirt(s) => grow_live(s.max_cpus, s.max_memory_mib),
            MachineSpec::CloudHypervisor(s) => grow_live(s.max_cpus, s.max_memory_mib),
            MachineSpec::Proxmox(_) | MachineSpec::Custom(_) => Vec::new(),
        };
        let (firmware, image_source) = match spec {
            MachineSpec::VSphere(s) => (s.firmware, Some(K::Template)),
            MachineSpec::Proxmox(s) => (s.firmware, Some(K::TemplateId)),
            MachineSpec::Libvirt(s) => (
                Some(s.firmware),
                Some(if s.image.volume.is_some() {
                    K::Volume
                } else {
                    K::Path
                }),
            ),
            MachineSpec::CloudHypervisor(s) => (
                None,
                Some(if s.image.kernel.is_some() {
                    K::Kernel
                } else {
                    K::Firmware
                }),
            ),
            // A kind declared out of tree: its backend checks its own fields.
            MachineSpec::Custom(_) => (None, None),
        };
        Self {
            firmware,
            bootstrap,
            power_state: spec.power_state(),
            image_source,
            grow_live,
        }
    }

    /// Only what still matters once the machine exists: its power state.
    pub fn running(&self) -> Self {
        Self {
            power_state: self.power_state,
            ..Self::default()
        }
    }
}

impl BackendCapabilities {
    /// What a backend that declares nothing is assumed to do: `bios` and `efi`,
    /// cloud-config, `PoweredOn` and `PoweredOff`, every image source kind (finding
    /// the image is `find_image`'s call), no disk transfer, and no change applied to a
    /// machine that exists (an empty change table: every field `Never`).
    pub fn conservative() -> Self {
        Self {
            firmware: vec![Firmware::Bios, Firmware::Efi],
            bootstrap_formats: vec![BootstrapFormat::CloudConfig],
            power_states: vec![PowerState::PoweredOn, PowerState::PoweredOff],
            image_sources: ImageSourceKind::ALL.to_vec(),
            disk_export: vec![],
            disk_import: vec![],
            changes: vec![],
        }
    }

    /// The same capabilities less what the Provider's `capabilities.*` settings turn
    /// off (`capabilities.secureBoot`, `capabilities.suspend`, `capabilities.ignition`:
    /// `"false"` removes, `"true"` keeps; a setting never adds what the backend cannot
    /// do). Any other value is an error naming the setting.
    pub fn narrowed(mut self, settings: &BTreeMap<String, String>) -> Result<Self, String> {
        let mut errors = Vec::new();
        let mut off = |key: &str| match settings.get(key).map(|v| v.trim()) {
            None | Some("true") => false,
            Some("false") => true,
            Some(other) => {
                errors.push(format!("settings.{key}: {other:?} is not true or false"));
                false
            }
        };
        if off(SECURE_BOOT_SETTING) {
            self.firmware.retain(|f| *f != Firmware::EfiSecure);
        }
        if off(SUSPEND_SETTING) {
            self.power_states.retain(|p| *p != PowerState::Suspended);
        }
        if off(IGNITION_SETTING) {
            self.bootstrap_formats
                .retain(|f| *f != BootstrapFormat::Ignition);
        }
        if errors.is_empty() {
            Ok(self)
        } else {
            Err(errors.join("; "))
        }
    }

    /// Whether it delivers bootstrap data in every format: then a machine's format
    /// cannot make it refuse the machine.
    pub fn delivers_every_bootstrap_format(&self) -> bool {
        ALL_BOOTSTRAP_FORMATS
            .iter()
            .all(|f| self.bootstrap_formats.contains(f))
    }

    /// What `wants` asks that is not listed, for humans, one phrase each
    /// (`cannot boot efi-secure`, `cannot deliver ignition`, `cannot be Suspended`,
    /// `cannot boot an image from a volume`, `cannot honour maxCPUs: ...` where the
    /// change table does not grow the field `Live`); empty when it can serve it all.
    pub fn missing(&self, wants: &Wants) -> Vec<String> {
        let mut missing = Vec::new();
        if let Some(f) = wants.firmware
            && !self.firmware.contains(&f)
        {
            missing.push(format!("cannot boot {}", firmware_name(f)));
        }
        if let Some(b) = wants.bootstrap
            && !self.bootstrap_formats.contains(&b)
        {
            missing.push(format!("cannot deliver {}", bootstrap_format_name(b)));
        }
        if !self.power_states.contains(&wants.power_state) {
            missing.push(format!("cannot be {}", power_state_name(wants.power_state)));
        }
        if let Some(k) = wants.image_source
            && !self.image_sources.contains(&k)
        {
            missing.push(format!("cannot boot an image from a {}", k.as_str()));
        }
        for &field in &wants.grow_live {
            let mode = crate::changes::mode(&self.changes, field, true);
            if mode != ChangeMode::Live {
                missing.push(format!(
                    "cannot honour {} (its change table grows {} {}, not Live)",
                    headroom_field(field),
                    field.as_str(),
                    mode.as_str()
                ));
            }
        }
        missing
    }
}

impl ImageSourceKind {
    /// Every kind, in a stable order.
    pub const ALL: [ImageSourceKind; 8] = [
        Self::Template,
        Self::ContentLibraryItem,
        Self::TemplateId,
        Self::Volume,
        Self::Path,
        Self::Kernel,
        Self::Firmware,
        Self::Name,
    ];
}

/// The capabilities a Provider publishes, or the conservative ones when its status
/// has none yet (written by an older operator, or never checked).
pub fn published(status: Option<&crate::api::provider::ProviderStatus>) -> BackendCapabilities {
    status
        .and_then(|s| s.backend_capabilities.clone())
        .unwrap_or_else(BackendCapabilities::conservative)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn everything() -> BackendCapabilities {
        BackendCapabilities {
            firmware: ALL_FIRMWARE.to_vec(),
            bootstrap_formats: ALL_BOOTSTRAP_FORMATS.to_vec(),
            power_states: ALL_POWER_STATES.to_vec(),
            image_sources: ImageSourceKind::ALL.to_vec(),
            ..Default::default()
        }
    }

    #[test]
    fn only_a_backend_with_both_formats_delivers_every_format() {
        assert!(everything().delivers_every_bootstrap_format());
        assert!(!BackendCapabilities::conservative().delivers_every_bootstrap_format());
        let no_ignition = everything()
            .narrowed(&settings(&[(IGNITION_SETTING, "false")]))
            .expect("a valid setting");
        assert!(!no_ignition.delivers_every_bootstrap_format());
        let none = BackendCapabilities {
            bootstrap_formats: vec![],
            ..everything()
        };
        assert!(!none.delivers_every_bootstrap_format());
    }

    #[test]
    fn settings_only_narrow() {
        // (settings, has efi-secure, has Suspended, has ignition, error)
        type Case<'a> = (&'a [(&'a str, &'a str)], bool, bool, bool, bool);
        let cases: [Case<'_>; 6] = [
            (&[], true, true, true, false),
            (&[(SECURE_BOOT_SETTING, "false")], false, true, true, false),
            (&[(SUSPEND_SETTING, " false ")], true, false, true, false),
            (&[(IGNITION_SETTING, "false")], true, true, false, false),
            (&[(SECURE_BOOT_SETTING, "true")], true, true, true, false),
            (&[(SUSPEND_SETTING, "no")], true, true, true, true),
        ];
        for (pairs, secure, suspend, ignition, error) in cases {
            match everything().narrowed(&settings(pairs)) {
                Ok(c) => {
                    assert!(!error, "{pairs:?}: want an error");
                    assert_eq!(
                        c.firmware.contains(&Firmware::EfiSecure),
                        secure,
                        "{pairs:?}"
                    );
                    assert_eq!(
                        c.power_states.contains(&PowerState::Suspended),
                        suspend,
                        "{pairs:?}"
                    );
                    assert_eq!(
                        c.bootstrap_formats.contains(&BootstrapFormat::Ignition),
                        ignition,
                        "{pairs:?}"
                    );
                }
                Err(e) => {
                    assert!(error, "{pairs:?}: {e}");
                    assert!(e.contains(SUSPEND_SETTING), "{e}");
                }
            }
        }
        let conservative = BackendCapabilities::conservative();
        assert_eq!(
            conservative
                .clone()
                .narrowed(&settings(&[(SECURE_BOOT_SETTING, "true")])),
            Ok(conservative),
            "true never adds"
        );
    }

    #[test]
    fn missing_names_each_thing() {
        let caps = BackendCapabilities::conservative();
        let wants = Wants {
            firmware: Some(Firmware::EfiSecure),
            bootstrap: Some(BootstrapFormat::Ignition),
            power_state: PowerState::Suspended,
            image_source: None,
            grow_live: vec![],
        };
        assert_eq!(
            caps.missing(&wants),
            [
                "cannot boot efi-secure",
                "cannot deliver ignition",
                "cannot be Suspended"
            ]
        );
        assert!(
            caps.missing(&wants.running())
                .contains(&"cannot be Suspended".to_string())
        );
        assert!(caps.missing(&Wants::default()).is_empty());
        assert!(everything().missing(&wants).is_empty());
    }

    #[test]
    fn headroom_needs_a_live_row_for_each_field_asked() {
        use crate::api::resources::ChangeRule;
        use ChangeMode::*;
        let wants = |max_cpus, max_memory| Wants {
            grow_live: grow_live(max_cpus, max_memory),
            ..Wants::default()
        };
        // (change table, maxCPUs, maxMemoryMiB, what is missing)
        type Case = (Vec<ChangeRule>, Option<u32>, Option<u64>, Vec<&'static str>);
        let cpus_live = ChangeRule::grow_shrink(MachineField::Cpus, Live, PowerOff);
        let memory_next = ChangeRule::both(MachineField::MemoryMib, NextBoot);
        let cases: Vec<Case> = vec![
            (vec![], None, None, vec![]),
            (
                vec![],
                Some(4),
                None,
                vec!["cannot honour maxCPUs (its change table grows cpus Never, not Live)"],
            ),
            (vec![cpus_live.clone()], Some(4), None, vec![]),
            (
                vec![cpus_live.clone(), memory_next],
                Some(4),
                Some(4096),
                vec![
                    "cannot honour maxMemoryMiB (its change table grows memoryMiB NextBoot, not Live)",
                ],
            ),
        ];
        for (changes, max_cpus, max_memory, missing) in cases {
            let caps = BackendCapabilities {
                changes,
                ..everything()
            };
            assert_eq!(
                caps.missing(&wants(max_cpus, max_memory)),
                missing,
                "{max_cpus:?} {max_memory:?}"
            );
            assert!(
                caps.missing(&wants(max_cpus, max_memory).running())
                    .is_empty(),
                "a machine that exists is not asked again"
            );
        }
    }

    #[test]
    fn every_class_source_kind_is_known() {
        for class in ProviderClass::ALL {
            for kind in image_source_kinds(class) {
                assert!(ImageSourceKind::ALL.contains(kind));
            }
        }
    }
}
