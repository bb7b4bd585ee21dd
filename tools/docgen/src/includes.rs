//! Guards the book's `{{#include file.yaml:FROM:TO}}` excerpts of `examples/`: a range
//! must still be whole YAML documents, starting at the top of the file or right after a
//! `---` line and ending at the end of the file or right before one. So an example that
//! grows or moves makes `make docs-check` fail instead of the book silently showing half
//! of one object and half of the next.

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
    if !(file.ends_with(".yaml") || file.ends_with(".yml")) {
        return Ok(());
    }
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
    let starts_document = from == 1 || lines[from - 2] == "---";
    let ends_document = to == lines.len() || lines[to] == "---";
    if !starts_document || !ends_document {
        return Err(format!(
            "lines {from}..{to} are no longer whole YAML documents (each must start after a '---' line or at line 1 and end before one or at the end); fix the range"
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
    }
}
