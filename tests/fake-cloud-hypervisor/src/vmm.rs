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
}

impl Vmm {
    /// A VMM with no VM.
    pub fn new(pid: u32) -> Self {
        Self { vm: None, pid }
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
            (_, op) => error(500, &[&format!("{op} is not implemented by the fake")]),
        }
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
