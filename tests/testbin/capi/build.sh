#!/usr/bin/env bash
# Builds Cluster API's managers and clusterctl from sigs.k8s.io/cluster-api (pinned in
# versions.env and go.mod) into a cache directory keyed by that version and the Go
# version, copies CAPI core's CRDs, webhook configurations, RBAC and metadata.yaml from
# the module next to them, writes a clusterctl local repository of the three CAPI
# providers and packs their managers as OCI image archives, then prints that directory.
# Warm runs only stat.
#
#   <dir>/manager            sigs.k8s.io/cluster-api/core
#   <dir>/clusterctl         sigs.k8s.io/cluster-api/cmd/clusterctl
#   <dir>/kubeadm-bootstrap-manager      sigs.k8s.io/cluster-api/bootstrap/kubeadm
#   <dir>/kubeadm-control-plane-manager  sigs.k8s.io/cluster-api/controlplane/kubeadm
#   <dir>/crds/*.yaml        core/config/crd/bases (cluster, addons, ipam, runtime groups)
#   <dir>/webhook/manifests.yaml   core/config/webhook/manifests.yaml
#   <dir>/rbac/*.yaml        core/config/rbac (manager-role, aggregated-manager-role, ...)
#   <dir>/metadata.yaml      CAPI's clusterctl metadata (release series -> contract)
#   <dir>/crds-kubeadm/*.yaml the kubeadm bootstrap and control-plane CRDs
#   <dir>/crds-clusterctl/*.yaml clusterctl's inventory CRD (providers.clusterctl.cluster.x-k8s.io)
#   <dir>/repository/        a clusterctl local repository (`file://` provider URLs), as
#                            CAPI's `make release-manifests` writes its release assets:
#     cluster-api/<v>/{core-components.yaml,metadata.yaml}
#     bootstrap-kubeadm/<v>/{bootstrap-components.yaml,metadata.yaml}
#     control-plane-kubeadm/<v>/{control-plane-components.yaml,metadata.yaml}
#                            (`kubectl kustomize` of each config/default, the manager
#                            image set to the release's name, imagePullPolicy IfNotPresent)
#   <dir>/images/*.oci.tar   the three managers as OCI image archives under those names
#                            (tools/oci-image; `ctr -n k8s.io images import` takes them),
#                            reproducible: every time is the module version's time (the
#                            digests also follow the host's ca-certificates bundle)
#   <dir>/images/images.txt  "<image reference> <digest> <archive>" per image
#
# KUBECTL overrides the kubectl used for `kubectl kustomize` (default: the one
# tests/testbin/build.sh builds); CARGO the cargo that builds tools/oci-image.
set -euo pipefail
cd "$(dirname "$0")"
source ./versions.env

command -v go >/dev/null || { echo "capi: Go is required (https://go.dev/doc/install)" >&2; exit 1; }
go_version=$(go env GOVERSION)
cache_root=${BANLIEUE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/banlieue}
dir="$cache_root/capi/capi-${CAPI_VERSION}_${go_version}"

# The release's image names (CAPI's Makefile: PROD_REGISTRY/<IMAGE_NAME>:<RELEASE_TAG>).
registry=registry.k8s.io/cluster-api
# provider dir | components file | module package | binary | image name | kustomize root
providers=(
  "cluster-api|core-components.yaml|sigs.k8s.io/cluster-api/core|manager|cluster-api-controller|core/config"
  "bootstrap-kubeadm|bootstrap-components.yaml|sigs.k8s.io/cluster-api/bootstrap/kubeadm|kubeadm-bootstrap-manager|kubeadm-bootstrap-controller|bootstrap/kubeadm/config"
  "control-plane-kubeadm|control-plane-components.yaml|sigs.k8s.io/cluster-api/controlplane/kubeadm|kubeadm-control-plane-manager|kubeadm-control-plane-controller|controlplane/kubeadm/config"
)

complete() {
  local f p name components binary image
  for f in clusterctl crds crds-kubeadm crds-clusterctl webhook rbac metadata.yaml .complete images/images.txt; do
    [[ -e "$dir/$f" ]] || return 1
  done
  for p in "${providers[@]}"; do
    IFS='|' read -r name components _ binary image _ <<<"$p"
    for f in "$binary" "repository/$name/$CAPI_VERSION/$components" "repository/$name/$CAPI_VERSION/metadata.yaml" \
      "images/$image-$CAPI_VERSION.oci.tar"; do
      [[ -e "$dir/$f" ]] || return 1
    done
  done
}
if complete; then
  echo "$dir"
  exit 0
fi
# Tests call this script (tests/integration/src/capi): one build of a directory at a
# time; who waited for it finds it complete.
mkdir -p "$(dirname "$dir")"
exec 9>"$dir.lock"
flock 9
if complete; then
  echo "$dir"
  exit 0
fi

repo_root=$(cd ../../.. && pwd)
kubectl=${KUBECTL:-$(../build.sh)/kubectl}
[[ -x "$kubectl" ]] || { echo "capi: no kubectl at $kubectl" >&2; exit 1; }
cargo=${CARGO:-cargo}

source ../go-cache.sh
export CGO_ENABLED=0 GOFLAGS="-mod=mod -buildvcs=false -trimpath"
rm -rf "$dir.tmp"
mkdir -p "$dir.tmp"
trap 'rm -rf "$dir.tmp"' EXIT
src=$(go list -m -f '{{.Dir}}' sigs.k8s.io/cluster-api)
[[ -n "$src" && -d "$src/core/config" ]] || {
  go mod download sigs.k8s.io/cluster-api
  src=$(go list -m -f '{{.Dir}}' sigs.k8s.io/cluster-api)
}
minor=$(echo "$CAPI_VERSION" | cut -d. -f2)
# CAPI reads its own version from these (clusterctl compares it with provider
# metadata; the manager logs it).
ldflags="-s -w -X sigs.k8s.io/cluster-api/version.gitVersion=${CAPI_VERSION} \
  -X sigs.k8s.io/cluster-api/version.gitMajor=1 \
  -X sigs.k8s.io/cluster-api/version.gitMinor=${minor} \
  -X sigs.k8s.io/cluster-api/version.gitTreeState=clean"
# One `go build` per program (the managers share most packages, and the build cache
# compiles them once).
for p in "${providers[@]}"; do
  IFS='|' read -r _ _ package binary _ _ <<<"$p"
  echo "capi: building Cluster API ${CAPI_VERSION} $binary (first run only; a few minutes)" >&2
  go build -ldflags "$ldflags" -o "$dir.tmp/$binary" "$package"
done
echo "capi: building clusterctl ${CAPI_VERSION} (first run only)" >&2
go build -ldflags "$ldflags" -o "$dir.tmp/clusterctl" sigs.k8s.io/cluster-api/cmd/clusterctl

mkdir -p "$dir.tmp/crds" "$dir.tmp/crds-kubeadm" "$dir.tmp/crds-clusterctl" "$dir.tmp/webhook" "$dir.tmp/rbac"
cp "$src"/core/config/crd/bases/*.yaml "$dir.tmp/crds/"
cp "$src"/bootstrap/kubeadm/config/crd/bases/*.yaml "$src"/controlplane/kubeadm/config/crd/bases/*.yaml \
  "$dir.tmp/crds-kubeadm/"
cp "$src"/cmd/clusterctl/config/crd/bases/clusterctl.cluster.x-k8s.io_providers.yaml "$dir.tmp/crds-clusterctl/"
cp "$src/core/config/webhook/manifests.yaml" "$dir.tmp/webhook/"
cp "$src"/core/config/rbac/*.yaml "$dir.tmp/rbac/"
rm -f "$dir.tmp/rbac/kustomization.yaml"
cp "$src/metadata.yaml" "$dir.tmp/metadata.yaml"
echo "$CAPI_VERSION" > "$dir.tmp/VERSION"

# The clusterctl repository: what CAPI's `make release` does (manifest-modification sets
# the manager image and pull policy in each config/default's patches with sed, then
# release-manifests runs `kustomize build` of each and copies metadata.yaml), on a copy
# of the read-only module tree.
work=$(mktemp -d)
trap 'rm -rf "$dir.tmp" "$work"' EXIT
for p in "${providers[@]}"; do
  IFS='|' read -r name components _ _ image config <<<"$p"
  mkdir -p "$work/$name"
  cp -r "$src/$config" "$work/$name/config"
  chmod -R u+w "$work/$name"
  sed -i -e "s@image: .*@image: $registry/$image:$CAPI_VERSION@" "$work/$name/config/default/manager_image_patch.yaml"
  sed -i -e 's@imagePullPolicy: .*@imagePullPolicy: IfNotPresent@' "$work/$name/config/default/manager_pull_policy.yaml"
  out="$dir.tmp/repository/$name/$CAPI_VERSION"
  mkdir -p "$out"
  "$kubectl" kustomize "$work/$name/config/default" >"$out/$components"
  cp "$src/metadata.yaml" "$out/metadata.yaml"
  # What clusterctl and the rig rely on: the provider label on every object, one
  # namespace, the image and pull policy just set.
  grep -q "image: $registry/$image:$CAPI_VERSION\$" "$out/$components" ||
    { echo "capi: $components does not name $registry/$image:$CAPI_VERSION" >&2; exit 1; }
  grep -q 'imagePullPolicy: IfNotPresent$' "$out/$components" ||
    { echo "capi: $components does not set imagePullPolicy IfNotPresent" >&2; exit 1; }
  read -r objects labelled < <(awk -v want="$name" '
    function end_doc() { if (kind != "") { n++; if (ok) l++ } kind = ""; ok = 0; meta = 0 }
    /^---$/ { end_doc(); next }
    /^kind:/ { kind = $2 }
    /^metadata:/ { meta = 1; next }
    /^[^ ]/ { meta = 0 }
    meta && $0 == "    cluster.x-k8s.io/provider: " want { ok = 1 }
    END { end_doc(); print n + 0, l + 0 }' "$out/$components")
  (( objects > 0 && objects == labelled )) ||
    { echo "capi: $components: $labelled of $objects objects carry cluster.x-k8s.io/provider: $name" >&2; exit 1; }
  (( $(grep -c '^kind: Namespace$' "$out/$components") == 1 )) ||
    { echo "capi: $components must hold exactly one Namespace" >&2; exit 1; }
done

# The images: a distroless-like root (CAPI's Dockerfile: gcr.io/distroless/static:nonroot,
# /manager, USER 65532, ENTRYPOINT ["/manager"]); the managers are static binaries.
echo "capi: building tools/oci-image and packing the manager images" >&2
(cd "$repo_root" && "$cargo" build --quiet --release --locked -p banlieue-oci-image)
oci_image="${CARGO_TARGET_DIR:-$repo_root/target}/release/oci-image"
ca=/etc/ssl/certs/ca-certificates.crt
[[ -s "$ca" ]] || { echo "capi: $ca is missing (Debian package ca-certificates)" >&2; exit 1; }
# Every time in the images is the module version's publication time (reproducible).
epoch=$(go list -m -f '{{if .Time}}{{.Time.Unix}}{{end}}' sigs.k8s.io/cluster-api)
[[ "$epoch" =~ ^[0-9]+$ ]] || epoch=0
mkdir -p "$dir.tmp/images"
: >"$dir.tmp/images/images.txt"
for p in "${providers[@]}"; do
  IFS='|' read -r name _ _ binary image _ <<<"$p"
  rootfs="$work/rootfs-$name"
  mkdir -p "$rootfs/etc/ssl/certs" "$rootfs/tmp" "$rootfs/home/nonroot"
  install -m 0755 "$dir.tmp/$binary" "$rootfs/manager"
  install -m 0644 "$ca" "$rootfs/etc/ssl/certs/ca-certificates.crt"
  printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >"$rootfs/etc/passwd"
  printf 'root:x:0:\nnonroot:x:65532:\n' >"$rootfs/etc/group"
  chmod 0644 "$rootfs/etc/passwd" "$rootfs/etc/group"
  find "$rootfs" -type d -exec chmod 0755 {} +
  chmod 1777 "$rootfs/tmp"
  chown 65532:65532 "$rootfs/home/nonroot" 2>/dev/null || true
  chmod 0700 "$rootfs/home/nonroot"
  ref="$registry/$image:$CAPI_VERSION"
  archive="$dir.tmp/images/$image-$CAPI_VERSION.oci.tar"
  read -r digest _ < <("$oci_image" --rootfs "$rootfs" --out "$archive" --ref "$ref" --epoch "$epoch" \
    --user 65532:65532 --entrypoint '["/manager"]')
  [[ "$digest" == sha256:* ]] || { echo "capi: oci-image wrote no digest for $ref" >&2; exit 1; }
  echo "$ref $digest $image-$CAPI_VERSION.oci.tar" >>"$dir.tmp/images/images.txt"
done

chmod -R u+w "$dir.tmp"
touch "$dir.tmp/.complete"
rm -rf "$dir"
mv "$dir.tmp" "$dir"
echo "$dir"
