//! `banlieue-docgen`: the book's generated pages and its link check.
//!
//! ```text
//! banlieue-docgen generate <book-src> [--check]   API reference, backends' crate docs, SUMMARY.md blocks
//! banlieue-docgen check-links <built-html-dir>     every relative link and anchor resolves
//! ```
//!
//! Generated pages are committed; `--check` fails when they differ from what the code
//! generates, the way `make crds-check` does for `deploy/crds/`.

mod api_reference;
mod capabilities;
mod crate_docs;
mod generate;
mod includes;
mod links;
mod schema;
mod summary;

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, bail};

const USAGE: &str = "usage: banlieue-docgen generate <book-src> [--check]\n       banlieue-docgen check-links <built-html-dir>";

fn main() -> ExitCode {
    match run(std::env::args().skip(1).collect()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("banlieue-docgen: {err:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: Vec<String>) -> anyhow::Result<()> {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    match args.as_slice() {
        ["generate", src] => generate::write(&PathBuf::from(src)),
        ["generate", src, "--check"] => generate::check(&PathBuf::from(src)),
        ["check-links", dir] => {
            let report = links::check(&PathBuf::from(dir))
                .with_context(|| format!("checking links under {dir}"))?;
            for problem in &report.problems {
                eprintln!("{problem}");
            }
            if !report.problems.is_empty() {
                bail!(
                    "{} broken link(s) in {} pages",
                    report.problems.len(),
                    report.pages
                );
            }
            println!(
                "links: {} pages, {} relative links and {} external links checked, none broken",
                report.pages, report.relative, report.external
            );
            Ok(())
        }
        _ => bail!("{USAGE}"),
    }
}
