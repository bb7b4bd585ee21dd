//go:build tools

// Package testbin pins the Go programs banlieue's tests run: etcd, kube-apiserver, and
// the rest of a real single-node cluster (kubelet, kube-controller-manager,
// kube-scheduler, kube-proxy) and kubectl, all from one Kubernetes release.
package testbin

import (
	_ "go.etcd.io/etcd/server/v3"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
