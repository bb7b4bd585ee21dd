//! Parsers for flag values that clap has none for: Go-style durations and
//! controller-runtime-style bind addresses.

use std::net::{IpAddr, Ipv4Addr, SocketAddr, ToSocketAddrs};
use std::time::Duration;

/// Parses a duration the way Go's `time.ParseDuration` does
/// ([`banlieue_sdk::duration::parse`]): `10m`, `30s`, `1h30m`, `500ms`, `1.5s`; a bare
/// `0` is zero.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    banlieue_sdk::duration::parse(s).map_err(|e| e.to_string())
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
    fn durations_are_go_durations_with_a_unit() {
        // The parser is the SDK's (its cases are there); a flag takes no bare number.
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
        let error = parse_duration("10").unwrap_err();
        assert!(error.contains("missing unit"), "{error}");
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
