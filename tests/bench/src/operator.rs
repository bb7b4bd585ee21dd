//! The operator under test: `banlieue run` as a child process, killed on drop.

use std::fs::File;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

/// A running `banlieue run`.
#[derive(Debug)]
pub struct Operator {
    child: Child,
    health: SocketAddr,
    diagnostics: SocketAddr,
    log: PathBuf,
}

impl Operator {
    /// Starts `binary run` against `kubeconfig`, probes and metrics on free loopback ports,
    /// output to `log`, with `extra` flags appended. `BANLIEUE_*` variables are removed so
    /// that only the flags configure it.
    pub fn spawn(
        binary: &Path,
        kubeconfig: &Path,
        log: &Path,
        extra: &[String],
    ) -> anyhow::Result<Self> {
        let health = free_port()?;
        let diagnostics = free_port()?;
        let file = File::create(log).with_context(|| format!("creating {}", log.display()))?;
        let mut command = Command::new(binary);
        command
            .arg("run")
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .arg(format!("--health-addr={health}"))
            .arg(format!("--diagnostics-address={diagnostics}"))
            // Loopback only, scraped by the bench itself.
            .arg("--insecure-diagnostics")
            .arg("--log-format=plain")
            .args(extra)
            .stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file);
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("BANLIEUE_") {
                command.env_remove(key);
            }
        }
        let child = command
            .spawn()
            .with_context(|| format!("starting {}", binary.display()))?;
        Ok(Self {
            child,
            health,
            diagnostics,
            log: log.to_owned(),
        })
    }

    /// The process id (for `/proc` sampling).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits until `GET /readyz` answers 200 (caches synced), or fails at `timeout`.
    pub async fn wait_ready(&mut self, timeout: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait()? {
                bail!(
                    "the operator exited early ({status}); see {}",
                    self.log.display()
                );
            }
            if let Ok(response) = http_get(self.health, "/readyz").await
                && response.starts_with("HTTP/1.1 200")
            {
                return Ok(());
            }
            if Instant::now() >= deadline {
                bail!(
                    "the operator was not ready within {timeout:?}; see {}",
                    self.log.display()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The client settings the operator logged at startup (`qps=500.0 burst=1000
    /// adaptive=true`): what it ran with, defaults included, whatever the flags said.
    pub fn client_settings(&self) -> Option<String> {
        let log = std::fs::read_to_string(&self.log).ok()?;
        let line = log.lines().find(|l| l.contains("kubernetes client"))?;
        let fields: Vec<&str> = line
            .split_whitespace()
            .filter(|f| {
                ["qps=", "burst=", "adaptive="]
                    .iter()
                    .any(|k| f.starts_with(k))
            })
            .collect();
        (!fields.is_empty()).then(|| fields.join(" "))
    }

    /// The sum of `banlieue_api_writes_total` over all controllers, as the operator
    /// counts its own writes (a cross-check of the audit log).
    pub async fn writes_total(&self) -> Option<f64> {
        Some(
            self.metric("banlieue_api_writes_total")
                .await?
                .into_iter()
                .sum(),
        )
    }

    /// The most machines the operator had being created at once on one Provider
    /// (`banlieue_creates_in_flight_peak`, the largest over Providers).
    pub async fn creates_in_flight_peak(&self) -> Option<f64> {
        self.metric("banlieue_creates_in_flight_peak{")
            .await?
            .into_iter()
            .reduce(f64::max)
    }

    /// The values of every series whose line starts with `prefix`.
    async fn metric(&self, prefix: &str) -> Option<Vec<f64>> {
        let body = http_get(self.diagnostics, "/metrics").await.ok()?;
        Some(
            body.lines()
                .filter(|l| l.starts_with(prefix))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .collect(),
        )
    }

    /// Whether the operator has exited.
    pub fn exited(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(Some(_)))
    }

    /// Stops the operator: SIGTERM (through `kill(1)`, which needs no unsafe code), then
    /// SIGKILL after `grace`.
    pub fn stop(&mut self, grace: Duration) {
        if matches!(self.child.try_wait(), Ok(Some(_))) {
            return;
        }
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A free loopback port (bound, then released).
fn free_port() -> anyhow::Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0").context("reserving a loopback port")?;
    Ok(listener.local_addr()?)
}

/// A plain `GET` over HTTP/1.1; returns the whole response (status line, headers, body).
async fn http_get(addr: SocketAddr, path: &str) -> std::io::Result<String> {
    let exchange = async {
        let mut stream = TcpStream::connect(addr).await?;
        let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await?;
        let mut response = String::new();
        stream.read_to_string(&mut response).await?;
        Ok(response)
    };
    tokio::time::timeout(Duration::from_secs(5), exchange)
        .await
        .unwrap_or_else(|_| Err(std::io::Error::other("timed out")))
}
