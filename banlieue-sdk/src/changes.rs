//! How a machine that exists takes a change of its spec, decided from values: what
//! differs between what it runs with and what it is asked for ([`differences`]), and,
//! from its backend's change table, which of those are applied now and which wait,
//! for what ([`assess`]).
//!
//! The controller asks the backend to apply [`Assessment::apply`] (with
//! [`Backend::apply_changes`](crate::backend::Backend::apply_changes)), reads the
//! machine back, and assesses again: a change is reported applied only once the
//! backend reads it back. What waits is published in `status.resources.pending` and in
//! the `UpToDate` and `RestartRequired` conditions.

use crate::api::common::PowerState;
use crate::api::resources::{
    ChangeMode, ChangeRule, DiskSize, MachineField, MachineResources, PendingChange,
};

/// One difference between what a machine runs with and what it is asked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Difference {
    /// The field.
    pub field: MachineField,
    /// What runs, for humans.
    pub running: String,
    /// What is asked, for humans.
    pub desired: String,
    /// Whether the change grows (a larger value, an added item) or shrinks.
    pub grows: bool,
}

impl Difference {
    fn new(
        field: MachineField,
        running: impl ToString,
        desired: impl ToString,
        grows: bool,
    ) -> Self {
        Self {
            field,
            running: running.to_string(),
            desired: desired.to_string(),
            grows,
        }
    }
}

fn disks(list: &[DiskSize]) -> String {
    if list.is_empty() {
        return "none".to_owned();
    }
    list.iter()
        .map(|d| format!("{} {}GiB", d.name, d.size_gib))
        .collect::<Vec<_>>()
        .join(", ")
}

/// What differs between `running` and `desired`, in [`MachineField::ALL`]'s order. A
/// size only one side knows (a backend that does not read a topology back, a spec
/// that leaves the OS disk at the image's size, a spec that lists no network device)
/// is not a difference; neither is an OS disk larger than asked (the size asked is a
/// floor).
pub fn differences(desired: &MachineResources, running: &MachineResources) -> Vec<Difference> {
    use MachineField as F;
    let mut out = Vec::new();
    if desired.cpus != running.cpus {
        out.push(Difference::new(
            F::Cpus,
            running.cpus,
            desired.cpus,
            desired.cpus > running.cpus,
        ));
    }
    if let (Some(want), Some(have)) = (desired.cores_per_socket, running.cores_per_socket)
        && want != have
    {
        out.push(Difference::new(F::CoresPerSocket, have, want, want > have));
    }
    if desired.memory_mib != running.memory_mib {
        out.push(Difference::new(
            F::MemoryMib,
            running.memory_mib,
            desired.memory_mib,
            desired.memory_mib > running.memory_mib,
        ));
    }
    if let (Some(want), Some(have)) = (desired.os_disk_gib, running.os_disk_gib)
        && want > have
    {
        out.push(Difference::new(F::OsDiskSize, have, want, true));
    }
    let find =
        |list: &[DiskSize], name: &str| list.iter().find(|d| d.name == name).map(|d| d.size_gib);
    let mut resized: Vec<(String, u32, u32)> = Vec::new();
    for want in &desired.data_disks {
        if let Some(have) = find(&running.data_disks, &want.name)
            && have != want.size_gib
        {
            resized.push((want.name.clone(), have, want.size_gib));
        }
    }
    if !resized.is_empty() {
        let grows = resized.iter().all(|(_, have, want)| want > have);
        let show = |pick: fn(&(String, u32, u32)) -> u32| {
            resized
                .iter()
                .map(|r| format!("{} {}GiB", r.0, pick(r)))
                .collect::<Vec<_>>()
                .join(", ")
        };
        out.push(Difference::new(
            F::DataDiskSize,
            show(|r| r.1),
            show(|r| r.2),
            grows,
        ));
    }
    let added = desired
        .data_disks
        .iter()
        .any(|d| find(&running.data_disks, &d.name).is_none());
    let removed = running
        .data_disks
        .iter()
        .any(|d| find(&desired.data_disks, &d.name).is_none());
    if added || removed {
        // A swap (one added, one removed) shrinks too: the removal decides.
        out.push(Difference::new(
            F::DataDisks,
            disks(&running.data_disks),
            disks(&desired.data_disks),
            !removed,
        ));
    }
    // No network asked is not "no network": a VSphereMachine without `network` keeps
    // its template's devices. So 0 asked is not a difference (nor a way to remove the
    // last device).
    if desired.networks != 0 && desired.networks != running.networks {
        out.push(Difference::new(
            F::Networks,
            running.networks,
            desired.networks,
            desired.networks > running.networks,
        ));
    }
    if let (Some(want), Some(have)) = (desired.firmware, running.firmware)
        && want != have
    {
        out.push(Difference::new(
            F::Firmware,
            have.as_str(),
            want.as_str(),
            true,
        ));
    }
    out
}

/// How `table` says a change of `field` is applied (a field it does not list:
/// [`ChangeMode::Never`]).
pub fn mode(table: &[ChangeRule], field: MachineField, grows: bool) -> ChangeMode {
    table
        .iter()
        .find(|r| r.field == field)
        .map(|r| if grows { r.grow } else { r.shrink })
        .unwrap_or(ChangeMode::Never)
}

/// How `table` says the change `difference` (from `running` to `desired`) is applied
/// to this machine: [`mode`], except that a `Live` growth beyond the hot-add ceiling
/// `running` reports (`maxCPUs`, `maxMemoryMiB`) takes its rule's
/// [`beyond_max`](ChangeRule::beyond_max) mode (`NextBoot` when the rule names none).
///
/// What the controller decides with ([`assess`]) and what a backend that keeps sizes
/// as values applies by (the simulator): one rule for both.
pub fn mode_for(
    table: &[ChangeRule],
    difference: &Difference,
    desired: &MachineResources,
    running: &MachineResources,
) -> ChangeMode {
    let mode = mode(table, difference.field, difference.grows);
    if mode == ChangeMode::Live && beyond_ceiling(difference.field, desired, running) {
        return table
            .iter()
            .find(|r| r.field == difference.field)
            .and_then(|r| r.beyond_max)
            .unwrap_or(ChangeMode::NextBoot);
    }
    mode
}

/// What one look at a machine decides about its changes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Assessment {
    /// The fields to hand the backend now, sorted: `Live` changes of a running
    /// machine, `NextBoot` changes not yet written to its configuration, and every
    /// change that is not `Never` of a machine that is powered off.
    pub apply: Vec<MachineField>,
    /// The changes that wait, with what for.
    pub pending: Vec<PendingChange>,
    /// Every difference (applied now or waiting).
    pub differences: Vec<Difference>,
}

impl Assessment {
    /// Whether the machine runs with what it is asked for.
    pub fn up_to_date(&self) -> bool {
        self.differences.is_empty()
    }

    /// Whether a change waits for a power cycle (`NextBoot` or `PowerOff`).
    pub fn restart_required(&self) -> bool {
        self.pending
            .iter()
            .any(|p| p.waits_for != ChangeMode::Never)
    }

    /// The changes that can never be applied to this machine.
    pub fn refused(&self) -> impl Iterator<Item = &PendingChange> {
        self.pending
            .iter()
            .filter(|p| p.waits_for == ChangeMode::Never)
    }
}

/// Decides, for a machine that exists and has no operation in flight, which
/// differences between `running` and `desired` the backend applies now and which wait.
///
/// `next_boot` is the configuration the machine's next boot uses, when the backend
/// reads one back that differs from `running` (a `NextBoot` change already written);
/// `power` its power state. A `Live` change beyond the hot-add ceiling the machine
/// reports (`maxCPUs`, `maxMemoryMiB`) is its rule's `beyondMax` ([`mode_for`]).
pub fn assess(
    desired: &MachineResources,
    running: &MachineResources,
    next_boot: Option<&MachineResources>,
    table: &[ChangeRule],
    power: Option<PowerState>,
) -> Assessment {
    let off = power == Some(PowerState::PoweredOff);
    let found = differences(desired, running);
    let staged = next_boot
        .map(|n| differences(desired, n))
        .unwrap_or_else(|| found.clone());
    let mut apply = Vec::new();
    let mut pending = Vec::new();
    for d in &found {
        let mode = mode_for(table, d, desired, running);
        let waits = |waits_for| PendingChange {
            field: d.field,
            running: d.running.clone(),
            desired: d.desired.clone(),
            waits_for,
        };
        match mode {
            ChangeMode::Never => pending.push(waits(ChangeMode::Never)),
            _ if off => apply.push(d.field),
            ChangeMode::Live => apply.push(d.field),
            ChangeMode::NextBoot => {
                // Written once: the next boot's configuration has it already.
                if staged.iter().any(|s| s.field == d.field) {
                    apply.push(d.field);
                }
                pending.push(waits(ChangeMode::NextBoot));
            }
            ChangeMode::PowerOff => pending.push(waits(ChangeMode::PowerOff)),
        }
    }
    // A change written for the next boot and then taken back (the spec asks again what
    // runs): the next boot's configuration still has it, so it is written again, to
    // what is asked, or the next boot would take what nobody asks any more.
    if let Some(next) = next_boot
        && !off
    {
        for d in differences(desired, next) {
            if !found.iter().any(|f| f.field == d.field)
                && mode(table, d.field, d.grows) != ChangeMode::Never
            {
                apply.push(d.field);
            }
        }
    }
    apply.sort();
    apply.dedup();
    Assessment {
        apply,
        pending,
        differences: found,
    }
}

fn beyond_ceiling(
    field: MachineField,
    desired: &MachineResources,
    running: &MachineResources,
) -> bool {
    match field {
        MachineField::Cpus => running.max_cpus.is_some_and(|max| desired.cpus > max),
        MachineField::MemoryMib => running
            .max_memory_mib
            .is_some_and(|max| desired.memory_mib > max),
        _ => false,
    }
}

/// Sets `field` of `to` to what it is in `from`: what a backend that keeps sizes as
/// values (the simulator, a test double) does to apply a change. `DataDiskSize` sets
/// the sizes of the disks both have; `DataDisks` adds the disks only `from` has and
/// removes those it lacks.
pub fn apply_field(to: &mut MachineResources, from: &MachineResources, field: MachineField) {
    use MachineField as F;
    match field {
        F::Cpus => to.cpus = from.cpus,
        F::CoresPerSocket => to.cores_per_socket = from.cores_per_socket,
        F::MemoryMib => to.memory_mib = from.memory_mib,
        F::OsDiskSize => to.os_disk_gib = from.os_disk_gib.max(to.os_disk_gib),
        F::DataDiskSize => {
            for disk in &mut to.data_disks {
                if let Some(want) = from.data_disks.iter().find(|d| d.name == disk.name) {
                    disk.size_gib = want.size_gib;
                }
            }
        }
        F::DataDisks => {
            to.data_disks
                .retain(|d| from.data_disks.iter().any(|w| w.name == d.name));
            for want in &from.data_disks {
                if !to.data_disks.iter().any(|d| d.name == want.name) {
                    to.data_disks.push(want.clone());
                }
            }
            to.data_disks.sort();
        }
        F::Networks => to.networks = from.networks,
        F::Firmware => to.firmware = from.firmware,
    }
}

/// For humans: each waiting change, `memoryMiB 2048 → 4096 waits for the next boot`,
/// joined with `; `.
pub fn describe(pending: &[PendingChange]) -> String {
    pending
        .iter()
        .map(|p| {
            let waits = match p.waits_for {
                ChangeMode::NextBoot => "waits for the next boot (a power cycle)",
                ChangeMode::PowerOff => "waits for a power-off",
                ChangeMode::Never => "cannot be applied to this machine (it needs a new one)",
                ChangeMode::Live => "is being applied",
            };
            format!("{} {} → {} {waits}", p.field.as_str(), p.running, p.desired)
        })
        .collect::<Vec<_>>()
        .join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use ChangeMode::*;
    use MachineField as F;

    fn shape(cpus: u32, memory: u64) -> MachineResources {
        MachineResources {
            cpus,
            memory_mib: memory,
            networks: 1,
            ..Default::default()
        }
    }

    fn disk(name: &str, gib: u32) -> DiskSize {
        DiskSize {
            name: name.into(),
            size_gib: gib,
        }
    }

    fn table() -> Vec<ChangeRule> {
        vec![
            ChangeRule::grow_shrink(F::Cpus, Live, PowerOff),
            ChangeRule::grow_shrink(F::MemoryMib, Live, PowerOff),
            ChangeRule::grow_shrink(F::DataDiskSize, Live, Never),
            ChangeRule::grow_shrink(F::DataDisks, Live, Live),
            ChangeRule::both(F::Networks, NextBoot),
        ]
    }

    #[test]
    fn nothing_differs_nothing_to_do() {
        let a = assess(
            &shape(2, 2048),
            &shape(2, 2048),
            None,
            &table(),
            Some(PowerState::PoweredOn),
        );
        assert!(a.up_to_date() && !a.restart_required() && a.apply.is_empty());
    }

    #[test]
    fn the_table_decides_per_field_and_direction() {
        let on = Some(PowerState::PoweredOn);
        // (desired cpus, desired memory, apply, pending (field, waits for))
        type Case = (u32, u64, Vec<MachineField>, Vec<(MachineField, ChangeMode)>);
        let cases: Vec<Case> = vec![
            (4, 2048, vec![F::Cpus], vec![]),
            (1, 2048, vec![], vec![(F::Cpus, PowerOff)]),
            (4, 4096, vec![F::Cpus, F::MemoryMib], vec![]),
            (2, 1024, vec![], vec![(F::MemoryMib, PowerOff)]),
        ];
        for (cpus, memory, apply, pending) in cases {
            let a = assess(&shape(cpus, memory), &shape(2, 2048), None, &table(), on);
            assert_eq!(a.apply, apply, "{cpus} {memory}");
            let got: Vec<_> = a.pending.iter().map(|p| (p.field, p.waits_for)).collect();
            assert_eq!(got, pending, "{cpus} {memory}");
        }
    }

    #[test]
    fn a_powered_off_machine_takes_every_change_but_never() {
        let mut want = shape(1, 1024);
        want.firmware = Some(crate::api::common::Firmware::Bios);
        let mut have = shape(2, 2048);
        have.firmware = Some(crate::api::common::Firmware::Efi);
        let a = assess(&want, &have, None, &table(), Some(PowerState::PoweredOff));
        assert_eq!(a.apply, [F::Cpus, F::MemoryMib]);
        let refused: Vec<_> = a.refused().map(|p| p.field).collect();
        assert_eq!(
            refused,
            [F::Firmware],
            "firmware is not in the table: Never"
        );
        assert!(!a.restart_required());
    }

    #[test]
    fn beyond_the_hot_add_ceiling_waits_for_the_next_boot() {
        let mut have = shape(2, 2048);
        have.max_cpus = Some(4);
        have.max_memory_mib = Some(4096);
        let on = Some(PowerState::PoweredOn);
        let within = assess(&shape(4, 4096), &have, None, &table(), on);
        assert_eq!(within.apply, [F::Cpus, F::MemoryMib]);
        let beyond = assess(&shape(8, 8192), &have, None, &table(), on);
        // Written now for the next boot, and reported as waiting for it.
        assert_eq!(beyond.apply, [F::Cpus, F::MemoryMib]);
        assert!(beyond.restart_required());
        assert!(beyond.pending.iter().all(|p| p.waits_for == NextBoot));
        // Once the next boot's configuration has it, it is not written again.
        let staged = assess(&shape(8, 8192), &have, Some(&shape(8, 8192)), &table(), on);
        assert!(staged.apply.is_empty());
        assert_eq!(staged.pending.len(), 2);
        assert!(describe(&staged.pending).contains("cpus 2 → 8 waits for the next boot"));
    }

    #[test]
    fn beyond_the_ceiling_a_rule_may_wait_for_a_power_off_instead() {
        // vSphere's rows: a VM without hot-add reports a ceiling of what it has.
        let vsphere = vec![
            ChangeRule::grow_shrink(F::Cpus, Live, PowerOff).with_beyond_max(PowerOff),
            ChangeRule::grow_shrink(F::MemoryMib, Live, PowerOff).with_beyond_max(PowerOff),
        ];
        let on = Some(PowerState::PoweredOn);
        // (ceiling cpus, ceiling memory, desired cpus, desired memory, apply, pending)
        type Case = (
            Option<u32>,
            Option<u64>,
            u32,
            u64,
            Vec<MachineField>,
            Vec<(MachineField, ChangeMode)>,
        );
        let cases: Vec<Case> = vec![
            // hot-add on: no ceiling, both live
            (None, None, 4, 4096, vec![F::Cpus, F::MemoryMib], vec![]),
            // hot-add off: nothing is written now, both wait for a power-off
            (
                Some(2),
                Some(2048),
                4,
                4096,
                vec![],
                vec![(F::Cpus, PowerOff), (F::MemoryMib, PowerOff)],
            ),
            // CPU hot-add only
            (
                None,
                Some(2048),
                4,
                4096,
                vec![F::Cpus],
                vec![(F::MemoryMib, PowerOff)],
            ),
            // a shrink is the shrink rule's, ceiling or not
            (None, None, 1, 2048, vec![], vec![(F::Cpus, PowerOff)]),
        ];
        for (max_cpus, max_memory, cpus, memory, apply, pending) in cases {
            let mut have = shape(2, 2048);
            have.max_cpus = max_cpus;
            have.max_memory_mib = max_memory;
            let a = assess(&shape(cpus, memory), &have, None, &vsphere, on);
            assert_eq!(
                a.apply, apply,
                "{max_cpus:?} {max_memory:?} {cpus} {memory}"
            );
            let got: Vec<_> = a.pending.iter().map(|p| (p.field, p.waits_for)).collect();
            assert_eq!(got, pending, "{max_cpus:?} {max_memory:?} {cpus} {memory}");
            // Powered off, every one is applied.
            let off = assess(
                &shape(cpus, memory),
                &have,
                None,
                &vsphere,
                Some(PowerState::PoweredOff),
            );
            assert!(off.pending.is_empty(), "{off:?}");
        }
        // A rule that names nothing beyond: NextBoot.
        let mut have = shape(2, 2048);
        have.max_cpus = Some(2);
        let d = &differences(&shape(4, 2048), &have)[0];
        assert_eq!(mode_for(&table(), d, &shape(4, 2048), &have), NextBoot);
    }

    #[test]
    fn a_next_boot_change_taken_back_is_written_back() {
        let on = Some(PowerState::PoweredOn);
        let mut staged = shape(2, 2048);
        staged.networks = 2;
        // What runs is asked again, but the next boot would take 2 networks.
        let a = assess(
            &shape(2, 2048),
            &shape(2, 2048),
            Some(&staged),
            &table(),
            on,
        );
        assert!(a.up_to_date(), "the guest runs with what is asked");
        assert_eq!(
            a.apply,
            [F::Networks],
            "the next boot's configuration is written back"
        );
        // Nothing staged: nothing to write.
        let a = assess(&shape(2, 2048), &shape(2, 2048), None, &table(), on);
        assert!(a.apply.is_empty());
    }

    #[test]
    fn disks_grow_are_added_and_removed() {
        let on = Some(PowerState::PoweredOn);
        let mut have = shape(2, 2048);
        have.os_disk_gib = Some(20);
        have.data_disks = vec![disk("data", 10), disk("logs", 5)];
        let mut want = have.clone();
        want.os_disk_gib = Some(10); // a floor: smaller than what runs is no change
        want.data_disks = vec![disk("data", 20), disk("logs", 5), disk("scratch", 1)];
        let a = assess(&want, &have, None, &table(), on);
        let fields: Vec<_> = a.differences.iter().map(|d| d.field).collect();
        assert_eq!(fields, [F::DataDiskSize, F::DataDisks]);
        assert_eq!(a.apply, [F::DataDiskSize, F::DataDisks]);
        assert_eq!(a.differences[0].desired, "data 20GiB");
        // A disk shrunk: refused by the table (and by admission before it).
        want.data_disks = vec![disk("data", 5), disk("logs", 5)];
        let a = assess(&want, &have, None, &table(), on);
        assert_eq!(a.refused().count(), 1);
        // A disk swapped for another counts as a removal.
        want.data_disks = vec![disk("data", 10), disk("other", 5)];
        let d = differences(&want, &have);
        assert_eq!((d[0].field, d[0].grows), (F::DataDisks, false));
        // The OS disk grows.
        want.os_disk_gib = Some(40);
        assert_eq!(differences(&want, &have)[0].field, F::OsDiskSize);
        assert_eq!(mode(&table(), F::OsDiskSize, true), Never, "not listed");
    }

    #[test]
    fn applying_every_differing_field_leaves_no_difference() {
        let mut have = shape(2, 2048);
        have.os_disk_gib = Some(20);
        have.data_disks = vec![disk("data", 10), disk("gone", 5)];
        have.firmware = Some(crate::api::common::Firmware::Efi);
        let mut want = shape(4, 1024);
        want.cores_per_socket = None;
        want.os_disk_gib = Some(30);
        want.data_disks = vec![disk("data", 20), disk("new", 1)];
        want.networks = 3;
        want.firmware = Some(crate::api::common::Firmware::Bios);
        let fields: Vec<_> = differences(&want, &have).iter().map(|d| d.field).collect();
        assert_eq!(fields.len(), 7, "{fields:?}");
        for field in fields {
            apply_field(&mut have, &want, field);
        }
        assert!(differences(&want, &have).is_empty(), "{have:?}");
        // The OS disk never shrinks.
        want.os_disk_gib = Some(5);
        apply_field(&mut have, &want, F::OsDiskSize);
        assert_eq!(have.os_disk_gib, Some(30));
    }

    #[test]
    fn unknown_sides_are_not_differences() {
        let mut none_asked = shape(2, 2048);
        none_asked.networks = 0;
        assert!(
            differences(&none_asked, &shape(2, 2048)).is_empty(),
            "a template's NICs kept"
        );
        let mut want = shape(2, 2048);
        want.cores_per_socket = Some(2);
        want.os_disk_gib = Some(40);
        want.firmware = Some(crate::api::common::Firmware::Efi);
        assert!(differences(&want, &shape(2, 2048)).is_empty());
    }
}
