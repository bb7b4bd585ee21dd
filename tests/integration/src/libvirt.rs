//! The libvirt test rig: a real `libvirtd` and `virtlogd` (Debian packages) run by
//! `tests/testbin/libvirt/daemons.sh` in network, mount and PID namespaces this test
//! run creates (so nothing clashes with a system libvirtd and every bridge, dnsmasq
//! and QEMU process lives and dies inside them), an isolated libvirt network with
//! DHCP (no `<forward>`: no NAT, no route out), a directory storage pool in a
//! temporary directory, and the tiny test guest (`tests/testbin/libvirt/build.sh`)
//! uploaded into it as a qcow2 volume.
//!
//! The client side is only the daemon's unix socket:
//! `qemu:///system?socket=<state>/run/libvirt-sock`.

use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

use virt::connect::Connect;
use virt::storage_vol::StorageVol;
use virt::stream::Stream;

/// The rig's network: isolated, DHCP on 192.168.150.0/24.
pub const NETWORK: &str = "bnltest";
/// The network's bridge (inside the rig's network namespace).
pub const BRIDGE: &str = "bnlbr0";
/// The rig's storage pool.
pub const POOL: &str = "bnl";
/// The guest image's volume in [`POOL`].
pub const IMAGE_VOLUME: &str = "guest.qcow2";

/// A running libvirt rig; torn down on drop (the PID namespace takes every process).
pub struct LibvirtRig {
    /// `qemu:///system?socket=...`.
    pub uri: String,
    /// The daemons' state directory (config, run, logs).
    pub state: PathBuf,
    child: Child,
    /// The lifeline: `daemons.sh` tears everything down when this pipe closes, also
    /// when this process dies without running destructors.
    _lifeline: ChildStdin,
    _dir: tempfile::TempDir,
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn in_ci() -> bool {
    banlieue_testenv::rigs_required()
}

/// The guest's cache directory (builds it, and installs the packages, on first use).
pub fn guest_dir() -> Result<PathBuf, String> {
    let script = repo_root().join("tests/testbin/libvirt/build.sh");
    let out = Command::new(&script)
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("running {}: {e}", script.display()))?;
    if !out.status.success() {
        return Err(format!("{} failed ({})", script.display(), out.status));
    }
    Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
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

impl LibvirtRig {
    /// Starts the rig, or `None` when it cannot run here outside CI (the test then
    /// skips with a message). Under CI or `make` (`banlieue_testenv::rigs_required`) a missing part panics: CI fails, never skips.
    pub fn start() -> Option<Self> {
        let unavailable = |why: String| {
            if in_ci() {
                panic!("the libvirt rig is required under CI and make: {why}");
            }
            eprintln!("SKIPPED: libvirt rig unavailable: {why}");
            None
        };
        if !is_root() {
            return unavailable("needs root (namespaces, bridges, QEMU)".into());
        }
        let guest = match guest_dir() {
            Ok(g) => g,
            Err(e) => return unavailable(e),
        };
        Some(Self::start_with(&guest))
    }

    /// Starts the daemons and sets up network, pool and image from `guest`.
    pub fn start_with(guest: &Path) -> Self {
        // libvirt prints every error to stderr by default; the tests look at results.
        virt::error::clear_error_callback();
        let dir = tempfile::Builder::new()
            .prefix("bnl-libvirt-")
            .tempdir()
            .expect("tempdir");
        let state = dir.path().join("state");
        std::fs::create_dir_all(&state).expect("state dir");
        let log = std::fs::File::create(dir.path().join("daemons.out")).expect("log");
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
            .arg(repo_root().join("tests/testbin/libvirt/daemons.sh"))
            .arg(&state)
            .stdin(Stdio::piped())
            .stdout(log.try_clone().expect("log"))
            .stderr(log);
        #[cfg(unix)]
        {
            use std::os::unix::process::CommandExt;
            command.process_group(0);
        }
        let mut child = command.spawn().expect("starting unshare + daemons.sh");
        let lifeline = child.stdin.take().expect("stdin");
        let uri = format!(
            "qemu:///system?socket={}",
            state.join("run/libvirt-sock").display()
        );
        let rig = Self {
            uri,
            state,
            child,
            _lifeline: lifeline,
            _dir: dir,
        };
        let conn = rig.wait_for_daemon(Duration::from_secs(30));
        rig.setup(&conn, guest);
        rig
    }

    fn wait_for_daemon(&self, timeout: Duration) -> Connect {
        let started = Instant::now();
        loop {
            if self.state.join("run/libvirt-sock").exists()
                && let Ok(conn) = Connect::open(Some(&self.uri))
            {
                return conn;
            }
            if started.elapsed() > timeout {
                panic!(
                    "libvirtd did not come up in {timeout:?}; daemons.out:\n{}\nlibvirtd.log:\n{}",
                    std::fs::read_to_string(self._dir.path().join("daemons.out"))
                        .unwrap_or_default(),
                    std::fs::read_to_string(self.state.join("libvirtd.log")).unwrap_or_default()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn setup(&self, conn: &Connect, guest: &Path) {
        let network = format!(
            "<network><name>{NETWORK}</name><bridge name='{BRIDGE}' stp='off' delay='0'/>\
             <ip address='192.168.150.1' netmask='255.255.255.0'><dhcp>\
             <range start='192.168.150.100' end='192.168.150.200'/></dhcp></ip></network>"
        );
        conn.create_network_xml(&network)
            .expect("creating the rig's network");
        let pool_dir = self._dir.path().join("pool");
        std::fs::create_dir_all(&pool_dir).expect("pool dir");
        let pool = conn
            .create_storage_pool_xml(
                &format!(
                    "<pool type='dir'><name>{POOL}</name><target><path>{}</path></target></pool>",
                    pool_dir.display()
                ),
                0,
            )
            .expect("creating the rig's pool");
        let image = std::fs::read(guest.join("guest.qcow2")).expect("reading the guest image");
        let vol = StorageVol::create_xml(
            &pool,
            &format!(
                "<volume><name>{IMAGE_VOLUME}</name><capacity unit='bytes'>{}</capacity>\
                 <target><format type='qcow2'/></target></volume>",
                image.len()
            ),
            0,
        )
        .expect("creating the image volume");
        let stream = Stream::new(conn, 0).expect("stream");
        vol.upload(&stream, 0, image.len() as u64, 0)
            .expect("upload");
        let mut sent = 0;
        while sent < image.len() {
            let n = stream.send(&image[sent..]).expect("sending the image");
            assert!(n > 0, "upload stream closed");
            sent += n as usize;
        }
        stream.finish().expect("finishing the upload");
        pool.refresh(0).expect("refresh");
    }

    /// A fresh connection to the rig's daemon.
    pub fn connect(&self) -> Connect {
        Connect::open(Some(&self.uri)).expect("connecting to the rig's libvirtd")
    }

    /// Every domain's `(name, uuid, active)`.
    pub fn domains(&self) -> Vec<(String, String, bool)> {
        let conn = self.connect();
        conn.list_all_domains(0)
            .expect("listing domains")
            .iter()
            .map(|d| {
                (
                    d.name().unwrap_or_default(),
                    d.uuid_string().unwrap_or_default(),
                    d.is_active().unwrap_or(false),
                )
            })
            .collect()
    }

    /// Every volume name in the rig's pool.
    pub fn volumes(&self) -> Vec<String> {
        let conn = self.connect();
        let pool = conn.lookup_storage_pool_by_name(POOL).expect("pool");
        pool.refresh(0).expect("refresh");
        let mut names = pool.list_volumes().expect("volumes");
        names.sort();
        names
    }

    /// The network's DHCP leases (JSON: MAC, IP, hostname), from the file libvirt's
    /// lease helper keeps per bridge.
    pub fn leases(&self) -> String {
        std::fs::read_to_string(self.state.join(format!("lib/dnsmasq/{BRIDGE}.status")))
            .unwrap_or_default()
    }

    /// The serial console log of domain `name` (what the guest printed).
    pub fn console(&self, name: &str) -> String {
        std::fs::read_to_string(self.state.join(format!("log/qemu/{name}-console.log")))
            .unwrap_or_default()
    }
}

impl Drop for LibvirtRig {
    fn drop(&mut self) {
        // unshare --kill-child: killing it kills the namespace's PID 1, and with it
        // libvirtd, virtlogd, dnsmasq and every QEMU.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
