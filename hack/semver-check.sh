#!/usr/bin/env bash
# Semver check of the published crates against the last release: cargo-semver-checks
# compares each crate's public API with the one at the newest `v*` git tag and fails
# on a breaking change the version number does not announce.
#
# No release yet means no baseline: the script says so and passes.
# BANLIEUE_SEMVER_BASELINE=<git rev> compares against any revision instead (a branch
# point, or `HEAD~1` to try the script).
#
# Part of `make test`. Until the first `v*` tag it only says there is no baseline. From
# then on it costs: cargo-semver-checks built cold in 20 minutes on the 2-core CI
# machine (release profile, ~450 crates; once, then cached), and a check against a
# baseline took 10.5 min (rustdoc JSON of both revisions of seven crates, measured
# with BANLIEUE_SEMVER_BASELINE=HEAD).
# It is installed once, pinned, into ${BANLIEUE_CACHE:-~/.cache/banlieue}/cargo-semver-checks-<version>.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

VERSION=0.51.0
CARGO=${CARGO:-cargo}
cache=${BANLIEUE_CACHE:-$HOME/.cache/banlieue}/cargo-semver-checks-$VERSION

baseline=${BANLIEUE_SEMVER_BASELINE:-$(git tag --list 'v*' --sort=-version:refname | head -n 1)}
if [[ -z "$baseline" ]]; then
  echo "semver-check: no v* release tag yet, so there is no public API to compare against; nothing to check"
  exit 0
fi
git rev-parse --verify --quiet "$baseline^{commit}" >/dev/null || {
  echo "semver-check: baseline $baseline is not a commit in this repository" >&2
  exit 1
}

if [[ ! -x "$cache/bin/cargo-semver-checks" ]]; then
  echo "semver-check: building cargo-semver-checks $VERSION into $cache (once; ~20 min cold on 2 cores)" >&2
  "$CARGO" install --locked --root "$cache" cargo-semver-checks --version "$VERSION"
fi
hack/build-deps.sh

mapfile -t crates < <(hack/published-crates.sh)
if [[ ${#crates[@]} -eq 0 ]]; then
  echo "semver-check: no publishable crate found" >&2
  exit 1
fi
args=()
for crate in "${crates[@]}"; do args+=(--package "$crate"); done
echo "semver-check: ${crates[*]} against $baseline"
# Rustdoc of the libraries alone (no dev-dependencies) needs a Kubernetes version for
# k8s-openapi, as on docs.rs; its own target dir keeps the workspace's artifacts valid.
K8S_OPENAPI_ENABLED_VERSION=1.33 CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target}/semver-check \
  "$cache/bin/cargo-semver-checks" semver-checks check-release \
  --baseline-rev "$baseline" --all-features "${args[@]}"
