//! What the benchmark binaries share: the audit-log and `/proc` measurements, the
//! operator child process, and the SVG charts.
//!
//! `banlieue-bench` (`make bench`) is the scale benchmark against the minimal-writes
//! floor; `capi-peer-bench` (`make bench-capi-peer`) runs one Cluster API workload
//! against banlieue and against Cluster API's own in-memory provider.

pub mod measure;
pub mod operator;
pub mod svg;

use http::{HeaderName, HeaderValue};
use kube::Client;

/// A client of `control_plane` whose requests carry [`measure::BENCH_USER_AGENT`], so the
/// audit log tells them from the operator's.
pub async fn bench_client(
    control_plane: &banlieue_testenv::ControlPlane,
) -> anyhow::Result<Client> {
    // Building one harness client installs rustls's crypto provider for the process.
    drop(control_plane.client().await);
    let mut config = control_plane.kube_config();
    config.headers.push((
        HeaderName::from_static("user-agent"),
        HeaderValue::from_static(measure::BENCH_USER_AGENT),
    ));
    Ok(Client::try_from(config)?)
}

/// The median of `values` (the mean of the middle two for an even count); NaN if empty.
pub fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    match n {
        0 => f64::NAN,
        _ if n % 2 == 1 => values[n / 2],
        _ => f64::midpoint(values[n / 2 - 1], values[n / 2]),
    }
}

#[cfg(test)]
mod tests {
    use super::median;

    #[test]
    fn medians() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), 2.5);
        assert!(median(vec![]).is_nan());
    }
}
