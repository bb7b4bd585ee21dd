#!/usr/bin/env bash
# Frees the disk the checks before `cargo test` used and the test build does not read,
# so the test build (several GiB of test binaries) has room on a small CI disk (a full
# one made `ld` die with SIGBUS while linking). Removed: the publish-check and
# semver-check target dirs (their own builds), rustdoc output, and the release build's
# intermediate artifacts (deps, build scripts, fingerprints). Kept: the images in
# target/image and the release binaries the tests and `make bench` start.
#
# Under CI (CI=true) it always runs; elsewhere only with BANLIEUE_PRUNE=1, because a
# developer's next `make test` would rebuild the release image and the lone packages
# cold (~15 min on 2 cores). It prints what it freed.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

if [[ "${CI:-}" != true && "${BANLIEUE_PRUNE:-}" != 1 ]]; then
  exit 0
fi
target=${CARGO_TARGET_DIR:-target}
before=$(df -Pk "$target" | awk 'NR==2 {print $4}')
rm -rf "$target/publish-check" "$target/semver-check" "$target/doc" \
  "$target/release/deps" "$target/release/build" "$target/release/.fingerprint" \
  "$target/release/incremental" "$target/release/examples"
after=$(df -Pk "$target" | awk 'NR==2 {print $4}')
echo "prune-before-tests: freed $(((after - before) / 1024)) MiB; $((after / 1024)) MiB free for the test build"
