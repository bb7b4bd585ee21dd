//! `copy-bench`: the throughput of `migration.strategy: CopyDisk`'s copy
//! ([`disk_copy::copy`], libvirt → Cloud Hypervisor) of a 2 GiB disk full of data,
//! against `qemu-img convert` of the same source file alone, as a ratio. Writes
//! `docs/benchmarks/copy-<date>.md`; `make bench-copy` builds and runs it.
//!
//! ```text
//! copy-bench [--fake-vmm PATH] [--runs N] [--out DIR] [--work DIR]
//! ```
//!
//! - `--fake-vmm`: the `fake-ch-vmm` bin of this package (default: next to this
//!   executable, where cargo puts both);
//! - `--runs`: timed runs of each side (default 3; the report gives medians);
//! - `--out`: where the report goes (default the repository's `docs/benchmarks`);
//! - `--work`: where the staging directory and the baseline's output go (default the
//!   system temporary directory, where the rigs keep their disks too).
//!
//! The rigs are the tests' (`tests/integration/src`): a real libvirtd + QEMU
//! ([`LibvirtRig`]) and host files with the spec-checked fake VMM ([`ChRig`]). A
//! powered-off libvirt machine is made with a 2 GiB OS disk (`diskGiB: 2`), which is
//! then filled end to end with pseudo-random bytes. Each run drops the page cache
//! first (as root), then times one side:
//!
//! - **banlieue**: `disk_copy::copy(libvirt, cloud_hypervisor, …)` with the shipped
//!   defaults into a fresh staging directory: the libvirt export (stream download of
//!   each layer, flattened with `qemu-img`), `qemu-img convert` qcow2 → raw, the Cloud
//!   Hypervisor import. Its phases are read from its [`Progress`] and the staging
//!   directory while it runs.
//! - **qemu-img**: `qemu-img convert -f qcow2 -O raw <the volume's file> <out.raw>`.
//!
//! Every result is checked with `qemu-img compare` against the source (a mismatch
//! panics); nothing else is asserted: the numbers are reported, never judged.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use banlieue_backend_cloud_hypervisor::{ChBackend, ChFactory};
use banlieue_backend_libvirt::LibvirtFactory;
use banlieue_integration_tests::cloud_hypervisor::{ChRig, Guest};
use banlieue_integration_tests::libvirt::{IMAGE_VOLUME, LibvirtRig, NETWORK, POOL};
use banlieue_sdk::api::common::{Firmware, PowerState, ProviderClass};
use banlieue_sdk::api::infra::cloud_hypervisor::CloudHypervisorMachineSpec;
use banlieue_sdk::api::infra::libvirt::{LibvirtMachineSpec, LibvirtNetworkInterface};
use banlieue_sdk::api::vm_image::{LibvirtImageSource, PoolVolume};
use banlieue_sdk::backend::{
    Backend, BackendFactory, Connection, Deletion, MachineIdentity, MachineRequest, MachineSpec,
};
use banlieue_sdk::controllers::disk_copy::{self, Progress};
use serde_json::json;

const GIB: u64 = 1 << 30;
const MIB: f64 = (1 << 20) as f64;
/// The OS disk's size (`diskGiB`).
const DISK_GIB: u32 = 2;
const SOURCE_UID: &str = "c0b1e000-0000-4000-8000-000000000000";
/// How often the phases of a copy are sampled.
const SAMPLE: Duration = Duration::from_millis(10);
const WAIT: Duration = Duration::from_secs(120);

struct Args {
    fake_vmm: PathBuf,
    runs: usize,
    out: PathBuf,
    work: Option<PathBuf>,
}

fn usage(why: &str) -> ! {
    eprintln!(
        "copy-bench: {why}\nusage: copy-bench [--fake-vmm PATH] [--runs N] [--out DIR] [--work DIR]"
    );
    std::process::exit(2);
}

fn args() -> Args {
    let here = std::env::current_exe().expect("this executable's path");
    let mut args = Args {
        fake_vmm: here.with_file_name("fake-ch-vmm"),
        runs: 3,
        out: Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/benchmarks"),
        work: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || {
            it.next()
                .unwrap_or_else(|| usage(&format!("{flag} needs a value")))
        };
        match flag.as_str() {
            "--fake-vmm" => args.fake_vmm = value().into(),
            "--runs" => {
                args.runs = value()
                    .parse()
                    .ok()
                    .filter(|n| *n > 0)
                    .unwrap_or_else(|| usage("--runs takes a positive number"));
            }
            "--out" => args.out = value().into(),
            "--work" => args.work = Some(value().into()),
            "-h" | "--help" => usage("the CopyDisk copy against qemu-img convert"),
            other => usage(&format!("unknown argument {other:?}")),
        }
    }
    if !args.fake_vmm.is_file() {
        usage(&format!(
            "the fake VMM {} is not there (build it: cargo build -p banlieue-integration-tests --bin fake-ch-vmm)",
            args.fake_vmm.display()
        ));
    }
    args
}

// ---- the two rigs' machines ----------------------------------------------------------

fn libvirt_request(uid: &str, name: &str) -> MachineRequest {
    MachineRequest {
        identity: MachineIdentity::new(uid, "bench", name),
        spec: MachineSpec::Libvirt(LibvirtMachineSpec {
            change_policy: Default::default(),
            provider_ref: None,
            provider_id: None,
            power_state: PowerState::PoweredOff,
            bootstrap: None,
            image: LibvirtImageSource {
                volume: Some(PoolVolume {
                    pool: POOL.into(),
                    name: IMAGE_VOLUME.into(),
                }),
                path: None,
                format: Default::default(),
            },
            storage_pool: POOL.into(),
            cpus: 1,
            max_cpus: None,
            cores_per_socket: None,
            max_memory_mib: None,
            memory_mib: 256,
            disk_gib: Some(DISK_GIB),
            firmware: Firmware::Bios,
            cpu_mode: Default::default(),
            additional_disks: vec![],
            network: vec![LibvirtNetworkInterface {
                network: Some(NETWORK.into()),
                ..Default::default()
            }],
        }),
        failure_domain: None,
        bootstrap: None,
        instance_id: None,
        disks_imported: false,
    }
}

/// The Cloud Hypervisor machine the copy makes: on imported disks, the source's
/// instance ID.
fn ch_request(rig: &ChRig, uid: &str) -> MachineRequest {
    let spec: CloudHypervisorMachineSpec = serde_json::from_value(json!({
        "image": rig.image, "cpus": 1, "memoryMiB": 256, "diskGiB": DISK_GIB,
        "powerState": "PoweredOff", "network": [{"macAddress": "52:54:00:c0:b1:01"}]
    }))
    .expect("the Cloud Hypervisor spec");
    MachineRequest {
        identity: MachineIdentity::new(uid, "bench", format!("dst-{}", &uid[uid.len() - 2..])),
        spec: MachineSpec::CloudHypervisor(spec),
        failure_domain: None,
        bootstrap: None,
        instance_id: Some(SOURCE_UID.into()),
        disks_imported: true,
    }
}

fn ch_backend(rig: &ChRig) -> Arc<ChBackend> {
    ChFactory::new()
        .connect_ch(&Connection {
            class: ProviderClass::CloudHypervisor,
            endpoint: rig.endpoint(),
            credentials: BTreeMap::new(),
            ca_bundle: None,
            insecure_skip_tls_verify: false,
            settings: rig.settings(),
        })
        .expect("connecting to the Cloud Hypervisor rig")
}

fn libvirt_backend(rig: &LibvirtRig) -> Arc<dyn Backend> {
    LibvirtFactory::new()
        .connect(&Connection {
            class: ProviderClass::Libvirt,
            endpoint: rig.uri.clone(),
            credentials: Default::default(),
            ca_bundle: None,
            insecure_skip_tls_verify: false,
            settings: [
                ("domainType".to_string(), "qemu".to_string()),
                ("pollInterval".to_string(), "1s".to_string()),
            ]
            .into(),
        })
        .expect("connecting to the libvirt rig")
}

async fn settle(backend: &dyn Backend, request: &MachineRequest) {
    let started = Instant::now();
    loop {
        let observed = backend.ensure(request).await.expect("ensure");
        if observed.settled_at(PowerState::PoweredOff) {
            return;
        }
        assert!(
            started.elapsed() < WAIT,
            "never settled powered off: {observed:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The file of a volume of the rig's pool (the rig shares this file system).
fn volume_path(rig: &LibvirtRig, name: &str) -> PathBuf {
    let conn = rig.connect();
    let pool = conn.lookup_storage_pool_by_name(POOL).expect("pool");
    pool.refresh(0).expect("refresh");
    let vol = pool
        .lookup_storage_vol_by_name(name)
        .unwrap_or_else(|e| panic!("volume {name}: {e}"));
    PathBuf::from(vol.path().expect("volume path"))
}

// ---- host programs and /proc ---------------------------------------------------------

fn run(program: &str, args: &[&str]) -> String {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{program} {args:?} failed ({}): {}{stdout}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

fn utf8(path: &Path) -> &str {
    path.to_str().expect("a UTF-8 path")
}

/// Panics unless the two disks hold the same bytes as the guest sees them.
fn assert_same(what: &str, a: &Path, a_format: &str, b: &Path, b_format: &str) {
    let out = Command::new("qemu-img")
        .args(["compare", "-f", a_format, "-F", b_format])
        .args([a, b])
        .output()
        .expect("qemu-img compare");
    assert!(
        out.status.success(),
        "CONTENT MISMATCH: {what}: {} ({a_format}) and {} ({b_format}) differ ({}): {}{}",
        a.display(),
        b.display(),
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("copy-bench: {what}: identical to the source");
}

/// `sync`, then (as root) `echo 3 > /proc/sys/vm/drop_caches`; whether it dropped.
fn drop_caches() -> bool {
    run("sync", &[]);
    std::fs::write("/proc/sys/vm/drop_caches", "3\n").is_ok()
}

/// Seconds a `sync` takes: what was left to write back.
fn timed_sync() -> f64 {
    let started = Instant::now();
    run("sync", &[]);
    started.elapsed().as_secs_f64()
}

fn clock_ticks() -> f64 {
    run("getconf", &["CLK_TCK"])
        .trim()
        .parse()
        .expect("getconf CLK_TCK")
}

/// `(utime + stime, cutime + cstime)` of a process from `/proc/<pid>/stat`, in ticks:
/// its own CPU and that of its children it has waited for.
fn cpu_ticks(pid: &str) -> (u64, u64) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<u64> = stat
        .rsplit_once(')')
        .map(|(_, rest)| {
            rest.split_whitespace()
                .map(|f| f.parse().unwrap_or(0))
                .collect()
        })
        .unwrap_or_default();
    let at = |i: usize| fields.get(i).copied().unwrap_or(0);
    // After the `(comm)`: state is field 3, utime 14, stime 15, cutime 16, cstime 17.
    (at(11) + at(12), at(13) + at(14))
}

/// The rig's libvirtd (its command line names the rig's state directory).
fn libvirtd_pid(rig: &LibvirtRig) -> Option<String> {
    let needle = format!("{}/libvirtd.pid", rig.state.display());
    std::fs::read_dir("/proc")
        .ok()?
        .flatten()
        .find_map(|entry| {
            let pid = entry.file_name().to_string_lossy().into_owned();
            pid.parse::<u32>().ok()?;
            let cmdline = std::fs::read(entry.path().join("cmdline")).ok()?;
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            (cmdline.contains("/usr/sbin/libvirtd") && cmdline.contains(&needle)).then_some(pid)
        })
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

fn one_minute_load() -> f64 {
    load_average()
        .split_whitespace()
        .next()
        .and_then(|l| l.parse().ok())
        .unwrap_or(f64::NAN)
}

fn proc_value(file: &str, key: &str) -> Option<String> {
    std::fs::read_to_string(file).ok()?.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        (k.trim() == key).then(|| v.trim().to_owned())
    })
}

/// The mount `path` is on: `(device, mount point, file system)`, from `/proc/mounts`.
fn mount_of(path: &Path) -> Option<(String, String, String)> {
    let path = path.canonicalize().unwrap_or_else(|_| path.to_owned());
    let mounts = std::fs::read_to_string("/proc/mounts").ok()?;
    mounts
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            Some((
                f.next()?.to_owned(),
                f.next()?.to_owned(),
                f.next()?.to_owned(),
            ))
        })
        .filter(|(_, mount, _)| path.starts_with(mount))
        .max_by_key(|(_, mount, _)| mount.len())
}

/// `vda` for `/dev/vda`: the name `/proc/partitions` and `/proc/diskstats` use.
fn device_name(device: &str) -> &str {
    device.trim_start_matches("/dev/")
}

/// `` `/dev/vda` mounted on `/` (ext4, 256 GiB, rotational=1) ``.
fn disk_of(path: &Path) -> String {
    let Some((device, mount, fs)) = mount_of(path) else {
        return "unknown".into();
    };
    let name = device_name(&device);
    let size = std::fs::read_to_string("/proc/partitions")
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() == 4 && f[3] == name).then(|| f[2].parse::<u64>().ok())?
        })
        .map_or("size unknown".into(), |kib| format!("{} GiB", kib >> 20));
    let rotational = std::fs::read_to_string(format!("/sys/block/{name}/queue/rotational"))
        .map_or("?".into(), |r| r.trim().to_owned());
    format!("`{device}` mounted on `{mount}` ({fs}, {size}, rotational={rotational})")
}

/// Bytes written to block device `name` since boot (`/proc/diskstats`, sectors of
/// 512 bytes): every writer on the machine, not only this benchmark.
fn device_written(name: &str) -> u64 {
    std::fs::read_to_string("/proc/diskstats")
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() > 9 && f[2] == name).then(|| f[9].parse::<u64>().ok())?
        })
        .map_or(0, |sectors| sectors * 512)
}

/// The page cache's `Dirty + Writeback` bytes (`/proc/meminfo`): written, not yet on disk.
fn dirty_bytes() -> u64 {
    let kib = |key| {
        proc_value("/proc/meminfo", key)
            .and_then(|v| v.trim_end_matches(" kB").parse::<u64>().ok())
            .unwrap_or(0)
    };
    (kib("Dirty") + kib("Writeback")) * 1024
}

fn vm_setting(name: &str) -> String {
    std::fs::read_to_string(format!("/proc/sys/vm/{name}"))
        .map_or("?".into(), |v| v.trim().to_owned())
}

fn qemu_img_version() -> String {
    run("qemu-img", &["--version"])
        .lines()
        .next()
        .unwrap_or_default()
        .to_owned()
}

fn libvirt_version(v: u32) -> String {
    format!("{}.{}.{}", v / 1_000_000, v / 1000 % 1000, v % 1000)
}

fn today() -> String {
    run("date", &["-u", "+%Y-%m-%d"]).trim().to_owned()
}

fn allocated(path: &Path) -> u64 {
    std::fs::metadata(path).map_or(0, |m| m.blocks() * 512)
}

fn length(path: &Path) -> u64 {
    std::fs::metadata(path).map_or(0, |m| m.len())
}

// ---- filling the source --------------------------------------------------------------

/// Writes `bytes` pseudo-random bytes (splitmix64: no zero blocks, no repeats a
/// compressor or dedup could use) to a raw file.
fn random_file(path: &Path, bytes: u64) {
    use std::io::Write;
    let mut file = std::io::BufWriter::new(std::fs::File::create(path).expect("random file"));
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut chunk = vec![0u8; 8 << 20];
    for _ in 0..bytes / chunk.len() as u64 {
        for word in chunk.chunks_exact_mut(8) {
            state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            word.copy_from_slice(&(z ^ (z >> 31)).to_le_bytes());
        }
        file.write_all(&chunk).expect("writing the random file");
    }
    file.into_inner()
        .expect("flushing the random file")
        .sync_all()
        .expect("syncing the random file");
}

// ---- one timed run of each side ------------------------------------------------------

/// The machine at one moment of a run: CPU ticks so far of this process, of the
/// children it has reaped (`qemu-img`) and of the rig's libvirtd; the page cache's
/// dirty bytes.
#[derive(Clone, Copy)]
struct Sample {
    at: Duration,
    own: u64,
    children: u64,
    libvirtd: u64,
    dirty: u64,
}

fn sample(started: Instant, libvirtd: Option<&str>) -> Sample {
    let (own, children) = cpu_ticks("self");
    Sample {
        at: started.elapsed(),
        own,
        children,
        libvirtd: libvirtd.map_or(0, |pid| {
            let (own, reaped) = cpu_ticks(pid);
            own + reaped
        }),
        dirty: dirty_bytes(),
    }
}

/// One phase of a banlieue run.
struct Phase {
    name: &'static str,
    seconds: f64,
    cpu_own: f64,
    cpu_children: f64,
    cpu_libvirtd: f64,
    /// Dirty + writeback bytes when it started, and at most during it.
    dirty_start: u64,
    dirty_peak: u64,
}

/// The order phases come in; a run shows each at most once.
const PHASES: [&str; 5] = ["check", "download", "flatten", "convert", "import"];

/// The phase a copy is in, from its [`Progress`] and its staging directory: the
/// libvirt export downloads each layer as `os.layer<i>.qcow2`, then `qemu-img
/// convert`s them into `export/os.qcow2`, which appears as that starts.
fn phase_now(progress: &Progress, export_dir: &Path) -> &'static str {
    let described = progress.describe();
    match described.split(':').next().unwrap_or_default() {
        "Exporting" if export_dir.join("os.qcow2").exists() => "flatten",
        "Exporting" => "download",
        "Converting" => "convert",
        "Importing" => "import",
        _ => "check",
    }
}

/// The phases a run went through: where each started, its peak dirty bytes.
#[derive(Default)]
struct Timeline {
    marks: Vec<(&'static str, Sample, u64)>,
}

impl Timeline {
    fn observe(&mut self, phase: &'static str, now: Sample) {
        match self.marks.last_mut() {
            Some((name, _, peak)) if *name == phase => *peak = (*peak).max(now.dirty),
            _ => self.marks.push((phase, now, now.dirty)),
        }
    }

    fn phases(&self, end: Sample, ticks: f64) -> Vec<Phase> {
        let secs = |t: u64| t as f64 / ticks;
        self.marks
            .iter()
            .enumerate()
            .map(|(i, (name, from, peak))| {
                let to = self.marks.get(i + 1).map_or(end, |m| m.1);
                Phase {
                    name,
                    seconds: to.at.saturating_sub(from.at).as_secs_f64(),
                    cpu_own: secs(to.own.saturating_sub(from.own)),
                    cpu_children: secs(to.children.saturating_sub(from.children)),
                    cpu_libvirtd: secs(to.libvirtd.saturating_sub(from.libvirtd)),
                    dirty_start: from.dirty,
                    dirty_peak: *peak,
                }
            })
            .collect()
    }
}

/// One run of the product path.
struct CopyRun {
    seconds: f64,
    sync: f64,
    phases: Vec<Phase>,
    cpu_own: f64,
    cpu_children: f64,
    cpu_libvirtd: f64,
    load: f64,
    /// Bytes the device took from the start of the run to the end of its `sync`.
    written: u64,
    /// The export's flat qcow2 and the imported raw file: length, allocated.
    exported: (u64, u64),
    imported: (u64, u64),
    /// The import took the staged raw file away (moved it) instead of copying it.
    import_moved: bool,
}

/// One run of `qemu-img convert` alone.
struct ConvertRun {
    seconds: f64,
    sync: f64,
    cpu_children: f64,
    load: f64,
    written: u64,
    dirty_peak: u64,
}

struct Bench<'a> {
    lv_rig: &'a LibvirtRig,
    lv: Arc<dyn Backend>,
    ch_rig: &'a ChRig,
    ch: Arc<ChBackend>,
    source: MachineRequest,
    source_file: PathBuf,
    work: PathBuf,
    /// The work directory's block device, as `/proc/diskstats` names it.
    device: String,
    ticks: f64,
    /// Whether every run's cache drop worked.
    dropped: bool,
}

impl Bench<'_> {
    async fn copy(&mut self, run: usize, last: bool) -> CopyRun {
        let uid = format!("c0b1e000-0000-4000-8000-0000000000{run:02}");
        let target = ch_request(self.ch_rig, &uid);
        let staging = self.work.join("staging");
        let _ = std::fs::remove_dir_all(&staging);
        std::fs::create_dir_all(&staging).expect("staging dir");
        let export_dir = staging.join("export");
        let from = self.lv.disk_transfer().expect("libvirt transfers disks");
        let to = self
            .ch
            .disk_transfer()
            .expect("Cloud Hypervisor transfers disks");
        let libvirtd = libvirtd_pid(self.lv_rig);
        let libvirtd = libvirtd.as_deref();
        self.dropped &= drop_caches();
        let load = one_minute_load();
        let written = device_written(&self.device);
        let progress = Progress::default();
        let mut timeline = Timeline::default();
        let started = Instant::now();
        let first = sample(started, libvirtd);
        timeline.observe("check", first);
        let result = {
            let copy = disk_copy::copy(
                from,
                to,
                &self.source.identity,
                &target,
                &staging,
                &progress,
            );
            let mut copy = std::pin::pin!(copy);
            let mut tick = tokio::time::interval(SAMPLE);
            loop {
                tokio::select! {
                    done = &mut copy => break done,
                    _ = tick.tick() => {
                        let phase = phase_now(&progress, &export_dir);
                        timeline.observe(phase, sample(started, libvirtd));
                    }
                }
            }
        };
        let end = sample(started, libvirtd);
        let sync = timed_sync();
        let written = device_written(&self.device).saturating_sub(written);
        let converted = result.unwrap_or_else(|e| panic!("copy run {run}: {e}"));
        assert_eq!(converted.len(), 1, "one disk: {converted:?}");
        let exported = export_dir.join("os.qcow2");
        let imported = self
            .ch_rig
            .state_dir
            .join(format!("{uid}.imported"))
            .join("disk.raw");
        let secs = |t: u64| t as f64 / self.ticks;
        let out = CopyRun {
            seconds: end.at.as_secs_f64(),
            sync,
            phases: timeline.phases(end, self.ticks),
            cpu_own: secs(end.own - first.own),
            cpu_children: secs(end.children - first.children),
            cpu_libvirtd: secs(end.libvirtd.saturating_sub(first.libvirtd)),
            load,
            written,
            exported: (length(&exported), allocated(&exported)),
            imported: (length(&imported), allocated(&imported)),
            import_moved: !converted[0].path.exists(),
        };
        eprintln!(
            "copy-bench: run {run}: banlieue copy {:.2} s ({:.0} MiB/s), then sync {:.2} s",
            out.seconds,
            throughput(out.seconds),
            out.sync
        );

        // What Cloud Hypervisor holds is the source's bytes.
        assert_same(
            &format!("run {run}: the imported disk"),
            &self.source_file,
            "qcow2",
            &imported,
            "raw",
        );
        if last {
            // Made on them: the machine's disk is the import, not the image.
            settle(&*self.ch, &target).await;
            let disk = self.ch_rig.machine_dir(&uid).join("disk.raw");
            assert_same(
                &format!("run {run}: the Cloud Hypervisor machine's disk"),
                &self.source_file,
                "qcow2",
                &disk,
                "raw",
            );
        }
        assert_eq!(
            self.ch.delete(&target.identity).await.expect("delete"),
            Deletion::Gone
        );
        std::fs::remove_dir_all(&staging).expect("removing the staging dir");
        out
    }

    fn convert(&mut self, run: usize) -> ConvertRun {
        let out_file = self.work.join("out.raw");
        let _ = std::fs::remove_file(&out_file);
        self.dropped &= drop_caches();
        let load = one_minute_load();
        let written = device_written(&self.device);
        let (_, children0) = cpu_ticks("self");
        let mut dirty_peak = 0;
        let started = Instant::now();
        let mut child = Command::new("qemu-img")
            .args(["convert", "-f", "qcow2", "-O", "raw"])
            .args([&self.source_file, &out_file])
            .spawn()
            .expect("qemu-img convert");
        let status = loop {
            if let Some(status) = child.try_wait().expect("waiting for qemu-img") {
                break status;
            }
            dirty_peak = dirty_peak.max(dirty_bytes());
            std::thread::sleep(SAMPLE);
        };
        let took = started.elapsed().as_secs_f64();
        let (_, children1) = cpu_ticks("self");
        assert!(status.success(), "qemu-img convert failed: {status}");
        let sync = timed_sync();
        let written = device_written(&self.device).saturating_sub(written);
        eprintln!(
            "copy-bench: run {run}: qemu-img convert {took:.2} s ({:.0} MiB/s), then sync {sync:.2} s",
            throughput(took)
        );
        assert_same(
            &format!("run {run}: qemu-img convert's output"),
            &self.source_file,
            "qcow2",
            &out_file,
            "raw",
        );
        std::fs::remove_file(&out_file).expect("removing out.raw");
        ConvertRun {
            seconds: took,
            sync,
            cpu_children: (children1 - children0) as f64 / self.ticks,
            load,
            written,
            dirty_peak,
        }
    }
}

// ---- the report ----------------------------------------------------------------------

fn throughput(seconds: f64) -> f64 {
    f64::from(DISK_GIB) * 1024.0 / seconds
}

fn median(mut values: Vec<f64>) -> f64 {
    values.retain(|v| !v.is_nan());
    if values.is_empty() {
        return f64::NAN;
    }
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    if values.len() % 2 == 1 {
        values[mid]
    } else {
        (values[mid - 1] + values[mid]) / 2.0
    }
}

fn mib(bytes: u64) -> String {
    format!("{:.0} MiB", bytes as f64 / MIB)
}

fn capitalized(text: &str) -> String {
    let mut chars = text.chars();
    chars
        .next()
        .map_or_else(String::new, |c| c.to_uppercase().chain(chars).collect())
}

fn mib_f(bytes: f64) -> String {
    format!("{:.0} MiB", bytes / MIB)
}

struct Setup {
    date: String,
    cpu_model: String,
    nproc: usize,
    ram: String,
    disk: String,
    kernel: String,
    dirty_limits: String,
    qemu_img: String,
    libvirt_lib: String,
    libvirt_daemon: String,
    qemu: String,
    load_start: String,
    load_end: String,
    runs: usize,
    dropped: bool,
    /// The source volume's file: length, allocated.
    source_len: u64,
    source_alloc: u64,
    export_bound: u64,
}

/// The medians of a set of runs, by phase.
struct PhaseMedians<'a>(&'a [CopyRun]);

impl PhaseMedians<'_> {
    fn of(&self, name: &str, value: impl Fn(&Phase) -> f64) -> f64 {
        median(
            self.0
                .iter()
                .filter_map(|r| r.phases.iter().find(|p| p.name == name).map(&value))
                .collect(),
        )
    }

    fn seen(&self, name: &str) -> bool {
        self.0
            .iter()
            .any(|r| r.phases.iter().any(|p| p.name == name))
    }
}

fn report(setup: &Setup, copies: &[CopyRun], converts: &[ConvertRun]) -> String {
    use std::fmt::Write;
    let m = |values: Vec<f64>| median(values);
    let copy_median = m(copies.iter().map(|r| r.seconds).collect());
    let convert_median = m(converts.iter().map(|r| r.seconds).collect());
    let ratio = convert_median / copy_median;
    let copy_durable = m(copies.iter().map(|r| r.seconds + r.sync).collect());
    let convert_durable = m(converts.iter().map(|r| r.seconds + r.sync).collect());
    let durable_ratio = convert_durable / copy_durable;
    let convert_sync = m(converts.iter().map(|r| r.sync).collect());
    let copy_written = m(copies.iter().map(|r| r.written as f64).collect());
    let convert_written = m(converts.iter().map(|r| r.written as f64).collect());
    let cpu_own = m(copies.iter().map(|r| r.cpu_own).collect());
    let cpu_children = m(copies.iter().map(|r| r.cpu_children).collect());
    let cpu_libvirtd = m(copies.iter().map(|r| r.cpu_libvirtd).collect());
    let q_cpu = m(converts.iter().map(|r| r.cpu_children).collect());
    let q_dirty = m(converts.iter().map(|r| r.dirty_peak as f64).collect());
    let phases = PhaseMedians(copies);
    // Whether the Cloud Hypervisor import moved the staged file into place (a rename on
    // the same file system) rather than copying it: then it is no pass over the data.
    let moved = copies.iter().all(|r| r.import_moved);
    let writes = if moved { "three" } else { "four" };
    let names: Vec<&str> = PHASES.into_iter().filter(|n| phases.seen(n)).collect();
    let secs = |name: &str| phases.of(name, |p| p.seconds);
    let share = |name: &str| 100.0 * secs(name) / copy_median;
    let cache = if setup.dropped {
        "dropped before every timed run (`sync; echo 3 > /proc/sys/vm/drop_caches`), for both sides"
    } else {
        "**not** dropped (not root, or `/proc/sys/vm/drop_caches` not writable): every run after the first may read the source from the page cache"
    };

    let mut s = String::new();
    let w = &mut s;
    let _ = writeln!(w, "# Copy benchmark, {}\n", setup.date);
    let _ = writeln!(
        w,
        "Generated by `make bench-copy` (`tests/integration/src/bin/copy-bench.rs`, release build): \
         the throughput of `migration.strategy: CopyDisk`'s copy of a {DISK_GIB} GiB disk full of data \
         from the libvirt rig to the Cloud Hypervisor rig, against `qemu-img convert` of the same \
         source file alone, on this machine. No number here is asserted; only the copies' content is \
         (`qemu-img compare` against the source after every run).\n"
    );
    let _ = writeln!(w, "## Summary\n");
    let _ = writeln!(
        w,
        "| | median of {} runs | throughput | median, run + `sync` | throughput |",
        setup.runs
    );
    let _ = writeln!(w, "|---|---:|---:|---:|---:|");
    let _ = writeln!(
        w,
        "| banlieue `disk_copy::copy`, libvirt → Cloud Hypervisor | {copy_median:.2} s | {:.0} MiB/s | {copy_durable:.2} s | {:.0} MiB/s |",
        throughput(copy_median),
        throughput(copy_durable)
    );
    let _ = writeln!(
        w,
        "| `qemu-img convert -f qcow2 -O raw` of the source alone | {convert_median:.2} s | {:.0} MiB/s | {convert_durable:.2} s | {:.0} MiB/s |",
        throughput(convert_median),
        throughput(convert_durable)
    );
    let _ = writeln!(
        w,
        "\n**Ratio, banlieue copy throughput / `qemu-img convert` throughput: {ratio:.2}** \
         ({durable_ratio:.2} when each side is timed until its writes are on disk, `+ sync`). \
         Throughput is the disk's {DISK_GIB} GiB ({} MiB) of guest data over the wall time; the \
         ratio is of the medians (`qemu-img`'s median seconds / banlieue's median seconds).\n",
        DISK_GIB * 1024
    );

    let _ = writeln!(w, "## Machine and versions\n");
    let _ = writeln!(
        w,
        "- CPU: {} cores (`nproc`), {}",
        setup.nproc, setup.cpu_model
    );
    let _ = writeln!(w, "- RAM: {} (`/proc/meminfo` MemTotal)", setup.ram);
    let _ = writeln!(
        w,
        "- Disk: {}; the rigs' disks, the staging directory and the baseline's output are all on it",
        setup.disk
    );
    let _ = writeln!(
        w,
        "- Kernel {}; page cache writeback limits: {}",
        setup.kernel, setup.dirty_limits
    );
    let _ = writeln!(
        w,
        "- Load average (1, 5, 15 min): {} at the start, {} at the end. The machine is shared \
         (other work's builds and tests may run beside the benchmark); each run's 1-minute load \
         is in its row.",
        setup.load_start, setup.load_end
    );
    let _ = writeln!(w, "- {}", setup.qemu_img);
    let _ = writeln!(
        w,
        "- libvirt {} (client library), libvirtd {} (the rig's daemon), QEMU {} (libvirt's \
         hypervisor version)",
        setup.libvirt_lib, setup.libvirt_daemon, setup.qemu
    );
    let _ = writeln!(w, "- Page cache: {cache}.\n");

    let _ = writeln!(w, "## What is measured\n");
    let _ = writeln!(
        w,
        "- **Source**: a powered-off libvirt machine made by the libvirt backend (`diskGiB: \
         {DISK_GIB}`, in the rig's directory pool); its OS disk is a qcow2 overlay on the rig's \
         guest image. All {DISK_GIB} GiB of it are overwritten with pseudo-random bytes (splitmix64, \
         no zero block) by `qemu-img convert -n` of a random raw file into the overlay, checked \
         with `qemu-img compare`. The overlay's file is {} long, {} allocated: the disk holds \
         {DISK_GIB} GiB of data, not a sparse hole. `export_size` bounds the export at {}.",
        mib(setup.source_len),
        mib(setup.source_alloc),
        mib(setup.export_bound)
    );
    let _ = writeln!(
        w,
        "- **banlieue**: one call of \
         `banlieue_sdk::controllers::disk_copy::copy(libvirt, cloud_hypervisor, source, target, staging, progress)`, \
         what `migration.strategy: CopyDisk` runs, with the shipped defaults, timed from the call to \
         its return. That is the staging space check; the libvirt export (each layer of the OS \
         disk downloaded over a libvirt stream in 1 MiB messages into a file that is `fsync`ed, \
         the overlay rebased onto the downloaded image, the pair flattened into one qcow2 file by \
         `qemu-img convert`); `qemu-img convert` of that file to raw, what Cloud Hypervisor imports; \
         the Cloud Hypervisor import ({}). Each run imports for a new machine UID, deleted after its check. Not timed: \
         creating the machine on the imported disk (`ensure`), done after the last run, to check \
         that disk too.",
        if moved {
            "the converted file moved into the machine's import directory, a rename on the same \
             file system"
        } else {
            "`qemu-img convert` raw → raw into the machine's import directory"
        }
    );
    let _ = writeln!(
        w,
        "- **qemu-img**: `qemu-img convert -f qcow2 -O raw <the source volume's file> <out.raw>`, the \
         same file read through its backing image as the export reads it, written next to the \
         staging directory."
    );
    let _ = writeln!(
        w,
        "- {} runs of each, alternating which side goes first. Before each timed run the previous \
         run's files are removed and the page cache is handled as said above. `+ sync` is a `sync` \
         right after the run, outside its time: the writes it left in the page cache. `qemu-img \
         convert` writes with `cache=unsafe` by default and never flushes; of banlieue's {writes} \
         writes only the stream download is `fsync`ed. `device writes` is what `/proc/diskstats` \
         counts for the disk from the start of the run to the end of its `sync`: every writer on \
         the machine, this run's bytes and file system metadata included.",
        setup.runs
    );
    let _ = writeln!(
        w,
        "- Phases of a banlieue run are sampled every {} ms from its `Progress` (`Checking staging \
         space`, `Exporting`, `Converting`, `Importing`) and its staging directory: the flatten \
         starts when `export/os.qcow2` appears. `download` is the stream download of every layer \
         (the overlay's {}, the image's few MiB) and the `rebase -u`; `flatten` the export's \
         `qemu-img convert` of the layers into one qcow2. CPU is `utime + stime` \
         (`/proc/<pid>/stat`) of this process (the stream's receiving end, the file writes), of its \
         reaped `qemu-img` children (`cutime + cstime`) and of the rig's libvirtd (the stream's \
         sending end, reading the volume). Dirty is `Dirty + Writeback` of `/proc/meminfo`: \
         written, not yet on disk.\n",
        SAMPLE.as_millis(),
        mib(setup.source_len)
    );

    let _ = writeln!(w, "## Runs\n");
    let _ = writeln!(
        w,
        "| run | banlieue | MiB/s | + sync | device writes | qemu-img convert | MiB/s | + sync | device writes | 1-min load, banlieue / qemu-img |"
    );
    let _ = writeln!(w, "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (i, (c, q)) in copies.iter().zip(converts).enumerate() {
        let _ = writeln!(
            w,
            "| {} | {:.2} s | {:.0} | {:.2} s | {} | {:.2} s | {:.0} | {:.2} s | {} | {:.2} / {:.2} |",
            i + 1,
            c.seconds,
            throughput(c.seconds),
            c.sync,
            mib(c.written),
            q.seconds,
            throughput(q.seconds),
            q.sync,
            mib(q.written),
            c.load,
            q.load
        );
    }
    let _ = writeln!(
        w,
        "| median | {copy_median:.2} s | {:.0} | {:.2} s | {} | {convert_median:.2} s | {:.0} | {convert_sync:.2} s | {} | |\n",
        throughput(copy_median),
        m(copies.iter().map(|r| r.sync).collect()),
        mib_f(copy_written),
        throughput(convert_median),
        mib_f(convert_written),
    );

    let _ = writeln!(w, "## Where banlieue's time goes\n");
    let _ = write!(w, "| run |");
    for name in &names {
        let _ = write!(w, " {name} |");
    }
    let _ = writeln!(w, " total |");
    let _ = writeln!(w, "|---:|{}---:|", "---:|".repeat(names.len()));
    for (i, c) in copies.iter().enumerate() {
        let _ = write!(w, "| {} |", i + 1);
        for name in &names {
            match c.phases.iter().find(|p| p.name == *name) {
                Some(p) => {
                    let _ = write!(w, " {:.2} s |", p.seconds);
                }
                None => {
                    let _ = write!(w, " – |");
                }
            }
        }
        let _ = writeln!(w, " {:.2} s |", c.seconds);
    }
    let _ = writeln!(
        w,
        "\nMedians over the runs, by phase, and the baseline beside them:\n"
    );
    let _ = writeln!(
        w,
        "| phase | time | share | CPU: this process | CPU: qemu-img | CPU: libvirtd | dirty at start | dirty, peak |"
    );
    let _ = writeln!(w, "|---|---:|---:|---:|---:|---:|---:|---:|");
    for name in &names {
        let _ = writeln!(
            w,
            "| {name} | {:.2} s | {:.0} % | {:.2} s | {:.2} s | {:.2} s | {} | {} |",
            secs(name),
            share(name),
            phases.of(name, |p| p.cpu_own),
            phases.of(name, |p| p.cpu_children),
            phases.of(name, |p| p.cpu_libvirtd),
            mib_f(phases.of(name, |p| p.dirty_start as f64)),
            mib_f(phases.of(name, |p| p.dirty_peak as f64)),
        );
    }
    let _ = writeln!(
        w,
        "| **banlieue, all** | {copy_median:.2} s | 100 % | {cpu_own:.2} s | {cpu_children:.2} s | {cpu_libvirtd:.2} s | | |"
    );
    let _ = writeln!(
        w,
        "| **`qemu-img convert` alone** | {convert_median:.2} s | | | {q_cpu:.2} s | | 0 MiB (dropped) | {} |\n",
        mib_f(q_dirty)
    );
    if !phases.seen("import") {
        let _ = writeln!(
            w,
            "The import never lasted one sample ({} ms): its time is in the conversion's.\n",
            SAMPLE.as_millis()
        );
    }
    let last = copies.last().expect("a run");
    let _ = writeln!(
        w,
        "Files of the last banlieue run: the export's flat qcow2 {} long ({} allocated), the \
         imported raw {} long ({} allocated).\n",
        mib(last.exported.0),
        mib(last.exported.1),
        mib(last.imported.0),
        mib(last.imported.1),
    );

    // The reading, from the medians.
    let _ = writeln!(w, "## Reading\n");
    let mut steps = vec![
        "the stream download (libvirtd reads the volume, this process writes the file and `fsync`s it)",
    ];
    if names.contains(&"flatten") {
        steps.push("the export's flatten into one qcow2");
    }
    steps.push("the conversion to raw");
    if !moved {
        steps.push("the Cloud Hypervisor import");
    }
    let count = ["once", "twice", "three times", "four times", "five times"]
        .get(steps.len() - 1)
        .copied()
        .unwrap_or("many times");
    let last_step = steps.pop().unwrap_or_default();
    let passes = format!(
        "{count} where `qemu-img convert` writes it once: {} and {last_step}, each reading the \
         whole disk and writing it again{}",
        steps.join(", "),
        if moved {
            "; the Cloud Hypervisor import moves the converted file into place (a rename on the \
             same file system, no pass over the data)"
        } else {
            ""
        }
    );
    let mut reading = format!(
        "banlieue's copy writes the disk's {DISK_GIB} GiB {passes}. The device counts {} written \
         per banlieue run against {} per `qemu-img` run (run and `sync`; other writers on the \
         machine add to both). Of banlieue's median {copy_median:.2} s, ",
        mib_f(copy_written),
        mib_f(convert_written),
    );
    let what = |name: &str| match name {
        "check" => "the staging check",
        "download" => "the stream download",
        "flatten" => "the flatten",
        "convert" => "the qcow2 → raw conversion",
        "import" => "the import",
        _ => "another phase",
    };
    let parts: Vec<String> = names
        .iter()
        .map(|name| {
            format!(
                "{} takes {:.2} s ({:.0} %)",
                what(name),
                secs(name),
                share(name)
            )
        })
        .collect();
    reading.push_str(&parts.join(", "));
    if !names.contains(&"import") {
        let _ = write!(
            reading,
            " and the import less than one sample ({} ms)",
            SAMPLE.as_millis()
        );
    }
    let pass_names: Vec<&str> = names
        .iter()
        .copied()
        .filter(|n| *n != "check" && !(moved && *n == "import"))
        .collect();
    let per_pass = pass_names.iter().map(|n| secs(n)).sum::<f64>() / pass_names.len() as f64;
    let _ = write!(
        reading,
        ". Its {} passes average {per_pass:.2} s, {:.2}× the baseline's {convert_median:.2} s, \
         so the ratio is about 1 / ({} × {:.2}) = {:.2} (measured: {ratio:.2}). ",
        pass_names.len(),
        per_pass / convert_median,
        pass_names.len(),
        per_pass / convert_median,
        convert_median / (pass_names.len() as f64 * per_pass),
    );
    let slowest = pass_names
        .iter()
        .copied()
        .max_by(|a, b| secs(a).total_cmp(&secs(b)))
        .unwrap_or("download");
    if names.contains(&"download") {
        let download = secs("download");
        let lead = if slowest == "download" {
            "The slowest pass is the stream download: it moves"
        } else {
            "The stream download moves"
        };
        let _ = write!(
            reading,
            "{lead} the overlay's {} at {:.0} MiB/s, `fsync` included, through the stream's two \
             ends, {:.2} s of CPU in this process and {:.2} s in libvirtd ({:.0} % and {:.0} % of \
             a core). ",
            mib(setup.source_len),
            setup.source_len as f64 / MIB / download,
            phases.of("download", |p| p.cpu_own),
            phases.of("download", |p| p.cpu_libvirtd),
            100.0 * phases.of("download", |p| p.cpu_own) / download,
            100.0 * phases.of("download", |p| p.cpu_libvirtd) / download,
        );
    }
    let convert = secs("convert");
    let convert_dirty = phases.of("convert", |p| p.dirty_start as f64);
    let convert_cpu = phases.of("convert", |p| p.cpu_children);
    if convert > 1.25 * convert_median {
        let _ = write!(
            reading,
            "The conversion to raw is the baseline's very command, on a file still in the page \
             cache, yet takes {convert:.2} s against {convert_median:.2} s (and {convert_cpu:.2} s \
             of `qemu-img` CPU against {q_cpu:.2} s); it starts with {} of the previous pass not \
             yet on disk, where the baseline starts with a clean page cache. ",
            mib_f(convert_dirty),
        );
    } else {
        let _ = write!(
            reading,
            "The conversion to raw, the baseline's very command on a file still in the page \
             cache, takes {convert:.2} s against the baseline's {convert_median:.2} s, though it \
             starts with {} of the previous pass not yet on disk. ",
            mib_f(convert_dirty),
        );
    }
    // The qemu-img passes, by whether they start with the previous pass's output still
    // in the page cache, unwritten.
    let (mut dirty_passes, mut clean_passes) = (Vec::new(), Vec::new());
    for name in ["flatten", "convert", "import"] {
        if !pass_names.contains(&name) {
            continue;
        }
        let dirty = phases.of(name, |p| p.dirty_start as f64);
        let cpu = phases.of(name, |p| p.cpu_children);
        if name != "convert" {
            let why = if name == "flatten" && dirty < (GIB / 2) as f64 {
                " (the download `fsync`s its file)"
            } else {
                ""
            };
            let _ = write!(
                reading,
                "The {name} starts with {} dirty{why} and takes {:.2} s, with {cpu:.2} s of \
                 `qemu-img` CPU. ",
                mib_f(dirty),
                secs(name),
            );
        }
        if dirty >= (GIB / 2) as f64 {
            dirty_passes.push((name, cpu));
        } else {
            clean_passes.push((name, cpu));
        }
    }
    let mean = |passes: &[(&str, f64)]| {
        passes.iter().map(|(_, cpu)| cpu).sum::<f64>() / passes.len() as f64
    };
    let list = |passes: &[(&str, f64)]| {
        passes
            .iter()
            .map(|(name, _)| what(name).to_owned())
            .collect::<Vec<_>>()
            .join(", ")
    };
    if !dirty_passes.is_empty()
        && !clean_passes.is_empty()
        && mean(&dirty_passes) > 1.5 * mean(&clean_passes)
    {
        let _ = write!(
            reading,
            "The passes that start with the previous pass's output still unwritten in the page \
             cache ({}) use {:.2} s of `qemu-img` CPU per pass, against {:.2} s for those that \
             start clean ({}) and {q_cpu:.2} s for the baseline, for the same {DISK_GIB} GiB: \
             writing into a page cache full of dirty data costs CPU and time \
             here, so a flush between passes, or writing with `qemu-img convert -t none`, is \
             worth measuring. ",
            list(&dirty_passes),
            mean(&dirty_passes),
            mean(&clean_passes),
            list(&clean_passes),
        );
    }
    let cores = |name: &str| 100.0 * phases.of(name, |p| p.cpu_children) / secs(name);
    let busy = (cpu_own + cpu_children + cpu_libvirtd) / (copy_median * setup.nproc as f64);
    let shares: Vec<String> = pass_names
        .iter()
        .filter(|n| **n != "download")
        .map(|n| format!("{:.0} % of {}'s wall time", cores(n), what(n)))
        .collect();
    let _ = write!(
        reading,
        "The passes run one after another: `qemu-img`'s CPU is {} ({:.0} % for the \
         baseline{}), and over the whole copy its processes use {:.0} % of the {} cores. ",
        shares.join(", "),
        100.0 * q_cpu / convert_median,
        if setup.dropped {
            ", whose reads wait on the disk"
        } else {
            ""
        },
        100.0 * busy,
        setup.nproc,
    );
    let _ = write!(
        reading,
        "The baseline's {DISK_GIB} GiB mostly stay in the page cache when it returns: its `sync` \
         afterwards takes {convert_sync:.2} s, and timed until each side's bytes are on disk the \
         ratio is {durable_ratio:.2} instead of {ratio:.2}. "
    );
    let verdict = if secs(slowest) <= 3.0 * convert_median {
        format!(
            "No pass is far slower than the baseline (the slowest, {}, is {:.1}× it); the gap is \
             their number.",
            what(slowest),
            secs(slowest) / convert_median
        )
    } else {
        format!(
            "{} is {:.1}× the baseline: look there first.",
            capitalized(what(slowest)),
            secs(slowest) / convert_median
        )
    };
    let _ = write!(
        reading,
        "{verdict} What would narrow the gap further is fewer passes (the export writing the \
         format the target imports while it flattens{}) more than tuning one of them.",
        if moved {
            ""
        } else {
            ", or an import that moves a staged raw file on the same file system instead of \
             copying it"
        }
    );
    let _ = writeln!(w, "{reading}");
    s
}

// ---- main ----------------------------------------------------------------------------

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args = args();
    let load_start = load_average();
    let Some(lv_rig) = LibvirtRig::start() else {
        eprintln!("copy-bench: the libvirt rig cannot run here (see above)");
        std::process::exit(1);
    };
    let ch_rig = ChRig::new(utf8(&args.fake_vmm), Guest::Exit);
    let work = match &args.work {
        Some(dir) => tempfile::Builder::new()
            .prefix("bnl-copy-bench-")
            .tempdir_in(dir),
        None => tempfile::Builder::new().prefix("bnl-copy-bench-").tempdir(),
    }
    .expect("work dir");
    let device = mount_of(work.path())
        .map(|(device, _, _)| device_name(&device).to_owned())
        .unwrap_or_default();

    // The source: powered off, 2 GiB of data.
    let lv = libvirt_backend(&lv_rig);
    let source = libvirt_request(SOURCE_UID, "src");
    settle(&*lv, &source).await;
    let source_file = volume_path(&lv_rig, &format!("bnl-{SOURCE_UID}-os.qcow2"));
    eprintln!(
        "copy-bench: filling {} with {DISK_GIB} GiB of pseudo-random data",
        source_file.display()
    );
    let random = work.path().join("random.raw");
    random_file(&random, u64::from(DISK_GIB) * GIB);
    run(
        "qemu-img",
        &[
            "convert",
            "-n",
            "-f",
            "raw",
            "-O",
            "qcow2",
            utf8(&random),
            utf8(&source_file),
        ],
    );
    assert_same("the filled source", &random, "raw", &source_file, "qcow2");
    std::fs::remove_file(&random).expect("removing the random file");
    run("sync", &[]);
    let transfer = lv.disk_transfer().expect("libvirt transfers disks");
    let export_bound = transfer
        .export_size(&source.identity)
        .await
        .expect("export_size")
        .expect("the source exists");

    let conn = lv_rig.connect();
    let mut bench = Bench {
        lv_rig: &lv_rig,
        lv: lv.clone(),
        ch_rig: &ch_rig,
        ch: ch_backend(&ch_rig),
        source: source.clone(),
        source_file: source_file.clone(),
        work: work.path().to_owned(),
        device,
        ticks: clock_ticks(),
        dropped: true,
    };
    let mut copies = Vec::new();
    let mut converts = Vec::new();
    for run in 1..=args.runs {
        let last = run == args.runs;
        if run % 2 == 1 {
            copies.push(bench.copy(run, last).await);
            converts.push(bench.convert(run));
        } else {
            converts.push(bench.convert(run));
            copies.push(bench.copy(run, last).await);
        }
    }

    let setup = Setup {
        date: today(),
        cpu_model: proc_value("/proc/cpuinfo", "model name").unwrap_or_default(),
        nproc: std::thread::available_parallelism().map_or(0, |n| n.get()),
        ram: proc_value("/proc/meminfo", "MemTotal").map_or("unknown".into(), |kb| {
            let kib: u64 = kb.trim_end_matches(" kB").parse().unwrap_or(0);
            format!("{:.1} GiB", kib as f64 / (1 << 20) as f64)
        }),
        disk: disk_of(work.path()),
        kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .unwrap_or_default()
            .trim()
            .to_owned(),
        dirty_limits: format!(
            "`vm.dirty_background_ratio={}`, `vm.dirty_ratio={}`, `vm.dirty_background_bytes={}`, `vm.dirty_bytes={}`",
            vm_setting("dirty_background_ratio"),
            vm_setting("dirty_ratio"),
            vm_setting("dirty_background_bytes"),
            vm_setting("dirty_bytes"),
        ),
        qemu_img: qemu_img_version(),
        libvirt_lib: virt::connect::Connect::version().map_or("?".into(), libvirt_version),
        libvirt_daemon: conn.lib_version().map_or("?".into(), libvirt_version),
        qemu: conn.hyp_version().map_or("?".into(), libvirt_version),
        load_start,
        load_end: load_average(),
        runs: args.runs,
        dropped: bench.dropped,
        source_len: length(&source_file),
        source_alloc: allocated(&source_file),
        export_bound,
    };
    assert_eq!(
        lv.delete(&source.identity)
            .await
            .expect("delete the source"),
        Deletion::Gone
    );
    let text = report(&setup, &copies, &converts);
    std::fs::create_dir_all(&args.out).expect("report dir");
    let path = args.out.join(format!("copy-{}.md", setup.date));
    std::fs::write(&path, &text).expect("writing the report");
    let copy_median = median(copies.iter().map(|r| r.seconds).collect());
    let convert_median = median(converts.iter().map(|r| r.seconds).collect());
    println!(
        "banlieue copy: median {copy_median:.2} s ({:.0} MiB/s); qemu-img convert: median {convert_median:.2} s ({:.0} MiB/s); ratio {:.2}",
        throughput(copy_median),
        throughput(convert_median),
        convert_median / copy_median
    );
    println!("wrote {}", path.display());
}
