//! vcsim (govmomi's vCenter simulator, run as a separate process) for the vSphere
//! backend's tests: the project-owned `tests/testbin/vcsim/main.go`, built by
//! `tests/testbin/vcsim/build.sh`, on 127.0.0.1 with TLS.
//!
//! The harness prints one JSON line when ready (endpoint, CA, credentials, template)
//! and then takes one JSON command per line on stdin (faults, inspection).

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
    /// The CA (PEM) that signed the server's certificate.
    pub ca_pem: String,
    /// The user vcsim accepts.
    pub username: String,
    /// Its password.
    pub password: String,
    /// The seeded template's inventory path (it has a snapshot, for linked clones).
    pub template: String,
    /// The datacenter.
    pub datacenter: String,
    /// Its compute clusters.
    pub clusters: Vec<String>,
    /// `about.fullName`.
    pub version: String,
}

/// A running vcsim; killed on drop.
pub struct Vcsim {
    /// Endpoint, CA, credentials and inventory names.
    pub ready: Ready,
    child: Child,
    io: Mutex<(ChildStdin, BufReader<ChildStdout>)>,
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The vcsim binary: `$BANLIEUE_VCSIM`, else what `build.sh` prints (it builds on
/// first use). `Err` when it cannot be had.
pub fn binary() -> Result<PathBuf, String> {
    if let Ok(path) = std::env::var("BANLIEUE_VCSIM") {
        return Ok(PathBuf::from(path));
    }
    let script = repo_root().join("tests/testbin/vcsim/build.sh");
    let out = Command::new(&script)
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("running {}: {e}", script.display()))?;
    if !out.status.success() {
        return Err(format!("{} failed ({})", script.display(), out.status));
    }
    Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}

/// [`binary`], or `None` after a loud skip; under CI or `make` a missing vcsim panics.
fn binary_or_skip() -> Option<PathBuf> {
    match binary() {
        Ok(b) => Some(b),
        Err(e) if banlieue_testenv::rigs_required() => {
            panic!("vcsim is required under CI and make: {e}")
        }
        Err(e) => {
            eprintln!("SKIPPED: vcsim unavailable: {e}");
            None
        }
    }
}

impl Vcsim {
    /// Starts vcsim, or `None` when it cannot be built outside CI (the test then skips
    /// with a message). Under CI or `make` (`banlieue_testenv::rigs_required`) a missing vcsim panics: CI fails, never skips.
    pub fn start() -> Option<Self> {
        Self::start_args(&[])
    }

    /// Like [`Vcsim::start`], with extra flags (`-clusters N`, `-ip-prefix 10.78`).
    pub fn start_args(args: &[&str]) -> Option<Self> {
        let binary = binary_or_skip()?;
        Some(Self::start_with(&binary, args))
    }

    /// Like [`Vcsim::start_args`], but inside the network namespace `netns` (a
    /// `/proc/<pid>/ns/net`, e.g. a node rig's), serving on `ip` there: a vCenter
    /// outside the cluster that its Pods reach.
    pub fn start_in_network_namespace(netns: &Path, ip: &str, args: &[&str]) -> Option<Self> {
        let binary = binary_or_skip()?;
        let mut command = Command::new("nsenter");
        command
            .arg(format!("--net={}", netns.display()))
            .arg("--")
            .arg(&binary)
            .args(["-listen", &format!("{ip}:0")])
            .args(args);
        Some(Self::spawn(command))
    }

    /// Starts the binary at `binary`.
    pub fn start_with(binary: &Path, args: &[&str]) -> Self {
        let mut command = Command::new(binary);
        command.args(args);
        Self::spawn(command)
    }

    fn spawn(mut command: Command) -> Self {
        command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        #[cfg(unix)]
        {
            use std::os::unix::process::CommandExt;
            command.process_group(0);
        }
        let mut child = command.spawn().expect("starting vcsim");
        let stdin = child.stdin.take().expect("stdin");
        let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
        let mut line = String::new();
        stdout
            .read_line(&mut line)
            .expect("reading vcsim's ready line");
        let ready: Ready = serde_json::from_str(&line)
            .unwrap_or_else(|e| panic!("vcsim's ready line {line:?}: {e}"));
        Self {
            ready,
            child,
            io: Mutex::new((stdin, stdout)),
        }
    }

    /// Sends one command and returns the answer; panics when the harness reports an error.
    pub fn command(&self, command: Value) -> Value {
        let answer = self.answer(&command);
        assert_eq!(
            answer["ok"], true,
            "vcsim command {command} failed: {answer}"
        );
        answer
    }

    fn answer(&self, command: &Value) -> Value {
        let mut io = self.io.lock().unwrap_or_else(|e| e.into_inner());
        writeln!(io.0, "{command}").expect("writing to vcsim");
        io.0.flush().expect("flush");
        let mut line = String::new();
        io.1.read_line(&mut line).expect("reading from vcsim");
        serde_json::from_str(&line).expect("vcsim's answer")
    }

    /// Every VM (the template included): name, moref, biosUUID, instanceUUID, power, template,
    /// cpus, memoryMB, extraConfig, ip, pool, nics, diskKB, disksKB, diskFiles (each
    /// disk's `[ds] path`), diskPaths (where each is on this host).
    pub fn vms(&self) -> Vec<Value> {
        let command = json!({"cmd": "vms"});
        // The listing reads each VM's properties after finding it: a VM destroyed in
        // between fails the read. Look again, a few times.
        for _ in 0..10 {
            let answer = self.answer(&command);
            if answer["ok"] == true {
                return answer["vms"].as_array().cloned().unwrap_or_default();
            }
            if !answer["error"]
                .as_str()
                .is_some_and(|e| e.contains("already been deleted"))
            {
                panic!("vcsim command {command} failed: {answer}");
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        self.command(command)["vms"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    /// Where the first disk (its descriptor) of `vm` (one of [`Vcsim::vms`]) is on this
    /// host: vcsim keeps datastores in local directories, which `qemu-img` reads.
    pub fn disk_path(&self, vm: &Value) -> PathBuf {
        let path = vm["diskPaths"][0].as_str().unwrap_or_default();
        assert!(!path.is_empty(), "vcsim knows no disk path for {vm}");
        PathBuf::from(path)
    }

    /// The VM named `name`, if any.
    pub fn vm(&self, name: &str) -> Option<Value> {
        self.vms().into_iter().find(|v| v["name"] == name)
    }

    /// The vCenter sessions (the harness's own left out): `{key, userName}`.
    pub fn sessions(&self) -> Vec<Value> {
        self.command(json!({"cmd": "sessions"}))["sessions"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    /// Ends every session (as an expiry would); returns how many.
    pub fn terminate_sessions(&self) -> u64 {
        self.command(json!({"cmd": "terminate_sessions"}))["terminated"]
            .as_u64()
            .unwrap_or_default()
    }

    /// The next `times` calls of the VM task method `method` (e.g. `CloneVM_Task`)
    /// start a task that fails with `message`.
    pub fn fail_task(&self, method: &str, message: &str, times: u32) {
        self.command(
            json!({"cmd": "fail_task", "method": method, "message": message, "times": times}),
        );
    }

    /// The next `times` calls of `method` get a SOAP fault (SystemError) with `message`.
    pub fn fail(&self, method: &str, message: &str, times: u32) {
        self.command(json!({"cmd": "fail", "method": method, "message": message, "times": times}));
    }

    /// How often `method` was called (the harness's own calls included).
    pub fn calls(&self, method: &str) -> u64 {
        self.command(json!({"cmd": "calls"}))["calls"][method]
            .as_u64()
            .unwrap_or_default()
    }

    /// Every task waits `ms` milliseconds before it runs (clones stay in flight).
    pub fn task_delay(&self, ms: u64) {
        self.command(json!({"cmd": "task_delay", "ms": ms}));
    }

    /// Forgets injected faults.
    pub fn clear_faults(&self) {
        self.command(json!({"cmd": "clear_faults"}));
    }
}

impl Vcsim {
    /// The vcsim process: stopped (`SIGSTOP`) it is a vCenter that stopped answering.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Vcsim {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
