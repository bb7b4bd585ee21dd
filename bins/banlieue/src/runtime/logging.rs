//! Structured logs on stderr (`--log-format`, `--log-level`).
//!
//! Nothing logs secret values: credentials only ever travel inside the SDK's
//! `SecretValue`, whose `Debug` and `Display` print a placeholder, and the kube
//! `Config` (which holds tokens and keys) is never logged.

use std::io::IsTerminal as _;

use clap::ValueEnum;
use tracing_subscriber::EnvFilter;

/// How log lines look.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Plain,
    /// One JSON object per line, fields flattened (for log collectors).
    Json,
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

/// Installs the global subscriber.
pub fn init(format: LogFormat, directives: &str) -> anyhow::Result<()> {
    let filter = EnvFilter::builder().parse(directives)?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    let result = match format {
        LogFormat::Plain => builder.try_init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .try_init(),
    };
    result.map_err(|e| anyhow::anyhow!("installing the logger: {e}"))
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
    fn directives_are_checked() {
        assert!(parse_directives("info").is_ok());
        assert!(parse_directives("debug,kube=warn,banlieue_sdk=trace").is_ok());
        assert!(parse_directives("kube=notalevel").is_err());
    }
}
