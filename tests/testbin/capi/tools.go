//go:build tools

// Package capi pins the Cluster API programs banlieue's contract tests run: the core
// manager and clusterctl. It is a module of its own (not ../go.mod) so CAPI's
// dependency graph never moves the pinned kube-apiserver's.
package capi

import (
	_ "sigs.k8s.io/cluster-api/cmd/clusterctl"
	_ "sigs.k8s.io/cluster-api/core"
)
