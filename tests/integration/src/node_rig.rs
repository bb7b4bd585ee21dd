//! The real node rig: a single-node Kubernetes cluster (etcd, kube-apiserver,
//! kube-controller-manager, kube-scheduler, containerd + runc, the kubelet and
//! kube-proxy) run by `tests/testbin/node/rig.sh` in network, mount and PID namespaces
//! this test run creates. The node is `rig-node` with the IP 10.200.0.1 on a dummy
//! device inside the network namespace, Pods get 10.244.0.0/24 on a CNI bridge there,
//! Services 10.96.0.0/24. Nothing in the namespaces has a link out: the cluster can
//! reach no other machine, and binds nothing on the host's addresses.
//!
//! The test process reaches the apiserver through the file system only: `rig.sh` serves
//! `<state>/apiserver.sock` (socat to the apiserver inside the namespace), and
//! [`NodeRig`] proxies a TCP port on the host's 127.0.0.1 to it, for
//! [`NodeRig::client`] and the kubeconfig [`NodeRig::kubeconfig_path`] (admin, for
//! kubectl or clusterctl). Images are OCI archives imported into containerd with
//! [`NodeRig::import_image`]; Pods use `imagePullPolicy: Never` or `IfNotPresent`
//! (there is no registry, and no network to reach one).
//!
//! Binaries: the Kubernetes ones from `KUBEBUILDER_ASSETS` (`tests/testbin/build.sh`),
//! the pause image (containerd's sandbox image, `docker.io/local/pause:1`) and the
//! Debian packages from `tests/testbin/node/build.sh`.
//!
//! Teardown ([`NodeRig::stop`], or drop): the lifeline pipe closes, `rig.sh` stops the
//! components, kills what is left in its PID namespace and removes the kubelet's cgroup
//! root; then the process group gets SIGKILL as a backstop, and the rig checks that no
//! process of it, no mount under its directory, no cgroup of it and none of its
//! namespaces is left before removing its directory.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::config::{KubeConfigOptions, Kubeconfig};

/// The node's name (`--hostname-override`).
pub const NODE_NAME: &str = "rig-node";
/// The node's IP, on a dummy device inside the rig's network namespace.
pub const NODE_IP: &str = "10.200.0.1";
/// The sandbox image every Pod's pause container runs; also a do-nothing container image.
pub const PAUSE_IMAGE: &str = "docker.io/local/pause:1";
/// The CNI bridge inside the rig's network namespace (it must never appear on the host).
pub const BRIDGE: &str = "rigbr0";

/// The Kubernetes binaries the rig runs, all from one directory.
const BINARIES: [&str; 7] = [
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubelet",
    "kube-proxy",
    "kubectl",
];
/// The components' logs (`<state>/<name>.log`), for failure messages.
const COMPONENTS: [&str; 8] = [
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "containerd",
    "kubelet",
    "kube-proxy",
    "apiserver-socket",
];

/// How long the steps of [`NodeRig::start`] took.
#[derive(Clone, Copy, Debug, Default)]
pub struct Timings {
    /// `tests/testbin/node/build.sh` (packages and the pause image; a stat when warm).
    pub build: Duration,
    /// Spawning the namespaces until `rig.sh` reported every component started (the
    /// apiserver answering).
    pub started: Duration,
    /// Spawning the namespaces until the Node was Ready.
    pub node_ready: Duration,
}

/// A running node rig; torn down by [`NodeRig::stop`] or on drop.
pub struct NodeRig {
    /// The directory everything of the rig lives in (removed on teardown).
    dir: PathBuf,
    /// `<dir>/state`: certificates, kubeconfigs, data, logs (`<component>.log`).
    state: PathBuf,
    kubeconfig: PathBuf,
    cgroup_root: String,
    child: Option<Child>,
    /// The lifeline: `rig.sh` tears everything down when this pipe closes, also when
    /// this process dies without running destructors.
    lifeline: Option<ChildStdin>,
    /// The namespaces of `rig.sh` (`/proc/<pid>/ns/*` links), to check they are gone.
    namespaces: Vec<String>,
    proxy: Option<Proxy>,
    /// How long starting took.
    pub timings: Timings,
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .map(|l| l.split_whitespace().nth(2) == Some("0"))
        })
        .unwrap_or(false)
}

/// banlieue's full image, `target/image/banlieue-<version>-full.oci.tar` (written by
/// `make image`, a prerequisite of `make test`), or `None` when it is missing outside CI
/// and make (the test then skips, saying why); under CI and make a missing archive panics.
pub fn banlieue_image() -> Option<PathBuf> {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("target"));
    let archive = target.join("image").join(format!(
        "banlieue-{}-full.oci.tar",
        env!("CARGO_PKG_VERSION")
    ));
    if archive.is_file() {
        return Some(archive);
    }
    let why = format!("no image archive {} (run `make image`)", archive.display());
    assert!(
        !banlieue_testenv::rigs_required(),
        "required under CI and make: {why}"
    );
    eprintln!("SKIPPED: {why}");
    None
}

/// The directory with the Kubernetes binaries: `$KUBEBUILDER_ASSETS`, else
/// `/usr/local/kubebuilder/bin` (as envtest), when it has all of them.
pub fn binaries_dir() -> Result<PathBuf, String> {
    let dir = std::env::var_os("KUBEBUILDER_ASSETS")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/local/kubebuilder/bin"));
    let missing: Vec<&str> = BINARIES
        .into_iter()
        .filter(|name| !is_executable(&dir.join(name)))
        .collect();
    if missing.is_empty() {
        Ok(dir)
    } else {
        Err(format!(
            "{} lacks {} (KUBEBUILDER_ASSETS=$(tests/testbin/build.sh))",
            dir.display(),
            missing.join(", ")
        ))
    }
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    path.metadata()
        .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// The pause image's cache directory (`pause.tar`): runs `tests/testbin/node/build.sh`,
/// which also installs the Debian packages on first use.
pub fn pause_dir() -> Result<PathBuf, String> {
    let script = repo_root().join("tests/testbin/node/build.sh");
    let out = Command::new(&script)
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("running {}: {e}", script.display()))?;
    if !out.status.success() {
        return Err(format!("{} failed ({})", script.display(), out.status));
    }
    Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}

impl NodeRig {
    /// Starts the rig and waits for the Node to be Ready, or returns `None` when the
    /// rig cannot run here outside CI (the test then skips, saying why). Under CI or
    /// `make` ([`banlieue_testenv::rigs_required`]) a missing part panics: CI fails,
    /// never skips.
    pub async fn start() -> Option<Self> {
        let unavailable = |why: String| {
            if banlieue_testenv::rigs_required() {
                panic!("the real node rig is required under CI and make: {why}");
            }
            eprintln!("SKIPPED: real node rig unavailable: {why}");
            None
        };
        if !is_root() {
            return unavailable("needs root (namespaces, mounts, cgroups, containers)".into());
        }
        let bin = match binaries_dir() {
            Ok(bin) => bin,
            Err(e) => return unavailable(e),
        };
        let started = Instant::now();
        let pause = match pause_dir() {
            Ok(dir) => dir,
            Err(e) => return unavailable(e),
        };
        let build = started.elapsed();
        let mut rig = Self::start_with(&bin, &pause.join("pause.tar"));
        rig.timings.build = build;
        rig.wait_node_ready(Duration::from_secs(120)).await;
        Some(rig)
    }

    /// Spawns the rig from the binaries in `bin` with `pause_archive` as containerd's
    /// sandbox image and waits until `rig.sh` reports the apiserver answering (not yet
    /// the Node Ready: see [`NodeRig::wait_node_ready`]).
    pub fn start_with(bin: &Path, pause_archive: &Path) -> Self {
        sweep_stale_rigs();
        let temp = tempfile::Builder::new()
            .prefix(DIR_PREFIX)
            .tempdir()
            .expect("tempdir");
        let dir = temp.keep();
        std::fs::write(dir.join("owner"), process_identity(std::process::id()))
            .expect("owner file");
        let state = dir.join("state");
        std::fs::create_dir_all(&state).expect("state dir");
        let cgroup_root = cgroup_root_of(&dir);
        let log = std::fs::File::create(dir.join("rig.out")).expect("log");
        let mut command = Command::new("unshare");
        command
            .args([
                "--net",
                "--mount",
                "--pid",
                "--fork",
                "--mount-proc",
                "--propagation",
                "private",
                "--kill-child",
            ])
            .arg(repo_root().join("tests/testbin/node/rig.sh"))
            .arg(&state)
            .arg(bin)
            .arg(pause_archive)
            .arg(&cgroup_root)
            .stdin(Stdio::piped())
            .stdout(log.try_clone().expect("log"))
            .stderr(log);
        {
            use std::os::unix::process::CommandExt;
            command.process_group(0);
        }
        let spawned = Instant::now();
        let mut child = command.spawn().expect("starting unshare + rig.sh");
        let lifeline = child.stdin.take().expect("stdin");
        let mut rig = Self {
            kubeconfig: state.join("kubeconfig-host"),
            dir,
            state,
            cgroup_root,
            child: Some(child),
            lifeline: Some(lifeline),
            namespaces: Vec::new(),
            proxy: None,
            timings: Timings::default(),
        };
        rig.wait_started(Duration::from_secs(90));
        rig.timings.started = spawned.elapsed();
        rig.namespaces = rig.rig_namespaces();
        let proxy = Proxy::start(rig.state.join("apiserver.sock"));
        rig.write_host_kubeconfig(proxy.port);
        rig.proxy = Some(proxy);
        rig.timings.node_ready = spawned.elapsed();
        rig
    }

    fn wait_started(&mut self, timeout: Duration) {
        let started = Instant::now();
        loop {
            if self.state.join("ready").exists() {
                return;
            }
            let exited = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten());
            if let Some(status) = exited {
                panic!(
                    "the node rig exited ({status}) before it was ready\n{}",
                    self.logs()
                );
            }
            if started.elapsed() > timeout {
                panic!("the node rig was not ready in {timeout:?}\n{}", self.logs());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits for the Node [`NODE_NAME`] to be Ready; panics after `timeout` with the
    /// tail of every component's log.
    pub async fn wait_node_ready(&mut self, timeout: Duration) {
        let client = self.client().await;
        let nodes: Api<Node> = Api::all(client);
        let started = Instant::now();
        let mut last = String::from("no Node yet");
        loop {
            match nodes.get_opt(NODE_NAME).await {
                Ok(Some(node)) => {
                    let ready = node
                        .status
                        .as_ref()
                        .and_then(|s| s.conditions.as_ref())
                        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"));
                    match ready {
                        Some(c) if c.status == "True" => break,
                        Some(c) => {
                            last = format!(
                                "Ready={} {}: {}",
                                c.status,
                                c.reason.as_deref().unwrap_or(""),
                                c.message.as_deref().unwrap_or("")
                            )
                        }
                        None => last = "no Ready condition yet".into(),
                    }
                }
                Ok(None) => {}
                Err(e) => last = format!("reading the Node: {e}"),
            }
            if let Some(Some(status)) = self.child.as_mut().map(|c| c.try_wait().ok().flatten()) {
                panic!(
                    "the node rig exited ({status}) before the Node was Ready\n{}",
                    self.logs()
                );
            }
            if started.elapsed() > timeout {
                panic!(
                    "Node {NODE_NAME} was not Ready in {timeout:?} ({last})\n{}",
                    self.logs()
                );
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        // From spawning the namespaces: the time up to the ready marker, plus this wait.
        self.timings.node_ready = self.timings.started + started.elapsed();
    }

    /// The tail of `rig.sh`'s output and of every component's log.
    pub fn logs(&self) -> String {
        let mut out = String::new();
        let tail =
            |path: &Path| banlieue_testenv::log_tail(path, 30).unwrap_or_else(|e| format!("({e})"));
        out.push_str(&format!(
            "--- rig.sh\n{}\n",
            tail(&self.dir.join("rig.out"))
        ));
        for name in COMPONENTS {
            out.push_str(&format!(
                "--- {name}\n{}\n",
                tail(&self.state.join(format!("{name}.log")))
            ));
        }
        out
    }

    /// A new admin client (through the proxy), bound to the calling runtime.
    pub async fn client(&self) -> kube::Client {
        let kubeconfig = Kubeconfig::read_from(&self.kubeconfig).expect("the rig's kubeconfig");
        let config =
            kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
                .await
                .expect("the rig's kubeconfig");
        kube::Client::try_from(config).expect("a client for the rig")
    }

    /// The admin kubeconfig for the host (`https://127.0.0.1:<port>`, valid while the
    /// rig runs), for kubectl, clusterctl and the like.
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig
    }

    /// The rig's state directory (`<component>.log`, `pki/`, `kubelet/`, ...).
    pub fn state_dir(&self) -> &Path {
        &self.state
    }

    /// The apiserver's audit events so far (`<state>/audit.log`): every request made by
    /// a ServiceAccount, at the Metadata level (user, verb, objectRef, responseStatus).
    pub fn audit_events(&self) -> Vec<serde_json::Value> {
        let text = std::fs::read_to_string(self.state.join("audit.log")).unwrap_or_default();
        text.lines()
            .filter_map(|line| serde_json::from_str(line).ok())
            .collect()
    }

    /// `path` as the rig's processes see it: through `/proc/<rig.sh>/root`, in the rig's
    /// mount namespace (the kubelet's volume mounts, such as a Pod's projected
    /// ServiceAccount token, exist only there; the host sees empty mount points).
    pub fn path_in_rig(&self, path: &Path) -> PathBuf {
        let pid = self.rig_pid().expect("the rig is running");
        Path::new(&format!("/proc/{pid}/root")).join(path.strip_prefix("/").unwrap_or(path))
    }

    /// The rig's PID, network and mount namespaces (`pid:[...]`, `net:[...]`,
    /// `mnt:[...]`), which teardown checks are gone.
    pub fn namespaces(&self) -> &[String] {
        &self.namespaces
    }

    /// The kubelet's cgroup root (one cgroup name per rig, in every hierarchy).
    pub fn cgroup_root(&self) -> &str {
        &self.cgroup_root
    }

    /// The host PIDs of a container's processes, by its ID (a Pod's
    /// `status.containerStatuses[].containerID`, with or without `containerd://`):
    /// the processes whose cgroup is the container's under the rig's cgroup root.
    pub fn container_pids(&self, container_id: &str) -> Vec<u32> {
        let id = container_id
            .strip_prefix("containerd://")
            .unwrap_or(container_id);
        let root = format!("/{}/", self.cgroup_root);
        let Ok(entries) = std::fs::read_dir("/proc") else {
            return Vec::new();
        };
        let mut pids: Vec<u32> = entries
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
            .filter(|pid| {
                std::fs::read_to_string(format!("/proc/{pid}/cgroup")).is_ok_and(|cgroups| {
                    cgroups
                        .lines()
                        .any(|l| l.contains(&root) && l.trim_end().ends_with(id))
                })
            })
            .collect();
        pids.sort_unstable();
        pids
    }

    /// containerd's socket (a file, so `ctr` works from the host's network namespace).
    pub fn containerd_socket(&self) -> PathBuf {
        self.state.join("containerd.sock")
    }

    /// Imports an OCI image archive (its index names the image with
    /// `io.containerd.image.name` / `org.opencontainers.image.ref.name`) into
    /// containerd's `k8s.io` namespace, where the kubelet finds it.
    pub fn import_image(&self, archive: &Path) -> Result<(), String> {
        let out = Command::new("ctr")
            .arg("--address")
            .arg(self.containerd_socket())
            .args(["-n", "k8s.io", "images", "import"])
            .arg(archive)
            .output()
            .map_err(|e| format!("running ctr: {e}"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "ctr images import {} failed ({}): {}{}",
                archive.display(),
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ))
        }
    }

    fn write_host_kubeconfig(&self, port: u16) {
        let token = std::fs::read_to_string(self.state.join("admin-token")).expect("admin token");
        let kubeconfig = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: rig\n  cluster:\n    \
             server: https://127.0.0.1:{port}\n    certificate-authority: {ca}\n\
             users:\n- name: admin\n  user:\n    token: {token}\ncontexts:\n- name: admin@rig\n  \
             context:\n    cluster: rig\n    user: admin\ncurrent-context: admin@rig\n",
            ca = self.state.join("pki/ca.crt").display(),
            token = token.trim(),
        );
        std::fs::write(&self.kubeconfig, kubeconfig).expect("writing kubeconfig-host");
    }

    /// The rig's network namespace (`/proc/<pid>/ns/net`), for a process that plays
    /// something outside the cluster which its Pods reach at [`NODE_IP`] (a vCenter).
    /// Stop such processes before the rig.
    pub fn network_namespace(&self) -> PathBuf {
        let pid = self.rig_pid().expect("the rig is running");
        PathBuf::from(format!("/proc/{pid}/ns/net"))
    }

    /// The PID of `rig.sh` (PID 1 of the rig's PID namespace) in this PID namespace.
    fn rig_pid(&self) -> Option<u32> {
        let unshare = self.child.as_ref()?.id();
        let children =
            std::fs::read_to_string(format!("/proc/{unshare}/task/{unshare}/children")).ok()?;
        children.split_whitespace().next()?.parse().ok()
    }

    fn rig_namespaces(&self) -> Vec<String> {
        let Some(pid) = self.rig_pid() else {
            return Vec::new();
        };
        ["pid", "net", "mnt"]
            .into_iter()
            .filter_map(|ns| std::fs::read_link(format!("/proc/{pid}/ns/{ns}")).ok())
            .map(|link| link.to_string_lossy().into_owned())
            .collect()
    }

    /// Stops the rig and returns what it left behind (nothing, unless something is
    /// wrong: then its directory stays too, for a look).
    pub fn stop(mut self) -> Vec<String> {
        self.teardown()
    }

    fn teardown(&mut self) -> Vec<String> {
        let Some(mut child) = self.child.take() else {
            return Vec::new();
        };
        if let Some(proxy) = self.proxy.take() {
            proxy.stop();
        }
        let pgid = child.id();
        // Closing the lifeline makes rig.sh stop everything and remove its cgroups.
        drop(self.lifeline.take());
        let deadline = Instant::now() + Duration::from_secs(30);
        while child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        // The backstop: the process group (unshare, rig.sh and everything rig.sh started
        // that kept it), then the kernel kills the rest of the PID namespace.
        let _ = Command::new("kill")
            .args(["-KILL", "--", &format!("-{pgid}")])
            .stderr(Stdio::null())
            .status();
        let _ = child.wait();

        let deadline = Instant::now() + Duration::from_secs(15);
        let mut left = loop {
            let left = self.leftover_processes(pgid);
            if left.is_empty() || Instant::now() > deadline {
                break left;
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        left.extend(self.remove_cgroups());
        left.extend(self.leftover_mounts());
        if Path::new("/sys/class/net").join(BRIDGE).exists() {
            left.push(format!(
                "network device {BRIDGE} in the host's network namespace"
            ));
        }
        if left.is_empty() {
            if let Err(e) = std::fs::remove_dir_all(&self.dir) {
                left.push(format!("removing {}: {e}", self.dir.display()));
            }
        } else {
            eprintln!(
                "node rig: left behind (keeping {}): {left:#?}",
                self.dir.display()
            );
        }
        left
    }

    /// Processes in the rig's process group or in any of its namespaces.
    fn leftover_processes(&self, pgid: u32) -> Vec<String> {
        let mut left = Vec::new();
        let Ok(entries) = std::fs::read_dir("/proc") else {
            return left;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(pid) = name.to_str().and_then(|n| n.parse::<u32>().ok()) else {
                continue;
            };
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let comm = stat
                .split_once('(')
                .and_then(|(_, rest)| rest.rsplit_once(')'))
                .map(|(comm, _)| comm.to_owned())
                .unwrap_or_default();
            let pgrp = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(2))
                .and_then(|p| p.parse::<u32>().ok());
            if pgrp == Some(pgid) {
                left.push(format!("process {pid} ({comm}) in the rig's process group"));
                continue;
            }
            for ns in ["pid", "net", "mnt"] {
                let link = std::fs::read_link(format!("/proc/{pid}/ns/{ns}"))
                    .map(|l| l.to_string_lossy().into_owned())
                    .unwrap_or_default();
                if self.namespaces.contains(&link) {
                    left.push(format!("process {pid} ({comm}) in the rig's {link}"));
                    break;
                }
            }
        }
        left
    }

    /// Mounts under the rig's directory, or of its namespaces, in this mount namespace.
    fn leftover_mounts(&self) -> Vec<String> {
        let dir = self.dir.to_string_lossy().into_owned();
        std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap_or_default()
            .lines()
            .filter(|line| {
                line.contains(&dir) || self.namespaces.iter().any(|ns| line.contains(ns.as_str()))
            })
            .map(|line| format!("mount: {line}"))
            .collect()
    }

    /// Removes the kubelet's cgroup root (rig.sh does when it stops in order; this is
    /// the backstop) and reports what could not be removed.
    fn remove_cgroups(&self) -> Vec<String> {
        let mut left = Vec::new();
        let Ok(hierarchies) = std::fs::read_dir("/sys/fs/cgroup") else {
            return left;
        };
        for hierarchy in hierarchies.flatten() {
            let root = hierarchy.path().join(&self.cgroup_root);
            if !root.is_dir() {
                continue;
            }
            let deadline = Instant::now() + Duration::from_secs(10);
            while remove_cgroup_tree(&root).is_err() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(100));
            }
            if root.exists() {
                left.push(format!("cgroup {}", root.display()));
            }
        }
        left
    }
}

/// The rig directories' prefix, in the temporary directory.
const DIR_PREFIX: &str = "bnl-node-";

/// The kubelet's cgroup root for the rig in `dir`.
fn cgroup_root_of(dir: &Path) -> String {
    format!(
        "banlieue-{}",
        dir.file_name().expect("name").to_string_lossy()
    )
}

/// `<pid> <start time>` of a process (its start time tells a reused PID apart).
fn process_identity(pid: u32) -> String {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let start = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().nth(19))
        .unwrap_or("");
    format!("{pid} {start}")
}

/// Removes what rigs of test processes that died without their destructors (kill -9)
/// left: their directories and (empty) cgroup roots. Their lifelines closed, so their
/// namespaces are gone or going; a directory is taken once rig.sh said it stopped, or
/// after five minutes.
fn sweep_stale_rigs() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    for entry in entries.flatten() {
        let dir = entry.path();
        let is_rig = entry
            .file_name()
            .to_str()
            .is_some_and(|n| n.starts_with(DIR_PREFIX));
        let Ok(owner) = std::fs::read_to_string(dir.join("owner")) else {
            continue;
        };
        let owner_alive = owner
            .split_whitespace()
            .next()
            .and_then(|pid| pid.parse::<u32>().ok())
            .is_some_and(|pid| process_identity(pid) == owner);
        if !is_rig || owner_alive || mountinfo.contains(dir.to_string_lossy().as_ref()) {
            continue;
        }
        let stopped = std::fs::read_to_string(dir.join("rig.out")).is_ok_and(|out| {
            out.lines()
                .any(|l| l.starts_with("rig: ") && l.ends_with(" stopped"))
        });
        let old = entry
            .metadata()
            .and_then(|m| m.modified())
            .is_ok_and(|t| t.elapsed().unwrap_or_default() > Duration::from_secs(300));
        if !(stopped || old) {
            continue;
        }
        let cgroup_root = cgroup_root_of(&dir);
        if let Ok(hierarchies) = std::fs::read_dir("/sys/fs/cgroup") {
            for hierarchy in hierarchies.flatten() {
                let _ = remove_cgroup_tree(&hierarchy.path().join(&cgroup_root));
            }
        }
        eprintln!(
            "node rig: removing {} (its test process died)",
            dir.display()
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// Removes a cgroup directory and its children, deepest first (cgroup directories are
/// removed with rmdir, their files go with them).
fn remove_cgroup_tree(dir: &Path) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)?.flatten() {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            remove_cgroup_tree(&entry.path())?;
        }
    }
    std::fs::remove_dir(dir)
}

impl Drop for NodeRig {
    fn drop(&mut self) {
        self.teardown();
    }
}

/// TCP on the host's 127.0.0.1 to the apiserver's unix socket, on threads of this
/// process (nothing to leave behind).
struct Proxy {
    port: u16,
    stopping: Arc<AtomicBool>,
    streams: Arc<Mutex<Vec<TcpStream>>>,
    accept: Option<JoinHandle<()>>,
}

impl Proxy {
    fn start(socket: PathBuf) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("binding the proxy on 127.0.0.1");
        let port = listener.local_addr().expect("proxy address").port();
        let stopping = Arc::new(AtomicBool::new(false));
        let streams = Arc::new(Mutex::new(Vec::new()));
        let accept = {
            let stopping = stopping.clone();
            let streams = streams.clone();
            std::thread::spawn(move || {
                for tcp in listener.incoming() {
                    if stopping.load(Ordering::SeqCst) {
                        break;
                    }
                    let Ok(tcp) = tcp else { continue };
                    let Ok(unix) = UnixStream::connect(&socket) else {
                        continue;
                    };
                    if let Ok(clone) = tcp.try_clone() {
                        let mut streams = streams.lock().expect("streams");
                        streams.retain(|s: &TcpStream| s.peer_addr().is_ok());
                        streams.push(clone);
                    }
                    let (Ok(tcp_read), Ok(unix_write)) = (tcp.try_clone(), unix.try_clone()) else {
                        continue;
                    };
                    std::thread::spawn(move || pipe(tcp_read, unix_write));
                    std::thread::spawn(move || pipe(unix, tcp));
                }
            })
        };
        Self {
            port,
            stopping,
            streams,
            accept: Some(accept),
        }
    }

    fn stop(mut self) {
        self.stopping.store(true, Ordering::SeqCst);
        // Wake the accept loop.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
        if let Some(accept) = self.accept.take() {
            let _ = accept.join();
        }
        for stream in self.streams.lock().expect("streams").drain(..) {
            let _ = stream.shutdown(Shutdown::Both);
        }
    }
}

/// Copies one direction of a proxied connection until either side closes.
fn pipe<R: Read + Shutdownable, W: Write + Shutdownable>(mut from: R, mut to: W) {
    let _ = std::io::copy(&mut from, &mut to);
    to.shutdown_write();
    from.shutdown_read();
}

trait Shutdownable {
    fn shutdown_write(&self);
    fn shutdown_read(&self);
}

impl Shutdownable for TcpStream {
    fn shutdown_write(&self) {
        let _ = self.shutdown(Shutdown::Write);
    }
    fn shutdown_read(&self) {
        let _ = self.shutdown(Shutdown::Read);
    }
}

impl Shutdownable for UnixStream {
    fn shutdown_write(&self) {
        let _ = self.shutdown(Shutdown::Write);
    }
    fn shutdown_read(&self) {
        let _ = self.shutdown(Shutdown::Read);
    }
}
