//! Guards the book's line-range excerpts, `{{#include file:FROM:TO}}`: a YAML range
//! must still be whole documents (starting at the top of the file or right after a
//! `---` line, ending at the end or right before one), a Rust range one whole item with
//! its doc comment. So a file that grows or moves makes `make docs-check` fail instead
//! of the book silently showing half of one object and half of the next.

use std::path::Path;

use anyhow::Context;

/// Problems found in every `.md` file under `src` (recursively, following no symlinks).
pub fn check(src: &Path) -> anyhow::Result<Vec<String>> {
    let mut problems = Vec::new();
    visit(src, &mut problems)?;
    Ok(problems)
}

fn visit(dir: &Path, problems: &mut Vec<String>) -> anyhow::Result<()> {
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let entry = entry?;
        let path = entry.path();
        // The ADRs and benchmark reports are symlinked in and include nothing.
        if entry.file_type()?.is_symlink() {
            continue;
        }
        if path.is_dir() {
            visit(&path, problems)?;
        } else if path.extension().is_some_and(|e| e == "md") {
            let text = std::fs::read_to_string(&path)?;
            for directive in directives(&text) {
                if let Err(why) = check_range(&path, &directive) {
                    problems.push(format!(
                        "{}: {{{{#include {directive}}}}}: {why}",
                        path.display()
                    ));
                }
            }
        }
    }
    Ok(())
}

fn directives(text: &str) -> Vec<String> {
    text.match_indices("{{#include ")
        .filter_map(|(at, _)| {
            let rest = &text[at + "{{#include ".len()..];
            rest.find("}}").map(|end| rest[..end].trim().to_owned())
        })
        .collect()
}

fn check_range(page: &Path, directive: &str) -> Result<(), String> {
    let mut parts = directive.split(':');
    let file = parts.next().unwrap_or_default();
    let target = page.parent().unwrap_or(Path::new("")).join(file);
    let text = std::fs::read_to_string(&target).map_err(|e| format!("cannot read {file}: {e}"))?;
    let (Some(from), Some(to)) = (parts.next(), parts.next()) else {
        return Ok(()); // The whole file (or an anchor): nothing to go stale.
    };
    let lines: Vec<&str> = text.lines().collect();
    let from: usize = from
        .parse()
        .map_err(|_| format!("bad start line {from:?}"))?;
    let to: usize = to.parse().map_err(|_| format!("bad end line {to:?}"))?;
    if from == 0 || to < from || to > lines.len() {
        return Err(format!(
            "lines {from}..{to} are not within the file's {} lines",
            lines.len()
        ));
    }
    if file.ends_with(".rs") {
        return whole_rust_item(&lines, from, to);
    }
    if !(file.ends_with(".yaml") || file.ends_with(".yml")) {
        return Ok(());
    }
    let starts_document = from == 1 || lines[from - 2] == "---";
    let ends_document = to == lines.len() || lines[to] == "---";
    if !starts_document || !ends_document {
        return Err(format!(
            "lines {from}..{to} are no longer whole YAML documents (each must start after a '---' line or at line 1 and end before one or at the end); fix the range"
        ));
    }
    Ok(())
}

/// A Rust excerpt must be one top-level item with its doc comment: it starts at
/// column 0 with `///`, `#[` or `pub`, after a line that is not part of the same doc
/// comment, and ends with the item's closing `}` at column 0.
fn whole_rust_item(lines: &[&str], from: usize, to: usize) -> Result<(), String> {
    let first = lines[from - 1];
    let before = if from > 1 { lines[from - 2] } else { "" };
    let starts = (first.starts_with("///") || first.starts_with("#[") || first.starts_with("pub "))
        && !before.starts_with("///")
        && !before.starts_with("#[");
    if !starts || lines[to - 1] != "}" {
        return Err(format!(
            "lines {from}..{to} are no longer one whole item (doc comment to closing brace); fix the range"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_must_be_whole_documents() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("x.yaml"),
            "# a\nkind: A\n---\nkind: B\nname: b\n---\nkind: C\n",
        )
        .unwrap();
        let page = |body: &str| {
            std::fs::write(dir.path().join("p.md"), body).unwrap();
            check(dir.path()).unwrap()
        };
        assert!(page("{{#include x.yaml:1:2}} {{#include x.yaml:4:5}} {{#include x.yaml:7:7}} {{#include x.yaml}}").is_empty());
        let problems = page(
            "{{#include x.yaml:2:2}}\n{{#include x.yaml:4:4}}\n{{#include x.yaml:4:9}}\n{{#include nope.yaml}}",
        );
        assert_eq!(problems.len(), 4, "{problems:?}");
        assert!(problems[0].contains("no longer whole YAML documents"));
        assert!(problems[2].contains("not within"));
        assert!(problems[3].contains("cannot read nope.yaml"));

        std::fs::write(
            dir.path().join("x.rs"),
            "use a;\n\n/// Doc.\npub trait T {\n    fn f();\n}\n",
        )
        .unwrap();
        assert!(page("{{#include x.rs:3:6}}").is_empty());
        assert_eq!(
            page("{{#include x.rs:4:6}}\n{{#include x.rs:3:5}}").len(),
            2
        );
    }
}
