//! Running `banlieue run` as a real process against the shared test control plane, and
//! killing it the way a node failure or the OOM killer does.

#![allow(dead_code)] // each test binary uses a different part

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use banlieue_sdk::api::VirtualMachine;
use banlieue_sdk::conditions;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// How long a test waits for convergence.
pub const WAIT: Duration = Duration::from_secs(120);

/// Lease timing short enough for a test.
pub const LEADER_FLAGS: &[&str] = &[
    "--leader-elect",
    "--leader-elect-lease-duration",
    "4s",
    "--leader-elect-renew-deadline",
    "3s",
    "--leader-elect-retry-period",
    "500ms",
];

/// One `banlieue run` process; SIGKILLed on drop.
pub struct Replica {
    pub child: Child,
    /// The port of its `/readyz`.
    pub health: u16,
}

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A free loopback port.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Starts `banlieue run` for `namespace`, logging JSON to `log` (appended to, so a
/// restarted operator's log follows its predecessor's), with `extra` flags.
pub fn start(namespace: &str, log: &std::path::Path, extra: &[&str]) -> Replica {
    spawn(namespace, log, "0", extra)
}

/// [`start`] with the diagnostics server on a free loopback port (secure unless `extra`
/// says `--insecure-diagnostics`); returns that port too.
pub fn start_with_diagnostics(
    namespace: &str,
    log: &std::path::Path,
    extra: &[&str],
) -> (Replica, u16) {
    let port = free_port();
    let replica = spawn(namespace, log, &format!("127.0.0.1:{port}"), extra);
    (replica, port)
}

fn spawn(namespace: &str, log: &std::path::Path, diagnostics: &str, extra: &[&str]) -> Replica {
    let health = free_port();
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_banlieue"))
        .args(["run", "--log-format", "json"])
        .args([
            "--kubeconfig",
            banlieue_testenv::kubeconfig_path().to_str().unwrap(),
        ])
        .args(["--namespace", namespace, "--sync-period", "30s"])
        // Used only with --leader-elect: the Lease lives in the test's namespace.
        .args(["--leader-election-namespace", namespace])
        .args([
            "--health-addr",
            &format!("127.0.0.1:{health}"),
            "--diagnostics-address",
            diagnostics,
        ])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    Replica { child, health }
}

/// SIGKILL (what `Child::kill` sends on Unix): no chance to clean up or release a Lease.
pub fn kill_9(replica: &mut Replica) {
    replica.child.kill().unwrap();
    replica.child.wait().unwrap();
}

/// The status code and body of `GET /readyz`, or None when nothing answers.
pub async fn readyz(port: u16) -> Option<(u16, String)> {
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .ok()?;
    stream
        .write_all(b"GET /readyz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .await
        .ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await.ok()?;
    let code = response.split_whitespace().nth(1)?.parse().ok()?;
    let body = response.split("\r\n\r\n").nth(1).unwrap_or_default();
    Some((code, body.trim().to_owned()))
}

/// Which replicas lead: `/readyz` says `ok` (a standby is ready too, and says
/// `standby: ...`).
pub async fn leaders(replicas: &[&Replica]) -> Vec<bool> {
    let mut out = Vec::new();
    for r in replicas {
        out.push(
            readyz(r.health)
                .await
                .is_some_and(|(code, body)| code == 200 && body == "ok"),
        );
    }
    out
}

/// Waits until [`leaders`] returns `want`.
pub async fn wait_for_leaders(replicas: &[&Replica], want: &[bool]) {
    let started = Instant::now();
    loop {
        let now = leaders(replicas).await;
        if now == want {
            return;
        }
        assert!(
            started.elapsed() < WAIT,
            "readyz of the replicas: {now:?}, want {want:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Whether the VM's `Ready` condition is true.
pub fn is_ready(vm: &VirtualMachine) -> bool {
    vm.status
        .as_ref()
        .is_some_and(|s| conditions::is_true(&s.conditions, "Ready"))
}

/// The last lines of an operator log, for failure messages.
pub fn tail(log: &std::path::Path) -> String {
    banlieue_testenv::log_tail(log, 30).unwrap_or_else(|e| format!("({e})"))
}
