//! Shared by the disk transfer suites (`libvirt_disks.rs`, `cloud_hypervisor_disks.rs`):
//! `qemu-img` and `qemu-io` (Debian's qemu-utils) judging real disk files, and the
//! patterns written into a source disk that must come out at the same offsets.

use std::path::Path;
use std::process::Command;

use serde_json::Value;

/// `(byte, offset, length)`: written into a source disk before export, read back from
/// the imported one. The offsets are past the test images' data, so the guest still
/// boots; the image's own bytes are checked by `qemu-img compare`.
pub const PATTERNS: [(u8, &str, &str); 3] = [
    (0xab, "32M", "64k"),
    (0xcd, "512M", "128k"),
    (0xef, "1023M", "64k"),
];

pub use banlieue_integration_tests::qemu_utils;

/// Runs a program, panicking with its stderr unless it succeeds; returns its stdout.
pub fn run(program: &str, args: &[&str]) -> String {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{program} {args:?}: {}{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

fn qemu_io(path: &Path, format: &str, command: &str) -> String {
    run(
        "qemu-io",
        &[
            "-f",
            format,
            "-c",
            command,
            path.to_str().expect("a UTF-8 path"),
        ],
    )
}

/// Writes [`PATTERNS`] into the disk at `path`.
pub fn write_patterns(path: &Path, format: &str) {
    for (byte, offset, len) in PATTERNS {
        qemu_io(path, format, &format!("write -P {byte:#x} {offset} {len}"));
    }
}

/// Asserts [`PATTERNS`] are in the disk at `path` (qemu-io fails on a mismatch).
pub fn assert_patterns(path: &Path, format: &str) {
    for (byte, offset, len) in PATTERNS {
        let out = qemu_io(path, format, &format!("read -P {byte:#x} {offset} {len}"));
        assert!(
            !out.contains("Pattern verification failed"),
            "{}: {out}",
            path.display()
        );
    }
}

/// `qemu-img info --output=json` of the file alone.
pub fn info(path: &Path, format: &str) -> Value {
    let out = run(
        "qemu-img",
        &[
            "info",
            "--output=json",
            "-f",
            format,
            path.to_str().expect("a UTF-8 path"),
        ],
    );
    serde_json::from_str(&out).expect("qemu-img info JSON")
}

/// Asserts the file is one flat image of `format`: no backing file at all.
pub fn assert_flat(path: &Path, format: &str) -> Value {
    let info = info(path, format);
    assert_eq!(info["format"], format, "{info:#}");
    for key in ["backing-filename", "full-backing-filename"] {
        assert!(
            info.get(key).is_none(),
            "{}: {key} in {info:#}",
            path.display()
        );
    }
    info
}

/// Asserts the two disks hold the same bytes, as the guest sees them (through any
/// backing file).
pub fn assert_same(a: &Path, a_format: &str, b: &Path, b_format: &str) {
    let out = run(
        "qemu-img",
        &[
            "compare",
            "-f",
            a_format,
            "-F",
            b_format,
            a.to_str().expect("a UTF-8 path"),
            b.to_str().expect("a UTF-8 path"),
        ],
    );
    assert!(out.contains("Images are identical"), "{out}");
}
