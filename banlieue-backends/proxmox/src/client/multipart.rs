//! `multipart/form-data` bodies for PVE's storage upload: the plain fields first
//! (pveproxy reads them before the file), then the file.

use super::Form;

/// A complete multipart body with its boundary.
pub struct Body {
    boundary: String,
    bytes: Vec<u8>,
}

impl Body {
    /// The body for `fields` and one file part.
    pub fn new(fields: &Form, file_field: &str, filename: &str, data: &[u8]) -> Self {
        let boundary = boundary_for(fields, data);
        let mut bytes = Vec::with_capacity(data.len() + 512);
        for (key, value) in fields.pairs() {
            bytes.extend_from_slice(
                format!(
                    "--{boundary}\r\nContent-Disposition: form-data; name=\"{}\"\r\n\r\n{value}\r\n",
                    quote(key)
                )
                .as_bytes(),
            );
        }
        bytes.extend_from_slice(
            format!(
                "--{boundary}\r\nContent-Disposition: form-data; name=\"{}\"; filename=\"{}\"\r\nContent-Type: application/octet-stream\r\n\r\n",
                quote(file_field),
                quote(filename)
            )
            .as_bytes(),
        );
        bytes.extend_from_slice(data);
        bytes.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
        Self { boundary, bytes }
    }

    /// `multipart/form-data; boundary=…`.
    pub fn content_type(&self) -> String {
        format!("multipart/form-data; boundary={}", self.boundary)
    }

    /// The encoded body.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }
}

fn quote(text: &str) -> String {
    text.replace(['"', '\r', '\n'], "_")
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// A boundary that occurs in no part (RFC 2046 5.1.1).
fn boundary_for(fields: &Form, data: &[u8]) -> String {
    (0u64..)
        .map(|n| format!("banlieue-{n:016x}-boundary"))
        .find(|b| {
            !contains(data, b.as_bytes())
                && !fields.pairs().iter().any(|(_, v)| v.contains(b.as_str()))
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_come_first_then_the_file() {
        let body = Body::new(
            &Form::new().set("content", "iso"),
            "filename",
            "seed.iso",
            b"DATA",
        );
        let text = String::from_utf8(body.bytes().to_vec()).unwrap();
        assert_eq!(
            text,
            "--banlieue-0000000000000000-boundary\r\nContent-Disposition: form-data; name=\"content\"\r\n\r\niso\r\n\
             --banlieue-0000000000000000-boundary\r\nContent-Disposition: form-data; name=\"filename\"; filename=\"seed.iso\"\r\nContent-Type: application/octet-stream\r\n\r\nDATA\r\n\
             --banlieue-0000000000000000-boundary--\r\n"
        );
        assert_eq!(
            body.content_type(),
            "multipart/form-data; boundary=banlieue-0000000000000000-boundary"
        );
    }

    #[test]
    fn the_boundary_never_occurs_in_the_data() {
        let data = b"x--banlieue-0000000000000000-boundary".to_vec();
        let body = Body::new(&Form::new(), "filename", "a.iso", &data);
        assert!(
            body.content_type()
                .ends_with("banlieue-0000000000000001-boundary")
        );
    }
}
