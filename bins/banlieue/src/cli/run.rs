//! `banlieue run`: the operator. Flags carry Cluster API's names; each can also be
//! set from a `BANLIEUE_*` environment variable (a flag on the command line wins).

use std::path::PathBuf;
use std::time::Duration;

use banlieue_sdk::controllers::{Concurrency, Settings};
use clap::Args;
use clap::builder::BoolishValueParser;

use super::values::{BindAddress, parse_bind_address, parse_duration};
use banlieue_runtime::RunConfig;
use banlieue_runtime::client::{ClientConfig, DEFAULT_KUBE_API_BURST, DEFAULT_KUBE_API_QPS};
use banlieue_runtime::leader::LeaderConfig;
use banlieue_runtime::logging::{self, LogFormat};
use clap::builder::{PossibleValuesParser, TypedValueParser as _};

use crate::runtime::backends;

/// Namespace of the leader election Lease when neither the flag nor `POD_NAMESPACE` says.
pub const DEFAULT_LEADER_ELECTION_NAMESPACE: &str = "banlieue-system";

/// Options of `banlieue run`.
#[derive(Args, Debug, Clone, PartialEq)]
pub struct RunCommand {
    /// Watch only this namespace (empty: all namespaces).
    #[arg(long, env = "BANLIEUE_NAMESPACE", value_name = "NAMESPACE")]
    namespace: Option<String>,

    /// Only reconcile objects labelled `cluster.x-k8s.io/watch-filter=<VALUE>`.
    #[arg(long, env = "BANLIEUE_WATCH_FILTER", value_name = "VALUE")]
    watch_filter: Option<String>,

    /// Elect a leader through a Lease, so that only one replica reconciles.
    #[arg(
        long,
        env = "BANLIEUE_LEADER_ELECT",
        value_name = "BOOL",
        num_args = 0..=1,
        require_equals = true,
        default_value_t = false,
        default_missing_value = "true",
        value_parser = BoolishValueParser::new(),
    )]
    leader_elect: bool,

    /// How long other replicas wait after the leader's last renewal before taking over.
    #[arg(long, env = "BANLIEUE_LEADER_ELECT_LEASE_DURATION", value_name = "DURATION", default_value = "15s", value_parser = parse_duration)]
    leader_elect_lease_duration: Duration,

    /// How long after its last renewal the leader renews again (before the lease expires).
    #[arg(long, env = "BANLIEUE_LEADER_ELECT_RENEW_DEADLINE", value_name = "DURATION", default_value = "10s", value_parser = parse_duration)]
    leader_elect_renew_deadline: Duration,

    /// Pause between attempts to take the lease after an API error.
    #[arg(long, env = "BANLIEUE_LEADER_ELECT_RETRY_PERIOD", value_name = "DURATION", default_value = "2s", value_parser = parse_duration)]
    leader_elect_retry_period: Duration,

    /// How long in-flight reconciles get to finish after SIGTERM/SIGINT before they
    /// are dropped (as a crash would) and the Lease is released. Keep it below the
    /// Pod's `terminationGracePeriodSeconds` (10 s as installed): a replica killed
    /// while draining cannot release its Lease, and the next leader then waits for it
    /// to expire.
    #[arg(long, env = "BANLIEUE_GRACEFUL_SHUTDOWN_TIMEOUT", value_name = "DURATION", default_value = "5s", value_parser = parse_duration)]
    graceful_shutdown_timeout: Duration,

    /// Name of the leader election Lease.
    #[arg(
        long,
        env = "BANLIEUE_LEADER_ELECTION_ID",
        value_name = "NAME",
        default_value = "banlieue-leader-election"
    )]
    leader_election_id: String,

    /// Namespace of the leader election Lease [default: $POD_NAMESPACE, else banlieue-system].
    #[arg(
        long,
        env = "BANLIEUE_LEADER_ELECTION_NAMESPACE",
        value_name = "NAMESPACE"
    )]
    leader_election_namespace: Option<String>,

    /// Address of the probe server (`/healthz`, `/readyz`): `:PORT`, `HOST:PORT`, or `0` to disable.
    #[arg(long, env = "BANLIEUE_HEALTH_ADDR", value_name = "ADDR", default_value = ":9440", value_parser = parse_bind_address)]
    health_addr: BindAddress,

    /// Address of the diagnostics server (`/metrics`): `:PORT`, `HOST:PORT`, or `0` to
    /// disable. HTTPS (a self-signed certificate) for callers whose bearer token a
    /// TokenReview authenticates and a SubjectAccessReview allows `get` on the path
    /// (401 without a valid token, 403 when denied), as Cluster API providers serve it.
    #[arg(long, env = "BANLIEUE_DIAGNOSTICS_ADDRESS", value_name = "ADDR", default_value = ":8443", value_parser = parse_bind_address)]
    diagnostics_address: BindAddress,

    /// Serve diagnostics over plain HTTP to anyone, without TokenReview or
    /// SubjectAccessReview (for a loopback address or a trusted network).
    #[arg(long, env = "BANLIEUE_INSECURE_DIAGNOSTICS")]
    insecure_diagnostics: bool,

    /// How often a settled object is reconciled again (e.g. `10m`, `1h30m`).
    #[arg(long, env = "BANLIEUE_SYNC_PERIOD", value_name = "DURATION", default_value = "10m", value_parser = parse_duration)]
    sync_period: Duration,

    /// Where `migration.strategy: CopyDisk` stages VM disks between export and import
    /// (a directory per VM, removed after): as large as the largest VM's disks twice
    /// over, for the export and its `qemu-img convert`
    /// [default: $TMPDIR/banlieue-staging, else /tmp/banlieue-staging].
    #[arg(long, env = "BANLIEUE_STAGING_DIR", value_name = "PATH")]
    staging_dir: Option<PathBuf>,

    /// Most requests per second to the Kubernetes API, on average (client-side token
    /// bucket). A ceiling: each round of 429 Too Many Requests answers halves the rate
    /// (down to 5), which then grows back by 5 % of this per second.
    #[arg(long, env = "BANLIEUE_KUBE_API_QPS", value_name = "QPS", default_value_t = DEFAULT_KUBE_API_QPS, value_parser = parse_qps)]
    kube_api_qps: f64,

    /// Requests to the Kubernetes API allowed in a burst (the token bucket's size at the
    /// ceiling rate; it shrinks with the rate).
    #[arg(long, env = "BANLIEUE_KUBE_API_BURST", value_name = "N", default_value_t = DEFAULT_KUBE_API_BURST, value_parser = clap::value_parser!(u32).range(1..))]
    kube_api_burst: u32,

    /// Parallel reconciles of the Provider controller.
    #[arg(long, env = "BANLIEUE_PROVIDER_CONCURRENCY", value_name = "N", default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..))]
    provider_concurrency: u16,

    /// Parallel reconciles of the VirtualMachine controller.
    #[arg(long, env = "BANLIEUE_VIRTUALMACHINE_CONCURRENCY", value_name = "N", default_value_t = 16, value_parser = clap::value_parser!(u16).range(1..))]
    virtualmachine_concurrency: u16,

    /// Parallel reconciles of each infrastructure machine controller.
    #[arg(long, env = "BANLIEUE_MACHINE_CONCURRENCY", value_name = "N", default_value_t = 16, value_parser = clap::value_parser!(u16).range(1..))]
    machine_concurrency: u16,

    /// Parallel reconciles of the VMImage controller.
    #[arg(long, env = "BANLIEUE_IMAGE_CONCURRENCY", value_name = "N", default_value_t = 2, value_parser = clap::value_parser!(u16).range(1..))]
    image_concurrency: u16,

    /// Log line format.
    #[arg(long, env = "BANLIEUE_LOG_FORMAT", value_name = "FORMAT", default_value_t = LogFormat::Plain,
          value_parser = PossibleValuesParser::new(LogFormat::ALL.map(LogFormat::as_str)).try_map(|s| s.parse::<LogFormat>()))]
    log_format: LogFormat,

    /// Log filter, e.g. `info` or `info,banlieue_sdk=debug` [default: $RUST_LOG, else info].
    #[arg(long, env = "BANLIEUE_LOG_LEVEL", value_name = "FILTER", value_parser = logging::parse_directives)]
    log_level: Option<String>,

    /// Path to a kubeconfig [default: in-cluster config, else $KUBECONFIG, else ~/.kube/config].
    #[arg(long, env = "BANLIEUE_KUBECONFIG", value_name = "PATH")]
    kubeconfig: Option<PathBuf>,
}

fn parse_qps(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(qps) if qps > 0.0 && qps.is_finite() => Ok(qps),
        _ => Err(format!("{s:?} is not a positive number")),
    }
}

/// `Some(s)` unless empty (CAPI's flags treat an empty value as unset).
fn non_empty(value: &Option<String>) -> Option<String> {
    value
        .as_deref()
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
}

impl RunCommand {
    /// Runs the operator until SIGTERM/SIGINT (`Ok`) or until leadership is lost (`Err`).
    pub fn run(self) -> anyhow::Result<()> {
        let directives = logging::directives(
            self.log_level.as_deref(),
            std::env::var("RUST_LOG").ok().as_deref(),
        );
        logging::init(self.log_format, &directives)?;
        let config = self.config(std::env::var("POD_NAMESPACE").ok())?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()?;
        let compiled = backends::compiled();
        tracing::info!(
            version = env!("CARGO_PKG_VERSION"),
            backends = %backends::summary(&compiled),
            "starting banlieue"
        );
        let result = runtime.block_on(banlieue_runtime::run(config, backends::registry()));
        if let Err(error) = &result {
            tracing::error!(error = format!("{error:#}"), "banlieue run failed");
        }
        Ok(result?)
    }

    /// The runtime configuration, given the pod's namespace (`POD_NAMESPACE`).
    fn config(&self, pod_namespace: Option<String>) -> anyhow::Result<RunConfig> {
        let leader = self.leader_elect.then(|| LeaderConfig {
            lease_name: self.leader_election_id.clone(),
            namespace: non_empty(&self.leader_election_namespace)
                .or_else(|| non_empty(&pod_namespace))
                .unwrap_or_else(|| DEFAULT_LEADER_ELECTION_NAMESPACE.into()),
            lease_duration: self.leader_elect_lease_duration,
            renew_deadline: self.leader_elect_renew_deadline,
            retry_period: self.leader_elect_retry_period,
        });
        if let Some(leader) = &leader {
            leader.lease_seconds().map_err(anyhow::Error::msg)?;
        }
        Ok(RunConfig {
            client: ClientConfig {
                kubeconfig: self.kubeconfig.clone(),
                qps: self.kube_api_qps,
                burst: self.kube_api_burst,
            },
            health_addr: self.health_addr.0,
            diagnostics_addr: self.diagnostics_address.0,
            insecure_diagnostics: self.insecure_diagnostics,
            leader,
            shutdown_timeout: self.graceful_shutdown_timeout,
            // `run` installed it (scrubbing) before the runtime, for its own lines.
            logging: banlieue_runtime::logging::Logging::Installed,
            settings: Settings {
                namespace: non_empty(&self.namespace),
                watch_filter: non_empty(&self.watch_filter),
                sync_period: self.sync_period,
                concurrency: Concurrency {
                    provider: self.provider_concurrency,
                    virtual_machine: self.virtualmachine_concurrency,
                    machine: self.machine_concurrency,
                    image: self.image_concurrency,
                },
                staging_dir: self
                    .staging_dir
                    .clone()
                    .unwrap_or_else(|| Settings::default().staging_dir),
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use std::process::Command;

    use clap::{CommandFactory, FromArgMatches, Parser};

    use super::*;

    /// `banlieue run` on its own, for parsing.
    #[derive(Parser, Debug)]
    struct Harness {
        #[command(flatten)]
        run: RunCommand,
    }

    /// Parses flags with the environment ignored, so that these tests are hermetic.
    fn parse(args: &[&str]) -> Result<RunCommand, clap::Error> {
        let command = Harness::command().mut_args(|arg| arg.env(None::<&str>));
        let matches =
            command.try_get_matches_from(std::iter::once("run").chain(args.iter().copied()))?;
        Harness::from_arg_matches(&matches).map(|h| h.run)
    }

    /// Parses flags and `BANLIEUE_*` variables, as `banlieue run` does.
    fn parse_with_env(args: &[&str]) -> Result<RunCommand, clap::Error> {
        Harness::try_parse_from(std::iter::once("run").chain(args.iter().copied())).map(|h| h.run)
    }

    #[test]
    fn defaults() {
        let cmd = parse(&[]).unwrap();
        assert_eq!(cmd.namespace, None);
        assert_eq!(cmd.watch_filter, None);
        assert!(!cmd.leader_elect);
        assert_eq!(cmd.leader_elect_lease_duration, Duration::from_secs(15));
        assert_eq!(cmd.leader_elect_renew_deadline, Duration::from_secs(10));
        assert_eq!(cmd.leader_elect_retry_period, Duration::from_secs(2));
        assert_eq!(cmd.leader_election_id, "banlieue-leader-election");
        assert_eq!(cmd.leader_election_namespace, None);
        assert_eq!(cmd.graceful_shutdown_timeout, Duration::from_secs(5));
        assert_eq!(cmd.health_addr.0, Some("0.0.0.0:9440".parse().unwrap()));
        assert_eq!(
            cmd.diagnostics_address.0,
            Some("0.0.0.0:8443".parse().unwrap())
        );
        assert_eq!(cmd.sync_period, Duration::from_secs(600));
        assert_eq!(cmd.staging_dir, None);
        assert_eq!(cmd.kube_api_qps, 500.0);
        assert_eq!(cmd.kube_api_burst, 1000);
        assert_eq!(
            (
                cmd.provider_concurrency,
                cmd.virtualmachine_concurrency,
                cmd.machine_concurrency,
                cmd.image_concurrency
            ),
            (4, 16, 16, 2)
        );
        assert_eq!(cmd.log_format, LogFormat::Plain);
        assert_eq!(cmd.log_level, None);
        assert_eq!(cmd.kubeconfig, None);

        let config = cmd.config(None).unwrap();
        assert!(config.leader.is_none());
        assert_eq!(config.settings.sync_period, Duration::from_secs(600));
        // The SDK's default: under the temp dir, fine for a local run.
        assert_eq!(
            config.settings.staging_dir,
            std::env::temp_dir().join("banlieue-staging")
        );
    }

    #[test]
    fn flags() {
        let cmd = parse(&[
            "--namespace=tenant-a",
            "--watch-filter",
            "blue",
            "--leader-elect",
            "--leader-elect-lease-duration=1m",
            "--leader-elect-renew-deadline=45s",
            "--leader-elect-retry-period=500ms",
            "--leader-election-id=my-lease",
            "--graceful-shutdown-timeout=2s",
            "--health-addr=127.0.0.1:19440",
            "--diagnostics-address=0",
            "--sync-period=1h30m",
            "--staging-dir=/var/lib/banlieue/staging",
            "--kube-api-qps=5.5",
            "--kube-api-burst=7",
            "--virtualmachine-concurrency=3",
            "--log-format=json",
            "--log-level=debug,kube=info",
            "--kubeconfig=/tmp/kc",
        ])
        .unwrap();
        let config = cmd.config(Some("from-pod".into())).unwrap();
        assert_eq!(config.settings.namespace.as_deref(), Some("tenant-a"));
        assert_eq!(config.settings.watch_filter.as_deref(), Some("blue"));
        assert_eq!(config.settings.sync_period, Duration::from_secs(5400));
        assert_eq!(
            config.settings.staging_dir,
            PathBuf::from("/var/lib/banlieue/staging")
        );
        assert_eq!(config.settings.concurrency.virtual_machine, 3);
        assert_eq!(config.settings.concurrency.provider, 4);
        let leader = config.leader.unwrap();
        assert_eq!(leader.lease_name, "my-lease");
        assert_eq!(leader.namespace, "from-pod");
        assert_eq!(leader.lease_seconds(), Ok((60, 15)));
        assert_eq!(leader.retry_period, Duration::from_millis(500));
        assert_eq!(config.shutdown_timeout, Duration::from_secs(2));
        assert_eq!(config.health_addr, Some("127.0.0.1:19440".parse().unwrap()));
        assert_eq!(config.diagnostics_addr, None);
        assert_eq!(config.client.qps, 5.5);
        assert_eq!(config.client.burst, 7);
        assert_eq!(config.client.kubeconfig, Some(PathBuf::from("/tmp/kc")));
        assert_eq!(cmd.log_format, LogFormat::Json);
        assert_eq!(cmd.log_level.as_deref(), Some("debug,kube=info"));
    }

    #[test]
    fn leader_elect_takes_go_style_booleans() {
        assert!(parse(&["--leader-elect=true"]).unwrap().leader_elect);
        assert!(!parse(&["--leader-elect=false"]).unwrap().leader_elect);
        // As with Go's bool flags, a separate value is not taken.
        assert!(parse(&["--leader-elect", "false"]).is_err());
    }

    #[test]
    fn leader_election_namespace_falls_back_to_the_pod_then_banlieue_system() {
        let cmd = parse(&["--leader-elect"]).unwrap();
        assert_eq!(
            cmd.config(Some("pod-ns".into()))
                .unwrap()
                .leader
                .unwrap()
                .namespace,
            "pod-ns"
        );
        assert_eq!(
            cmd.config(Some(String::new()))
                .unwrap()
                .leader
                .unwrap()
                .namespace,
            "banlieue-system"
        );
        assert_eq!(
            cmd.config(None).unwrap().leader.unwrap().namespace,
            "banlieue-system"
        );
        let cmd = parse(&["--leader-elect", "--leader-election-namespace=ops"]).unwrap();
        assert_eq!(
            cmd.config(Some("pod-ns".into()))
                .unwrap()
                .leader
                .unwrap()
                .namespace,
            "ops"
        );
    }

    #[test]
    fn empty_namespace_and_watch_filter_mean_unset() {
        let config = parse(&["--namespace=", "--watch-filter="])
            .unwrap()
            .config(None)
            .unwrap();
        assert_eq!(config.settings.namespace, None);
        assert_eq!(config.settings.watch_filter, None);
    }

    #[test]
    fn invalid_values_are_rejected() {
        for args in [
            &["--sync-period=10"][..],
            &["--health-addr=9440"],
            &["--staging-dir="],
            &["--kube-api-qps=0"],
            &["--kube-api-qps=-1"],
            &["--kube-api-burst=0"],
            &["--image-concurrency=0"],
            &["--log-format=xml"],
            &["--log-level=kube=loud"],
        ] {
            assert!(parse(args).is_err(), "{args:?} should be rejected");
        }
        // Inconsistent leader election timing fails before connecting anywhere.
        let cmd = parse(&["--leader-elect", "--leader-elect-renew-deadline=20s"]).unwrap();
        assert!(cmd.config(None).is_err());
        // ...but is ignored without leader election.
        let cmd = parse(&["--leader-elect-renew-deadline=20s"]).unwrap();
        assert!(cmd.config(None).is_ok());
    }

    /// Set in the child process of [`env_vars_override_defaults_and_flags_win`].
    const CHILD: &str = "BANLIEUE_TEST_ENV_CHILD";

    /// Runs in a child process with `BANLIEUE_*` set: clap reads the process
    /// environment, and this crate forbids `unsafe` (`std::env::set_var`).
    #[test]
    fn env_child() {
        if std::env::var_os(CHILD).is_none() {
            return;
        }
        let cmd = parse_with_env(&["--image-concurrency=9"]).unwrap();
        let config = cmd.config(std::env::var("POD_NAMESPACE").ok()).unwrap();
        assert_eq!(config.settings.namespace.as_deref(), Some("env-ns"));
        assert_eq!(config.settings.watch_filter.as_deref(), Some("env-filter"));
        assert_eq!(config.settings.sync_period, Duration::from_secs(90));
        assert_eq!(config.settings.staging_dir, PathBuf::from("/env/staging"));
        assert_eq!(config.settings.concurrency.machine, 5);
        // The flag wins over BANLIEUE_IMAGE_CONCURRENCY.
        assert_eq!(config.settings.concurrency.image, 9);
        let leader = config.leader.unwrap();
        assert_eq!(leader.namespace, "env-lease-ns");
        assert_eq!(leader.lease_seconds(), Ok((30, 10)));
        assert_eq!(config.health_addr, Some("127.0.0.1:1234".parse().unwrap()));
        assert_eq!(config.diagnostics_addr, None);
        assert_eq!(config.client.qps, 50.0);
        assert_eq!(config.client.burst, 100);
        assert_eq!(
            config.client.kubeconfig,
            Some(PathBuf::from("/env/kubeconfig"))
        );
        assert_eq!(cmd.log_format, LogFormat::Json);
        assert_eq!(cmd.log_level.as_deref(), Some("warn"));
        println!("env-child-ok");
    }

    #[test]
    fn env_vars_override_defaults_and_flags_win() {
        if std::env::var_os(CHILD).is_some() {
            return;
        }
        let mut child = Command::new(std::env::current_exe().unwrap());
        child.args([
            "--exact",
            "cli::run::tests::env_child",
            "--nocapture",
            "--test-threads=1",
        ]);
        for (key, _) in std::env::vars().filter(|(k, _)| k.starts_with("BANLIEUE_")) {
            child.env_remove(key);
        }
        child.env(CHILD, "1").env("POD_NAMESPACE", "pod-ns").envs([
            ("BANLIEUE_NAMESPACE", "env-ns"),
            ("BANLIEUE_WATCH_FILTER", "env-filter"),
            ("BANLIEUE_LEADER_ELECT", "true"),
            ("BANLIEUE_LEADER_ELECT_LEASE_DURATION", "30s"),
            ("BANLIEUE_LEADER_ELECT_RENEW_DEADLINE", "20s"),
            ("BANLIEUE_LEADER_ELECTION_NAMESPACE", "env-lease-ns"),
            ("BANLIEUE_HEALTH_ADDR", "127.0.0.1:1234"),
            ("BANLIEUE_DIAGNOSTICS_ADDRESS", "0"),
            ("BANLIEUE_SYNC_PERIOD", "1m30s"),
            ("BANLIEUE_STAGING_DIR", "/env/staging"),
            ("BANLIEUE_KUBE_API_QPS", "50"),
            ("BANLIEUE_KUBE_API_BURST", "100"),
            ("BANLIEUE_MACHINE_CONCURRENCY", "5"),
            ("BANLIEUE_IMAGE_CONCURRENCY", "7"),
            ("BANLIEUE_LOG_FORMAT", "json"),
            ("BANLIEUE_LOG_LEVEL", "warn"),
            ("BANLIEUE_KUBECONFIG", "/env/kubeconfig"),
        ]);
        let output = child.output().unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success() && stdout.contains("env-child-ok"),
            "child failed:\n{stdout}\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
}
