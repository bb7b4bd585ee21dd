//go:build tools

// Package capi pins the Cluster API programs banlieue's tests run: the core manager,
// the kubeadm bootstrap and control-plane managers, and clusterctl. It is a module of
// its own (not ../go.mod) so CAPI's dependency graph never moves the pinned
// kube-apiserver's.
package capi

import (
	_ "sigs.k8s.io/cluster-api/bootstrap/kubeadm"
	_ "sigs.k8s.io/cluster-api/cmd/clusterctl"
	_ "sigs.k8s.io/cluster-api/controlplane/kubeadm"
	_ "sigs.k8s.io/cluster-api/core"
)
