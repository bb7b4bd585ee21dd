//! The Provider setting that caps how many machines a backend creates at once (the
//! operator enforces it; see [`super::Backend::default_max_concurrent_creates`]).

use std::collections::BTreeMap;

/// The Provider setting that caps concurrent creates.
pub const MAX_CONCURRENT_CREATES_SETTING: &str = "maxConcurrentCreates";

/// The largest cap a Provider may ask for: more creates in flight than this on one
/// hypervisor is no cap in practice, and a larger number is more likely a slip.
pub const MAX_CONCURRENT_CREATES_LIMIT: usize = 100_000;

/// The cap a Provider asks for: its setting, else its backend's default; `None` is no
/// cap (`"0"` asks for none). Anything but a whole number from 0 to
/// [`MAX_CONCURRENT_CREATES_LIMIT`] is an error saying so.
pub fn max_concurrent_creates(
    settings: &BTreeMap<String, String>,
    backend_default: Option<usize>,
) -> Result<Option<usize>, String> {
    let Some(value) = settings.get(MAX_CONCURRENT_CREATES_SETTING) else {
        return Ok(backend_default);
    };
    match value.trim().parse::<usize>() {
        Ok(0) => Ok(None),
        Ok(n) if n <= MAX_CONCURRENT_CREATES_LIMIT => Ok(Some(n)),
        // Too large for usize too ("18446744073709551616"): it is a whole number, just
        // not one allowed, so say the range rather than "not a number".
        _ => Err(format!(
            "{MAX_CONCURRENT_CREATES_SETTING} {value:?} is not a whole number from 0 (no cap) to {MAX_CONCURRENT_CREATES_LIMIT}"
        )),
    }
}
