//! The Provider setting that caps how many machines a backend creates at once (the
//! operator enforces it; see [`super::Backend::default_max_concurrent_creates`]).

use std::collections::BTreeMap;

/// The Provider setting that caps concurrent creates.
pub const MAX_CONCURRENT_CREATES_SETTING: &str = "maxConcurrentCreates";

/// The cap a Provider asks for: its setting, else its backend's default; `None` is no
/// cap (`"0"` asks for none).
pub fn max_concurrent_creates(
    settings: &BTreeMap<String, String>,
    backend_default: Option<usize>,
) -> Result<Option<usize>, String> {
    let Some(value) = settings.get(MAX_CONCURRENT_CREATES_SETTING) else {
        return Ok(backend_default);
    };
    match value.trim().parse::<usize>() {
        Ok(0) => Ok(None),
        Ok(n) => Ok(Some(n)),
        Err(_) => Err(format!(
            "{MAX_CONCURRENT_CREATES_SETTING} {value:?} is not a whole number (0 for no cap)"
        )),
    }
}
