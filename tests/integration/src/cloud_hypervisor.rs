//! The Cloud Hypervisor rig: a state directory, an image, and the VMM binary the
//! backend starts — the spec-checked fake (`tests/fake-cloud-hypervisor`, built as
//! this package's bin `fake-ch-vmm`) behind a wrapper script that records every API exchange, or a
//! real `cloud-hypervisor` named by `BANLIEUE_CH_BINARY` (with `BANLIEUE_CH_KERNEL`
//! or `BANLIEUE_CH_FIRMWARE`, `BANLIEUE_CH_DISK` and optionally `BANLIEUE_CH_CMDLINE`).
//!
//! With the fake, [`ChRig::exchanges`] reads what every VMM received and answered and
//! [`ChRig::assert_conformant`] fails the test on any OpenAPI violation.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};

/// What the fake's guest does when the ACPI power button is pressed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Guest {
    /// Powers off; the VMM exits (the real VMM's behaviour).
    Exit,
    /// Powers off; the VMM stays with the VM in `Shutdown`.
    Shutdown,
    /// Ignores the button (banlieue must fall back to `vm.shutdown`).
    Ignore,
}

impl Guest {
    fn flag(self) -> &'static str {
        match self {
            Self::Exit => "exit",
            Self::Shutdown => "shutdown",
            Self::Ignore => "ignore",
        }
    }
}

/// A state directory, an image and a VMM binary for one test.
pub struct ChRig {
    /// The Provider endpoint's directory.
    pub state_dir: PathBuf,
    /// The executable the backend starts (setting `binary`).
    pub binary: PathBuf,
    /// The fake's exchange log; `None` with a real binary.
    pub record: Option<PathBuf>,
    /// The image's `sources.cloudHypervisor`.
    pub image: Value,
    /// A dnsmasq-style lease file the Provider reads (setting `dhcpLeases`).
    pub leases: PathBuf,
    _dir: tempfile::TempDir,
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

impl ChRig {
    /// A rig around `fake` (the path of the `fake-ch-vmm` bin), unless
    /// `BANLIEUE_CH_BINARY` names a real binary.
    pub fn new(fake: &str, guest: Guest) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("bch")
            .tempdir()
            .expect("tempdir");
        let root = dir.path().to_owned();
        let state_dir = root.join("state");
        let leases = root.join("dnsmasq.leases");
        std::fs::write(&leases, "").expect("lease file");
        if let Some(binary) = env("BANLIEUE_CH_BINARY") {
            let mut image = json!({
                "disk": env("BANLIEUE_CH_DISK").expect("BANLIEUE_CH_DISK (a raw OS disk) with BANLIEUE_CH_BINARY"),
                "format": "raw",
            });
            match (env("BANLIEUE_CH_KERNEL"), env("BANLIEUE_CH_FIRMWARE")) {
                (Some(k), _) => {
                    image["kernel"] = json!(k);
                    image["cmdline"] = json!(
                        env("BANLIEUE_CH_CMDLINE")
                            .unwrap_or_else(|| "console=ttyS0 root=/dev/vda1 rw".into())
                    );
                }
                (None, Some(f)) => image["firmware"] = json!(f),
                (None, None) => {
                    panic!("BANLIEUE_CH_KERNEL or BANLIEUE_CH_FIRMWARE with BANLIEUE_CH_BINARY")
                }
            }
            return Self {
                state_dir,
                binary: PathBuf::from(binary),
                record: None,
                image,
                leases,
                _dir: dir,
            };
        }
        let record = root.join("exchanges.jsonl");
        let binary = root.join("cloud-hypervisor");
        // The wrapper is written under another name and copied into place by `cp`, so
        // this process never holds the executable open for writing: a child another
        // test thread forks meanwhile inherits every open descriptor until it execs,
        // and executing a file still open for writing fails with ETXTBSY ("Text file
        // busy", seen once in CI-like runs of the conformance suite).
        let draft = root.join("cloud-hypervisor.draft");
        std::fs::write(
            &draft,
            format!(
                "#!/bin/sh\nexec '{fake}' --record '{}' --guest-poweroff {} --guest-delay-ms 300 \"$@\"\n",
                record.display(),
                guest.flag()
            ),
        )
        .expect("wrapper");
        let copied = std::process::Command::new("cp")
            .arg(&draft)
            .arg(&binary)
            .status()
            .expect("cp the wrapper");
        assert!(copied.success(), "cp the wrapper: {copied}");
        chmod_x(&binary);
        let kernel = root.join("vmlinux");
        std::fs::write(&kernel, b"not really a kernel").expect("kernel");
        let disk = root.join("debian.raw");
        std::fs::write(&disk, vec![0x55u8; 1 << 20]).expect("disk");
        Self {
            state_dir,
            binary,
            record: Some(record),
            image: json!({"kernel": kernel, "cmdline": "console=ttyS0 root=/dev/vda1", "disk": disk, "format": "raw"}),
            leases,
            _dir: dir,
        }
    }

    /// A small qcow2 image made with `qemu-img` (Debian's qemu-utils). `None` (the test
    /// skips) when qemu-img is missing outside CI; under CI or `make` (`banlieue_testenv::rigs_required`) that panics.
    pub fn qcow2_image(&self) -> Option<String> {
        let path = self._dir.path().join("debian.qcow2");
        let made = std::process::Command::new("qemu-img")
            .args(["create", "-q", "-f", "qcow2"])
            .arg(&path)
            .arg("512M")
            .status();
        match made {
            Ok(status) if status.success() => Some(path.to_string_lossy().into_owned()),
            other if banlieue_testenv::rigs_required() => {
                panic!("qemu-img (apt install qemu-utils) is required under CI and make: {other:?}")
            }
            other => {
                eprintln!("SKIPPED: qemu-img unavailable: {other:?}");
                None
            }
        }
    }

    /// True when the rig runs the fake (exchange logs available).
    pub fn is_fake(&self) -> bool {
        self.record.is_some()
    }

    /// The Provider's `spec.settings`.
    pub fn settings(&self) -> BTreeMap<String, String> {
        BTreeMap::from([
            ("binary".into(), self.binary.to_string_lossy().into_owned()),
            ("shutdownTimeout".into(), "2s".into()),
            ("restartDelay".into(), "2s".into()),
            ("pollInterval".into(), "200ms".into()),
            ("hostName".into(), "ch-host-1".into()),
            (
                "dhcpLeases".into(),
                self.leases.to_string_lossy().into_owned(),
            ),
            ("imageDirectories".into(), self.image_directories()),
        ])
    }

    /// The Provider's `imageDirectories`: the rig's own directory (the fake's kernel
    /// and disks, [`ChRig::qcow2_image`]), and those of a real binary's kernel,
    /// firmware and disk.
    pub fn image_directories(&self) -> String {
        let mut dirs = vec![self._dir.path().to_string_lossy().into_owned()];
        for name in [
            "BANLIEUE_CH_KERNEL",
            "BANLIEUE_CH_FIRMWARE",
            "BANLIEUE_CH_DISK",
        ] {
            if let Some(parent) = env(name)
                .as_deref()
                .and_then(|p| Path::new(p).parent())
                .map(|p| p.to_string_lossy().into_owned())
                && !dirs.contains(&parent)
            {
                dirs.push(parent);
            }
        }
        dirs.join(",")
    }

    /// The rig's own directory, where its images are (and the test may put others).
    pub fn root(&self) -> &Path {
        self._dir.path()
    }

    /// The Provider's endpoint.
    pub fn endpoint(&self) -> String {
        format!("local://{}", self.state_dir.display())
    }

    /// Adds a DHCP lease for `mac`.
    pub fn lease(&self, mac: &str, ip: &str, host: &str) {
        let mut text = std::fs::read_to_string(&self.leases).unwrap_or_default();
        text.push_str(&format!("4102444800 {mac} {ip} {host} *\n"));
        std::fs::write(&self.leases, text).expect("lease file");
    }

    /// A machine's directory.
    pub fn machine_dir(&self, uid: &str) -> PathBuf {
        self.state_dir.join(uid)
    }

    /// A machine's `state.json`, if it exists.
    pub fn state(&self, uid: &str) -> Option<Value> {
        let text = std::fs::read(self.machine_dir(uid).join("state.json")).ok()?;
        serde_json::from_slice(&text).ok()
    }

    /// Pids of live VMMs serving `uid`'s socket (any process whose command line names it).
    pub fn vmm_pids(&self, uid: &str) -> Vec<u32> {
        let socket = self.machine_dir(uid).join("api.sock");
        vmm_pids_for(&socket.to_string_lossy())
    }

    /// Pids of every live VMM under the state directory.
    pub fn all_vmm_pids(&self) -> Vec<u32> {
        vmm_pids_for(&self.state_dir.to_string_lossy())
    }

    /// Every exchange the fake VMMs recorded (empty with a real binary).
    pub fn exchanges(&self) -> Vec<Value> {
        let Some(record) = &self.record else {
            return Vec::new();
        };
        std::fs::read_to_string(record)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).expect("an exchange line"))
            .collect()
    }

    /// The operations (`vm.create`, ...) sent to `uid`'s VMMs, in order.
    pub fn operations(&self, uid: &str) -> Vec<String> {
        let socket = self.machine_dir(uid).join("api.sock");
        self.exchanges()
            .into_iter()
            .filter(|e| e["socket"].as_str() == Some(&*socket.to_string_lossy()))
            .filter_map(|e| {
                e["path"]
                    .as_str()
                    .map(|p| p.trim_start_matches("/api/v1/").to_owned())
            })
            .collect()
    }

    /// Panics listing every exchange that broke the OpenAPI document.
    pub fn assert_conformant(&self) {
        let bad: Vec<Value> = self
            .exchanges()
            .into_iter()
            .filter(|e| e["violations"].as_array().is_some_and(|v| !v.is_empty()))
            .collect();
        assert!(bad.is_empty(), "OpenAPI violations: {bad:#?}");
    }
}

/// The rig's VMMs go with it: its directory (their disks and sockets) is removed, and
/// a VMM left running would outlive the test process, holding whatever it inherited
/// (e.g. the fd of `flock /tmp/banlieue-libvirt.lock`, so the next `flock` waits for
/// ever).
impl Drop for ChRig {
    fn drop(&mut self) {
        for pid in self.all_vmm_pids() {
            // Not `kill`: that asserts, and this may run while a test panics.
            let _ = std::process::Command::new("kill")
                .args(["-9", &pid.to_string()])
                .status();
        }
    }
}

/// Kills a process (SIGKILL), as an outsider would.
pub fn kill(pid: u32) {
    let status = std::process::Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .expect("kill");
    assert!(status.success(), "kill -9 {pid}");
}

fn chmod_x(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let mut perms = std::fs::metadata(path).expect("stat").permissions();
    perms.set_mode(0o755);
    std::fs::set_permissions(path, perms).expect("chmod");
}

fn vmm_pids_for(needle: &str) -> Vec<u32> {
    let mut pids = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return pids;
    };
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
        let zombie = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_none_or(|s| s == "Z" || s == "X");
        if zombie {
            continue;
        }
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline);
        // The wrapper execs the fake, so one process per VMM carries `--api-socket`.
        if cmdline.contains("--api-socket") && cmdline.contains(needle) {
            pids.push(pid);
        }
    }
    pids
}
