//! A link check over the built book: every relative `href`/`src` must name a file that
//! exists, and every `#fragment` an `id` in that file. External links are only checked
//! for form (scheme and host); nothing is fetched.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Component, Path, PathBuf};

use anyhow::Context;

/// What a check found.
#[derive(Default)]
pub struct Report {
    pub pages: usize,
    pub relative: usize,
    pub external: usize,
    pub problems: Vec<String>,
}

/// Checks every `.html` file under `root`.
pub fn check(root: &Path) -> anyhow::Result<Report> {
    let mut pages = BTreeMap::new();
    collect(root, root, &mut pages)?;
    anyhow::ensure!(!pages.is_empty(), "no HTML pages (was the book built?)");
    let ids: BTreeMap<&PathBuf, BTreeSet<String>> =
        pages.iter().map(|(path, html)| (path, ids(html))).collect();
    let mut report = Report {
        pages: pages.len(),
        ..Report::default()
    };
    for (page, html) in &pages {
        for link in links(html) {
            let link = decode_entities(&link);
            let at = format!("{}: {link}", page.display());
            match classify(&link) {
                Kind::External => {
                    report.external += 1;
                    if let Err(why) = well_formed(&link) {
                        report.problems.push(format!("{at}: {why}"));
                    }
                }
                Kind::Ignored => {}
                Kind::Relative => {
                    report.relative += 1;
                    if let Err(why) = resolve(root, page, &link, &ids) {
                        report.problems.push(format!("{at}: {why}"));
                    }
                }
            }
        }
    }
    Ok(report)
}

enum Kind {
    External,
    Relative,
    Ignored,
}

fn classify(link: &str) -> Kind {
    let lower = link.to_ascii_lowercase();
    if lower.starts_with("http://") || lower.starts_with("https://") || lower.starts_with("//") {
        Kind::External
    } else if lower.starts_with("mailto:")
        || lower.starts_with("javascript:")
        || lower.starts_with("data:")
    {
        Kind::Ignored
    } else if lower.contains(':') && !lower.contains('/') && !lower.contains('#') {
        // Some other scheme (`tel:`), never a file of ours.
        Kind::Ignored
    } else {
        Kind::Relative
    }
}

fn well_formed(link: &str) -> Result<(), String> {
    let rest = link
        .split_once("//")
        .map(|(_, rest)| rest)
        .ok_or("no '//' after the scheme")?;
    let host = rest.split(['/', '?', '#']).next().unwrap_or_default();
    if host.is_empty() || !host.contains('.') && !host.starts_with("localhost") {
        return Err(format!("malformed external link: host '{host}'"));
    }
    if link
        .chars()
        .any(|c| c.is_whitespace() || c == '"' || c == '<' || c == '>')
    {
        return Err("malformed external link: whitespace or quotes in it".into());
    }
    Ok(())
}

fn resolve(
    root: &Path,
    page: &Path,
    link: &str,
    ids: &BTreeMap<&PathBuf, BTreeSet<String>>,
) -> Result<(), String> {
    let (path, fragment) = match link.split_once('#') {
        Some((path, fragment)) => (path, Some(fragment)),
        None => (link, None),
    };
    let path = path.split('?').next().unwrap_or_default();
    let target = if path.is_empty() {
        page.to_path_buf()
    } else if let Some(absolute) = path.strip_prefix('/') {
        // The book is served from its own root; an absolute path is relative to it.
        normalize(Path::new(&percent_decode(absolute))).ok_or("escapes the book")?
    } else {
        let dir = page.parent().unwrap_or(Path::new(""));
        normalize(&dir.join(percent_decode(path))).ok_or("escapes the book")?
    };
    let on_disk = root.join(&target);
    let target = if on_disk.is_dir() {
        target.join("index.html")
    } else {
        target
    };
    if !root.join(&target).is_file() {
        return Err(format!("no such file {}", target.display()));
    }
    match (fragment, ids.get(&target)) {
        (Some(fragment), Some(found)) if !fragment.is_empty() => {
            let fragment = percent_decode(fragment);
            if found.contains(&fragment) {
                Ok(())
            } else {
                Err(format!("no anchor '#{fragment}' in {}", target.display()))
            }
        }
        _ => Ok(()),
    }
}

/// `a/./b/../c` → `a/c`; `None` when `..` climbs above the root.
fn normalize(path: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() {
                    return None;
                }
            }
            Component::Normal(name) => out.push(name),
            Component::RootDir | Component::Prefix(_) => {}
        }
    }
    Some(out)
}

fn collect(root: &Path, dir: &Path, out: &mut BTreeMap<PathBuf, String>) -> anyhow::Result<()> {
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        if path.is_dir() {
            collect(root, &path, out)?;
        } else if path.extension().is_some_and(|e| e == "html") {
            let html = std::fs::read_to_string(&path)
                .with_context(|| format!("reading {}", path.display()))?;
            let relative = path.strip_prefix(root).unwrap_or(&path).to_path_buf();
            out.insert(relative, html);
        }
    }
    Ok(())
}

/// The values of `href` and `src` attributes of tags (not of text inside `<code>`,
/// which mdBook escapes, so `<` there never starts a tag).
fn links(html: &str) -> Vec<String> {
    attributes(html, &["href", "src"])
}

fn ids(html: &str) -> BTreeSet<String> {
    attributes(html, &["id", "name"])
        .into_iter()
        .map(|id| decode_entities(&id))
        .collect()
}

fn attributes(html: &str, names: &[&str]) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = html;
    while let Some(start) = rest.find('<') {
        rest = &rest[start + 1..];
        if rest.starts_with("!--") {
            rest = rest.find("-->").map_or("", |end| &rest[end + 3..]);
            continue;
        }
        let end = tag_end(rest);
        let tag = &rest[..end];
        rest = &rest[end..];
        if tag.starts_with("script") || tag.starts_with("style") {
            // Script and style bodies are not markup.
            let close = if tag.starts_with("script") {
                "</script"
            } else {
                "</style"
            };
            rest = rest.find(close).map_or("", |i| &rest[i..]);
        }
        for name in names {
            if let Some(value) = attribute(tag, name) {
                out.push(value);
            }
        }
    }
    out
}

/// The index of the `>` closing a tag, skipping quoted attribute values.
fn tag_end(tag: &str) -> usize {
    let mut quote = None;
    for (i, c) in tag.char_indices() {
        match (quote, c) {
            (None, '"' | '\'') => quote = Some(c),
            (Some(q), c) if c == q => quote = None,
            (None, '>') => return i,
            _ => {}
        }
    }
    tag.len()
}

fn attribute(tag: &str, name: &str) -> Option<String> {
    let mut search = tag;
    loop {
        let at = search.find(name)?;
        let before = search[..at].chars().last();
        let after = &search[at + name.len()..];
        search = after;
        if !before.is_some_and(char::is_whitespace) {
            continue;
        }
        let Some(value) = after.trim_start().strip_prefix('=') else {
            continue;
        };
        let value = value.trim_start();
        let quote = value.chars().next()?;
        if quote == '"' || quote == '\'' {
            let body = &value[1..];
            return body.find(quote).map(|end| body[..end].to_owned());
        }
        let end = value
            .find(|c: char| c.is_whitespace() || c == '>')
            .unwrap_or(value.len());
        return Some(value[..end].to_owned());
    }
}

fn decode_entities(text: &str) -> String {
    text.replace("&quot;", "\"")
        .replace("&#39;", "'")
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&amp;", "&")
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn book(files: &[(&str, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for (path, body) in files {
            let path = dir.path().join(path);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, body).unwrap();
        }
        dir
    }

    #[test]
    fn finds_missing_files_and_anchors_and_malformed_external_links() {
        let dir = book(&[
            (
                "index.html",
                r##"<a href="guide/a.html#setup">ok</a> <a href="guide/a.html#nope">bad anchor</a>
               <img src="img/x.svg"> <a href="missing.html">gone</a> <a href="https://example.com/x">ext</a>
               <a href="https://nohost/">bad ext</a> <a href="mailto:a@b.c">m</a> <a href="#top">self</a>
               <h1 id="top">T</h1><script>var s = '<a href="in-script.html">';</script>"##,
            ),
            (
                "guide/a.html",
                r#"<h2 id="setup">S</h2><a href="../index.html#top">up</a> <a href="../../out.html">out</a> <a href="./">dir</a>"#,
            ),
            ("guide/index.html", "<p>dir index</p>"),
            ("img/x.svg", "<svg/>"),
        ]);
        let report = check(dir.path()).unwrap();
        let mut problems = report.problems.clone();
        problems.sort();
        assert_eq!(
            problems,
            vec![
                "guide/a.html: ../../out.html: escapes the book",
                "index.html: guide/a.html#nope: no anchor '#nope' in guide/a.html",
                "index.html: https://nohost/: malformed external link: host 'nohost'",
                "index.html: missing.html: no such file missing.html",
            ]
        );
        assert_eq!((report.pages, report.external), (3, 2));
    }

    #[test]
    fn decodes_entities_and_percent_escapes() {
        assert_eq!(percent_decode("a%20b%2Fc%zz"), "a b/c%zz");
        assert_eq!(decode_entities("a&amp;b"), "a&b");
        assert_eq!(
            attribute(r#"a class="x" href='y.html'"#, "href").as_deref(),
            Some("y.html")
        );
        assert_eq!(
            attribute(r#"a data-href="z" href=q.html"#, "href").as_deref(),
            Some("q.html")
        );
    }
}
