//go:build ignore

// Builds kube-apiserver into the per-machine cache, for `make
// kube-apiserver`: go run ./pkg/kubeapiserver/build_kube_apiserver.go
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/cellium/cellium/pkg/kubeapiserver"
)

func main() {
	gocmd := os.Getenv("GO")
	if gocmd == "" {
		gocmd = "go"
	}
	bin, err := kubeapiserver.Build(context.Background(), gocmd, os.Stderr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "kube-apiserver:", err)
		os.Exit(1)
	}
	fmt.Println(bin)
}
