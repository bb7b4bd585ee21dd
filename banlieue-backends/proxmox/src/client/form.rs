//! `application/x-www-form-urlencoded` bodies and query strings, as PVE reads them.

use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};

/// Everything but RFC 3986's unreserved characters is escaped (spaces as `%20`).
const ESCAPE: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// Percent-encodes one value the way PVE's `uri_unescape` expects: every byte outside
/// RFC 3986's unreserved set as `%XX`, spaces as `%20` (never `+`).
pub fn encode(value: &str) -> String {
    utf8_percent_encode(value, ESCAPE).to_string()
}

/// Ordered key/value pairs sent as a form body (POST, PUT) or a query string (GET,
/// DELETE). Values are strings: PVE's API takes every parameter as text.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Form {
    pairs: Vec<(String, String)>,
}

impl std::fmt::Debug for Form {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Keys only: values may carry passwords or bootstrap data.
        f.debug_list()
            .entries(self.pairs.iter().map(|(k, _)| k))
            .finish()
    }
}

impl Form {
    /// An empty form.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `key=value`.
    pub fn set(mut self, key: impl Into<String>, value: impl ToString) -> Self {
        self.push(key, value);
        self
    }

    /// Adds `key=value` when `value` is `Some`.
    pub fn set_opt(mut self, key: impl Into<String>, value: Option<impl ToString>) -> Self {
        if let Some(value) = value {
            self.push(key, value);
        }
        self
    }

    /// Adds `key=value` in place.
    pub fn push(&mut self, key: impl Into<String>, value: impl ToString) {
        self.pairs.push((key.into(), value.to_string()));
    }

    /// The value of `key`, if set.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.pairs
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// The pairs, in order.
    pub fn pairs(&self) -> &[(String, String)] {
        &self.pairs
    }

    /// True when there are no pairs.
    pub fn is_empty(&self) -> bool {
        self.pairs.is_empty()
    }

    /// `k1=v1&k2=v2`, each part percent-encoded.
    pub fn encode(&self) -> String {
        self.pairs
            .iter()
            .map(|(k, v)| format!("{}={}", encode(k), encode(v)))
            .collect::<Vec<_>>()
            .join("&")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_pairs_in_order_with_percent_twenty_spaces() {
        let form = Form::new()
            .set("newid", 123)
            .set("name", "web 1")
            .set("net0", "virtio,bridge=vmbr0,tag=10")
            .set_opt("pool", None::<&str>);
        assert_eq!(
            form.encode(),
            "newid=123&name=web%201&net0=virtio%2Cbridge%3Dvmbr0%2Ctag%3D10"
        );
        assert_eq!(form.get("name"), Some("web 1"));
        assert_eq!(format!("{form:?}"), r#"["newid", "name", "net0"]"#);
    }

    #[test]
    fn unicode_and_reserved_characters_are_escaped() {
        assert_eq!(encode("a+b/c é~"), "a%2Bb%2Fc%20%C3%A9~");
    }
}
