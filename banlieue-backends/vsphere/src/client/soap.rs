//! The SOAP 1.1 envelope vim25 uses, and its faults.

use super::xml::{Element, Xml};

/// Wraps a method element in a SOAP envelope.
pub fn envelope(body: &str) -> String {
    format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\
         <soapenv:Envelope xmlns:soapenv=\"http://schemas.xmlsoap.org/soap/envelope/\" \
         xmlns:xsd=\"http://www.w3.org/2001/XMLSchema\" \
         xmlns:xsi=\"http://www.w3.org/2001/XMLSchema-instance\">\
         <soapenv:Body>{body}</soapenv:Body></soapenv:Envelope>"
    )
}

/// Opens a method element in the vim25 namespace with its `_this`.
pub fn method(name: &str, this: &super::MoRef) -> Xml {
    let mut x = Xml::new();
    x.open(&format!("{name} xmlns=\"urn:vim25\""))
        .moref("_this", this);
    x
}

/// A vSphere fault: its type (e.g. `InvalidLogin`, `NotAuthenticated`) and the best
/// human-readable message vSphere gave.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VimFault {
    /// The fault type, without a `Fault` suffix.
    pub kind: String,
    /// `faultstring` / `localizedMessage`, plus detail fields (`reason`, `name`, ...).
    pub message: String,
}

impl std::fmt::Display for VimFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.message.is_empty() {
            write!(f, "{}", self.kind)
        } else {
            write!(f, "{}: {}", self.kind, self.message)
        }
    }
}

/// Fault detail fields worth showing to people, in this order.
const DETAIL_FIELDS: &[&str] = &["reason", "msg", "name", "invalidProperty", "privilegeId"];

impl VimFault {
    /// Reads a fault from a `MethodFault` element (a SOAP `detail` child, or a task's
    /// `info.error.fault`) and the surrounding message (`faultstring` or a task's
    /// `localizedMessage`).
    pub fn from_detail(fault: Option<&Element>, message: &str) -> Self {
        let kind = fault
            .map(|f| {
                f.xsi_type
                    .clone()
                    .unwrap_or_else(|| f.name.trim_end_matches("Fault").to_string())
            })
            .unwrap_or_else(|| "SystemError".into());
        let mut parts: Vec<String> = Vec::new();
        // vcsim's localized messages are Go type names (`*types.DuplicateName`): noise.
        let message = message.trim();
        if !message.is_empty() && !message.starts_with('*') && message != kind {
            parts.push(message.to_string());
        }
        if let Some(f) = fault {
            for m in f.children_named("faultMessage") {
                if let Some(text) = m.text_at(&["message"]).filter(|t| !t.is_empty()) {
                    parts.push(text.to_string());
                }
            }
            for field in DETAIL_FIELDS {
                if let Some(text) = f.text_at(&[field]).map(str::trim).filter(|t| !t.is_empty()) {
                    parts.push(format!("{field} {text}"));
                }
            }
            if let Some(cause) = f.at(&["faultCause", "localizedMessage"])
                && !cause.text.is_empty()
            {
                parts.push(cause.text.clone());
            }
        }
        parts.dedup();
        // A detail that repeats the message adds nothing.
        let first = parts.first().cloned().unwrap_or_default();
        parts.retain(|p| *p == first || !first.contains(p.trim_start_matches("reason ")));
        Self {
            kind,
            message: parts.join("; "),
        }
    }

    /// Reads a SOAP `Fault` element.
    pub fn from_soap(fault: &Element) -> Self {
        let string = fault.text_at(&["faultstring"]).unwrap_or_default();
        let detail = fault.child("detail").and_then(|d| d.children.first());
        Self::from_detail(detail, string)
    }
}

/// What a response body holds: the method's `returnval`s, or a fault.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    /// The `<Method>Response` element.
    Response(Element),
    /// A SOAP fault.
    Fault(VimFault),
}

/// Parses a response envelope.
pub fn parse_response(body: &str) -> Result<Answer, String> {
    let root = Element::parse(body)?;
    let body = root
        .child("Body")
        .ok_or_else(|| "the SOAP envelope has no Body".to_string())?;
    let first = body
        .children
        .first()
        .ok_or_else(|| "the SOAP Body is empty".to_string())?;
    if first.name == "Fault" {
        return Ok(Answer::Fault(VimFault::from_soap(first)));
    }
    Ok(Answer::Response(first.clone()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_soap_fault() {
        let xml = r#"<?xml version="1.0" encoding="UTF-8"?>
<soapenv:Envelope xmlns:soapenv="http://schemas.xmlsoap.org/soap/envelope/" xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance"><soapenv:Body><soapenv:Fault><faultcode>ServerFaultCode</faultcode><faultstring>Cannot complete login due to an incorrect user name or password.</faultstring><detail><InvalidLoginFault xmlns="urn:vim25" xsi:type="InvalidLogin"></InvalidLoginFault></detail></soapenv:Fault></soapenv:Body></soapenv:Envelope>"#;
        let Answer::Fault(f) = parse_response(xml).unwrap() else {
            panic!("fault")
        };
        assert_eq!(f.kind, "InvalidLogin");
        assert_eq!(
            f.message,
            "Cannot complete login due to an incorrect user name or password."
        );
    }

    #[test]
    fn fault_without_type_uses_the_element_name() {
        let e = Element::parse(
            "<NotAuthenticatedFault><privilegeId>System.View</privilegeId></NotAuthenticatedFault>",
        )
        .unwrap();
        let f = VimFault::from_detail(Some(&e), "");
        assert_eq!(f.kind, "NotAuthenticated");
        assert_eq!(f.message, "privilegeId System.View");
    }
}
