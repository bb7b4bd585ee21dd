//! The operator (`banlieue run`) as a child process that cannot outlive the demo.
//!
//! The child runs in its own process group, so the terminal's Ctrl-C reaches only the
//! demo, which then stops the operator in order (SIGTERM, SIGKILL after a grace period)
//! before the control plane. Dropping an [`Operator`] that is still running (an error
//! path, a panic) SIGKILLs its group; if the demo itself dies without unwinding, the
//! kernel SIGKILLs the operator (`PR_SET_PDEATHSIG`).

// `Command::pre_exec` (to set PR_SET_PDEATHSIG in the child) and `kill(2)` are unsafe FFI
// calls with no safe wrapper in std; each use carries a SAFETY comment.
#![allow(unsafe_code)]

use std::fs::File;
use std::io;
use std::net::{SocketAddr, TcpListener};
use std::os::fd::AsFd as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

use crate::signals::Signals;

/// How often readiness and exit are polled.
const POLL: Duration = Duration::from_millis(100);

/// Signals this soon after the one that started a stop are duplicates, not a second
/// Ctrl-C.
const REPEAT_WINDOW: Duration = Duration::from_secs(1);

/// Bounds one `/readyz` request.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// A running `banlieue run`, stopped (SIGKILL) on drop.
#[derive(Debug)]
pub struct Operator {
    child: Child,
    /// Where its output goes; `None` when it shares the demo's stderr.
    log: Option<PathBuf>,
    /// Its `--health-addr`.
    health: SocketAddr,
    /// Set once the child has been reaped, after which its pid must not be signalled.
    status: Option<ExitStatus>,
}

impl Operator {
    /// Starts `binary run` against `kubeconfig` with probes and metrics on free loopback
    /// ports, writing its output to `log` (created or truncated), or to the demo's stderr
    /// when `log` is `None`.
    ///
    /// Call it from the thread that lives as long as the demo (the main thread):
    /// `PR_SET_PDEATHSIG` fires when the *thread* that spawned the child exits.
    ///
    /// # Errors
    /// If no port can be reserved, the log cannot be created or the binary cannot run.
    pub fn spawn(binary: &Path, kubeconfig: &Path, log: Option<&Path>) -> anyhow::Result<Self> {
        let [health_port, metrics_port] = free_ports()?;
        let health = SocketAddr::from(([127, 0, 0, 1], health_port));
        let mut command = Command::new(binary);
        command
            .arg("run")
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .arg(format!("--health-addr={health}"))
            .arg(format!("--diagnostics-address=127.0.0.1:{metrics_port}"))
            // Loopback only, scraped by the demo itself.
            .arg("--insecure-diagnostics")
            .args(["--log-format=plain", "--sync-period=30s"])
            .stdin(Stdio::null())
            .process_group(0);
        // Every flag of `banlieue run` has a `BANLIEUE_*` variable (namespace, watch
        // filter, leader election...); the demo runs the operator as it configures it.
        // RUST_LOG still passes through.
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("BANLIEUE_") {
                command.env_remove(key);
            }
        }
        match log {
            Some(path) => {
                let file =
                    File::create(path).with_context(|| format!("creating {}", path.display()))?;
                command.stdout(file.try_clone()?).stderr(file);
            }
            None => {
                let stderr = io::stderr().as_fd().try_clone_to_owned()?;
                command.stdout(Stdio::from(stderr)).stderr(Stdio::inherit());
            }
        }
        let parent = std::process::id();
        // SAFETY: the closure runs in the forked child before exec and only makes
        // async-signal-safe system calls (prctl, getppid, getpid, kill).
        unsafe {
            command.pre_exec(move || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                    return Err(io::Error::last_os_error());
                }
                // The parent may have died between fork and prctl.
                if libc::getppid() != parent as libc::pid_t {
                    libc::kill(libc::getpid(), libc::SIGKILL);
                }
                Ok(())
            });
        }
        let child = command
            .spawn()
            .with_context(|| format!("starting {}", binary.display()))?;
        Ok(Self {
            child,
            log: log.map(Path::to_owned),
            health,
            status: None,
        })
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The log file, unless the output goes to the demo's stderr.
    pub fn log_path(&self) -> Option<&Path> {
        self.log.as_deref()
    }

    /// The probe server's address.
    pub fn health_addr(&self) -> SocketAddr {
        self.health
    }

    /// `Some(status)` once the operator has exited.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        if self.status.is_none() {
            self.status = self.child.try_wait().ok().flatten();
        }
        self.status
    }

    /// An error saying the operator exited with `status`, quoting the end of its log.
    pub fn exited_error(&self, status: ExitStatus) -> anyhow::Error {
        anyhow::anyhow!(
            "the operator exited early ({status})\n{}",
            self.log_tail(30)
        )
    }

    /// Waits until `GET /readyz` answers 200 (the controllers' caches have synced).
    ///
    /// # Errors
    /// If the operator exits first (quoting its log), or `deadline` passes.
    pub async fn wait_ready(&mut self, deadline: Instant) -> anyhow::Result<()> {
        loop {
            if let Some(status) = self.exited() {
                return Err(self.exited_error(status));
            }
            let last = match tokio::time::timeout(PROBE_TIMEOUT, readyz(self.health)).await {
                Ok(Ok(())) => return Ok(()),
                Ok(Err(e)) => e,
                Err(_) => format!("no answer within {PROBE_TIMEOUT:?}"),
            };
            if Instant::now() >= deadline {
                bail!(
                    "the operator did not get ready in time: GET http://{}/readyz: {last}\n{}",
                    self.health,
                    self.log_tail(30)
                );
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Stops the operator: SIGTERM, then SIGKILL after `grace` or at the next signal
    /// from `signals` (a second Ctrl-C, at least [`REPEAT_WINDOW`] later). Returns how it
    /// ended.
    pub async fn stop(&mut self, grace: Duration, signals: &mut Signals) -> Option<ExitStatus> {
        if let Some(status) = self.exited() {
            return Some(status);
        }
        self.signal(libc::SIGTERM);
        let deadline = Instant::now() + grace;
        loop {
            if let Some(status) = self.exited() {
                return Some(status);
            }
            if Instant::now() >= deadline {
                err!("the operator did not stop within {grace:?}: killing it");
                break;
            }
            tokio::select! {
                () = tokio::time::sleep(Duration::from_millis(20)) => {}
                name = signals.recv() => {
                    // One Ctrl-C or `timeout` can deliver a signal twice (to the process
                    // group, and forwarded by make): only a later one means "hurry".
                    if deadline - Instant::now() > grace.saturating_sub(REPEAT_WINDOW) {
                        continue;
                    }
                    err!("{name} again: killing the operator");
                    break;
                }
            }
        }
        self.kill();
        self.status
    }

    /// SIGKILLs the operator's process group and reaps it.
    fn kill(&mut self) {
        if self.exited().is_some() {
            return;
        }
        self.signal(libc::SIGKILL);
        self.status = self.child.wait().ok();
    }

    /// Sends `signal` to the operator's process group. Only called while the child is not
    /// reaped, so its pid (= the group id) cannot have been reused.
    fn signal(&self, signal: libc::c_int) {
        let Ok(pid) = libc::pid_t::try_from(self.child.id()) else {
            return;
        };
        // SAFETY: kill(2) with a negative pid signals that process group; no memory is
        // involved. The group is the unreaped child's own (`process_group(0)`).
        unsafe {
            libc::kill(-pid, signal);
        }
    }

    /// The last `lines` lines of the log, formatted for an error message.
    pub fn log_tail(&self, lines: usize) -> String {
        match &self.log {
            None => "(the operator's output went to stderr, above)".to_owned(),
            Some(path) => match banlieue_testenv::log_tail(path, lines) {
                Ok(text) if text.trim().is_empty() => format!("{} is empty", path.display()),
                Ok(text) => format!("last lines of {}:\n{text}", path.display()),
                Err(e) => format!("could not read {}: {e}", path.display()),
            },
        }
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Reserves distinct free loopback ports by binding them all at once, then releases them.
fn free_ports<const N: usize>() -> anyhow::Result<[u16; N]> {
    let listeners = (0..N)
        .map(|_| TcpListener::bind("127.0.0.1:0"))
        .collect::<Result<Vec<_>, _>>()
        .context("reserving a loopback port")?;
    let mut ports = [0; N];
    for (port, listener) in ports.iter_mut().zip(&listeners) {
        *port = listener.local_addr()?.port();
    }
    Ok(ports)
}

/// `GET /readyz` answers `200`.
async fn readyz(addr: SocketAddr) -> Result<(), String> {
    let exchange = async {
        let mut stream = TcpStream::connect(addr).await?;
        let request = format!("GET /readyz HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await?;
        let mut response = String::new();
        stream.read_to_string(&mut response).await?;
        Ok::<_, io::Error>(response)
    };
    let response = exchange.await.map_err(|e| e.to_string())?;
    let status_line = response.lines().next().unwrap_or_default();
    if status_line.split_whitespace().nth(1) == Some("200") {
        Ok(())
    } else {
        let body = response.split("\r\n\r\n").nth(1).unwrap_or_default().trim();
        Err(format!("{status_line}: {body}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tail_keeps_the_last_lines() {
        let dir = std::env::temp_dir().join(format!("banlieue-demo-tail-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("log");
        let text: String = (1..=50).map(|i| format!("line {i}\n")).collect();
        std::fs::write(&path, text).unwrap();
        assert_eq!(
            banlieue_testenv::log_tail(&path, 2).unwrap(),
            "line 49\nline 50"
        );
        assert_eq!(
            banlieue_testenv::log_tail(&path, 100)
                .unwrap()
                .lines()
                .count(),
            50
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn free_ports_are_distinct() {
        let [a, b] = free_ports().unwrap();
        assert_ne!(a, b);
    }
}
