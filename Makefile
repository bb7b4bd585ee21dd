# banlieue: the entry point for people and CI. `make help` lists the targets.
SHELL := /usr/bin/env bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

CARGO ?= cargo
TESTBIN_BUILD := tests/testbin/build.sh
# Under make a missing real part (rig, simulator, host tool) fails its test instead of
# skipping it (banlieue_testenv::rigs_required); a bare `cargo test` skips, loudly.
export BANLIEUE_REQUIRE_RIGS ?= 1

.PHONY: help
help: ## List targets.
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-12s %s\n", $$1, $$2}'

.PHONY: demo
demo: ## Run banlieue end to end on a local control plane with the simulated backend (DEMO_ONESHOT=1: exit once all VMs are Ready).
	@hack/build-deps.sh; assets=$$($(TESTBIN_BUILD)); tests/testbin/go-cache.sh prune; \
	$(CARGO) build --locked -p banlieue -p banlieue-demo; \
	bin=$${CARGO_TARGET_DIR:-target}/debug; \
	KUBEBUILDER_ASSETS="$$assets" exec "$$bin/banlieue-demo" --operator "$$bin/banlieue"

.PHONY: bench
bench: ## Scale benchmark (release operator, sim backend): N=100,1000,10000, or `make bench N=1000`; BENCH_ARGS for more flags. Report in docs/benchmarks/.
	@hack/build-deps.sh; assets=$$($(TESTBIN_BUILD)); \
	$(CARGO) build --locked --release -p banlieue -p banlieue-bench; \
	bin=$${CARGO_TARGET_DIR:-target}/release; sizes='$(N)'; \
	KUBEBUILDER_ASSETS="$$assets" "$$bin/banlieue-bench" --operator "$$bin/banlieue" --sizes "$${sizes:-100,1000,10000}" $(BENCH_ARGS)

.PHONY: bench-copy
bench-copy: libvirt fake-cloud-hypervisor ## CopyDisk copy throughput (a 2 GiB disk, libvirt rig -> Cloud Hypervisor rig, release build) against `qemu-img convert` alone, as a ratio; BENCH_COPY_ARGS for more flags (--runs N). Report in docs/benchmarks/.
	@hack/build-deps.sh; \
	$(CARGO) build --locked --release -p banlieue-integration-tests --bin copy-bench --bin fake-ch-vmm; \
	bin=$${CARGO_TARGET_DIR:-target}/release; \
	"$$bin/copy-bench" --fake-vmm "$$bin/fake-ch-vmm" $(BENCH_COPY_ARGS)

.PHONY: bench-backends
bench-backends: vcsim fakepve ## Backend floors: banlieue's API calls, sessions and times for N=100 machines on vcsim and fakepve as ratios to a minimal client doing the same lifecycle (release build); BENCH_BACKENDS_ARGS for more flags (--n N, --backends vsphere,proxmox). Report in docs/benchmarks/.
	@hack/build-deps.sh; assets=$$($(TESTBIN_BUILD)); \
	$(CARGO) build --locked --release -p banlieue-integration-tests --bin backend-floor-bench; \
	bin=$${CARGO_TARGET_DIR:-target}/release; \
	KUBEBUILDER_ASSETS="$$assets" "$$bin/backend-floor-bench" $(BENCH_BACKENDS_ARGS)

.PHONY: bench-capi-peer
bench-capi-peer: testbin ## One CAPI workload (a Cluster, MachineDeployments of N Machines) against banlieue and against Cluster API's in-memory provider (CAPD DevMachines, tests/testbin/capi-peer), same CAPI manager, QPS and concurrency; BENCH_CAPI_PEER_ARGS for more flags (--sizes 100,1000, --repeat N). Report in docs/benchmarks/.
	@hack/build-deps.sh; assets=$$($(TESTBIN_BUILD)); capi=$$(tests/testbin/capi/build.sh); peer=$$(tests/testbin/capi-peer/build.sh); \
	$(CARGO) build --locked --release -p banlieue -p banlieue-bench; \
	bin=$${CARGO_TARGET_DIR:-target}/release; \
	KUBEBUILDER_ASSETS="$$assets" BANLIEUE_CAPI_DIR="$$capi" "$$bin/capi-peer-bench" --operator "$$bin/banlieue" --peer-dir "$$peer" $(BENCH_CAPI_PEER_ARGS)

.PHONY: test
# One-off suite runs gain nothing from incremental artifacts, and they take several GiB
# (more than a small CI disk has left for the copy tests' staging).
test: export CARGO_INCREMENTAL ?= 0
# ~45 test binaries of ~140 MiB each, 40 % of it debug info (std's and the line tables):
# stripped, the test build needs ~2.6 GiB less. Panics still say where; backtraces name
# functions without lines. CARGO_PROFILE_DEV_STRIP=none keeps it.
test: export CARGO_PROFILE_DEV_STRIP ?= debuginfo
test: testbin lint crds-check features-check manifests-check dockerfile-check docs-check publish-check semver-check ## The whole test suite (what CI runs).
	hack/build-deps.sh
	hack/prune-before-tests.sh
	KUBEBUILDER_ASSETS="$$($(TESTBIN_BUILD))" $(CARGO) test --workspace --all-features --locked --no-fail-fast
	DEMO_ONESHOT=1 $(MAKE) --no-print-directory demo

.PHONY: e2e-proxmox
e2e-proxmox: testbin ## Only the Proxmox VE end-to-end tests (real apiserver + fakepve); part of `make test`.
	KUBEBUILDER_ASSETS="$$($(TESTBIN_BUILD))" $(CARGO) test --locked -p banlieue-integration-tests --test proxmox

.PHONY: e2e-vsphere
e2e-vsphere: testbin ## Only the vSphere end-to-end tests (real apiserver + vcsim); part of `make test`.
	KUBEBUILDER_ASSETS="$$($(TESTBIN_BUILD))" $(CARGO) test --locked -p banlieue-integration-tests --test vsphere

.PHONY: e2e-cloud-hypervisor
e2e-cloud-hypervisor: testbin ## Only the Cloud Hypervisor tests (real apiserver + the OpenAPI-checked fake VMM; BANLIEUE_CH_BINARY=... for a real one); part of `make test`.
	$(CARGO) test --locked -p fake-cloud-hypervisor -p banlieue-backend-cloud-hypervisor
	KUBEBUILDER_ASSETS="$$($(TESTBIN_BUILD))" $(CARGO) test --locked -p banlieue-integration-tests --test cloud_hypervisor

.PHONY: e2e-capi
e2e-capi: testbin ## Only the Cluster API contract tests (real apiserver + the real CAPI v1.14 manager and clusterctl, and a real `clusterctl move` between two control planes); part of `make test`.
	KUBEBUILDER_ASSETS="$$($(TESTBIN_BUILD))" $(CARGO) test --locked -p banlieue-integration-tests --test capi --test capi_rig --test clusterctl_move $(if $(wildcard tests/integration/tests/clusterctl.rs),--test clusterctl)

.PHONY: e2e-libvirt
e2e-libvirt: testbin ## Only the libvirt end-to-end tests (real apiserver + real libvirtd/QEMU in a network namespace); part of `make test`.
	$(CARGO) test --locked -p banlieue-backend-libvirt
	KUBEBUILDER_ASSETS="$$($(TESTBIN_BUILD))" $(CARGO) test --locked -p banlieue-integration-tests --test libvirt

.PHONY: features-check
features-check: ## A build with one backend feature links no other backend crate.
	hack/check-feature-isolation.sh

.PHONY: testbin
testbin: fakepve vcsim capi libvirt fake-cloud-hypervisor node-rig upgrade-from ## Build kube-apiserver and etcd from Go modules into a versioned cache dir; print it.
	@$(TESTBIN_BUILD)
	@tests/testbin/go-cache.sh prune

.PHONY: upgrade-from
upgrade-from: ## Build the image an upgrade test starts from: banlieue at an earlier commit (tests/testbin/upgrade; needs a full clone) into a versioned cache dir.
	@hack/build-deps.sh; tests/testbin/upgrade/build.sh >/dev/null

.PHONY: node-rig
node-rig: ## Install containerd, runc, CNI plugins and socat (Debian) and build the pause image for the real node rig (tests/testbin/node).
	@tests/testbin/node/build.sh >/dev/null

.PHONY: vcsim
vcsim: ## Build vcsim (govmomi's vCenter simulator, project-owned main) into a versioned cache dir.
	@tests/testbin/vcsim/build.sh >/dev/null

.PHONY: capi
capi: ## Build Cluster API v1.14 (core, kubeadm bootstrap and control-plane managers, clusterctl), their images and a clusterctl repository (tests/testbin/capi) into a versioned cache dir.
	@tests/testbin/capi/build.sh >/dev/null

.PHONY: libvirt
libvirt: ## Install libvirt, QEMU and dnsmasq (Debian, one suite) and build the tiny test guest into a versioned cache dir.
	@tests/testbin/libvirt/build.sh >/dev/null

.PHONY: fake-cloud-hypervisor
fake-cloud-hypervisor: ## Host tools the Cloud Hypervisor tests need besides cargo (qemu-utils, for the qcow2 overlay checks).
	@tests/fake-cloud-hypervisor/deps.sh

.PHONY: fakepve
fakepve: ## Create the Python venv with fakepve (the Proxmox VE simulator) in a versioned cache dir.
	@tests/testbin/fakepve/build.sh >/dev/null

.PHONY: lint
lint: ## rustfmt, clippy (warnings are errors) and rustdoc (missing docs are errors).
	hack/build-deps.sh
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets --all-features --locked -- -D warnings
	RUSTDOCFLAGS="-D warnings" $(CARGO) doc --workspace --no-deps --all-features --locked

.PHONY: crds
crds: ## Regenerate deploy/crds/ (one file per CRD).
	hack/build-deps.sh
	$(CARGO) run --quiet --locked -p banlieue -- crds --out-dir deploy/crds

.PHONY: crds-check
crds-check: ## Fail when deploy/crds/ differs from what the code generates.
	@hack/build-deps.sh; tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	$(CARGO) run --quiet --locked -p banlieue -- crds --out-dir "$$tmp" 2>/dev/null; \
	if ! diff -ru deploy/crds "$$tmp"; then \
	  echo "deploy/crds is stale: run 'make crds' and commit the result" >&2; exit 1; \
	fi; echo "deploy/crds: $$(ls deploy/crds | wc -l) CRDs, up to date"

.PHONY: manifests
manifests: ## Regenerate deploy/operator/ and deploy/capi/ (banlieue bootstrap manifests).
	$(CARGO) run --quiet --locked -p banlieue -- bootstrap manifests --out-dir deploy

.PHONY: manifests-check
manifests-check: ## Fail when deploy/operator/ or deploy/capi/ differ from what the code generates.
	@tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	$(CARGO) run --quiet --locked -p banlieue -- bootstrap manifests --out-dir "$$tmp" 2>/dev/null; \
	for d in operator capi; do \
	  if ! diff -ru "deploy/$$d" "$$tmp/$$d"; then \
	    echo "deploy/$$d is stale: run 'make manifests' and commit the result" >&2; exit 1; \
	  fi; \
	done; echo "deploy/operator, deploy/capi: up to date"

.PHONY: clusterctl-components
clusterctl-components: image ## Write clusterctl's release assets to target/clusterctl/release/ (components, metadata, cluster templates, the image archives they reference).
	$(CARGO) run --quiet --locked -p banlieue -- bootstrap release --out-dir target/clusterctl/release
	cp target/image/banlieue-*.oci.tar target/image/digests.txt target/clusterctl/release/

.PHONY: e2e-capi-packaging
e2e-capi-packaging: testbin ## bootstrap operator twice on the test control plane, the CAPI rig, real clusterctl on our release; part of `make test`.
	KUBEBUILDER_ASSETS="$$($(TESTBIN_BUILD))" $(CARGO) test --locked -p banlieue --test bootstrap --test clusterctl
	KUBEBUILDER_ASSETS="$$($(TESTBIN_BUILD))" $(CARGO) test --locked -p banlieue-integration-tests --test capi_rig

# The revision the image's binary names: the commit, ", dirty" when the tree is.
GIT_REV = $(shell git rev-parse --short=7 HEAD 2>/dev/null || echo unknown)$(shell [ -z "$$(git status --porcelain 2>/dev/null)" ] || echo ', dirty')

.PHONY: image
image: ## Build the operator images (full, slim) as OCI archives in target/image/ from the Dockerfile's stages, without a container engine; reproducible (ADR 0017).
	BANLIEUE_GIT_REV="$(GIT_REV)" hack/check-dockerfile.sh

.PHONY: dockerfile-check
dockerfile-check: image ## Check the Dockerfile without an engine: its build stages run here, its images are built (make image) and checked.

.PHONY: docs
docs: ## Build the book (docs/book, mdBook) into target/book.
	@hack/build-deps.sh; mdbook=$$(hack/docs-tools.sh); \
	"$$mdbook" build docs/book --dest-dir "$(CURDIR)/target/book"

.PHONY: docs-gen
docs-gen: ## Regenerate the book's API reference (from the CRDs) and SUMMARY.md's generated lists.
	@hack/build-deps.sh; $(CARGO) run --quiet --locked -p banlieue-docgen -- generate docs/book/src

.PHONY: docs-check
docs-check: ## Fail when the book's generated pages are stale, it does not build cleanly, or a link is broken.
	@hack/build-deps.sh; hack/docs-check.sh

.PHONY: publish-check
publish-check: ## cargo publish --dry-run of every published crate (SDK, nocloud, backends), packaged together and built alone; part of `make test`.
	hack/publish-check.sh

.PHONY: semver-check
semver-check: ## cargo-semver-checks of the published crates against the newest v* tag (part of make test; says so and passes while there is no tag; the first check builds the tool once, ~20 min cold, then ~10 min a run).
	hack/semver-check.sh

.PHONY: chaos
chaos: testbin ## Crash and outage tests, larger and repeated (ROUNDS=3 VMS=1000); report in docs/benchmarks/chaos-<date>.md.
	ROUNDS=$(ROUNDS) VMS=$(VMS) hack/chaos.sh
