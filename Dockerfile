# syntax=docker/dockerfile:1
# The banlieue operator image: a Rust build stage, a distroless non-root runtime.
#
#   docker build -t ghcr.io/banlieue-io/banlieue:0.1.0 \
#     --build-arg BANLIEUE_GIT_REV="$(git rev-parse --short HEAD)" .
#   docker build --build-arg VARIANT=slim ...     # every backend but libvirt
#
# VARIANT=full (the default) has every backend. The libvirt backend links libvirt's C
# client library, which needs glibc and some fifty shared libraries: build-full copies
# exactly the ones `ldd` lists (but glibc's and the GCC runtime, which the base has)
# into /usr/lib/banlieue. libvirt's `qemu+ssh://` transport runs an `ssh` binary the
# image does not have; use `qemu+libssh2://`, `qemu+libssh://` or `qemu+tls://`.
# VARIANT=slim leaves libvirt out (--no-default-features + the other backends): the
# binary needs only glibc and libgcc_s.
#
# How qemu-img gets there: `migration.strategy: CopyDisk` converts disks between formats
# with `qemu-img convert`, run from PATH, and every backend of either variant can take
# part in a copy (vSphere, Proxmox VE and Cloud Hypervisor as well as libvirt), so both
# variants ship it. Each build stage installs Debian's qemu-utils (the same Debian
# release as the runtime base), hack/runtime-tools.sh copies /usr/bin/qemu-img into
# target/runtime-bin (after checking it runs) and hack/runtime-libs.sh copies the
# libraries `ldd` lists for it (glib, GnuTLS, zstd, liburing, ...) next to banlieue's;
# the runtime stage puts it at /usr/local/bin/qemu-img (on PATH) with those libraries
# on LD_LIBRARY_PATH. CopyDisk's formats (raw, qcow2, vmdk) are built into qemu-img;
# qemu-block-extra's network drivers are not in the image. The copy stages disks under
# `--staging-dir`, an emptyDir in the `bootstrap operator` Deployment (the root is
# read-only).
#
# `bootstrap operator` deploys ghcr.io/banlieue-io/banlieue:<crate version> as user
# 65532 with Cluster API's security context (read-only root, no capabilities,
# RuntimeDefault seccomp); distroless's `nonroot` user is 65532 too.
#
# CI builds the build stages without a container engine: hack/check-dockerfile.sh
# (`make dockerfile-check`) runs their `cargo build` and `hack/` commands in the
# checkout and checks what the runtime stages COPY. Keep each of those on one line.

ARG VARIANT=full
ARG RUST_VERSION=1.95
ARG DEBIAN=bookworm

FROM docker.io/library/rust:${RUST_VERSION}-${DEBIAN} AS build-full
# libvirt's client library, found by the virt crate with pkg-config; qemu-img for CopyDisk.
RUN apt-get update && apt-get install -y --no-install-recommends libvirt-dev pkg-config qemu-utils && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
# What `--version` names as the git revision (the context has no .git).
ARG BANLIEUE_GIT_REV=unknown
RUN --mount=type=cache,target=/usr/local/cargo/registry cargo build --release --locked -p banlieue
RUN hack/runtime-tools.sh /usr/bin/qemu-img target/runtime-bin
RUN hack/runtime-libs.sh target/release/banlieue /usr/bin/qemu-img target/runtime-libs

FROM docker.io/library/rust:${RUST_VERSION}-${DEBIAN} AS build-slim
# qemu-img for CopyDisk.
RUN apt-get update && apt-get install -y --no-install-recommends qemu-utils && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
ARG BANLIEUE_GIT_REV=unknown
RUN --mount=type=cache,target=/usr/local/cargo/registry cargo build --release --locked -p banlieue --no-default-features --features vsphere,proxmox,cloud-hypervisor,sim
RUN hack/runtime-tools.sh /usr/bin/qemu-img target/runtime-bin
RUN hack/runtime-libs.sh target/release/banlieue /usr/bin/qemu-img target/runtime-libs

FROM gcr.io/distroless/cc-debian12:nonroot AS runtime-full
COPY --from=build-full /src/target/runtime-libs/ /usr/lib/banlieue/
ENV LD_LIBRARY_PATH=/usr/lib/banlieue
COPY --from=build-full /src/target/runtime-bin/qemu-img /usr/local/bin/qemu-img
COPY --from=build-full /src/target/release/banlieue /usr/local/bin/banlieue

FROM gcr.io/distroless/cc-debian12:nonroot AS runtime-slim
COPY --from=build-slim /src/target/runtime-libs/ /usr/lib/banlieue/
ENV LD_LIBRARY_PATH=/usr/lib/banlieue
COPY --from=build-slim /src/target/runtime-bin/qemu-img /usr/local/bin/qemu-img
COPY --from=build-slim /src/target/release/banlieue /usr/local/bin/banlieue

FROM runtime-${VARIANT}
LABEL org.opencontainers.image.source="https://github.com/banlieue-io/banlieue" \
      org.opencontainers.image.description="banlieue: one VirtualMachine API for vSphere, Proxmox VE, libvirt and Cloud Hypervisor; a Cluster API infrastructure provider" \
      org.opencontainers.image.licenses="Apache-2.0"
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/banlieue"]
CMD ["run"]
