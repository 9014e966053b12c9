//go:build ignore

// Builds hubble-relay and hubble into the per-machine cache, for `make
// hubble-relay`: go run ./pkg/hubblerelay/build_hubble_relay.go
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/cellium/cellium/pkg/hubblerelay"
)

func main() {
	gocmd := os.Getenv("GO")
	if gocmd == "" {
		gocmd = "go"
	}
	relay, cli, err := hubblerelay.Build(context.Background(), gocmd, os.Stderr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "hubble-relay:", err)
		os.Exit(1)
	}
	fmt.Println(relay)
	fmt.Println(cli)
}
