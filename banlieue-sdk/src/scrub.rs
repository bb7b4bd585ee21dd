//! The one scrubber every message leaving the operator passes through: status
//! condition messages, Events and log lines lose the credential values registered
//! here, replaced by [`REDACTED`].
//!
//! A credential is found in the forms it can be echoed in:
//! - as it is, JSON/Rust-`Debug` escaped (`\"`, `\\`, `\n`) and XML escaped (`&amp;`,
//!   `&quot;`, ... as a SOAP fault echoing a request carries it);
//! - percent-encoded by any encoder (any byte as `%XX` in either case) and
//!   form-encoded (a space as `+`): the matcher decodes as it compares, so which
//!   characters an encoder chose to escape does not matter;
//! - base64, standard and URL-safe, with and without padding, of the value and of its
//!   escaped and encoded forms; and inside a larger base64 blob (an echoed request
//!   body, `user:password` in a basic-auth header), through the characters that
//!   encode only the value's bytes at each of the three byte alignments;
//! - hex-encoded (`70617373...`, as an endpoint dumping the request's bytes echoes it);
//! - in any letter case: matching ignores ASCII case, so a value echoed upper-cased
//!   (or its hex in upper case) is found too;
//! - line by line for a multi-line value (a PEM key echoed one line at a time), PEM
//!   armor lines (`-----BEGIN ...`) excepted: they are not secret.
//!
//! Overlapping matches of different values merge into one [`REDACTED`].
//!
//! Values shorter than [`MIN_SECRET_LEN`] bytes (and lines of a multi-line value
//! shorter than that) are not scrubbed: redacting every `abc` in every message would
//! destroy messages without protecting a password that short. Base64 fragments shorter
//! than 6 characters are not scrubbed either (a 4-byte password is still scrubbed as
//! itself and as its whole encodings, not inside larger base64 blobs).
//!
//! [`global`] is the process-wide scrubber: the log writer is installed before the
//! controllers start and outlives them, and one process is one operator; values are
//! registered under a source (the Provider's `namespace/name`) so one Provider's
//! values are replaced or dropped without touching another's.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::io::{self, Write};
use std::sync::{Arc, LazyLock, PoisonError, RwLock};

/// What a credential is replaced with.
pub const REDACTED: &str = "[redacted]";

/// Shorter values (in bytes) are not scrubbed (see the module documentation).
pub const MIN_SECRET_LEN: usize = 4;

/// Shorter base64 fragments of a value inside a larger blob are not scrubbed.
const MIN_FRAGMENT_LEN: usize = 6;

/// Credential values by source, and the patterns they make.
pub struct Scrubber {
    state: RwLock<State>,
}

#[derive(Default)]
struct State {
    sources: BTreeMap<String, BTreeSet<String>>,
    patterns: Arc<Patterns>,
}

/// The process-wide scrubber the controllers register credentials with, and that
/// Events, conditions and logs pass through.
pub fn global() -> &'static Scrubber {
    static GLOBAL: LazyLock<Scrubber> = LazyLock::new(Scrubber::new);
    &GLOBAL
}

/// Whether `value` is long enough to be scrubbed ([`MIN_SECRET_LEN`]).
pub fn is_scrubbable(value: &str) -> bool {
    value.trim().len() >= MIN_SECRET_LEN
}

impl Default for Scrubber {
    fn default() -> Self {
        Self::new()
    }
}

impl Scrubber {
    /// A scrubber with no values: it changes nothing.
    pub fn new() -> Self {
        Self {
            state: RwLock::new(State::default()),
        }
    }

    /// Makes `values` the secret values of `source`, replacing what it had. Returns
    /// whether they changed.
    pub fn register<I, S>(&self, source: &str, values: I) -> bool
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let values: BTreeSet<String> = values
            .into_iter()
            .map(|v| v.as_ref().to_owned())
            .filter(|v| is_scrubbable(v))
            .collect();
        let unchanged = |state: &State| match state.sources.get(source) {
            Some(current) => *current == values,
            None => values.is_empty(),
        };
        // Registered on every reconcile: the common case only reads.
        if unchanged(&self.state.read().unwrap_or_else(PoisonError::into_inner)) {
            return false;
        }
        let mut state = self.state.write().unwrap_or_else(PoisonError::into_inner);
        if unchanged(&state) {
            return false;
        }
        if values.is_empty() {
            state.sources.remove(source);
        } else {
            state.sources.insert(source.to_owned(), values);
        }
        state.patterns = Arc::new(Patterns::of(state.sources.values().flatten()));
        true
    }

    /// Drops the values of `source` (a deleted Provider).
    pub fn forget(&self, source: &str) {
        self.register(source, std::iter::empty::<&str>());
    }

    /// Registers `values` for as long as the returned [`Held`] lives: for secrets a
    /// backend derives while it works (a session ticket or cookie), which are scrubbed
    /// from the login that made them to the drop of the session that holds them.
    pub fn hold<I, S>(&'static self, values: I) -> Held
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // Not a `namespace/name`: no Provider's source can collide with it.
        let source = format!("held:{n}");
        self.register(&source, values);
        Held {
            scrubber: self,
            source,
        }
    }

    /// `message` without any registered value, in any of its forms.
    pub fn scrub<'a>(&self, message: &'a str) -> Cow<'a, str> {
        let patterns = self
            .state
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .patterns
            .clone();
        patterns.scrub(message)
    }

    /// [`Scrubber::scrub`], owned.
    pub fn scrub_owned(&self, message: String) -> String {
        match self.scrub(&message) {
            Cow::Borrowed(_) => message,
            Cow::Owned(scrubbed) => scrubbed,
        }
    }
}

/// The secrets inside bootstrap data (cloud-config or Ignition user data), to register
/// while the machine that boots with it lives: kubeadm bootstrap tokens
/// (`abcdef.0123456789abcdef`, as `kubeadm join` takes them), kubeadm certificate keys
/// (the 64 hex digits after `certificate-key` / `certificateKey`, which decrypt the
/// control plane's certificates) and PEM private keys. Not the whole user data: it is
/// mostly public boilerplate (`#cloud-config`, `runcmd:`), and registering it would
/// redact every message quoting a line of it.
pub fn bootstrap_secrets(user_data: &str) -> Vec<String> {
    let mut out = Vec::new();
    let b = user_data.as_bytes();
    let token_char = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    for (dot, _) in user_data.match_indices('.') {
        let (Some(start), end) = (dot.checked_sub(6), dot + 17) else {
            continue;
        };
        if end > b.len()
            || !b[start..dot].iter().all(|&c| token_char(c))
            || !b[dot + 1..end].iter().all(|&c| token_char(c))
            || (start > 0 && token_char(b[start - 1]))
            || b.get(end).is_some_and(|&c| token_char(c))
        {
            continue;
        }
        out.push(user_data[start..end].to_owned());
        // The token's secret half alone: kubeadm logs and echoes the ID apart.
        out.push(user_data[dot + 1..end].to_owned());
    }
    let lower = user_data.to_ascii_lowercase();
    for marker in ["certificate-key", "certificatekey"] {
        for (at, _) in lower.match_indices(marker) {
            let rest = &user_data[at + marker.len()..];
            let value = rest.trim_start_matches([' ', '=', ':', '"', '\'', '\t']);
            let hex = value.bytes().take_while(u8::is_ascii_hexdigit).count();
            if hex == 64 {
                out.push(value[..hex].to_owned());
            }
        }
    }
    let mut rest = user_data;
    while let Some(begin) = rest.find("-----BEGIN ") {
        let block = &rest[begin..];
        let Some(end) = block.find("-----END ") else {
            break;
        };
        let end = block[end..].find('\n').map_or(block.len(), |n| end + n);
        let pem = &block[..end];
        if pem
            .lines()
            .next()
            .is_some_and(|l| l.contains("PRIVATE KEY"))
        {
            // Each line trimmed: in a cloud-config the key is indented YAML.
            out.push(pem.lines().map(str::trim).collect::<Vec<_>>().join("\n"));
        }
        rest = &block[end..];
    }
    out
}

/// Values registered by [`Scrubber::hold`], forgotten when this is dropped.
pub struct Held {
    scrubber: &'static Scrubber,
    source: String,
}

impl std::fmt::Debug for Held {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Held")
            .field("source", &self.source)
            .finish()
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.scrubber.forget(&self.source);
    }
}

/// Every form of every value, by its first byte.
struct Patterns {
    by_first: Vec<Vec<Box<[u8]>>>,
    count: usize,
}

impl Default for Patterns {
    fn default() -> Self {
        Self {
            by_first: vec![Vec::new(); 256],
            count: 0,
        }
    }
}

impl Patterns {
    fn of<'a>(values: impl Iterator<Item = &'a String>) -> Self {
        let all: BTreeSet<String> = values.flat_map(|v| forms(v)).collect();
        let mut patterns = Self::default();
        for form in all {
            let bytes = form.into_bytes().into_boxed_slice();
            // Matching ignores ASCII case: patterns are found by their lower-cased
            // first byte.
            patterns.by_first[usize::from(bytes[0].to_ascii_lowercase())].push(bytes);
            patterns.count += 1;
        }
        patterns
    }

    fn scrub<'a>(&self, message: &'a str) -> Cow<'a, str> {
        if self.count == 0 {
            return Cow::Borrowed(message);
        }
        let m = message.as_bytes();
        // Merged [start, end) byte ranges covered by some match.
        let mut spans: Vec<(usize, usize)> = Vec::new();
        for at in 0..m.len() {
            let firsts = [Some(m[at]), percent(m, at), (m[at] == b'+').then_some(b' ')]
                .map(|first| first.map(|b| b.to_ascii_lowercase()));
            let end = firsts
                .into_iter()
                .flatten()
                .flat_map(|first| &self.by_first[usize::from(first)])
                .filter_map(|pattern| match_at(m, at, pattern))
                .max();
            let Some(end) = end else { continue };
            match spans.last_mut() {
                Some(last) if at <= last.1 => last.1 = last.1.max(end),
                _ => spans.push((at, end)),
            }
        }
        if spans.is_empty() {
            return Cow::Borrowed(message);
        }
        let mut out = String::with_capacity(message.len());
        let mut done = 0;
        for (start, end) in spans {
            let start = floor_boundary(message, start).max(done);
            let end = ceil_boundary(message, end);
            out.push_str(&message[done..start]);
            out.push_str(REDACTED);
            done = end;
        }
        out.push_str(&message[done..]);
        Cow::Owned(out)
    }
}

fn floor_boundary(s: &str, mut i: usize) -> usize {
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

fn ceil_boundary(s: &str, mut i: usize) -> usize {
    while !s.is_char_boundary(i) {
        i += 1;
    }
    i
}

fn hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// The byte percent-encoded at `at`, if `%XX` is there.
fn percent(m: &[u8], at: usize) -> Option<u8> {
    if m.get(at) != Some(&b'%') {
        return None;
    }
    Some((hex(*m.get(at + 1)?)? << 4) | hex(*m.get(at + 2)?)?)
}

/// Where `pattern` ends in `m` when it starts at `at`, each of its bytes as it is (in
/// either ASCII case), percent-encoded, or (a space) as `+`.
fn match_at(m: &[u8], at: usize, pattern: &[u8]) -> Option<usize> {
    if m[at..]
        .get(..pattern.len())
        .is_some_and(|head| head.eq_ignore_ascii_case(pattern))
    {
        return Some(at + pattern.len());
    }
    let same = |a: Option<u8>, b: u8| a.is_some_and(|a| a.eq_ignore_ascii_case(&b));
    let mut j = at;
    for &p in pattern {
        if same(percent(m, j), p) {
            j += 3;
        } else if same(m.get(j).copied(), p) || (p == b' ' && m.get(j) == Some(&b'+')) {
            j += 1;
        } else {
            return None;
        }
    }
    Some(j)
}

/// Every form of `value` to look for.
fn forms(value: &str) -> Vec<String> {
    let mut atoms = vec![value.to_owned(), value.trim().to_owned()];
    if value.contains('\n') {
        atoms.extend(
            value
                .lines()
                .map(str::trim)
                .filter(|line| !line.starts_with("-----"))
                .map(str::to_owned),
        );
    }
    let mut out = Vec::new();
    for atom in atoms.iter().filter(|a| a.len() >= MIN_SECRET_LEN) {
        let textual = [
            atom.clone(),
            escape_json(atom),
            escape_xml(atom, true),
            escape_xml(atom, false),
            percent_encode(atom, false),
            percent_encode(atom, true),
        ];
        for text in textual {
            for alphabet in [STANDARD, URL_SAFE] {
                let padded = base64(text.as_bytes(), alphabet, true);
                out.push(padded.trim_end_matches('=').to_owned());
                out.push(padded);
                for offset in 0..3 {
                    let fragment = fragment(text.as_bytes(), offset, alphabet);
                    if fragment.len() >= MIN_FRAGMENT_LEN {
                        out.push(fragment);
                    }
                }
            }
            out.push(text);
        }
        // Case is ignored when matching: the lower-case hex finds the upper-case too.
        out.push(atom.bytes().map(|b| format!("{b:02x}")).collect());
    }
    out.retain(|form| form.len() >= MIN_SECRET_LEN);
    out
}

fn escape_json(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c => out.push(c),
        }
    }
    out
}

fn escape_xml(s: &str, quotes: bool) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' if quotes => out.push_str("&quot;"),
            '\'' if quotes => out.push_str("&apos;"),
            '\r' if quotes => out.push_str("&#13;"),
            c => out.push(c),
        }
    }
    out
}

/// RFC 3986 percent-encoding of everything but unreserved characters; `form`:
/// `application/x-www-form-urlencoded` (a space is `+`, `~` is escaped, `*` is not).
fn percent_encode(s: &str, form: bool) -> String {
    let mut out = String::with_capacity(s.len());
    for &b in s.as_bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' => out.push(char::from(b)),
            b'~' if !form => out.push('~'),
            b'*' if form => out.push('*'),
            b' ' if form => out.push('+'),
            b => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

const STANDARD: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
const URL_SAFE: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

fn base64(bytes: &[u8], alphabet: &[u8; 64], pad: bool) -> String {
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = (u32::from(chunk[0]) << 16)
            | (u32::from(chunk.get(1).copied().unwrap_or(0)) << 8)
            | u32::from(chunk.get(2).copied().unwrap_or(0));
        let chars = chunk.len() + 1;
        for i in 0..4 {
            if i < chars {
                out.push(char::from(alphabet[((n >> (18 - 6 * i)) & 63) as usize]));
            } else if pad {
                out.push('=');
            }
        }
    }
    out
}

/// The base64 characters that encode only `bytes` when they sit `offset` (0–2) bytes
/// past a 3-byte boundary of a larger blob.
fn fragment(bytes: &[u8], offset: usize, alphabet: &[u8; 64]) -> String {
    let mut shifted = vec![0; offset];
    shifted.extend_from_slice(bytes);
    let encoded = base64(&shifted, alphabet, false);
    let start = (8 * offset).div_ceil(6);
    let end = 8 * (offset + bytes.len()) / 6;
    encoded.get(start..end).unwrap_or_default().to_owned()
}

/// An [`io::Write`] that holds what is written and writes it, scrubbed by [`global`],
/// to the inner writer when flushed or dropped. Made once per log event (tracing's
/// `MakeWriter`), it sees whole lines, so a value is never split across writes.
pub struct ScrubbedWriter<W: Write> {
    inner: W,
    buffer: Vec<u8>,
}

impl<W: Write> ScrubbedWriter<W> {
    /// Wraps `inner`.
    pub fn new(inner: W) -> Self {
        Self {
            inner,
            buffer: Vec::new(),
        }
    }

    fn emit(&mut self) -> io::Result<()> {
        if self.buffer.is_empty() {
            return Ok(());
        }
        let text = String::from_utf8_lossy(&self.buffer);
        let scrubbed = global().scrub(&text);
        self.inner.write_all(scrubbed.as_bytes())?;
        self.buffer.clear();
        self.inner.flush()
    }
}

impl<W: Write> Write for ScrubbedWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.buffer.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.emit()
    }
}

impl<W: Write> Drop for ScrubbedWriter<W> {
    fn drop(&mut self) {
        let _ = self.emit();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn scrubber(values: &[&str]) -> Scrubber {
        let s = Scrubber::new();
        s.register("ns/p", values);
        s
    }

    fn b64(s: &str) -> String {
        base64(s.as_bytes(), STANDARD, true)
    }

    #[test]
    fn base64_matches_the_rfc_vectors() {
        for (raw, encoded) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(b64(raw), encoded);
        }
        assert_eq!(base64(&[0xfb, 0xff], URL_SAFE, false), "-_8");
        assert_eq!(base64(&[0xfb, 0xff], STANDARD, true), "+/8=");
    }

    #[test]
    fn nothing_registered_changes_nothing() {
        let s = Scrubber::new();
        assert!(matches!(s.scrub("a message"), Cow::Borrowed("a message")));
    }

    #[test]
    fn raw_values_are_replaced_and_the_rest_kept() {
        let s = scrubber(&["hunter2!"]);
        assert_eq!(
            s.scrub("login failed for root with hunter2! at vc"),
            "login failed for root with [redacted] at vc"
        );
        assert!(matches!(s.scrub("nothing here"), Cow::Borrowed(_)));
    }

    #[test]
    fn encoded_forms_are_replaced() {
        let secret = "p@ss w/rd+&<\"'~*";
        let s = scrubber(&[secret]);
        let forms = [
            secret.to_owned(),
            escape_json(secret),
            escape_xml(secret, true),
            escape_xml(secret, false),
            percent_encode(secret, false),
            percent_encode(secret, false).to_lowercase(),
            percent_encode(secret, true),
            // Every byte escaped, as some encoders do.
            secret.bytes().map(|b| format!("%{b:02x}")).collect(),
            b64(secret),
            b64(secret).trim_end_matches('=').to_owned(),
            base64(secret.as_bytes(), URL_SAFE, true),
            base64(secret.as_bytes(), URL_SAFE, false),
            b64(&percent_encode(secret, true)),
            b64(&escape_xml(secret, true)),
        ];
        for form in forms {
            let scrubbed = s.scrub_owned(format!("echo: <{form}> end"));
            assert_eq!(scrubbed, "echo: <[redacted]> end", "form {form:?}");
        }
    }

    #[test]
    fn hex_and_other_letter_cases_are_replaced() {
        let secret = "Tr0ub4dor&3-p@ss";
        let s = scrubber(&[secret]);
        let hex: String = secret.bytes().map(|b| format!("{b:02x}")).collect();
        for form in [
            hex.clone(),
            hex.to_uppercase(),
            secret.to_uppercase(),
            secret.to_lowercase(),
            percent_encode(&secret.to_uppercase(), false),
            b64(secret).to_lowercase(),
        ] {
            let scrubbed = s.scrub_owned(format!("echo: <{form}> end"));
            assert_eq!(scrubbed, "echo: <[redacted]> end", "form {form:?}");
        }
        // Case-blind, not careless: the rest of the message keeps its case.
        assert_eq!(
            s.scrub_owned(format!("Login FAILED for {} on VC", secret.to_uppercase())),
            "Login FAILED for [redacted] on VC"
        );
    }

    #[test]
    fn a_value_inside_a_larger_base64_blob_is_replaced() {
        let s = scrubber(&["correct-horse-battery"]);
        for prefix in ["", "u", "us", "user:", "username=root&password="] {
            let blob = b64(&format!("{prefix}correct-horse-battery&more=1"));
            let scrubbed = s.scrub_owned(format!("body {blob} end"));
            assert!(scrubbed.contains(REDACTED), "{prefix:?}: {scrubbed}");
            assert!(scrubbed.starts_with("body ") && scrubbed.ends_with(" end"));
        }
    }

    #[test]
    fn proxmox_token_headers_lose_the_secret_but_keep_the_token_id() {
        let secret = "0b6e3c55-1a2b-4c3d-9e8f-aabbccddeeff";
        let s = scrubber(&[secret]);
        let header = format!("PVEAPIToken=root@pam!ci={secret}");
        assert_eq!(
            s.scrub_owned(format!("Authorization: {header}")),
            "Authorization: PVEAPIToken=root@pam!ci=[redacted]"
        );
        let encoded = percent_encode(&header, true);
        assert_eq!(
            s.scrub(&encoded),
            "PVEAPIToken%3Droot%40pam%21ci%3D[redacted]"
        );
        assert!(
            !s.scrub(&b64(&header))
                .contains(&fragment(secret.as_bytes(), 1, STANDARD))
        );
    }

    #[test]
    fn a_pem_key_is_replaced_whole_and_line_by_line() {
        let key = "-----BEGIN OPENSSH PRIVATE KEY-----\n\
                   b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtzc2gtZW\n\
                   QyNTUxOQAAACBm0yWxYz8YBrWwN8c1s3q2vJ8o3Xb6kZ9tQeW3o1hZrQAAAJgAAAAAAAAA\n\
                   -----END OPENSSH PRIVATE KEY-----\n";
        let s = scrubber(&[key]);
        assert_eq!(s.scrub_owned(format!("key: {key}")), "key: [redacted]");
        assert_eq!(
            s.scrub_owned(format!("key: {}", escape_json(key))),
            "key: [redacted]"
        );
        let line = "QyNTUxOQAAACBm0yWxYz8YBrWwN8c1s3q2vJ8o3Xb6kZ9tQeW3o1hZrQAAAJgAAAAAAAAA";
        assert_eq!(
            s.scrub_owned(format!("bad line 3: {line}")),
            "bad line 3: [redacted]"
        );
        // Armor lines are not secret.
        assert_eq!(
            s.scrub("expected -----BEGIN OPENSSH PRIVATE KEY-----"),
            "expected -----BEGIN OPENSSH PRIVATE KEY-----"
        );
        assert_eq!(s.scrub(&b64(key)), "[redacted]");
    }

    #[test]
    fn overlapping_and_adjacent_values_merge_into_one_marker() {
        let s = scrubber(&["abcd1234", "1234wxyz"]);
        assert_eq!(s.scrub("x abcd1234wxyz y"), "x [redacted] y");
        assert_eq!(s.scrub("x abcd12341234wxyz y"), "x [redacted] y");
        // One value inside another.
        let s = scrubber(&["secret", "mysecretvalue"]);
        assert_eq!(
            s.scrub("a mysecretvalue b secret"),
            "a [redacted] b [redacted]"
        );
    }

    #[test]
    fn values_at_the_boundaries_are_replaced() {
        let s = scrubber(&["tok3n!"]);
        assert_eq!(s.scrub("tok3n!"), "[redacted]");
        assert_eq!(s.scrub("tok3n!x"), "[redacted]x");
        assert_eq!(s.scrub("xtok3n!"), "x[redacted]");
        assert_eq!(s.scrub("tok3n"), "tok3n");
        assert_eq!(s.scrub("tok3n%2"), "tok3n%2");
        assert_eq!(s.scrub("tok3n%21"), "[redacted]");
    }

    #[test]
    fn short_values_are_not_scrubbed() {
        let s = scrubber(&["abc", "", "  x "]);
        assert_eq!(s.scrub("abc abc"), "abc abc");
        assert!(
            !s.register("ns/p", ["abc"]),
            "nothing to register, nothing changed"
        );
        assert!(!is_scrubbable("abc"));
        assert!(is_scrubbable("abcd"));
    }

    #[test]
    fn non_ascii_values_keep_the_message_valid() {
        let s = scrubber(&["pässwörd"]);
        assert_eq!(s.scrub("é pässwörd é"), "é [redacted] é");
        assert_eq!(
            s.scrub_owned(format!("é {} é", percent_encode("pässwörd", false))),
            "é [redacted] é"
        );
    }

    #[test]
    fn sources_are_replaced_and_forgotten() {
        let s = Scrubber::new();
        assert!(s.register("ns/a", ["first-secret"]));
        assert!(!s.register("ns/a", ["first-secret"]));
        assert!(s.register("ns/b", ["other-secret"]));
        assert!(s.register("ns/a", ["second-secret"]));
        assert_eq!(
            s.scrub("first-secret second-secret other-secret"),
            "first-secret [redacted] [redacted]"
        );
        s.forget("ns/b");
        assert_eq!(s.scrub("other-secret"), "other-secret");
    }

    #[test]
    fn bootstrap_data_gives_its_tokens_keys_and_private_keys() {
        let key = "-----BEGIN EC PRIVATE KEY-----\n      MHcCAQEEIBkg4LVWM9nuwNSk3yByxZpYRTBnVJk5bZAq6fVqlgz0oAoGCCqGSM49\n      AwEHoUQDQgAEdHFtR2M8w6v7nbYvHKOdGyPnkZwqXlrKqzQlGcRqAMgYbkPB2XzG\n      -----END EC PRIVATE KEY-----";
        let user_data = format!(
            "#cloud-config\nruncmd:\n  - kubeadm join 10.0.0.1:6443 --token abcdef.0123456789abcdef \
             --discovery-token-ca-cert-hash sha256:{hash} --control-plane \
             --certificate-key {ck}\nwrite_files:\n  - path: /etc/k.key\n    content: |\n      {key}\n  - path: /etc/ca.crt\n    content: |\n      -----BEGIN CERTIFICATE-----\n      MIIBdzCCAR2gAwIBAgIBADAKBggqhkjOPQQDAjAjMSEwHwYDVQQDDBhrM3Mtc2Vy\n      -----END CERTIFICATE-----\n",
            hash = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
            ck = "9a1f0c3e5b7d2f4a6c8e0b1d3f5a7c9e1b3d5f7a9c1e3b5d7f9a1c3e5b7d9f1a",
        );
        let found = bootstrap_secrets(&user_data);
        assert!(
            found.contains(&"abcdef.0123456789abcdef".to_owned()),
            "{found:?}"
        );
        assert!(found.contains(&"0123456789abcdef".to_owned()), "{found:?}");
        assert!(
            found.contains(
                &"9a1f0c3e5b7d2f4a6c8e0b1d3f5a7c9e1b3d5f7a9c1e3b5d7f9a1c3e5b7d9f1a".to_owned()
            ),
            "{found:?}"
        );
        assert!(
            found
                .iter()
                .any(|v| v
                    .contains("MHcCAQEEIBkg4LVWM9nuwNSk3yByxZpYRTBnVJk5bZAq6fVqlgz0oAoGCCqGSM49")),
            "{found:?}"
        );
        // Public parts stay readable: the CA hash, the certificate, the boilerplate.
        let s = scrubber(&found.iter().map(String::as_str).collect::<Vec<_>>());
        let scrubbed = s.scrub(&user_data);
        assert!(!scrubbed.contains("0123456789abcdef"), "{scrubbed}");
        assert!(!scrubbed.contains("9a1f0c3e5b7d"), "{scrubbed}");
        assert!(!scrubbed.contains("MHcCAQEEIBkg4LVWM9nu"), "{scrubbed}");
        assert!(
            scrubbed.contains("e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855")
        );
        assert!(
            scrubbed.contains("MIIBdzCCAR2gAwIBAgIBADAKBggqhkjOPQQDAjAjMSEwHwYDVQQDDBhrM3Mtc2Vy")
        );
        assert!(
            scrubbed.starts_with("#cloud-config\nruncmd:\n  - kubeadm join 10.0.0.1:6443 --token ")
        );
        // Not tokens: versions, host names, longer runs.
        assert!(
            bootstrap_secrets("image: registry.k8s.io/pause:3.9 host abcdefg.0123456789abcdef")
                .is_empty()
        );
    }

    #[test]
    fn held_values_are_scrubbed_while_held() {
        let ticket = "PVE:root@pam:held-ticket-5e1f";
        let held = global().hold([ticket]);
        assert_eq!(
            global().scrub(&format!("cookie {ticket}")),
            "cookie [redacted]"
        );
        drop(held);
        assert_eq!(
            global().scrub(&format!("cookie {ticket}")),
            format!("cookie {ticket}")
        );
    }

    #[test]
    fn the_writer_scrubs_whole_lines_on_drop() {
        let secret = "writer-test-secret-7f3a";
        global().register("test/writer", [secret]);
        let mut out = Vec::new();
        {
            let mut w = ScrubbedWriter::new(&mut out);
            w.write_all(b"password=writer-test-").unwrap();
            w.write_all(b"secret-7f3a done\n").unwrap();
        }
        global().forget("test/writer");
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "password=[redacted] done\n"
        );
    }

    proptest! {
        #[test]
        fn no_form_survives(
            // No brackets: a value that is part of the marker is found in it.
            secret in "[!-Z\\\\^-~][ -Z\\\\^-~]{2,38}[!-Z\\\\^-~]",
            prefix in "[ -~]{0,20}",
            suffix in "[ -~]{0,20}",
        ) {
            let s = scrubber(&[&secret]);
            for form in [
                secret.clone(),
                percent_encode(&secret, false),
                percent_encode(&secret, true),
                b64(&secret),
                base64(secret.as_bytes(), URL_SAFE, false),
                secret.to_uppercase(),
                secret.bytes().map(|b| format!("{b:02X}")).collect(),
            ] {
                let scrubbed = s.scrub_owned(format!("{prefix}{form}{suffix}"));
                prop_assert!(scrubbed.contains(REDACTED));
                prop_assert!(!scrubbed.contains(&secret), "{}", scrubbed);
                prop_assert!(!scrubbed.contains(&form), "{}", scrubbed);
            }
        }

        #[test]
        fn base64_blobs_lose_every_whole_fragment(
            secret in "[a-zA-Z0-9]{8,32}",
            prefix in "[ -~]{0,10}",
            suffix in "[ -~]{0,10}",
        ) {
            let s = scrubber(&[&secret]);
            let blob = b64(&format!("{prefix}{secret}{suffix}"));
            let scrubbed = s.scrub(&blob);
            let offset = prefix.len() % 3;
            prop_assert!(!scrubbed.contains(&fragment(secret.as_bytes(), offset, STANDARD)));
        }

        #[test]
        fn messages_without_values_are_untouched(
            message in "[a-z ]{0,80}",
        ) {
            let s = scrubber(&["ZZ-secret-ZZ"]);
            prop_assert_eq!(s.scrub(&message), message.as_str());
        }

        #[test]
        fn scrubbing_never_panics_on_any_text(
            secret in "\\PC{4,12}",
            message in "\\PC{0,60}",
        ) {
            prop_assume!(is_scrubbable(&secret) && !secret.contains(['[', ']']));
            let s = scrubber(&[&secret]);
            let scrubbed = s.scrub_owned(format!("{message}{secret}{message}"));
            prop_assert!(!scrubbed.contains(&secret));
        }
    }
}
