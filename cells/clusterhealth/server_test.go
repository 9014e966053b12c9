package clusterhealth

import (
	"context"
	"net"
	"testing"

	"github.com/cellium/cellium/pkg/netlimit"
	"github.com/cellium/cellium/pkg/netlimit/netlimittest"
)

// /hello is reachable from outside the node: it caps the header and the
// connections it serves at once (issue 25: idle connections piled up).
func TestHelloLimits(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- serve(ctx, ln, "test") }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	addr := ln.Addr().String()
	netlimittest.HeaderCapped(t, addr, "/hello", netlimit.Default.MaxHeaderBytes)
	netlimittest.ConnCapped(t, addr, "/hello", netlimit.Default.MaxConns)
}
