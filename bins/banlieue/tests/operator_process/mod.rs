//! `banlieue run` as a child process for the hostile-input and secrets suites: its
//! whole output in a log file (to grep for panics and leaked secrets), `/readyz` on
//! a free loopback port. (Test binaries using it declare `mod common;` too.)

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::{free_port, readyz};

/// A running operator, killed on drop.
pub struct OperatorProcess {
    child: Child,
    health: u16,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl OperatorProcess {
    /// Starts `banlieue run` for `namespace` with every backend compiled in, debug
    /// logging (the more it logs, the more a leak would show) and a short sync period,
    /// and waits until `/readyz` answers 200.
    pub async fn start(namespace: &str) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = dir.path().join("operator.log");
        let health = free_port();
        let file = std::fs::File::create(&log).expect("log file");
        let child = Command::new(env!("CARGO_BIN_EXE_banlieue"))
            .args(["run", "--log-format", "json", "--log-level", "debug"])
            .args([
                "--kubeconfig",
                banlieue_testenv::kubeconfig_path()
                    .to_str()
                    .expect("UTF-8 path"),
            ])
            .args(["--namespace", namespace, "--sync-period", "15s"])
            .args(["--health-addr", &format!("127.0.0.1:{health}")])
            .args(["--diagnostics-address", "0"])
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(file.try_clone().expect("log file"))
            .stderr(file)
            .spawn()
            .expect("starting banlieue run");
        let operator = Self {
            child,
            health,
            log,
            _dir: dir,
        };
        let started = Instant::now();
        while operator.readyz().await != Some(200) {
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "the operator never became ready; its log:\n{}",
                operator.log_text()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        operator
    }

    /// The status code of `GET /readyz`, or `None` when nothing answers.
    pub async fn readyz(&self) -> Option<u16> {
        readyz(self.health).await.map(|(code, _)| code)
    }

    /// Everything the operator wrote so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Where the log is.
    #[allow(dead_code)] // the secrets suite reports it
    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// Asserts the operator is alive, still answers `/readyz` 200, and never panicked.
    pub async fn assert_healthy(&mut self) {
        if let Some(status) = self.child.try_wait().expect("try_wait") {
            panic!(
                "the operator exited ({status}); its log:\n{}",
                tail(&self.log_text())
            );
        }
        assert_eq!(
            self.readyz().await,
            Some(200),
            "the operator stopped serving /readyz"
        );
        let log = self.log_text();
        let panics: Vec<&str> = log.lines().filter(|l| l.contains("panicked")).collect();
        assert!(
            panics.is_empty(),
            "the operator panicked:\n{}",
            panics.join("\n")
        );
    }
}

fn tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

impl Drop for OperatorProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
