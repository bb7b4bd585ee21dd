//! `connection.endpoint` as users write it (with or without a trailing slash or the
//! API's path) normalised to the base URL a client joins its paths to.

use banlieue_sdk::backend::BackendError;

/// `https://host:8006`, `https://host:8006/` and `https://host:8006{api_path}` all give
/// `https://host:8006`. Anything but an `http(s)://` URL with a host is a terminal
/// `InvalidEndpoint` whose message shows `example`.
///
/// ```
/// use banlieue_kit::endpoint::base_url;
///
/// let url = base_url("https://vc.example/sdk/", "/sdk", "https://vc.example/sdk");
/// assert_eq!(url.unwrap(), "https://vc.example");
/// assert!(base_url("vc.example", "/sdk", "https://vc.example/sdk").is_err());
/// ```
pub fn base_url(endpoint: &str, api_path: &str, example: &str) -> Result<String, BackendError> {
    let trimmed = endpoint.trim().trim_end_matches('/');
    let trimmed = trimmed.strip_suffix(api_path).unwrap_or(trimmed);
    if !(trimmed.starts_with("https://") || trimmed.starts_with("http://"))
        || trimmed.len() <= "https://".len()
    {
        return Err(BackendError::terminal(
            "InvalidEndpoint",
            format!("connection.endpoint {endpoint:?} is not a URL such as {example}"),
        ));
    }
    Ok(trimmed.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_urls() {
        let ok = [
            ("https://pve:8006", "https://pve:8006"),
            ("https://pve:8006/", "https://pve:8006"),
            ("https://pve:8006/api2/json", "https://pve:8006"),
            (" https://pve:8006/api2/json/ ", "https://pve:8006"),
            ("http://127.0.0.1:9000", "http://127.0.0.1:9000"),
        ];
        for (input, want) in ok {
            assert_eq!(base_url(input, "/api2/json", "e").unwrap(), want, "{input}");
        }
        for bad in ["", "pve:8006", "https://", "ftp://pve", "https:///"] {
            let e = base_url(bad, "/api2/json", "https://pve.example:8006").unwrap_err();
            assert_eq!(e.reason, "InvalidEndpoint", "{bad}");
            assert!(
                e.message.contains("https://pve.example:8006"),
                "{}",
                e.message
            );
        }
    }
}
