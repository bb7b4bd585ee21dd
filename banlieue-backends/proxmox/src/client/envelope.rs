//! PVE's JSON envelope: `{"data": ...}` on success; `{"data": null, "message": ...,
//! "errors": {field: text}}` with an HTTP error status otherwise.

use std::collections::BTreeMap;

use banlieue_sdk::backend::BackendError;
use serde_json::Value;

/// An error answer from PVE, or a failure to reach it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PveError {
    /// PVE answered with an error status.
    Api {
        /// HTTP status (PVE also uses 595/596 for unreachable nodes).
        status: u16,
        /// PVE's `message` (trailing newline trimmed), else the HTTP reason phrase.
        message: String,
        /// Per-parameter errors of a 400 `Parameter verification failed.`.
        errors: BTreeMap<String, String>,
    },
    /// No answer: connection refused, TLS failure, timeout.
    Transport(String),
    /// An answer that is not PVE's envelope, or not the shape expected.
    Decode(String),
}

impl std::fmt::Display for PveError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Api {
                status,
                message,
                errors,
            } => {
                write!(f, "{message} (HTTP {status})")?;
                for (field, error) in errors {
                    write!(f, "; {field}: {}", error.trim_end())?;
                }
                Ok(())
            }
            Self::Transport(m) => write!(f, "{m}"),
            Self::Decode(m) => write!(f, "unexpected answer from Proxmox VE: {m}"),
        }
    }
}

impl std::error::Error for PveError {}

impl PveError {
    /// The HTTP status of an API error.
    pub fn status(&self) -> Option<u16> {
        match self {
            Self::Api { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// PVE's message of an API error (empty otherwise).
    pub fn message(&self) -> &str {
        match self {
            Self::Api { message, .. } => message,
            _ => "",
        }
    }

    /// PVE's way of saying "no such VM": a 500 about a missing config file.
    pub fn is_missing_vm(&self) -> bool {
        let m = self.message();
        self.status() == Some(500)
            && (m.contains("does not exist") || m.contains("unable to find configuration file"))
    }

    /// A clone's or `nextid`'s VMID is taken.
    pub fn is_vmid_taken(&self) -> bool {
        let m = self.message();
        let fields = match self {
            Self::Api { errors, .. } => errors.values().any(|e| e.contains("already exists")),
            _ => false,
        };
        fields || m.contains("already exists")
    }

    /// Classifies the error for the controllers.
    pub fn into_backend(self) -> BackendError {
        let text = self.to_string();
        match &self {
            Self::Transport(_) => BackendError::transient("Unreachable", text),
            Self::Decode(_) => BackendError::transient("UnexpectedResponse", text),
            Self::Api {
                status, message, ..
            } => {
                let m = message.as_str();
                match status {
                    401 => BackendError::terminal("Unauthorized", text),
                    403 => BackendError::terminal("Forbidden", text),
                    400 => BackendError::terminal("InvalidRequest", text),
                    _ if is_lock_message(m) => BackendError::transient("VMLocked", text),
                    _ if m.contains("no quorum") => BackendError::transient("NoQuorum", text),
                    500 if m.contains("hostname lookup") || m.contains("no such cluster node") => {
                        BackendError::terminal("UnknownNode", text)
                    }
                    595 | 596 => BackendError::transient("NodeUnreachable", text),
                    501 => BackendError::terminal("NotImplemented", text),
                    _ => BackendError::transient("ServerError", text),
                }
            }
        }
    }
}

/// `VM is locked (backup)`, `can't lock file '...' - got timeout`: wait and retry.
pub fn is_lock_message(message: &str) -> bool {
    message.contains("VM is locked")
        || (message.contains("lock file") && message.contains("timeout"))
}

/// Reads PVE's envelope: `data` for a 2xx status, else the error it describes.
/// `reason` is the HTTP reason phrase, used when the body carries no message.
pub fn parse(status: u16, reason: &str, body: &[u8]) -> Result<Value, PveError> {
    let parsed: Option<Value> = serde_json::from_slice(body).ok();
    if (200..300).contains(&status) {
        let mut value = parsed.ok_or_else(|| {
            PveError::Decode(format!(
                "HTTP {status} with a body that is not JSON: {}",
                snippet(body)
            ))
        })?;
        return Ok(value
            .get_mut("data")
            .map(Value::take)
            .unwrap_or(Value::Null));
    }
    let message = parsed
        .as_ref()
        .and_then(|v| v.get("message"))
        .and_then(Value::as_str)
        .map(|m| m.trim_end().to_string())
        .filter(|m| !m.is_empty())
        .unwrap_or_else(|| {
            if reason.is_empty() {
                format!("HTTP {status}: {}", snippet(body))
            } else {
                reason.to_string()
            }
        });
    let errors = parsed
        .as_ref()
        .and_then(|v| v.get("errors"))
        .and_then(Value::as_object)
        .map(|o| {
            o.iter()
                .map(|(k, v)| {
                    let text = v
                        .as_str()
                        .map(str::to_string)
                        .unwrap_or_else(|| v.to_string());
                    (k.clone(), text.trim_end().to_string())
                })
                .collect()
        })
        .unwrap_or_default();
    Err(PveError::Api {
        status,
        message,
        errors,
    })
}

fn snippet(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    match text.char_indices().nth(200) {
        Some((i, _)) => format!("{}...", &text[..i]),
        None => text.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use banlieue_sdk::backend::ErrorClass;

    fn golden(name: &str) -> Vec<u8> {
        let path = format!("{}/tests/golden/{name}", env!("CARGO_MANIFEST_DIR"));
        std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    #[test]
    fn success_unwraps_data() {
        let data = parse(200, "OK", &golden("version.json")).unwrap();
        assert_eq!(data["version"], "9.0.10");
        let upid = parse(200, "OK", &golden("clone.json")).unwrap();
        assert!(upid.as_str().unwrap().starts_with("UPID:pve1:"));
    }

    #[test]
    fn parameter_errors_keep_every_field() {
        let error = parse(
            400,
            "Parameter verification failed.",
            &golden("error_400_params.json"),
        )
        .unwrap_err();
        let PveError::Api {
            status,
            ref message,
            ref errors,
        } = error
        else {
            panic!("{error:?}")
        };
        assert_eq!(
            (status, message.as_str()),
            (400, "Parameter verification failed.")
        );
        assert_eq!(errors["cores"], "type check ('integer') failed - got 'abc'");
        assert!(errors["net0"].starts_with("invalid format"));
        let backend = error.into_backend();
        assert_eq!(backend.class, ErrorClass::Terminal);
        assert_eq!(backend.reason, "InvalidRequest");
        assert!(
            backend.message.contains("cores: type check"),
            "{}",
            backend.message
        );
    }

    #[test]
    fn bad_token_is_terminal_unauthorized_with_pves_words() {
        let error = parse(
            401,
            "authentication failure",
            &golden("error_401_token.json"),
        )
        .unwrap_err();
        let backend = error.into_backend();
        assert_eq!(backend.class, ErrorClass::Terminal);
        assert_eq!(backend.reason, "Unauthorized");
        assert_eq!(backend.message, "authentication failure (HTTP 401)");
    }

    #[test]
    fn missing_vm_is_recognised() {
        let error = parse(500, "", &golden("error_500_missing.json")).unwrap_err();
        assert!(error.is_missing_vm());
        assert_eq!(
            error.message(),
            "Configuration file 'nodes/pve1/qemu-server/555.conf' does not exist"
        );
    }

    #[test]
    fn locks_and_quorum_are_transient() {
        for (message, reason) in [
            ("VM is locked (backup)", "VMLocked"),
            (
                "can't lock file '/var/lock/qemu-server/lock-100.conf' - got timeout",
                "VMLocked",
            ),
            ("cluster not ready - no quorum?", "NoQuorum"),
            ("internal error", "ServerError"),
        ] {
            let body = serde_json::json!({"data": null, "message": format!("{message}\n")});
            let error = parse(500, "", body.to_string().as_bytes()).unwrap_err();
            let backend = error.into_backend();
            assert!(backend.is_transient(), "{message}");
            assert_eq!(backend.reason, reason);
        }
    }

    #[test]
    fn a_body_without_message_falls_back_to_the_reason_phrase() {
        let error = parse(502, "Bad Gateway", b"<html>proxy</html>").unwrap_err();
        assert_eq!(error.message(), "Bad Gateway");
        let error = parse(502, "", b"<html>proxy</html>").unwrap_err();
        assert_eq!(error.message(), "HTTP 502: <html>proxy</html>");
        assert!(matches!(
            parse(200, "OK", b"nope"),
            Err(PveError::Decode(_))
        ));
    }

    #[test]
    fn taken_vmids_are_recognised() {
        let body =
            br#"{"data":null,"message":"unable to create VM 101: config file already exists\n"}"#;
        assert!(parse(500, "", body).unwrap_err().is_vmid_taken());
        let body = br#"{"data":null,"message":"Parameter verification failed.\n","errors":{"vmid":"VM 101 already exists"}}"#;
        assert!(parse(400, "", body).unwrap_err().is_vmid_taken());
    }
}
