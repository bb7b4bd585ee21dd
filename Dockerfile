# syntax=docker/dockerfile:1
# The banlieue operator image: a Rust build stage, then `FROM scratch` with the root
# filesystem hack/image-rootfs.sh assembles from the build stage's Debian files.
#
#   docker build -t ghcr.io/banlieue-io/banlieue:0.1.0 \
#     --build-arg BANLIEUE_GIT_REV="$(git rev-parse --short HEAD)" .
#   docker build --build-arg VARIANT=slim ...     # every backend but libvirt
#
# Without a container engine, `make image` runs this file's build stages here and packs
# the same tree into target/image/banlieue-<version>-<variant>.oci.tar (tools/oci-image,
# reproducible: the same commit gives the same digest); `make dockerfile-check` is the
# same run plus its checks (ADR 0017). Both describe one filesystem by construction.
#
# VARIANT=full (the default) has every backend. The libvirt backend links libvirt's C
# client library, which needs some fifty shared libraries: image-rootfs copies exactly
# the ones `ldd` lists, glibc's included (there is no base image), into
# /usr/lib/banlieue. libvirt's `qemu+ssh://` transport runs an `ssh` binary the image
# does not have; use `qemu+libssh2://`, `qemu+libssh://` or `qemu+tls://`.
# VARIANT=slim leaves libvirt out (--no-default-features + the other backends).
#
# How qemu-img gets there: `migration.strategy: CopyDisk` converts disks between formats
# with `qemu-img convert`, run from PATH, and every backend of either variant can take
# part in a copy, so both variants ship it: Debian's qemu-utils (installed by the
# stage's apt line) at /usr/local/bin/qemu-img, its libraries beside banlieue's.
# CopyDisk's formats (raw, qcow2, vmdk) are built into qemu-img; qemu-block-extra's
# network drivers are not in the image. The copy stages disks under `--staging-dir`, an
# emptyDir in the `bootstrap operator` Deployment (the root is read-only).
#
# `bootstrap operator` deploys ghcr.io/banlieue-io/banlieue:<crate version> as user
# 65532 (`nonroot` in the image's /etc/passwd) with Cluster API's security context
# (read-only root, no capabilities, RuntimeDefault seccomp).
#
# hack/check-dockerfile.sh reads this file: keep each RUN and COPY on one line, the
# runtime stages `FROM scratch` with one COPY of the rootfs, and ENV/LABEL/USER/
# ENTRYPOINT/CMD as below (they become the OCI config `make image` writes).

ARG VARIANT=full
ARG RUST_VERSION=1.95
ARG DEBIAN=bookworm

FROM docker.io/library/rust:${RUST_VERSION}-${DEBIAN} AS build-full
# libvirt's client library, found by the virt crate with pkg-config; qemu-img for CopyDisk; the CA bundle.
RUN apt-get update && apt-get install -y --no-install-recommends libvirt-dev pkg-config qemu-utils ca-certificates && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
# What `--version` names as the git revision (the context has no .git).
ARG BANLIEUE_GIT_REV=unknown
RUN --mount=type=cache,target=/usr/local/cargo/registry cargo build --release --locked -p banlieue
RUN hack/image-rootfs.sh target/release/banlieue target/image/rootfs-full

FROM docker.io/library/rust:${RUST_VERSION}-${DEBIAN} AS build-slim
# qemu-img for CopyDisk; the CA bundle.
RUN apt-get update && apt-get install -y --no-install-recommends qemu-utils ca-certificates && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
ARG BANLIEUE_GIT_REV=unknown
RUN --mount=type=cache,target=/usr/local/cargo/registry cargo build --release --locked -p banlieue --no-default-features --features vsphere,proxmox,cloud-hypervisor,sim
RUN hack/image-rootfs.sh target/release/banlieue target/image/rootfs-slim

FROM scratch AS runtime-full
COPY --from=build-full /src/target/image/rootfs-full/ /

FROM scratch AS runtime-slim
COPY --from=build-slim /src/target/image/rootfs-slim/ /

FROM runtime-${VARIANT}
ENV PATH=/usr/local/bin LD_LIBRARY_PATH=/usr/lib/banlieue
LABEL org.opencontainers.image.source="https://github.com/banlieue-io/banlieue" org.opencontainers.image.description="banlieue: one VirtualMachine API for vSphere, Proxmox VE, libvirt and Cloud Hypervisor; a Cluster API infrastructure provider" org.opencontainers.image.licenses="Apache-2.0"
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/banlieue"]
CMD ["run"]
