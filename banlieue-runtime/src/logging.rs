//! Structured logs on stderr (`--log-format`, `--log-level`).
//!
//! Nothing logs secret values: credentials only ever travel inside the SDK's
//! `SecretValue`, whose `Debug` and `Display` print a placeholder, and the kube
//! `Config` (which holds tokens and keys) is never logged. And as a backend's own
//! words may echo them (a fault quoting the login request), every line is written
//! through the SDK's process-wide scrubber (`banlieue_sdk::scrub`), the same one
//! conditions and Events pass through: messages and fields alike lose the
//! credentials of every Provider.

use std::io::IsTerminal as _;

use banlieue_sdk::scrub::ScrubbedWriter;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::MakeWriter;

/// How log lines look.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Plain,
    /// One JSON object per line, fields flattened (for log collectors).
    Json,
}

impl LogFormat {
    /// Every format, as `--log-format` takes them.
    pub const ALL: [LogFormat; 2] = [LogFormat::Plain, LogFormat::Json];

    /// The format's name (`plain`, `json`).
    pub fn as_str(self) -> &'static str {
        match self {
            LogFormat::Plain => "plain",
            LogFormat::Json => "json",
        }
    }
}

impl std::fmt::Display for LogFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for LogFormat {
    type Err = String;

    /// `plain` or `json` (any case), so a CLI of any kind takes `--log-format`.
    fn from_str(s: &str) -> Result<Self, String> {
        LogFormat::ALL
            .into_iter()
            .find(|f| f.as_str().eq_ignore_ascii_case(s))
            .ok_or_else(|| format!("{s:?} is not a log format: plain or json"))
    }
}

/// The filter directives in effect: `--log-level`, else `RUST_LOG`, else `info`.
pub fn directives(flag: Option<&str>, rust_log: Option<&str>) -> String {
    flag.or(rust_log)
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .unwrap_or("info")
        .to_string()
}

/// Checks `--log-level` as a tracing filter (e.g. `info`, `debug,kube=info`).
pub fn parse_directives(s: &str) -> Result<String, String> {
    EnvFilter::builder()
        .parse(s)
        .map(|_| s.to_string())
        .map_err(|e| e.to_string())
}

/// Stderr, one scrubbed line per log event: the writer for an embedder that installs
/// its own subscriber ([`Logging::Installed`]) and wants banlieue's scrubbing.
pub fn scrubbed_stderr() -> impl for<'a> MakeWriter<'a> + Send + Sync + 'static {
    || ScrubbedWriter::new(std::io::stderr())
}

/// Who installs the process's logger ([`crate::RunConfig::logging`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Logging {
    /// [`crate::run`] installs the scrubbing logger on stderr ([`init`]) as it starts:
    /// the default, so an embedder's logs lose credentials without doing anything.
    Install {
        /// How lines look.
        format: LogFormat,
        /// Filter directives (see [`directives`]).
        directives: String,
    },
    /// The embedder installed the global subscriber itself before [`crate::run`]
    /// (`banlieue run` does, with [`init`]): an explicit opt-out, which leaves
    /// scrubbing to that subscriber's writer (use [`scrubbed_stderr`], or wrap yours in
    /// `banlieue_sdk::scrub::ScrubbedWriter`).
    Installed,
}

impl Default for Logging {
    /// [`Logging::Install`], plain lines, `RUST_LOG` else `info`.
    fn default() -> Self {
        Self::Install {
            format: LogFormat::Plain,
            directives: directives(None, std::env::var("RUST_LOG").ok().as_deref()),
        }
    }
}

impl Logging {
    /// Installs the logger when it is ours to install.
    pub fn apply(&self) -> crate::Result<()> {
        match self {
            Self::Install { format, directives } => init(*format, directives).map_err(|e| {
                crate::Error::Logging(format!(
                    "{e}: a global logger may already be installed: to keep yours, set \
                     RunConfig.logging to Logging::Installed (and write through \
                     logging::scrubbed_stderr so credentials stay out of it)"
                ))
            }),
            Self::Installed => Ok(()),
        }
    }
}

/// Installs the global subscriber.
pub fn init(format: LogFormat, directives: &str) -> crate::Result<()> {
    let filter = EnvFilter::builder()
        .parse(directives)
        .map_err(|e| crate::Error::Logging(format!("log filter {directives:?}: {e}")))?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(scrubbed_stderr())
        .with_ansi(std::io::stderr().is_terminal());
    let result = match format {
        LogFormat::Plain => builder.try_init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .try_init(),
    };
    result.map_err(|e| crate::Error::Logging(format!("installing the logger: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flag_wins_over_rust_log_which_wins_over_info() {
        assert_eq!(directives(Some("debug"), Some("warn")), "debug");
        assert_eq!(directives(None, Some("warn,kube=debug")), "warn,kube=debug");
        assert_eq!(directives(None, None), "info");
        assert_eq!(directives(None, Some("")), "info");
    }

    #[test]
    fn the_runtime_installs_the_scrubbing_logger_unless_told_not_to() {
        assert!(matches!(Logging::default(), Logging::Install { .. }));
        // The first install takes; a second is refused with what to do.
        let install = Logging::Install {
            format: LogFormat::Json,
            directives: "info".into(),
        };
        install.apply().expect("the first logger installs");
        let again = install.apply().expect_err("a second global logger");
        assert!(
            format!("{again:#}").contains("Logging::Installed"),
            "{again:#}"
        );
        Logging::Installed
            .apply()
            .expect("opting out installs nothing");
    }

    #[test]
    fn log_lines_lose_registered_credentials() {
        use std::sync::{Arc, Mutex};

        #[derive(Clone, Default)]
        struct Captured(Arc<Mutex<Vec<u8>>>);
        impl std::io::Write for Captured {
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(buf);
                Ok(buf.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let captured = Captured::default();
        let sink = captured.clone();
        let subscriber = tracing_subscriber::fmt()
            .json()
            .with_writer(move || ScrubbedWriter::new(sink.clone()))
            .finish();
        banlieue_sdk::scrub::global().register("test/logging", ["log-test-s3cr3t\"quoted"]);
        tracing::subscriber::with_default(subscriber, || {
            tracing::warn!(
                error = "login as root with log-test-s3cr3t\"quoted failed",
                "check failed"
            );
        });
        banlieue_sdk::scrub::global().forget("test/logging");
        let text = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
        assert!(
            text.contains("login as root with [redacted] failed"),
            "{text}"
        );
        assert!(!text.contains("s3cr3t"), "{text}");
    }

    #[test]
    fn directives_are_checked() {
        assert!(parse_directives("info").is_ok());
        assert!(parse_directives("debug,kube=warn,banlieue_sdk=trace").is_ok());
        assert!(parse_directives("kube=notalevel").is_err());
    }
}
