//! The VMM's state machine, hand-modelled on upstream `docs/api.md` (the OpenAPI
//! document has no preconditions): one VMM holds at most one VM.

use std::path::Path;

use serde_json::{Value, json};

/// The fake's version, reported by `vmm.ping`.
pub const VERSION: &str = "v48.0.0-fake";

/// `VmState` of the OpenAPI document.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VmState {
    /// Created, not booted.
    Created,
    /// Booted.
    Running,
    /// Shut down (may be booted again).
    Shutdown,
    /// Paused.
    Paused,
}

impl VmState {
    fn as_str(self) -> &'static str {
        match self {
            Self::Created => "Created",
            Self::Running => "Running",
            Self::Shutdown => "Shutdown",
            Self::Paused => "Paused",
        }
    }
}

/// What happens when the guest sees the ACPI power button.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GuestPowerOff {
    /// The guest powers off and the VMM process exits, as the real one does.
    Exit,
    /// The guest powers off and the VM stays, in `Shutdown`.
    Shutdown,
    /// The guest ignores the button.
    Ignore,
}

/// A side effect the server must carry out after answering.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum After {
    /// Nothing.
    Nothing,
    /// Exit the process (`vmm.shutdown`).
    ExitVmm,
    /// The power button was pressed: the guest reacts after a delay.
    PowerButton,
}

/// One answer: status, JSON body (if any), and what to do next.
#[derive(Clone, Debug, PartialEq)]
pub struct Reply {
    /// HTTP status.
    pub status: u16,
    /// Body, if any.
    pub body: Option<Value>,
    /// Side effect.
    pub after: After,
}

fn ok() -> Reply {
    Reply {
        status: 204,
        body: None,
        after: After::Nothing,
    }
}

fn json(body: Value) -> Reply {
    Reply {
        status: 200,
        body: Some(body),
        after: After::Nothing,
    }
}

/// An error in CH's v53 format: a JSON array of the error chain.
fn error(status: u16, chain: &[&str]) -> Reply {
    Reply {
        status,
        body: Some(json!(chain)),
        after: After::Nothing,
    }
}

/// The VMM.
#[derive(Debug)]
pub struct Vmm {
    vm: Option<(Value, VmState)>,
    pid: u32,
    /// The memory size the VM last booted with: the base of its hot-plug area.
    booted_ram: u64,
}

/// ACPI memory hot-plug adds memory in blocks of 128 MiB (upstream `docs/hotplug.md`).
const HOTPLUG_BLOCK: u64 = 128 << 20;

impl Vmm {
    /// A VMM with no VM.
    pub fn new(pid: u32) -> Self {
        Self {
            vm: None,
            pid,
            booted_ram: 0,
        }
    }

    /// The VM's state, if one is created.
    pub fn state(&self) -> Option<VmState> {
        self.vm.as_ref().map(|(_, s)| *s)
    }

    /// The guest reacted to the power button.
    pub fn guest_powered_off(&mut self) {
        if let Some((_, state)) = &mut self.vm
            && *state == VmState::Running
        {
            *state = VmState::Shutdown;
        }
    }

    /// Handles one already-validated request. `body` is the parsed JSON body, if any.
    pub fn handle(&mut self, method: &str, op: &str, body: Option<&Value>) -> Reply {
        let state = self.state();
        match (method, op) {
            ("GET", "vmm.ping") => json(json!({
                "build_version": format!("{VERSION}-banlieue"),
                "version": VERSION,
                "pid": self.pid,
                "features": ["kvm"],
            })),
            ("PUT", "vmm.shutdown") => Reply {
                after: After::ExitVmm,
                ..ok()
            },
            ("PUT", "vm.create") => match (state, body) {
                (Some(_), _) => error(409, &["Error creating the VM", "VM is already created"]),
                (None, None) => error(400, &["Missing VM configuration"]),
                (None, Some(config)) => match check_config(config) {
                    Err(e) => error(400, &["Error creating the VM", &e]),
                    Ok(()) => {
                        self.vm = Some((config.clone(), VmState::Created));
                        ok()
                    }
                },
            },
            ("PUT", "vm.delete") => {
                self.vm = None;
                ok()
            }
            ("GET", "vm.info") => match &self.vm {
                None => error(404, &["VM is not created"]),
                Some((config, state)) => json(json!({
                    "config": config,
                    "state": state.as_str(),
                    "memory_actual_size": config["memory"]["size"].as_i64().unwrap_or(512 << 20),
                })),
            },
            ("GET", "vm.counters") => match state {
                None => error(404, &["VM is not created"]),
                Some(_) => json(json!({})),
            },
            ("PUT", "vm.boot") => match state {
                None => error(404, &["VM is not created"]),
                Some(VmState::Created | VmState::Shutdown) => {
                    let (config, state) = self.vm.as_mut().expect("checked");
                    if let Err(e) = check_files(config) {
                        return error(500, &["Error booting the VM", &e]);
                    }
                    *state = VmState::Running;
                    self.booted_ram = config["memory"]["size"].as_u64().unwrap_or(0);
                    ok()
                }
                Some(_) => error(409, &["Error booting the VM", "VM is already booted"]),
            },
            ("PUT", "vm.shutdown") => {
                self.transition(&[VmState::Running, VmState::Paused], VmState::Shutdown)
            }
            ("PUT", "vm.reboot") => self.transition(&[VmState::Running], VmState::Running),
            ("PUT", "vm.pause") => self.transition(&[VmState::Running], VmState::Paused),
            ("PUT", "vm.resume") => self.transition(&[VmState::Paused], VmState::Running),
            ("PUT", "vm.power-button") => match state {
                None => error(404, &["VM is not created"]),
                Some(VmState::Running) => Reply {
                    after: After::PowerButton,
                    ..ok()
                },
                Some(_) => error(
                    405,
                    &["Error triggering the power button", "VM is not running"],
                ),
            },
            (_, _) if state.is_none() => error(404, &["VM is not created"]),
            ("PUT", "vm.resize") => self.resize(body.unwrap_or(&Value::Null)),
            ("PUT", "vm.resize-disk") => self.resize_disk(body.unwrap_or(&Value::Null)),
            ("PUT", "vm.add-net") => self.add_net(body.unwrap_or(&Value::Null)),
            ("PUT", "vm.remove-device") => self.remove_device(body.unwrap_or(&Value::Null)),
            (_, op) => error(500, &[&format!("{op} is not implemented by the fake")]),
        }
    }

    /// `vm.resize`, as upstream's `Vm::resize` with ACPI memory hot-plug: vCPUs up
    /// to `max_vcpus` (added or removed); memory added in 128 MiB blocks within the
    /// `hotplug_size` area above the size the VM booted with, a smaller size only
    /// recorded (it takes effect when the VM boots again). The VM's configuration
    /// takes the new `boot_vcpus` and `memory.size`, as upstream's does. Everything is
    /// checked before anything changes.
    fn resize(&mut self, body: &Value) -> Reply {
        let booted = self.booted_ram;
        let Some((config, state)) = &mut self.vm else {
            return error(404, &["VM is not created"]);
        };
        let live = matches!(state, VmState::Running | VmState::Paused);
        let vcpus = body["desired_vcpus"].as_u64();
        let ram = body["desired_ram"].as_u64();
        if let Some(want) = vcpus {
            let max = config["cpus"]["max_vcpus"].as_u64().unwrap_or(1);
            if want > max {
                return error(
                    500,
                    &[
                        "Error resizing the VM",
                        &format!("desired vCPUs {want} exceed max_vcpus {max}"),
                    ],
                );
            }
        }
        if let Some(want) = ram {
            let size = config["memory"]["size"].as_u64().unwrap_or(0);
            let room = config["memory"]["hotplug_size"].as_u64().unwrap_or(0);
            if live && want > size {
                if !(want - size).is_multiple_of(HOTPLUG_BLOCK) {
                    return error(
                        500,
                        &[
                            "Error resizing the VM",
                            &format!(
                                "memory to add ({} bytes) is not a multiple of 128 MiB",
                                want - size
                            ),
                        ],
                    );
                }
                if want > booted + room {
                    return error(
                        500,
                        &[
                            "Error resizing the VM",
                            &format!(
                                "insufficient hot-plug RAM: {want} bytes asked, {} possible",
                                booted + room
                            ),
                        ],
                    );
                }
            }
        }
        if let Some(want) = vcpus {
            config["cpus"]["boot_vcpus"] = json!(want);
        }
        if let Some(want) = ram {
            config["memory"]["size"] = json!(want);
        }
        ok()
    }

    /// `vm.resize-disk`: the disk with the id grows to `desired_size` (its raw file
    /// is extended, as upstream does for a raw image); a read-only disk, a smaller
    /// size or a VM that does not run is an error.
    fn resize_disk(&mut self, body: &Value) -> Reply {
        let Some((config, state)) = &self.vm else {
            return error(404, &["VM is not created"]);
        };
        let id = body["id"].as_str().unwrap_or_default();
        let Some(disk) = config["disks"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|d| d["id"].as_str() == Some(id))
        else {
            return error(
                404,
                &[
                    "Error resizing the disk",
                    &format!("no disk with id {id:?}"),
                ],
            );
        };
        if !matches!(state, VmState::Running | VmState::Paused) {
            return error(500, &["Error resizing the disk", "the VM is not booted"]);
        }
        if disk["readonly"].as_bool() == Some(true) {
            return error(
                500,
                &[
                    "Error resizing the disk",
                    &format!("disk {id} is read-only"),
                ],
            );
        }
        let Some(want) = body["desired_size"].as_u64() else {
            return error(500, &["Error resizing the disk", "no desired_size"]);
        };
        let path = disk["path"].as_str().unwrap_or_default();
        let grown = std::fs::OpenOptions::new()
            .write(true)
            .open(path)
            .and_then(|file| {
                let have = file.metadata()?.len();
                if want < have {
                    return Err(std::io::Error::other(format!(
                        "cannot shrink from {have} to {want} bytes"
                    )));
                }
                file.set_len(want)
            });
        match grown {
            Ok(()) => ok(),
            Err(e) => error(500, &["Error resizing the disk", &format!("{path}: {e}")]),
        }
    }

    /// `vm.add-net`: the interface joins the VM's `net` (an id is given when none is
    /// asked); a booted VM answers 200 with its PCI address (hot-plugged), one not
    /// booted 204 (cold-added, upstream's answers). An id in use is a 409.
    fn add_net(&mut self, body: &Value) -> Reply {
        let Some((config, state)) = &mut self.vm else {
            return error(404, &["VM is not created"]);
        };
        let ids = device_ids(config);
        let mut net = body.clone();
        let id = match net["id"].as_str() {
            Some(id) if ids.contains(&id.to_owned()) => {
                return error(
                    409,
                    &[
                        "Error adding the network device",
                        &format!("identifier {id} already exists"),
                    ],
                );
            }
            Some(id) => id.to_owned(),
            None => (0..)
                .map(|n| format!("_net{n}"))
                .find(|id| !ids.contains(id))
                .expect("a free id"),
        };
        net["id"] = json!(id);
        if !config["net"].is_array() {
            config["net"] = json!([]);
        }
        let list = config["net"].as_array_mut().expect("an array");
        list.push(net);
        let slot = ids.len() + list.len() + 1;
        match state {
            VmState::Running | VmState::Paused => {
                json(json!({"id": id, "bdf": format!("0000:00:{slot:02x}.0")}))
            }
            _ => ok(),
        }
    }

    /// `vm.remove-device`: the device with the id (an interface, a disk, ...) leaves
    /// the VM; an unknown id is a 404.
    fn remove_device(&mut self, body: &Value) -> Reply {
        let Some((config, _)) = &mut self.vm else {
            return error(404, &["VM is not created"]);
        };
        let id = body["id"].as_str().unwrap_or_default();
        for list in [
            "net",
            "disks",
            "fs",
            "pmem",
            "devices",
            "vdpa",
            "user_devices",
        ] {
            if let Some(items) = config[list].as_array_mut()
                && let Some(at) = items.iter().position(|d| d["id"].as_str() == Some(id))
            {
                items.remove(at);
                return ok();
            }
        }
        error(
            404,
            &[
                "Error removing the device",
                &format!("no device with identifier {id:?}"),
            ],
        )
    }

    fn transition(&mut self, from: &[VmState], to: VmState) -> Reply {
        match &mut self.vm {
            None => error(404, &["VM is not created"]),
            Some((_, state)) if from.contains(state) => {
                *state = to;
                ok()
            }
            Some((_, state)) => error(
                405,
                &[&format!(
                    "invalid VM state transition from {state:?} to {to:?}"
                )],
            ),
        }
    }
}

/// Config rules CH checks at `vm.create` (`VmConfig::validate`) that the schema
/// cannot express.
fn check_config(config: &Value) -> Result<(), String> {
    let payload = &config["payload"];
    if payload.get("kernel").is_none()
        && payload.get("firmware").is_none()
        && payload.get("igvm").is_none()
    {
        return Err("payload needs a kernel, a firmware or an IGVM file".into());
    }
    let boot = config["cpus"]["boot_vcpus"].as_u64().unwrap_or(1);
    let max = config["cpus"]["max_vcpus"].as_u64().unwrap_or(boot);
    if boot > max {
        return Err(format!("boot_vcpus {boot} exceeds max_vcpus {max}"));
    }
    // Upstream `VmConfig::validate`: no part of the topology is zero
    // (`CpuTopologyZeroPart`) and their product is `max_vcpus` (`CpuTopologyCount`).
    let topology = &config["cpus"]["topology"];
    if !topology.is_null() {
        let parts = [
            "threads_per_core",
            "cores_per_die",
            "dies_per_package",
            "packages",
        ]
        .map(|k| topology[k].as_u64().unwrap_or(0));
        if parts.contains(&0) {
            return Err(format!(
                "No part of the CPU topology can be zero: {topology}"
            ));
        }
        let product: u64 = parts.iter().product();
        if product != max {
            return Err(format!(
                "Product of CPU topology parts ({product}) does not match maximum vCPUs ({max})"
            ));
        }
    }
    if let Some(size) = config["memory"]["size"].as_u64()
        && size % 4096 != 0
    {
        return Err(format!(
            "memory size {size} is not a multiple of the page size"
        ));
    }
    let mut paths = std::collections::BTreeSet::new();
    for disk in config["disks"].as_array().into_iter().flatten() {
        if let Some(path) = disk["path"].as_str()
            && !paths.insert(path)
        {
            return Err(format!("disk path {path} is used twice"));
        }
    }
    Ok(())
}

/// Every device id the VM's configuration names.
fn device_ids(config: &Value) -> Vec<String> {
    [
        "net",
        "disks",
        "fs",
        "pmem",
        "devices",
        "vdpa",
        "user_devices",
    ]
    .iter()
    .flat_map(|list| config[*list].as_array().into_iter().flatten())
    .filter_map(|d| d["id"].as_str().map(str::to_owned))
    .collect()
}

/// Files CH opens when it boots: payload and disks must exist.
fn check_files(config: &Value) -> Result<(), String> {
    let payload = &config["payload"];
    let mut files: Vec<&str> = ["kernel", "firmware", "initramfs"]
        .iter()
        .filter_map(|k| payload[*k].as_str())
        .collect();
    files.extend(
        config["disks"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|d| d["path"].as_str()),
    );
    for file in files {
        if !Path::new(file).exists() {
            return Err(format!("cannot open {file}: No such file or directory"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// CH's own topology rules: a zero part or a product other than `max_vcpus` is
    /// refused at `vm.create`; a valid one is kept in the configuration `vm.info` shows.
    #[test]
    fn the_cpu_topology_must_hold_max_vcpus() {
        let kernel = std::env::temp_dir().to_string_lossy().into_owned();
        let config = |max: u64, cores: u64, packages: u64| {
            json!({"payload": {"kernel": kernel}, "cpus": {"boot_vcpus": 1, "max_vcpus": max,
                   "topology": {"threads_per_core": 1, "cores_per_die": cores,
                                "dies_per_package": 1, "packages": packages}}})
        };
        for (max, cores, packages) in [(4, 2, 1), (4, 0, 4), (3, 2, 2)] {
            let reply = Vmm::new(7).handle("PUT", "vm.create", Some(&config(max, cores, packages)));
            assert_eq!(reply.status, 400, "{max} {cores} {packages}");
        }
        let mut vmm = Vmm::new(7);
        assert_eq!(
            vmm.handle("PUT", "vm.create", Some(&config(4, 2, 2)))
                .status,
            204
        );
        let info = vmm.handle("GET", "vm.info", None);
        assert_eq!(
            info.body.unwrap()["config"]["cpus"]["topology"]["cores_per_die"],
            2
        );
    }

    #[test]
    fn follows_the_documented_state_machine() {
        let dir = std::env::temp_dir();
        let kernel = dir.to_string_lossy().into_owned();
        let mut vmm = Vmm::new(7);
        assert_eq!(vmm.handle("GET", "vm.info", None).status, 404);
        assert_eq!(vmm.handle("PUT", "vm.boot", None).status, 404);
        let bad = json!({"payload": {}});
        assert_eq!(vmm.handle("PUT", "vm.create", Some(&bad)).status, 400);
        let config =
            json!({"payload": {"kernel": kernel}, "cpus": {"boot_vcpus": 1, "max_vcpus": 1}});
        assert_eq!(vmm.handle("PUT", "vm.create", Some(&config)).status, 204);
        assert_eq!(vmm.handle("PUT", "vm.create", Some(&config)).status, 409);
        assert_eq!(vmm.state(), Some(VmState::Created));
        assert_eq!(vmm.handle("PUT", "vm.shutdown", None).status, 405);
        assert_eq!(vmm.handle("PUT", "vm.boot", None).status, 204);
        assert_eq!(vmm.handle("PUT", "vm.boot", None).status, 409);
        let info = vmm.handle("GET", "vm.info", None);
        assert_eq!(
            (info.status, &info.body.as_ref().unwrap()["state"]),
            (200, &json!("Running"))
        );
        assert_eq!(
            vmm.handle("PUT", "vm.power-button", None).after,
            After::PowerButton
        );
        vmm.guest_powered_off();
        assert_eq!(vmm.state(), Some(VmState::Shutdown));
        assert_eq!(vmm.handle("PUT", "vm.boot", None).status, 204);
        assert_eq!(vmm.handle("PUT", "vm.shutdown", None).status, 204);
        assert_eq!(vmm.handle("PUT", "vm.delete", None).status, 204);
        assert_eq!(vmm.state(), None);
        assert_eq!(
            vmm.handle("PUT", "vmm.shutdown", None).after,
            After::ExitVmm
        );
    }

    #[test]
    fn resizes_within_the_hot_plug_room_as_upstream_does() {
        let dir = tempfile::tempdir().unwrap();
        let kernel = dir.path().join("vmlinux");
        let data = dir.path().join("data.raw");
        std::fs::write(&kernel, b"k").unwrap();
        std::fs::File::create(&data)
            .unwrap()
            .set_len(1 << 30)
            .unwrap();
        let mut vmm = Vmm::new(7);
        let config = json!({"payload": {"kernel": kernel},
            "cpus": {"boot_vcpus": 2, "max_vcpus": 4},
            "memory": {"size": 1u64 << 30, "hotplug_size": 1u64 << 30},
            "disks": [{"id": "data0", "path": data}, {"id": "seed", "path": kernel, "readonly": true}]});
        let resize =
            |vmm: &mut Vmm, body: Value| vmm.handle("PUT", "vm.resize", Some(&body)).status;
        let resize_disk =
            |vmm: &mut Vmm, body: Value| vmm.handle("PUT", "vm.resize-disk", Some(&body)).status;
        assert_eq!(resize(&mut vmm, json!({"desired_vcpus": 3})), 404);
        assert_eq!(vmm.handle("PUT", "vm.create", Some(&config)).status, 204);
        assert_eq!(
            resize_disk(&mut vmm, json!({"id": "data0", "desired_size": 2u64 << 30})),
            500,
            "not booted"
        );
        assert_eq!(vmm.handle("PUT", "vm.boot", None).status, 204);
        let info = |vmm: &mut Vmm| vmm.handle("GET", "vm.info", None).body.unwrap();
        // vCPUs within max_vcpus, both ways; beyond, refused and nothing changed.
        assert_eq!(resize(&mut vmm, json!({"desired_vcpus": 4})), 204);
        assert_eq!(info(&mut vmm)["config"]["cpus"]["boot_vcpus"], 4);
        assert_eq!(resize(&mut vmm, json!({"desired_vcpus": 3})), 204);
        assert_eq!(
            resize(
                &mut vmm,
                json!({"desired_vcpus": 5, "desired_ram": 1536u64 << 20})
            ),
            500
        );
        let now = info(&mut vmm);
        assert_eq!(now["config"]["cpus"]["boot_vcpus"], 3);
        assert_eq!(now["config"]["memory"]["size"], 1u64 << 30);
        // Memory in 128 MiB blocks, within the room above what it booted with.
        assert_eq!(
            resize(&mut vmm, json!({"desired_ram": (1u64 << 30) + (100 << 20)})),
            500
        );
        assert_eq!(resize(&mut vmm, json!({"desired_ram": 1536u64 << 20})), 204);
        assert_eq!(info(&mut vmm)["memory_actual_size"], 1536u64 << 20);
        assert_eq!(resize(&mut vmm, json!({"desired_ram": 2048u64 << 20})), 204);
        assert_eq!(
            resize(&mut vmm, json!({"desired_ram": 2176u64 << 20})),
            500,
            "beyond the room"
        );
        // Disks: grown, never shrunk; read-only and unknown ones refused.
        assert_eq!(
            resize_disk(&mut vmm, json!({"id": "data0", "desired_size": 2u64 << 30})),
            204
        );
        assert_eq!(std::fs::metadata(&data).unwrap().len(), 2 << 30);
        assert_eq!(
            resize_disk(&mut vmm, json!({"id": "data0", "desired_size": 1u64 << 30})),
            500
        );
        assert_eq!(
            resize_disk(&mut vmm, json!({"id": "seed", "desired_size": 1u64 << 30})),
            500
        );
        assert_eq!(
            resize_disk(&mut vmm, json!({"id": "nope", "desired_size": 1u64 << 30})),
            404
        );
        assert_eq!(std::fs::metadata(&data).unwrap().len(), 2 << 30);
    }

    #[test]
    fn interfaces_are_hot_plugged_and_removed() {
        let dir = tempfile::tempdir().unwrap();
        let kernel = dir.path().join("vmlinux");
        std::fs::write(&kernel, b"k").unwrap();
        let mut vmm = Vmm::new(7);
        let add = |vmm: &mut Vmm, body: Value| vmm.handle("PUT", "vm.add-net", Some(&body));
        let config = json!({"payload": {"kernel": kernel}, "net": [{"id": "net0", "tap": "t0"}]});
        assert_eq!(add(&mut vmm, json!({"id": "net1"})).status, 404);
        assert_eq!(vmm.handle("PUT", "vm.create", Some(&config)).status, 204);
        assert_eq!(
            add(&mut vmm, json!({"id": "net1", "tap": "t1"})).status,
            204,
            "cold"
        );
        assert_eq!(vmm.handle("PUT", "vm.boot", None).status, 204);
        let hot = add(
            &mut vmm,
            json!({"id": "net2", "tap": "t2", "mac": "52:54:00:00:00:02"}),
        );
        assert_eq!(hot.status, 200);
        assert_eq!(hot.body.unwrap()["id"], "net2");
        assert_eq!(add(&mut vmm, json!({"id": "net2"})).status, 409);
        let info = vmm.handle("GET", "vm.info", None).body.unwrap();
        assert_eq!(info["config"]["net"][2]["mac"], "52:54:00:00:00:02");
        let remove = |vmm: &mut Vmm, id: &str| {
            vmm.handle("PUT", "vm.remove-device", Some(&json!({"id": id})))
                .status
        };
        assert_eq!(remove(&mut vmm, "net1"), 204);
        assert_eq!(remove(&mut vmm, "net1"), 404);
        let info = vmm.handle("GET", "vm.info", None).body.unwrap();
        let ids: Vec<&str> = info["config"]["net"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n["id"].as_str().unwrap())
            .collect();
        assert_eq!(ids, ["net0", "net2"]);
    }

    #[test]
    fn boot_fails_when_files_are_missing() {
        let mut vmm = Vmm::new(7);
        let config = json!({"payload": {"kernel": "/nonexistent/vmlinux"}});
        assert_eq!(vmm.handle("PUT", "vm.create", Some(&config)).status, 204);
        let reply = vmm.handle("PUT", "vm.boot", None);
        assert_eq!(reply.status, 500);
        assert!(
            reply
                .body
                .unwrap()
                .to_string()
                .contains("/nonexistent/vmlinux")
        );
    }
}
