//! Build script: records the git revision the binary is built from, for `--version`
//! (`banlieue 0.1.0 (git abc1234, dirty)`), as the compile-time env var
//! `BANLIEUE_BUILD_GIT_REV`.
//!
//! Where the revision comes from, first match wins:
//! 1. `BANLIEUE_GIT_REV`, verbatim: builds without a checkout set it (the Dockerfile
//!    passes its build argument of that name);
//! 2. `.cargo_vcs_info.json`, which `cargo package` writes into a crate tarball;
//! 3. `git`, when this crate is tracked in the checkout around it;
//! 4. otherwise `unknown`.
//!
//! "dirty" is what `git status` said when this script last ran: it reruns when HEAD
//! moves (a commit, a checkout), not on every edit or `git add` (that would recompile
//! the binary on any change in the workspace, or whenever git rewrites its index).
//! `tests/cli.rs` includes this file to test [`git_rev`] in and outside a checkout.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The variable a build without a git checkout sets to name its revision.
pub const OVERRIDE_VAR: &str = "BANLIEUE_GIT_REV";

/// A revision and the files whose change should rerun this script.
#[derive(Debug)]
pub struct GitRev {
    /// `abc1234`, `abc1234, dirty` or `unknown`.
    pub rev: String,
    /// Files that move when the revision or the dirty state may have changed.
    pub watch: Vec<PathBuf>,
}

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rerun-if-env-changed={OVERRIDE_VAR}");
    let dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    let found = git_rev(&dir, std::env::var(OVERRIDE_VAR).ok());
    for path in &found.watch {
        println!("cargo::rerun-if-changed={}", path.display());
    }
    println!("cargo::rustc-env=BANLIEUE_BUILD_GIT_REV={}", found.rev);
}

/// The revision of the crate in `dir`; `override_rev` is `$BANLIEUE_GIT_REV`.
pub fn git_rev(dir: &Path, override_rev: Option<String>) -> GitRev {
    let override_rev = override_rev
        .map(|rev| rev.trim().to_owned())
        .filter(|rev| !rev.is_empty() && !rev.contains('\n'));
    if let Some(rev) = override_rev {
        return GitRev { rev, watch: vec![] };
    }
    let vcs_info = dir.join(".cargo_vcs_info.json");
    if let Some(rev) = from_vcs_info(&vcs_info) {
        return GitRev {
            rev,
            watch: vec![vcs_info],
        };
    }
    from_git(dir).unwrap_or_else(|| GitRev {
        rev: "unknown".to_owned(),
        watch: vec![],
    })
}

/// `{"git": {"sha1": "<40 hex>", "dirty": true}, ...}` as `cargo package` writes it.
/// A few string searches rather than a JSON parser: a build script's dependencies are
/// built for every build of the binary.
fn from_vcs_info(path: &Path) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    let after = &text[text.find("\"sha1\"")? + "\"sha1\"".len()..];
    let sha: String = after
        .trim_start_matches([' ', ':', '"', '\n', '\t'])
        .chars()
        .take_while(char::is_ascii_hexdigit)
        .collect();
    if sha.len() < 7 {
        return None;
    }
    let dirty = text
        .replace([' ', '\n', '\t'], "")
        .contains("\"dirty\":true");
    Some(describe(&sha[..7], dirty))
}

fn describe(short: &str, dirty: bool) -> String {
    if dirty {
        format!("{short}, dirty")
    } else {
        short.to_owned()
    }
}

/// Runs git in `dir`; `None` when git is missing or fails.
fn git(dir: &Path, args: &[&str]) -> Option<String> {
    // --no-optional-locks: a build must not rewrite the index under a developer's feet.
    let out = Command::new("git")
        .arg("--no-optional-locks")
        .arg("-C")
        .arg(dir)
        .args(args)
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

fn from_git(dir: &Path) -> Option<GitRev> {
    // Only a checkout that tracks this crate names its revision: a copy unpacked inside
    // some other repository is not that repository's code.
    git(dir, &["ls-files", "--error-unmatch", "Cargo.toml"])?;
    let short = git(dir, &["rev-parse", "--short", "HEAD"])?;
    let status = git(dir, &["status", "--porcelain", "--untracked-files=no"])?;
    let mut watch = Vec::new();
    let mut watch_git_path = |name: &str| {
        if let Some(path) = git(dir, &["rev-parse", "--git-path", name]) {
            let path = dir.join(path);
            // A missing file would rerun this script on every build.
            if path.exists() {
                watch.push(path);
            }
        }
    };
    watch_git_path("HEAD");
    watch_git_path("packed-refs");
    if let Some(branch) = git(dir, &["symbolic-ref", "-q", "HEAD"]) {
        watch_git_path(&branch);
    }
    Some(GitRev {
        rev: describe(&short, !status.is_empty()),
        watch,
    })
}
