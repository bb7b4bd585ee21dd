//! A binary of another workspace package, for tests that run it as its own process
//! (another package's binary has no `CARGO_BIN_EXE_*`).

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Command;
use std::sync::{Mutex, OnceLock};

/// The path of `bin` from workspace package `package`, built once per test process by
/// the cargo that runs the tests. Cargo prints the executable's path, so a custom
/// `CARGO_TARGET_DIR` or profile needs no guessing; a fresh binary costs one
/// fingerprint check.
///
/// # Panics
/// When the build fails (with cargo's output) or cargo reports no such executable.
pub fn workspace_binary(package: &str, bin: &str) -> PathBuf {
    static BUILT: OnceLock<Mutex<HashMap<String, PathBuf>>> = OnceLock::new();
    let mut built = BUILT
        .get_or_init(Default::default)
        .lock()
        .expect("built binaries");
    if let Some(path) = built.get(bin) {
        return path.clone();
    }
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let workspace = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
    let output = Command::new(cargo)
        .current_dir(workspace)
        .args(["build", "--locked", "-p", package, "--bin", bin])
        .arg("--message-format=json-render-diagnostics")
        .output()
        .unwrap_or_else(|e| panic!("run cargo build for {package}: {e}"));
    assert!(
        output.status.success(),
        "cargo build -p {package} --bin {bin} failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let path = String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|m| m["reason"] == "compiler-artifact" && m["target"]["name"] == bin)
        .find_map(|m| m["executable"].as_str().map(PathBuf::from))
        .unwrap_or_else(|| panic!("cargo reported no {bin} executable"));
    built.insert(bin.to_owned(), path.clone());
    path
}
