//! fakepve (a PVE 9 API simulator from PyPI, AGPL, run as a separate process) for the
//! Proxmox backend's tests: started through `tests/testbin/fakepve/harness.py` with
//! the venv `tests/testbin/fakepve/build.sh` makes, on 127.0.0.1 with TLS.
//!
//! The harness prints one JSON line when ready (endpoint, CA, credentials) and then
//! takes one JSON command per line on stdin (faults, inspection).

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Mutex;

use serde::Deserialize;
use serde_json::{Value, json};

/// What the harness reports when it is ready.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Ready {
    /// `https://127.0.0.1:<port>`.
    pub endpoint: String,
    /// The self-signed server certificate (PEM), to use as the CA bundle.
    pub ca_pem: String,
    /// API token ID (`root@pam!banlieue`).
    #[serde(rename = "tokenID")]
    pub token_id: String,
    /// API token secret.
    pub token_secret: String,
    /// A user for ticket logins.
    pub username: String,
    /// Its password.
    pub password: String,
    /// The seeded template's VMID.
    #[serde(rename = "templateID")]
    pub template_id: u32,
    /// Cluster nodes.
    pub nodes: Vec<String>,
    /// Cluster name.
    pub cluster: String,
}

/// A running fakepve; killed on drop.
pub struct FakePve {
    /// Endpoint, CA and credentials.
    pub ready: Ready,
    child: Child,
    io: Mutex<(ChildStdin, BufReader<ChildStdout>)>,
    _dir: tempfile::TempDir,
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The venv's directory: `$BANLIEUE_FAKEPVE_VENV`, else what `build.sh` prints (it
/// creates the venv on first use). `Err` when it cannot be had.
pub fn venv() -> Result<PathBuf, String> {
    if let Ok(dir) = std::env::var("BANLIEUE_FAKEPVE_VENV") {
        return Ok(PathBuf::from(dir));
    }
    let script = repo_root().join("tests/testbin/fakepve/build.sh");
    let out = Command::new(&script)
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("running {}: {e}", script.display()))?;
    if !out.status.success() {
        return Err(format!("{} failed ({})", script.display(), out.status));
    }
    Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}

impl FakePve {
    /// Starts fakepve, or `None` when its venv cannot be built outside CI (the test
    /// then skips with a message). Under CI or `make` (`banlieue_testenv::rigs_required`) a missing venv panics: CI fails,
    /// never skips.
    pub fn start() -> Option<Self> {
        let venv = match venv() {
            Ok(v) => v,
            Err(e) if banlieue_testenv::rigs_required() => {
                panic!("fakepve is required under CI and make: {e}")
            }
            Err(e) => {
                eprintln!("SKIPPED: fakepve unavailable: {e}");
                return None;
            }
        };
        Some(Self::start_with(&venv))
    }

    /// Starts the harness with the venv at `venv`.
    pub fn start_with(venv: &Path) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let harness = repo_root().join("tests/testbin/fakepve/harness.py");
        let mut command = Command::new(venv.join("bin/python"));
        command
            .arg(&harness)
            .arg("--dir")
            .arg(dir.path())
            .args(["--port", "0", "--time-scale", "0.01"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        #[cfg(unix)]
        {
            use std::os::unix::process::CommandExt;
            command.process_group(0);
        }
        let mut child = command.spawn().expect("starting fakepve's harness");
        let stdin = child.stdin.take().expect("stdin");
        let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
        let mut line = String::new();
        stdout
            .read_line(&mut line)
            .expect("reading fakepve's ready line");
        let ready: Ready = serde_json::from_str(&line)
            .unwrap_or_else(|e| panic!("fakepve's ready line {line:?}: {e}"));
        Self {
            ready,
            child,
            io: Mutex::new((stdin, stdout)),
            _dir: dir,
        }
    }

    /// Sends one command and returns the answer; panics when the harness reports an error.
    pub fn command(&self, command: Value) -> Value {
        let mut io = self.io.lock().unwrap_or_else(|e| e.into_inner());
        writeln!(io.0, "{command}").expect("writing to fakepve");
        io.0.flush().expect("flush");
        let mut line = String::new();
        io.1.read_line(&mut line).expect("reading from fakepve");
        let answer: Value = serde_json::from_str(&line).expect("fakepve's answer");
        assert_eq!(
            answer["ok"], true,
            "fakepve command {command} failed: {answer}"
        );
        answer
    }

    /// Every VM (template included): vmid, name, node, status, lock, template, config.
    pub fn vms(&self) -> Vec<Value> {
        self.command(json!({"cmd": "vms"}))["vms"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    /// The non-template VMs.
    pub fn machines(&self) -> Vec<Value> {
        self.vms()
            .into_iter()
            .filter(|v| v["template"] != true)
            .collect()
    }

    /// Leaves VM `vmid` locked with `lock` (e.g. `backup`).
    pub fn lock(&self, vmid: u64, lock: &str) {
        self.command(json!({"cmd": "lock", "vmid": vmid, "lock": lock}));
    }

    /// Clears the VM's lock.
    pub fn unlock(&self, vmid: u64) {
        self.command(json!({"cmd": "unlock", "vmid": vmid}));
    }

    /// Another task holds the VM's config lock for `secs` PVE seconds (`None`: until released).
    pub fn hold_config_lock(&self, vmid: u64, secs: Option<f64>) {
        self.command(json!({"cmd": "hold_config_lock", "vmid": vmid, "secs": secs}));
    }

    /// Releases a lock taken by [`FakePve::hold_config_lock`].
    pub fn release_config_lock(&self, vmid: u64) {
        self.command(json!({"cmd": "release_config_lock", "vmid": vmid}));
    }

    /// Answers the next `times` requests `method …suffix` with HTTP `status` and `message`.
    pub fn fail(&self, method: &str, suffix: &str, status: u16, message: &str, times: Option<u32>) {
        self.command(json!({"cmd": "fail", "method": method, "suffix": suffix,
                            "status": status, "message": message, "times": times}));
    }

    /// The next clone task ends with `TASK ERROR: <message>`.
    pub fn fail_next_clone(&self, message: &str) {
        self.command(json!({"cmd": "fail_next_clone", "message": message}));
    }

    /// Each clone copies for `secs` real seconds from now on (0: at once).
    pub fn clone_delay(&self, secs: f64) {
        self.command(json!({"cmd": "clone_delay", "secs": secs}));
    }

    /// Clone copies running now, and the most at once so far (counted inside fakepve's
    /// clone task).
    pub fn clones(&self) -> (u64, u64) {
        let answer = self.command(json!({"cmd": "clones"}));
        (
            answer["running"]
                .as_u64()
                .expect("running from the harness"),
            answer["peak"].as_u64().expect("peak from the harness"),
        )
    }

    /// Loses (or regains) quorum.
    pub fn quorum(&self, quorate: bool) {
        let cmd = if quorate {
            "regain_quorum"
        } else {
            "lose_quorum"
        };
        self.command(json!({"cmd": cmd}));
    }

    /// Invalidates every login ticket.
    pub fn revoke_tickets(&self) {
        self.command(json!({"cmd": "revoke_tickets"}));
    }

    /// Files uploaded to storages, by file name: `(storage, content type, bytes)`.
    pub fn uploads(&self) -> std::collections::BTreeMap<String, (String, String, Vec<u8>)> {
        use base64::Engine;
        let answer = self.command(json!({"cmd": "uploads"}));
        answer["uploads"]
            .as_object()
            .into_iter()
            .flatten()
            .map(|(name, u)| {
                let data = base64::engine::general_purpose::STANDARD
                    .decode(u["data"].as_str().unwrap_or_default())
                    .expect("base64 from the harness");
                let text = |k: &str| u[k].as_str().unwrap_or_default().to_string();
                (name.clone(), (text("storage"), text("content"), data))
            })
            .collect()
    }

    /// The ISO files on each storage.
    pub fn isos(&self) -> std::collections::BTreeMap<String, Vec<String>> {
        serde_json::from_value(self.command(json!({"cmd": "isos"}))["isos"].clone())
            .expect("isos from the harness")
    }

    /// Requests seen from index `since`: `([method, path]…, next index)`.
    pub fn requests(&self, since: usize) -> (Vec<(String, String)>, usize) {
        let answer = self.command(json!({"cmd": "requests", "since": since}));
        let list = answer["requests"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|r| Some((r[0].as_str()?.to_string(), r[1].as_str()?.to_string())))
            .collect();
        (list, answer["next"].as_u64().unwrap_or_default() as usize)
    }
}

impl Drop for FakePve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
