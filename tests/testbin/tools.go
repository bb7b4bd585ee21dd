//go:build tools

// Package testbin pins the Go programs banlieue's tests run: kube-apiserver and etcd.
package testbin

import (
	_ "go.etcd.io/etcd/server/v3"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
)
