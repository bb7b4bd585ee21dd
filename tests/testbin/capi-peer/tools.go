//go:build tools

// Package peer pins the peer of `make bench-capi-peer`: Cluster API's own development
// infrastructure provider (CAPD, `test/infrastructure/docker`), run with its `inMemory`
// backend (`DevCluster` / `DevMachine`), which needs no Docker. It is a module of its
// own so that its dependency graph (Docker's client) moves neither ../go.mod nor
// ../capi/go.mod.
package peer

import _ "sigs.k8s.io/cluster-api/test/infrastructure/docker"
