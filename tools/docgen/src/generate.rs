//! Writes, or checks, everything generated in the book: the API reference pages and
//! the SUMMARY.md blocks that list them, the benchmark reports and the ADRs (whose
//! files stay where they are, in docs/; the book reaches them through symlinks).

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, bail};

use crate::api_reference;
use crate::summary;

/// Every generated page, by book-relative path: the API reference and the backends'
/// crate docs. `src` is the book's `src/` (the repository root is three levels up).
fn pages(src: &Path) -> anyhow::Result<BTreeMap<String, String>> {
    let mut pages = api_reference::render_all()?;
    let repo = src.join("../../..");
    pages.extend(crate::crate_docs::render_all(&repo)?);
    pages.insert(
        crate::capabilities::PAGE.to_owned(),
        crate::capabilities::render(),
    );
    Ok(pages)
}

/// Writes the pages (removing pages of kinds that no longer exist) and SUMMARY.md.
pub fn write(src: &Path) -> anyhow::Result<()> {
    let pages = pages(src)?;
    let dir = src.join(api_reference::DIR);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    for stale in markdown_files(&dir)? {
        if !pages.contains_key(&format!("{}/{stale}", api_reference::DIR)) {
            std::fs::remove_file(dir.join(&stale))?;
        }
    }
    for path in pages.keys() {
        if let Some(dir) = src.join(path).parent() {
            std::fs::create_dir_all(dir)?;
        }
    }
    for (path, text) in &pages {
        std::fs::write(src.join(path), text).with_context(|| format!("writing {path}"))?;
    }
    let summary_path = src.join("SUMMARY.md");
    std::fs::write(&summary_path, summary_text(src)?)
        .with_context(|| format!("writing {}", summary_path.display()))?;
    println!(
        "docs: {} generated pages and SUMMARY.md written under {}",
        pages.len(),
        src.display()
    );
    Ok(())
}

/// Fails, listing what differs, when a committed page or SUMMARY.md block is stale.
pub fn check(src: &Path) -> anyhow::Result<()> {
    let pages = pages(src)?;
    let mut stale = Vec::new();
    for (path, text) in &pages {
        match std::fs::read_to_string(src.join(path)) {
            Ok(committed) if &committed == text => {}
            Ok(_) => stale.push(format!("{path}: differs")),
            Err(_) => stale.push(format!("{path}: missing")),
        }
    }
    for page in markdown_files(&src.join(api_reference::DIR))? {
        if !pages.contains_key(&format!("{}/{page}", api_reference::DIR)) {
            stale.push(format!(
                "{}/{page}: no such kind any more",
                api_reference::DIR
            ));
        }
    }
    if summary_text(src)? != read(&src.join("SUMMARY.md"))? {
        stale.push("SUMMARY.md: a generated block differs".into());
    }
    let excerpts = crate::includes::check(src)?;
    if !excerpts.is_empty() {
        bail!(
            "excerpts of examples/ went stale:\n  {}",
            excerpts.join("\n  ")
        );
    }
    if !stale.is_empty() {
        bail!(
            "the book's generated pages are stale: run 'make docs-gen' and commit the result\n  {}",
            stale.join("\n  ")
        );
    }
    println!(
        "docs: {} generated pages and SUMMARY.md, up to date",
        pages.len()
    );
    Ok(())
}

/// SUMMARY.md with its three generated blocks filled in.
fn summary_text(src: &Path) -> anyhow::Result<String> {
    let current = read(&src.join("SUMMARY.md"))?;
    let text = summary::replace_block(&current, "api-reference", &api_reference::summary_lines())?;
    let text = summary::replace_block(&text, "benchmarks", &benchmark_lines(src)?)?;
    summary::replace_block(&text, "adr", &adr_lines(src)?)
}

/// `benchmarks/scale.md` (the pointer to the latest report), then every dated report,
/// newest first.
fn benchmark_lines(src: &Path) -> anyhow::Result<Vec<String>> {
    let dir = src.join("benchmarks");
    let mut reports: Vec<String> = markdown_files(&dir)?
        .into_iter()
        .filter(|name| name != "scale.md")
        .collect();
    reports.sort_by(|a, b| b.cmp(a));
    let mut lines = vec![format!(
        "- [{}](benchmarks/scale.md)",
        title(&dir.join("scale.md"))?
    )];
    for report in reports {
        lines.push(format!(
            "  - [{}](benchmarks/{report})",
            title(&dir.join(&report))?
        ));
    }
    Ok(lines)
}

/// Every ADR, in number order, under the hand-written "Architecture decisions" page.
fn adr_lines(src: &Path) -> anyhow::Result<Vec<String>> {
    let dir = src.join("adr");
    let mut adrs = markdown_files(&dir)?;
    adrs.sort();
    adrs.iter()
        .map(|adr| Ok(format!("  - [{}](adr/{adr})", title(&dir.join(adr))?)))
        .collect()
}

/// A page's first `# ` heading, for its SUMMARY entry.
fn title(path: &Path) -> anyhow::Result<String> {
    let text = read(path)?;
    let heading = text
        .lines()
        .find_map(|line| line.strip_prefix("# "))
        .with_context(|| format!("{} has no '# ' title", path.display()))?;
    // Brackets would end the SUMMARY link text.
    Ok(heading.trim().replace('[', "(").replace(']', ")"))
}

fn read(path: &Path) -> anyhow::Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
}

fn markdown_files(dir: &Path) -> anyhow::Result<Vec<String>> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(Vec::new());
    };
    let mut names = Vec::new();
    for entry in entries {
        let name = entry?.file_name().to_string_lossy().into_owned();
        if name.ends_with(".md") {
            names.push(name);
        }
    }
    names.sort();
    Ok(names)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_reports_newest_first_and_adrs_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path();
        for (path, text) in [
            ("benchmarks/scale.md", "# Scale benchmark\n"),
            ("benchmarks/scale-2026-01-02.md", "# Scale, 2026-01-02\n"),
            (
                "benchmarks/scale-2026-03-04.md",
                "intro\n# Scale, 2026-03-04\n",
            ),
            ("adr/0002-b.md", "# ADR 0002: b [x]\n"),
            ("adr/0001-a.md", "# ADR 0001: a\n"),
        ] {
            std::fs::create_dir_all(src.join(path).parent().unwrap()).unwrap();
            std::fs::write(src.join(path), text).unwrap();
        }
        assert_eq!(
            benchmark_lines(src).unwrap(),
            vec![
                "- [Scale benchmark](benchmarks/scale.md)",
                "  - [Scale, 2026-03-04](benchmarks/scale-2026-03-04.md)",
                "  - [Scale, 2026-01-02](benchmarks/scale-2026-01-02.md)",
            ]
        );
        assert_eq!(
            adr_lines(src).unwrap(),
            vec![
                "  - [ADR 0001: a](adr/0001-a.md)",
                "  - [ADR 0002: b (x)](adr/0002-b.md)"
            ]
        );
    }
}
