package clusterhealth

import (
	"context"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/hivetest"

	"github.com/cellium/cellium/pkg/netlimit"
	"github.com/cellium/cellium/pkg/netlimit/netlimittest"
)

// /hello is reachable from outside the node: it caps the header and the
// connections it serves at once (issue 25: idle connections piled up).
func TestHelloLimits(t *testing.T) {
	ln := serveT(t, "test")
	addr := ln.Addr().String()
	netlimittest.HeaderCapped(t, addr, "/hello", netlimit.Default.MaxHeaderBytes)
	netlimittest.ConnCapped(t, addr, "/hello", netlimit.Default.MaxConns)
}

// /hello answers GET with the node's name and nothing else; a port
// another listener holds is an error naming the flag.
func TestHelloAnswers(t *testing.T) {
	ln := serveT(t, "node a")
	ctx := t.Context()
	base := "http://" + ln.Addr().String()
	for _, tc := range []struct {
		method, path string
		status       int
		body         string
	}{
		{http.MethodGet, "/hello", http.StatusOK, "cellium node a\n"},
		{http.MethodPost, "/hello", http.StatusMethodNotAllowed, ""},
		{http.MethodGet, "/", http.StatusNotFound, ""},
	} {
		req, _ := http.NewRequestWithContext(ctx, tc.method, base+tc.path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.status || tc.body != "" && string(body) != tc.body {
			t.Errorf("%s %s = %d %q, want %d %q", tc.method, tc.path, resp.StatusCode, body, tc.status, tc.body)
		}
	}

	port := uint16(ln.Addr().(*net.TCPAddr).Port)
	h := &recordingHealth{}
	err := serveNode(ctx, h, hivetest.Logger(t), port, "a")
	if err == nil || !strings.Contains(err.Error(), "--cluster-health-port "+strconv.Itoa(int(port))) {
		t.Fatalf("serveNode on a taken port = %v, want an error naming --cluster-health-port", err)
	}
	if h.degraded == "" {
		t.Fatal("serveNode on a taken port did not report Degraded")
	}
}

// recordingHealth is a cell.Health that keeps the last Degraded reason.
type recordingHealth struct {
	cell.Health
	degraded string
}

func (h *recordingHealth) Degraded(reason string, err error) {
	h.degraded = reason + ": " + err.Error()
}

// serveT serves /hello as what on a loopback listener until the test
// ends, and fails it should serve end with an error.
func serveT(t *testing.T, what string) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- serve(ctx, ln, what) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	return ln
}
