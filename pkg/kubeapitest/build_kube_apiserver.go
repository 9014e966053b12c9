//go:build ignore

// Builds kube-apiserver into the per-machine cache, for `make
// kube-apiserver`: go run ./pkg/kubeapitest/build_kube_apiserver.go
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/cellium/cellium/pkg/kubeapitest"
)

func main() {
	gocmd := os.Getenv("GO")
	if gocmd == "" {
		gocmd = "go"
	}
	bin, err := kubeapitest.Build(context.Background(), gocmd, os.Stderr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "kube-apiserver:", err)
		os.Exit(1)
	}
	fmt.Println(bin)
}
