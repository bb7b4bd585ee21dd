//! The CLI as people run it: `--version` names the git revision of the build, the man
//! pages render with groff and cover every subcommand, and bash completes every
//! subcommand. The subcommands come from `--help`, not from the generators under test.
//! build.rs is included to test where the revision comes from outside this checkout.

#[allow(dead_code)]
#[path = "../build.rs"]
mod build_script;

use std::path::Path;
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_banlieue");

fn run(program: &str, args: &[&str], dir: Option<&Path>) -> (bool, String, String) {
    let mut cmd = Command::new(program);
    cmd.args(args);
    if let Some(dir) = dir {
        cmd.current_dir(dir);
    }
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("running {program} {args:?}: {e}"));
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn banlieue(args: &[&str]) -> String {
    let (ok, stdout, stderr) = run(BIN, args, None);
    assert!(ok, "banlieue {args:?} failed: {stderr}");
    stdout
}

fn git(args: &[&str]) -> Option<String> {
    let (ok, stdout, _) = run("git", args, Some(Path::new(env!("CARGO_MANIFEST_DIR"))));
    ok.then(|| stdout.trim().to_owned())
}

/// A tool the test needs: `None` (skip) on a developer machine without it, a failure in
/// CI, where every real part must be there.
fn tool(name: &str, package: &str) -> Option<()> {
    let found = Command::new(name).arg("--version").output().is_ok();
    if !found {
        assert!(
            !banlieue_testenv::rigs_required(),
            "{name} is missing (Debian package {package}; hack/build-deps.sh installs it)"
        );
        eprintln!("skipped: {name} is missing (Debian package {package})");
    }
    found.then_some(())
}

/// The subcommands `banlieue <path> --help` lists, as paths, depth first.
fn command_paths(path: &[String]) -> Vec<Vec<String>> {
    let mut args: Vec<&str> = path.iter().map(String::as_str).collect();
    args.push("--help");
    let help = banlieue(&args);
    let mut paths = Vec::new();
    for name in help
        .lines()
        .skip_while(|line| line.trim() != "Commands:")
        .skip(1)
        .take_while(|line| !line.trim().is_empty())
        .filter_map(|line| line.split_whitespace().next())
        .filter(|name| *name != "help")
    {
        let mut sub = path.to_vec();
        sub.push(name.to_owned());
        paths.push(sub.clone());
        paths.extend(command_paths(&sub));
    }
    paths
}

fn every_subcommand() -> Vec<Vec<String>> {
    let paths = command_paths(&[]);
    for expected in ["run", "crds", "bootstrap", "completion", "man"] {
        assert!(
            paths.iter().any(|p| p == &[expected.to_owned()]),
            "--help lists {expected}: {paths:?}"
        );
    }
    assert!(
        paths.iter().any(|p| p.len() == 2),
        "nested subcommands (bootstrap operator) are listed: {paths:?}"
    );
    paths
}

#[test]
fn version_names_the_revision_of_this_checkout() {
    let version = banlieue(&["--version"]);
    let prefix = format!("banlieue {} (git ", env!("CARGO_PKG_VERSION"));
    let rev = version
        .trim()
        .strip_prefix(&prefix)
        .and_then(|rest| rest.strip_suffix(')'))
        .unwrap_or_else(|| panic!("--version is not '{prefix}<rev>)': {version}"));
    assert_eq!(banlieue(&["-V"]), version, "-V and --version agree");
    if let Ok(expected) = std::env::var(build_script::OVERRIDE_VAR) {
        assert_eq!(rev, expected.trim(), "BANLIEUE_GIT_REV names the revision");
        return;
    }
    let head = git(&["rev-parse", "HEAD"]).expect("these tests run in a git checkout");
    let commit = rev.strip_suffix(", dirty").unwrap_or(rev);
    assert!(
        commit.len() >= 7 && commit.chars().all(|c| c.is_ascii_hexdigit()),
        "an abbreviated commit, not '{rev}'"
    );
    // Others may commit between the build and this test in a shared checkout: the
    // built revision is HEAD or one of its ancestors, never anything else.
    assert!(
        head.starts_with(commit) || git(&["merge-base", "--is-ancestor", commit, "HEAD"]).is_some(),
        "--version names {commit}, which is not HEAD ({head}) nor an ancestor of it"
    );
}

#[test]
fn the_build_script_finds_the_revision_in_this_checkout() {
    let found = build_script::git_rev(Path::new(env!("CARGO_MANIFEST_DIR")), None);
    let head = git(&["rev-parse", "HEAD"]).expect("these tests run in a git checkout");
    let commit = found.rev.strip_suffix(", dirty").unwrap_or(&found.rev);
    assert!(
        commit.len() >= 7 && head.starts_with(commit),
        "{found:?} vs HEAD {head}"
    );
    let git_dir = git(&["rev-parse", "--absolute-git-dir"]).unwrap();
    assert!(
        found
            .watch
            .iter()
            .any(|p| p.canonicalize().ok() == Path::new(&git_dir).join("HEAD").canonicalize().ok()),
        "a commit or checkout reruns the build script: {:?}",
        found.watch
    );
    assert!(
        found.watch.iter().all(|p| p.exists()),
        "a missing watched file would rerun the build script on every build"
    );
}

#[test]
fn the_build_script_falls_back_outside_a_checkout() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("Cargo.toml"), "[package]\n").unwrap();
    // No repository at all (a crate tarball without .cargo_vcs_info.json).
    assert_eq!(build_script::git_rev(dir.path(), None).rev, "unknown");

    // A repository that does not track the crate is not its revision.
    let (ok, _, stderr) = run("git", &["init", "--quiet"], Some(dir.path()));
    assert!(ok, "git init: {stderr}");
    assert_eq!(build_script::git_rev(dir.path(), None).rev, "unknown");

    // A crate tarball: cargo package's record of the commit.
    let sha = "0123456789abcdef0123456789abcdef01234567";
    let vcs_info = dir.path().join(".cargo_vcs_info.json");
    std::fs::write(
        &vcs_info,
        format!("{{\n  \"git\": {{\n    \"sha1\": \"{sha}\"\n  }},\n  \"path_in_vcs\": \"bins/banlieue\"\n}}"),
    )
    .unwrap();
    let found = build_script::git_rev(dir.path(), None);
    assert_eq!(found.rev, "0123456");
    assert_eq!(found.watch, vec![vcs_info.clone()]);
    std::fs::write(
        &vcs_info,
        format!(
            "{{\"git\":{{\"sha1\":\"{sha}\",\"dirty\":true}},\"path_in_vcs\":\"bins/banlieue\"}}"
        ),
    )
    .unwrap();
    assert_eq!(
        build_script::git_rev(dir.path(), None).rev,
        "0123456, dirty"
    );

    // The Docker build's argument wins; an empty one does not count.
    let given = |rev: &str| build_script::git_rev(dir.path(), Some(rev.to_owned())).rev;
    assert_eq!(given("abc1234"), "abc1234");
    assert_eq!(given(" \n"), "0123456, dirty");
}

#[test]
fn man_pages_render_and_cover_every_subcommand() {
    let paths = every_subcommand();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("man1");
    banlieue(&["man", "--out-dir", out.to_str().unwrap()]);

    let mut expected: Vec<String> = paths
        .iter()
        .map(|p| format!("banlieue-{}.1", p.join("-")))
        .collect();
    expected.push("banlieue.1".to_owned());
    expected.sort();
    let mut written: Vec<String> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    written.sort();
    assert_eq!(written, expected, "one page per command");

    if tool("groff", "groff-base").is_none() {
        return;
    }
    let render = |page: &str| {
        let path = out.join(page);
        let (ok, text, warnings) = run(
            "groff",
            &["-man", "-Tutf8", "-ww", "-P-cbou", path.to_str().unwrap()],
            None,
        );
        assert!(ok && warnings.is_empty(), "groff {page}: {warnings}");
        text
    };
    let top = render("banlieue.1");
    assert!(
        top.contains(
            banlieue(&["--version"])
                .trim()
                .trim_start_matches("banlieue ")
        ),
        "banlieue.1 names the version:\n{top}"
    );
    for path in &paths {
        let name = format!("banlieue-{}", path.join("-"));
        let parent_page = match &path[..path.len() - 1] {
            [] => "banlieue.1".to_owned(),
            parent => format!("banlieue-{}.1", parent.join("-")),
        };
        let parent = render(&parent_page);
        // SUBCOMMANDS lists each as a reference to its page: `banlieue-run(1)`.
        assert!(
            parent.lines().any(|l| l.trim() == format!("{name}(1)")),
            "{parent_page} lists {name}(1):\n{parent}"
        );
        let own = render(&format!("{name}.1"));
        let named = own
            .lines()
            .skip_while(|l| l.trim() != "NAME")
            .nth(1)
            .map(|l| l.split_whitespace().take(2).collect::<Vec<_>>());
        assert_eq!(
            named,
            Some(vec![name.as_str(), "-"]),
            "{name}.1 names its command in NAME:\n{own}"
        );
    }
}

#[test]
fn bash_completes_every_subcommand() {
    let paths = every_subcommand();
    let script = banlieue(&["completion", "bash"]);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("banlieue.bash");
    std::fs::write(&file, &script).unwrap();
    // What bash offers after `banlieue <path> <TAB>`, by calling the registered function
    // as readline would.
    let complete = |words: &[String]| -> Vec<String> {
        let line = format!("banlieue {} ", words.join(" "));
        let mut comp_words = vec!["banlieue".to_owned()];
        comp_words.extend(words.iter().cloned());
        comp_words.push(String::new());
        let program = format!(
            "set -e; source {file}; fn=$(complete -p banlieue | sed -E 's/.*-F ([^ ]+).*/\\1/'); \
             COMP_WORDS=({words}); COMP_CWORD={cword}; COMP_LINE='{line}'; COMP_POINT={point}; \
             \"$fn\" banlieue '' '{prev}'; printf '%s\\n' \"${{COMPREPLY[@]}}\"",
            file = file.display(),
            words = comp_words
                .iter()
                .map(|w| format!("'{w}'"))
                .collect::<Vec<_>>()
                .join(" "),
            cword = comp_words.len() - 1,
            point = line.len(),
            prev = comp_words[comp_words.len() - 2],
        );
        let (ok, stdout, stderr) = run("bash", &["-c", &program], None);
        assert!(ok, "bash completion for '{line}': {stderr}");
        stdout.lines().map(str::to_owned).collect()
    };
    let mut parents: Vec<Vec<String>> = vec![vec![]];
    parents.extend(
        paths
            .iter()
            .filter(|p| {
                paths
                    .iter()
                    .any(|q| q.len() == p.len() + 1 && q.starts_with(p))
            })
            .cloned(),
    );
    for parent in parents {
        let offered = complete(&parent);
        for path in paths
            .iter()
            .filter(|p| p.len() == parent.len() + 1 && p.starts_with(&parent))
        {
            let sub = path.last().unwrap();
            assert!(
                offered.contains(sub),
                "`banlieue {} <TAB>` offers {sub}: {offered:?}",
                parent.join(" ")
            );
        }
    }
}
