//! A value that must never be printed: credentials and bootstrap data.

use std::fmt;

/// A secret string. `Debug` and `Display` print `<redacted>`, so it can sit inside
/// structs that get logged without leaking; read it with [`SecretValue::expose`].
#[derive(Clone, PartialEq, Eq, Default)]
pub struct SecretValue(String);

impl SecretValue {
    /// Wraps a secret.
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The secret itself, for the one place that sends it to the backend.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Debug for SecretValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

impl fmt::Display for SecretValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

impl From<&str> for SecretValue {
    fn from(value: &str) -> Self {
        Self::new(value)
    }
}

impl From<String> for SecretValue {
    fn from(value: String) -> Self {
        Self(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn never_prints_the_value() {
        let secret = SecretValue::new("hunter2");
        assert_eq!(format!("{secret:?} {secret}"), "<redacted> <redacted>");
        assert_eq!(secret.expose(), "hunter2");
    }
}
