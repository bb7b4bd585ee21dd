//! `/debug/pprof/profile`: a CPU profile of the whole process, in the format Go's
//! `net/http/pprof` serves (a gzipped `perftools.profiles.Profile`), so that
//! `go tool pprof https://…:8443/debug/pprof/profile?seconds=10` reads it as it reads a
//! Cluster API provider's. Sampled by pprof-rs (SIGPROF at [`FREQUENCY`] Hz, as Go
//! samples); see docs/adr/0018-pprof-profiles.md.
//!
//! `seconds` is how long to sample: [`DEFAULT_SECONDS`] when absent or empty, as in Go;
//! a whole number from 1 to [`MAX_SECONDS`] otherwise. Anything else (0, `abc`, `2.5`,
//! more than the maximum) is 400: a profile shorter than asked for is worse than an
//! answer saying why. The profiler is process-wide, so one profile at a time: a request
//! while one is being taken is 409.

use std::io::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use ::pprof::protos::Message as _;
use axum::http::{StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use flate2::Compression;
use flate2::write::GzEncoder;

/// How long a profile samples when the request does not say.
pub const DEFAULT_SECONDS: u64 = 30;
/// The longest profile served.
pub const MAX_SECONDS: u64 = 60;
/// Samples per second (Go's `runtime/pprof` rate).
const FREQUENCY: i32 = 100;
/// Libraries not unwound from a signal handler (pprof-rs' advice: unwinding through
/// them can deadlock).
const BLOCKLIST: [&str; 4] = ["libc", "libgcc", "pthread", "vdso"];

/// Whether a profile is being taken.
static BUSY: AtomicBool = AtomicBool::new(false);

/// The right to take the one profile; given back on drop (also when the caller goes
/// away mid-profile and the handler is dropped).
struct Busy;

impl Busy {
    fn take() -> Option<Self> {
        BUSY.compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
            .then_some(Busy)
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        BUSY.store(false, Ordering::Release);
    }
}

/// The sampling time a query string asks for (its first `seconds`, as Go's `FormValue`
/// reads it), or why it is refused.
pub fn seconds(query: Option<&str>) -> Result<u64, String> {
    let asked = query
        .unwrap_or_default()
        .split('&')
        .map(|pair| pair.split_once('=').unwrap_or((pair, "")))
        .find(|(key, _)| *key == "seconds")
        .map(|(_, value)| value);
    match asked {
        None | Some("") => Ok(DEFAULT_SECONDS),
        Some(value) => match value.parse::<u64>() {
            Ok(n) if (1..=MAX_SECONDS).contains(&n) => Ok(n),
            _ => Err(format!(
                "seconds must be a whole number from 1 to {MAX_SECONDS}, not {value:?}"
            )),
        },
    }
}

/// Samples the process for `seconds` (the guard stops the profiler when dropped).
async fn sample(seconds: u64) -> anyhow::Result<Vec<u8>> {
    // Starting resolves a backtrace once (pprof-rs' warm-up) and reads the loaded
    // libraries: off the async workers, as is symbolising the report.
    let guard = tokio::task::spawn_blocking(|| {
        ::pprof::ProfilerGuardBuilder::default()
            .frequency(FREQUENCY)
            .blocklist(&BLOCKLIST)
            .build()
    })
    .await??;
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    tokio::task::spawn_blocking(move || {
        let profile = guard.report().build()?.pprof()?;
        drop(guard);
        let mut gzip = GzEncoder::new(Vec::new(), Compression::default());
        gzip.write_all(&profile.encode_to_vec())?;
        Ok(gzip.finish()?)
    })
    .await?
}

/// `GET /debug/pprof/profile[?seconds=N]`.
pub(super) async fn profile(uri: Uri) -> Response {
    let seconds = match seconds(uri.query()) {
        Ok(seconds) => seconds,
        Err(why) => {
            return (StatusCode::BAD_REQUEST, format!("Bad Request: {why}\n")).into_response();
        }
    };
    let Some(_busy) = Busy::take() else {
        return (
            StatusCode::CONFLICT,
            "Conflict: a CPU profile is already being taken; ask again when it is done\n",
        )
            .into_response();
    };
    tracing::info!(seconds, "diagnostics: taking a CPU profile");
    match sample(seconds).await {
        Ok(body) => (
            StatusCode::OK,
            [
                (header::CONTENT_TYPE, "application/octet-stream"),
                (
                    header::CONTENT_DISPOSITION,
                    "attachment; filename=\"profile\"",
                ),
                (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            ],
            body,
        )
            .into_response(),
        Err(error) => {
            tracing::error!(error = format!("{error:#}"), "diagnostics: CPU profile");
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("Internal Server Error: could not take the CPU profile: {error:#}\n"),
            )
                .into_response()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_default_as_in_go_and_are_bounded() {
        assert_eq!(seconds(None), Ok(DEFAULT_SECONDS));
        assert_eq!(seconds(Some("")), Ok(DEFAULT_SECONDS));
        assert_eq!(seconds(Some("seconds=")), Ok(DEFAULT_SECONDS));
        assert_eq!(seconds(Some("debug=1")), Ok(DEFAULT_SECONDS));
        assert_eq!(seconds(Some("seconds=1")), Ok(1));
        assert_eq!(seconds(Some("x=y&seconds=60")), Ok(60));
        for refused in [
            "seconds=0",
            "seconds=61",
            "seconds=abc",
            "seconds=2.5",
            "seconds=-1",
        ] {
            assert!(seconds(Some(refused)).is_err(), "{refused}");
        }
    }

    #[test]
    fn one_profile_at_a_time() {
        let first = Busy::take().expect("nobody is profiling");
        assert!(Busy::take().is_none());
        drop(first);
        assert!(Busy::take().is_some());
    }
}
