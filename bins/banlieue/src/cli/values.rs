//! Parsers for flag values that clap has none for: Go-style durations and
//! controller-runtime-style bind addresses.

use std::net::{IpAddr, Ipv4Addr, SocketAddr, ToSocketAddrs};
use std::time::Duration;

/// Parses a duration the way Go's `time.ParseDuration` does: a sequence of decimal
/// numbers, each with an optional fraction and a unit (`h`, `m`, `s`, `ms`, `us`/`µs`,
/// `ns`), e.g. `10m`, `30s`, `1h30m`, `500ms`, `1.5s`. A bare `0` is zero.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    if s.is_empty() {
        return Err("empty duration".into());
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
                return Err(format!(
                    "missing unit in duration {s:?} (use h, m, s, ms, us or ns)"
                ));
            }
            other => return Err(format!("unknown unit {other:?} in duration {s:?}")),
        };
        nanos += scaled(number, per_unit)
            .ok_or_else(|| format!("invalid number {number:?} in duration {s:?}"))?;
    }
    let secs =
        u64::try_from(nanos / 1_000_000_000).map_err(|_| format!("duration {s:?} is too long"))?;
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

/// A server's bind address; `None` when disabled with `0`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BindAddress(pub Option<SocketAddr>);

/// Parses a bind address: `:9440` (every IPv4 interface), `127.0.0.1:9440`,
/// `[::1]:9440`, `localhost:9440` or `host:port` (resolved now). `0` disables
/// the server, as in controller-runtime.
pub fn parse_bind_address(s: &str) -> Result<BindAddress, String> {
    socket_address(s).map(BindAddress)
}

fn socket_address(s: &str) -> Result<Option<SocketAddr>, String> {
    let s = s.trim();
    if s == "0" {
        return Ok(None);
    }
    let (host, port) = s.rsplit_once(':').ok_or_else(|| {
        format!("address {s:?} has no port (use :PORT or HOST:PORT, or 0 to disable)")
    })?;
    let port: u16 = port
        .parse()
        .map_err(|_| format!("invalid port {port:?} in address {s:?}"))?;
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    let ip = match host {
        "" => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        "localhost" => IpAddr::V4(Ipv4Addr::LOCALHOST),
        host => match host.parse::<IpAddr>() {
            Ok(ip) => ip,
            Err(_)
                if host
                    .bytes()
                    .all(|b| b.is_ascii_digit() || b == b'.' || b == b':') =>
            {
                return Err(format!("invalid IP address {host:?} in address {s:?}"));
            }
            Err(_) => {
                return (host, port)
                    .to_socket_addrs()
                    .map_err(|e| format!("cannot resolve {host:?}: {e}"))?
                    .next()
                    .map(Some)
                    .ok_or_else(|| format!("{host:?} resolves to no address"));
            }
        },
    };
    Ok(Some(SocketAddr::new(ip, port)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        let cases = [
            ("0", Duration::ZERO),
            ("10m", Duration::from_secs(600)),
            ("30s", Duration::from_secs(30)),
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
            assert_eq!(parse_duration(input), Ok(want), "{input}");
        }
    }

    #[test]
    fn bad_durations() {
        for input in [
            "", "10", "s", "1d", "1.2.3s", "-5s", "5 s", "1h30", ".s", "m10",
        ] {
            assert!(parse_duration(input).is_err(), "{input:?} should not parse");
        }
    }

    #[test]
    fn addresses() {
        let some = |s: &str| BindAddress(Some(s.parse::<SocketAddr>().unwrap()));
        assert_eq!(parse_bind_address(":9440"), Ok(some("0.0.0.0:9440")));
        assert_eq!(
            parse_bind_address("127.0.0.1:8443"),
            Ok(some("127.0.0.1:8443"))
        );
        assert_eq!(parse_bind_address("0.0.0.0:0"), Ok(some("0.0.0.0:0")));
        assert_eq!(parse_bind_address("[::1]:9440"), Ok(some("[::1]:9440")));
        assert_eq!(
            parse_bind_address("localhost:9440"),
            Ok(some("127.0.0.1:9440"))
        );
        assert_eq!(parse_bind_address("0"), Ok(BindAddress(None)));
    }

    #[test]
    fn bad_addresses() {
        for input in ["", "9440", ":", ":http", ":70000", "127.0.0.1", "[::1]"] {
            assert!(
                parse_bind_address(input).is_err(),
                "{input:?} should not parse"
            );
        }
    }
}
