//go:build ignore

// Builds etcd StreamingVersion into the per-machine cache, for `make
// etcd`: go run ./pkg/etcdtest/build_etcd.go
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/cellium/cellium/pkg/etcdtest"
)

func main() {
	gocmd := os.Getenv("GO")
	if gocmd == "" {
		gocmd = "go"
	}
	bin, err := etcdtest.BuildStreaming(context.Background(), gocmd, os.Stderr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "etcd:", err)
		os.Exit(1)
	}
	fmt.Println(bin)
}
