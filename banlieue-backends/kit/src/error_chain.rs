//! An error with its causes, for messages a user reads: HTTP clients (reqwest) print
//! only the outermost error, which hides the TLS or DNS failure that caused it.

/// `error` and each of its sources, joined with `": "`.
pub fn with_causes(error: &(dyn std::error::Error + 'static)) -> String {
    let mut message = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        message.push_str(": ");
        message.push_str(&cause.to_string());
        source = cause.source();
    }
    message
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Outer(std::io::Error);

    impl std::fmt::Display for Outer {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("request failed")
        }
    }

    impl std::error::Error for Outer {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn every_cause_is_named_in_order() {
        let error = Outer(std::io::Error::other("certificate unknown"));
        assert_eq!(with_causes(&error), "request failed: certificate unknown");
        let alone = std::io::Error::other("refused");
        assert_eq!(with_causes(&alone), "refused");
    }
}
