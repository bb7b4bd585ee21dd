//! Go-style durations (`90s`, `1m30s`, `500ms`, `1h`, `0s`), as flags, settings and
//! environment variables spell them: one parser for the operator, the backends and the
//! test tools.

use std::fmt;
use std::time::Duration;

/// Why a text is not a duration; its message names the text and the problem.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DurationError(String);

impl fmt::Display for DurationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for DurationError {}

/// Parses a duration the way Go's `time.ParseDuration` does: a sequence of decimal
/// numbers, each with an optional fraction and a unit (`h`, `m`, `s`, `ms`, `us`/`µs`,
/// `ns`), e.g. `10m`, `30s`, `1h30m`, `500ms`, `1.5s`. A bare `0` is zero; surrounding
/// whitespace is ignored. Negative durations are rejected.
///
/// ```
/// use std::time::Duration;
/// use banlieue_sdk::duration::parse;
///
/// assert_eq!(parse("1m30s").unwrap(), Duration::from_secs(90));
/// assert_eq!(parse("500ms").unwrap(), Duration::from_millis(500));
/// assert!(parse("90").is_err(), "a unit is required");
/// ```
pub fn parse(s: &str) -> Result<Duration, DurationError> {
    let s = s.trim();
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    if s.is_empty() {
        return Err(DurationError("empty duration".into()));
    }
    let mut rest = s;
    let mut nanos: u128 = 0;
    while !rest.is_empty() {
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let number = &rest[..number_len];
        rest = &rest[number_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let unit = &rest[..unit_len];
        rest = &rest[unit_len..];
        let per_unit: u128 = match unit {
            "h" => 3_600_000_000_000,
            "m" => 60_000_000_000,
            "s" => 1_000_000_000,
            "ms" => 1_000_000,
            "us" | "µs" => 1_000,
            "ns" => 1,
            "" => {
                return Err(DurationError(format!(
                    "missing unit in duration {s:?} (use h, m, s, ms, us or ns)"
                )));
            }
            other => {
                return Err(DurationError(format!(
                    "unknown unit {other:?} in duration {s:?}"
                )));
            }
        };
        nanos += scaled(number, per_unit)
            .ok_or_else(|| DurationError(format!("invalid number {number:?} in duration {s:?}")))?;
    }
    let secs = u64::try_from(nanos / 1_000_000_000)
        .map_err(|_| DurationError(format!("duration {s:?} is too long")))?;
    // The remainder is below one second, so it fits in u32.
    Ok(Duration::new(secs, (nanos % 1_000_000_000) as u32))
}

/// `number * per_unit`, where `number` is a decimal with an optional fraction.
fn scaled(number: &str, per_unit: u128) -> Option<u128> {
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() && fraction.is_empty() {
        return None;
    }
    let digits = |d: &str| d.bytes().all(|b| b.is_ascii_digit());
    if !digits(whole) || !digits(fraction) {
        return None;
    }
    let whole: u128 = if whole.is_empty() {
        0
    } else {
        whole.parse().ok()?
    };
    let mut total = whole.checked_mul(per_unit)?;
    let mut scale = per_unit;
    for digit in fraction.bytes() {
        scale /= 10;
        total = total.checked_add(u128::from(digit - b'0') * scale)?;
    }
    Some(total)
}

/// Parses a duration as settings and test tools accept it: a bare whole number is
/// seconds (`90`), anything else is a Go-style duration ([`parse`]); whitespace around
/// the text and between a number and its unit (`90 s`) is ignored.
///
/// ```
/// use std::time::Duration;
/// use banlieue_sdk::duration::parse_or_seconds;
///
/// assert_eq!(parse_or_seconds("90").unwrap(), Duration::from_secs(90));
/// assert_eq!(parse_or_seconds("1m30s").unwrap(), Duration::from_secs(90));
/// ```
pub fn parse_or_seconds(text: &str) -> Result<Duration, DurationError> {
    let text = text.trim();
    if let Ok(secs) = text.parse::<u64>() {
        return Ok(Duration::from_secs(secs));
    }
    let compact: String = text.chars().filter(|c| !c.is_whitespace()).collect();
    parse(&compact).map_err(|_| DurationError(format!("{text:?} is not a duration")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations() {
        let cases = [
            ("0", Duration::ZERO),
            ("0s", Duration::ZERO),
            ("90s", Duration::from_secs(90)),
            ("1m30s", Duration::from_secs(90)),
            ("1h", Duration::from_secs(3600)),
            ("10m", Duration::from_secs(600)),
            ("1h30m", Duration::from_secs(5400)),
            ("500ms", Duration::from_millis(500)),
            ("1.5s", Duration::from_millis(1500)),
            (".5h", Duration::from_secs(1800)),
            ("2h45m30s", Duration::from_secs(2 * 3600 + 45 * 60 + 30)),
            ("1s500ms", Duration::from_millis(1500)),
            ("250us", Duration::from_micros(250)),
            ("250µs", Duration::from_micros(250)),
            ("7ns", Duration::from_nanos(7)),
            (" 15s ", Duration::from_secs(15)),
        ];
        for (input, want) in cases {
            assert_eq!(parse(input), Ok(want), "{input}");
        }
    }

    #[test]
    fn bad_go_durations() {
        for input in [
            "", "10", "s", "1d", "1.2.3s", "-5s", "5 s", "1h30", ".s", "m10",
        ] {
            assert!(parse(input).is_err(), "{input:?} should not parse");
        }
    }

    #[test]
    fn errors_say_what_is_wrong() {
        let message = |s| parse(s).unwrap_err().to_string();
        assert_eq!(message(""), "empty duration");
        assert_eq!(message("1d"), "unknown unit \"d\" in duration \"1d\"");
        assert!(
            message("10").starts_with("missing unit"),
            "{}",
            message("10")
        );
        assert!(message("1.2.3s").starts_with("invalid number"));
        assert!(message("99999999999999999999h").ends_with("is too long"));
    }

    #[test]
    fn bare_seconds_and_spaced_units() {
        assert_eq!(parse_or_seconds("90"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_or_seconds(" 0 "), Ok(Duration::ZERO));
        assert_eq!(parse_or_seconds("90 s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_or_seconds("500 ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_or_seconds("2m"), Ok(Duration::from_secs(120)));
        for bad in ["", "soon", "5x", "1 5", "-5"] {
            assert!(parse_or_seconds(bad).is_err(), "{bad:?} should not parse");
        }
    }
}
