//! Ages the way `kubectl get` prints them, so our table reads like kubectl's own.

/// `seconds` as kubectl's `HumanDuration` does: the precision shrinks as the age grows
/// (`45s`, `5m30s`, `47m`, `3h20m`, `26h`, `3d4h`, `300d`, `2y45d`, `9y`).
pub fn human(seconds: i64) -> String {
    if seconds < 0 {
        // A clock ahead of the apiserver's: kubectl prints `<invalid>` too.
        return "<invalid>".into();
    }
    let (minute, hour, day, year) = (60, 3600, 86_400, 365 * 86_400);
    match seconds {
        s if s < 2 * minute => format!("{s}s"),
        s if s < 10 * minute => with_rest(s / minute, "m", s % minute, "s"),
        s if s < 3 * hour => format!("{}m", s / minute),
        s if s < 8 * hour => with_rest(s / hour, "h", s % hour / minute, "m"),
        s if s < 48 * hour => format!("{}h", s / hour),
        s if s < 8 * day => with_rest(s / day, "d", s % day / hour, "h"),
        s if s < 2 * year => format!("{}d", s / day),
        s if s < 8 * year => with_rest(s / year, "y", s % year / day, "d"),
        s => format!("{}y", s / year),
    }
}

fn with_rest(major: i64, major_unit: &str, minor: i64, minor_unit: &str) -> String {
    if minor == 0 {
        format!("{major}{major_unit}")
    } else {
        format!("{major}{major_unit}{minor}{minor_unit}")
    }
}

#[cfg(test)]
mod tests {
    use super::human;

    #[test]
    fn matches_kubectl_human_duration() {
        let cases = [
            (-5, "<invalid>"),
            (0, "0s"),
            (119, "119s"),
            (120, "2m"),
            (330, "5m30s"),
            (600, "10m"),
            (47 * 60 + 59, "47m"),
            (3 * 3600 + 20 * 60, "3h20m"),
            (8 * 3600, "8h"),
            (26 * 3600, "26h"),
            (3 * 86_400 + 4 * 3600, "3d4h"),
            (300 * 86_400, "300d"),
            (2 * 365 * 86_400 + 45 * 86_400, "2y45d"),
            (9 * 365 * 86_400, "9y"),
        ];
        for (seconds, want) in cases {
            assert_eq!(human(seconds), want, "{seconds}s");
        }
    }
}
