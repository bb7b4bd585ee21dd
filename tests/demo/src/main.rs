//! `make demo`: banlieue's main job end to end.
//!
//! Starts a local control plane (etcd + kube-apiserver, from `banlieue-testenv`) and the
//! operator (`banlieue run`) as a child process, applies `examples/demo/` (a `sim`
//! Provider, a VMClass, a VMImage and a handful of VirtualMachines), and shows the
//! VirtualMachines' progress until every one is Ready. Then it leaves everything running
//! for `kubectl` until Ctrl-C (or SIGTERM), and tears down: the operator (SIGTERM, then
//! SIGKILL after 10s), then the control plane and its temporary directory.
//!
//! With `DEMO_ONESHOT=1` (`--oneshot`) it tears down and exits 0 as soon as all are
//! Ready, or exits 1 after `DEMO_TIMEOUT` (default 180s) naming the VirtualMachines
//! that are not Ready and quoting the operator's log. `make test` runs it that way.
//!
//! Environment: `KUBEBUILDER_ASSETS` (where `make testbin` put kube-apiserver and
//! etcd), `BANLIEUE_OPERATOR` (the operator binary), `DEMO_ONESHOT`, `DEMO_TIMEOUT`,
//! `DEMO_OPERATOR_LOGS=1` (the operator logs to stderr instead of a file), `RUST_LOG`
//! (passed to the operator), and the `KUBEBUILDER_*`/`BANLIEUE_TESTENV_*` variables of
//! `banlieue-testenv` (`BANLIEUE_TESTENV_KEEP=1` keeps the directory, with the log).

/// Prints a line on stdout, ignoring errors: a closed terminal (SIGHUP) or pipe must not
/// turn the teardown into a panic, as `println!` would.
macro_rules! out {
    () => {
        out!("")
    };
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}

/// Prints a line on stderr, ignoring errors (see [`out!`]).
macro_rules! err {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

/// Prints a step of the demo.
macro_rules! step {
    ($($arg:tt)*) => {
        out!("==> {}", format_args!($($arg)*))
    };
}

mod manifests;
mod operator;
mod signals;
mod table;
mod wait;

use std::io::IsTerminal as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use banlieue_sdk::api::VirtualMachine;
use banlieue_testenv::{ControlPlane, ControlPlaneConfig};
use clap::Parser;
use kube::api::Api;

use crate::manifests::Manifest;
use crate::operator::Operator;
use crate::signals::Signals;
use crate::wait::{Display, Mode, Progress, Watch};

/// The namespace the demo's namespaced objects go to (the kubeconfig's default, so that
/// `kubectl get bvm` needs no `-n`).
const NAMESPACE: &str = "default";

/// Between SIGTERM and SIGKILL when stopping the operator.
const OPERATOR_STOP_GRACE: Duration = Duration::from_secs(10);

/// Where the demo's manifests are, in this repository.
const DEFAULT_MANIFESTS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/demo");

/// banlieue end to end: a local control plane, the operator, the simulated backend and a
/// handful of VirtualMachines becoming Ready.
#[derive(Parser, Debug)]
#[command(name = "banlieue-demo", version)]
struct Args {
    /// The operator binary (`cargo build -p banlieue`).
    #[arg(
        long,
        env = "BANLIEUE_OPERATOR",
        value_name = "PATH",
        default_value = "target/debug/banlieue"
    )]
    operator: PathBuf,

    /// Directory of the manifests to apply (`*.yaml`, in file-name order).
    #[arg(long, env = "DEMO_MANIFESTS", value_name = "DIR", default_value = DEFAULT_MANIFESTS)]
    manifests: PathBuf,

    /// Exit (0) as soon as every VirtualMachine is Ready, instead of waiting for Ctrl-C.
    #[arg(
        long,
        env = "DEMO_ONESHOT",
        value_name = "BOOL",
        num_args = 0..=1,
        require_equals = true,
        default_value_t = false,
        default_missing_value = "true",
        value_parser = parse_flag,
    )]
    oneshot: bool,

    /// How long everything may take to be Ready, from the start (`180`, `90s`, `3m`).
    #[arg(long, env = "DEMO_TIMEOUT", value_name = "DURATION", default_value = "180s", value_parser = parse_duration)]
    timeout: Duration,

    /// Send the operator's logs to stderr instead of a file (the table then prints
    /// changes line by line).
    #[arg(
        long,
        env = "DEMO_OPERATOR_LOGS",
        value_name = "BOOL",
        num_args = 0..=1,
        require_equals = true,
        default_value_t = false,
        default_missing_value = "true",
        value_parser = parse_flag,
    )]
    operator_logs: bool,
}

/// Parses a boolean as Go and shells spell it (`1`, `true`, `yes`, `on`, and their
/// opposites), with an empty value meaning false (`DEMO_ONESHOT= make demo`).
fn parse_flag(text: &str) -> Result<bool, String> {
    match text.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "t" | "yes" | "y" | "on" => Ok(true),
        "" | "0" | "false" | "f" | "no" | "n" | "off" => Ok(false),
        _ => Err(format!(
            "{text:?} is not a boolean (1/0, true/false, yes/no)"
        )),
    }
}

/// Parses `180`, `180s`, `3m`, `1m30s` or `500ms`.
fn parse_duration(text: &str) -> Result<Duration, String> {
    banlieue_sdk::duration::parse_or_seconds(text).map_err(|_| {
        format!(
            "{:?} is not a duration like 180, 90s, 3m or 1m30s",
            text.trim()
        )
    })
}

fn main() -> ExitCode {
    let args = Args::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            err!("banlieue-demo: starting the Tokio runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    // The demo's own future runs on this (the main) thread: the operator is spawned from
    // it, and its PR_SET_PDEATHSIG is tied to the spawning thread.
    runtime.block_on(demo(args))
}

/// How the demo ended.
#[derive(Debug)]
enum End {
    /// Every VirtualMachine is Ready (one-shot mode).
    Done,
    /// A signal asked to stop.
    Signal(&'static str),
    /// Something failed; the error says what.
    Failed(anyhow::Error),
}

/// The whole demo; returns the exit code once everything it started is stopped.
async fn demo(args: Args) -> ExitCode {
    let started = Instant::now();
    let mut signals = match Signals::install() {
        Ok(signals) => signals,
        Err(e) => return fail(&anyhow::Error::new(e).context("installing signal handlers")),
    };
    // Check what can be checked before starting anything.
    let manifests = match manifests::load(&args.manifests) {
        Ok(manifests) => manifests,
        Err(e) => return fail(&e),
    };
    if !args.operator.is_file() {
        return fail(&anyhow::anyhow!(
            "the operator binary {} does not exist: build it with `cargo build -p banlieue`, \
             or pass --operator/BANLIEUE_OPERATOR (`make demo` does both)",
            args.operator.display()
        ));
    }

    step!("starting a local control plane (etcd + kube-apiserver)");
    let config = ControlPlaneConfig::from_env().banlieue_api();
    let mut starting = tokio::task::spawn_blocking(move || ControlPlane::start(config));
    let start_result = tokio::select! {
        result = &mut starting => result,
        name = signals.recv() => {
            err!("\n{name}: stopping as soon as the control plane has started");
            if let Ok(Ok(control_plane)) = starting.await {
                teardown(None, control_plane, &mut signals).await;
            }
            return exit_code(&End::Signal(name), false, &args);
        }
    };
    let control_plane = match start_result {
        Ok(Ok(control_plane)) => control_plane,
        Ok(Err(e)) => {
            return fail(&anyhow::Error::new(e).context(
                "the control plane did not start (`make testbin` builds kube-apiserver and \
                 etcd; KUBEBUILDER_ASSETS must name their directory)",
            ));
        }
        Err(e) => return fail(&anyhow::Error::new(e).context("starting the control plane")),
    };
    step!(
        "control plane at {} ({:.1}s)",
        control_plane.server_url(),
        started.elapsed().as_secs_f64()
    );

    let mut operator = None;
    let mut session = Session {
        args: &args,
        control_plane: &control_plane,
        manifests: &manifests,
        started,
        degraded: false,
    };
    let end = tokio::select! {
        end = session.run(&mut operator) => end,
        name = signals.recv() => End::Signal(name),
    };
    let degraded = session.degraded;
    match &end {
        End::Done => {}
        End::Signal(name) => out!("\n{name}: stopping"),
        End::Failed(error) => err!("\nbanlieue-demo: {error:#}"),
    }
    teardown(operator, control_plane, &mut signals).await;
    exit_code(&end, degraded, &args)
}

/// The exit code: 0 when done, or stopped by a signal in interactive mode after all
/// went well; 130 when a signal interrupts a one-shot run; 1 on failure.
fn exit_code(end: &End, degraded: bool, args: &Args) -> ExitCode {
    match end {
        End::Done => ExitCode::SUCCESS,
        End::Signal(_) if args.oneshot => ExitCode::from(130),
        End::Signal(_) if degraded => ExitCode::FAILURE,
        End::Signal(_) => ExitCode::SUCCESS,
        End::Failed(_) => ExitCode::FAILURE,
    }
}

/// Prints `error` and returns the failure exit code.
fn fail(error: &anyhow::Error) -> ExitCode {
    err!("banlieue-demo: {error:#}");
    ExitCode::FAILURE
}

/// Stops the operator, then the control plane (which removes its directory).
async fn teardown(operator: Option<Operator>, control_plane: ControlPlane, signals: &mut Signals) {
    // An operator that already exited was reported as such.
    if let Some(mut operator) = operator
        && operator.exited().is_none()
    {
        step!("stopping the operator (pid {})", operator.pid());
        if let Some(status) = operator.stop(OPERATOR_STOP_GRACE, signals).await
            && !status.success()
        {
            err!("the operator ended with {status}");
        }
    }
    step!("stopping the control plane");
    // Dropping it blocks while etcd and the apiserver stop.
    let dir = control_plane.dir().to_owned();
    let _ = tokio::task::spawn_blocking(move || drop(control_plane)).await;
    if dir.exists() {
        step!("kept {}", dir.display());
    } else {
        step!("stopped; removed {}", dir.display());
    }
}

/// One run of the demo against a started control plane.
struct Session<'a> {
    args: &'a Args,
    control_plane: &'a ControlPlane,
    manifests: &'a [Manifest],
    /// When the demo started.
    started: Instant,
    /// Set when the VirtualMachines did not all get Ready in time (interactive mode keeps
    /// running for inspection, then exits non-zero).
    degraded: bool,
}

impl Session<'_> {
    /// Starts the operator (into `operator`, so that the caller stops it whatever
    /// happens), applies the manifests and waits. Returns in one-shot mode or on failure;
    /// otherwise runs until cancelled.
    async fn run(&mut self, operator: &mut Option<Operator>) -> End {
        match self.try_run(operator).await {
            Ok(()) => End::Done,
            Err(error) => End::Failed(error),
        }
    }

    async fn try_run(&mut self, slot: &mut Option<Operator>) -> anyhow::Result<()> {
        let args = self.args;
        let deadline = self.started + args.timeout;
        let log = (!args.operator_logs).then(|| self.control_plane.dir().join("banlieue.log"));
        let operator = slot.insert(Operator::spawn(
            &args.operator,
            self.control_plane.kubeconfig_path(),
            log.as_deref(),
        )?);
        step!(
            "operator: {} run (pid {}), probes on {}",
            args.operator.display(),
            operator.pid(),
            operator.health_addr()
        );
        match operator.log_path() {
            Some(path) => step!("operator log: {}", path.display()),
            None => step!("operator log: stderr (DEMO_OPERATOR_LOGS)"),
        }
        let waiting = Instant::now();
        operator.wait_ready(deadline).await?;
        step!(
            "operator ready: caches synced ({:.1}s)",
            waiting.elapsed().as_secs_f64()
        );

        let client = self.control_plane.client().await;
        for manifest in self.manifests {
            manifests::apply(&client, NAMESPACE, manifest).await?;
        }
        let applied = Instant::now();
        let expected = manifests::virtual_machines(self.manifests);
        step!(
            "applied {} objects from {}: {}",
            self.manifests.len(),
            display_path(&args.manifests),
            summary(self.manifests)
        );
        out!();

        let mode = if std::io::stdout().is_terminal() && operator.log_path().is_some() {
            Mode::Live
        } else {
            Mode::Lines
        };
        let mut display = Display::new(mode);
        let watch = Watch::start(Api::<VirtualMachine>::namespaced(client, NAMESPACE));
        let progress =
            wait::until_ready(&watch, &expected, applied, deadline, operator, &mut display).await?;
        out!();
        match progress {
            Progress::Ready(elapsed) => step!(
                "all {} VirtualMachines are Ready, {:.1}s after they were applied ({:.1}s in all)",
                expected.len(),
                elapsed.as_secs_f64(),
                self.started.elapsed().as_secs_f64()
            ),
            Progress::TimedOut(report) => {
                let error = anyhow::anyhow!(
                    "timed out after {:?}: {report}\n\n{}",
                    args.timeout,
                    operator.log_tail(30)
                );
                if args.oneshot {
                    return Err(error);
                }
                err!("banlieue-demo: {error:#}\n");
                self.degraded = true;
            }
        }
        if args.oneshot {
            return Ok(());
        }
        self.instructions(operator.log_path(), &expected);
        Err(wait::follow(&watch, &expected, operator, &mut display).await)
    }

    /// What to do while the demo keeps running.
    fn instructions(&self, log: Option<&Path>, expected: &[String]) {
        let kubeconfig = self.control_plane.kubeconfig_path().display();
        let example = expected.first().map_or("web-1", String::as_str);
        let (kubectl, kubectl_note) = kubectl();
        out!("The control plane and the operator keep running. In another terminal:\n");
        out!("  export KUBECONFIG={kubeconfig}");
        out!("  {kubectl} get bvm,bprov -o wide{kubectl_note}");
        out!(
            "  {kubectl} patch bvm {example} --type=merge -p '{{\"spec\":{{\"powerState\":\"PoweredOff\"}}}}'"
        );
        out!();
        match log {
            Some(path) => out!("Operator log: {}", path.display()),
            None => out!("Operator log: on stderr"),
        }
        out!("Changes to the VirtualMachines are printed below. Ctrl-C stops everything.\n");
    }
}

/// `Provider/sim-lab, VMClass/demo-small, ...`, with runs of one kind shortened.
fn summary(manifests: &[Manifest]) -> String {
    let mut parts: Vec<(String, Vec<&str>)> = Vec::new();
    for manifest in manifests {
        match parts.last_mut() {
            Some((kind, names)) if kind == manifest.kind() => names.push(manifest.name()),
            _ => parts.push((manifest.kind().to_owned(), vec![manifest.name()])),
        }
    }
    parts
        .iter()
        .map(|(kind, names)| format!("{kind} {}", names.join(" ")))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `path` relative to the current directory when it is below it.
fn display_path(path: &Path) -> String {
    let absolute = path.canonicalize().unwrap_or_else(|_| path.to_owned());
    std::env::current_dir()
        .ok()
        .and_then(|cwd| absolute.strip_prefix(cwd).ok().map(Path::to_owned))
        .unwrap_or(absolute)
        .display()
        .to_string()
}

/// Whether an executable named `name` is on `PATH`.
/// The kubectl to name in the hints: the one `make testbin` built beside the apiserver
/// (same Kubernetes version), else one on PATH, else a note saying there is none.
fn kubectl() -> (String, &'static str) {
    let built = std::env::var_os("KUBEBUILDER_ASSETS")
        .map(|dir| Path::new(&dir).join("kubectl"))
        .filter(|path| path.is_file());
    match built {
        Some(path) => (path.display().to_string(), ""),
        None if on_path("kubectl") => ("kubectl".to_owned(), ""),
        None => (
            "kubectl".to_owned(),
            "   # no kubectl: tests/testbin/build.sh builds one into KUBEBUILDER_ASSETS",
        ),
    }
}

fn on_path(name: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|dir| dir.join(name).is_file()))
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory as _;

    use super::*;

    #[test]
    fn the_command_line_is_consistent() {
        Args::command().debug_assert();
    }

    #[test]
    fn parses_durations() {
        assert_eq!(parse_duration("180"), Ok(Duration::from_secs(180)));
        assert_eq!(parse_duration("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("3m"), Ok(Duration::from_secs(180)));
        assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        for bad in ["", "soon", "5x", "s", "-1"] {
            assert!(parse_duration(bad).is_err(), "{bad:?}");
        }
    }

    /// Parses flags with the environment ignored, so that the test is hermetic.
    fn parse(args: &[&str]) -> Args {
        use clap::FromArgMatches as _;
        let command = Args::command().mut_args(|arg| arg.env(None::<&str>));
        let matches = command
            .try_get_matches_from(std::iter::once("banlieue-demo").chain(args.iter().copied()))
            .unwrap();
        Args::from_arg_matches(&matches).unwrap()
    }

    #[test]
    fn flags_and_defaults() {
        let args = parse(&[]);
        assert!(!args.oneshot && !args.operator_logs);
        assert_eq!(args.timeout, Duration::from_secs(180));
        assert_eq!(args.operator, Path::new("target/debug/banlieue"));
        let args = parse(&["--oneshot", "--timeout=1m", "--operator=/x/banlieue"]);
        assert!(args.oneshot);
        assert_eq!(args.timeout, Duration::from_secs(60));
        assert_eq!(args.operator, Path::new("/x/banlieue"));
        assert!(!parse(&["--oneshot=0"]).oneshot);
        assert!(parse(&["--operator-logs"]).operator_logs);
    }

    #[test]
    fn parses_flags() {
        for yes in ["1", "true", "TRUE", "yes", "on"] {
            assert_eq!(parse_flag(yes), Ok(true), "{yes}");
        }
        for no in ["", " ", "0", "false", "no", "off"] {
            assert_eq!(parse_flag(no), Ok(false), "{no:?}");
        }
        assert!(parse_flag("maybe").is_err());
    }

    #[test]
    fn summarises_runs_of_kinds() {
        let manifest = |kind: &str, name: &str| Manifest {
            file: PathBuf::new(),
            object: serde_json::json!({"kind": kind, "metadata": {"name": name}}),
        };
        let manifests = [
            manifest("Provider", "p"),
            manifest("VirtualMachine", "a"),
            manifest("VirtualMachine", "b"),
        ];
        assert_eq!(summary(&manifests), "Provider p, VirtualMachine a b");
    }
}
