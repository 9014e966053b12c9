package clusterhealth

import (
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/cellium/cellium/pkg/netnsrun"
	"github.com/cellium/cellium/pkg/nettest"
)

// The health endpoint's namespace is made once and kept (a restart finds
// it); a plain file in its place (the bind mount gone with a reboot) is
// replaced by a new namespace; /hello served there answers from inside it
// and is not on the host's loopback.
func TestEndpointNetns(t *testing.T) {
	nettest.RequireRoot(t)
	path := filepath.Join(t.TempDir(), healthNetns)
	t.Cleanup(func() { netnsrun.Remove(path) })
	for i, want := range []bool{true, false} {
		created, err := ensureNetns(path)
		if err != nil || created != want {
			t.Fatalf("ensureNetns #%d = %v, %v; want created %v", i+1, created, err, want)
		}
	}
	if err := netnsrun.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, nil, 0o444); err != nil {
		t.Fatal(err)
	}
	if created, err := ensureNetns(path); err != nil || !created || !netnsrun.Exists(path) {
		t.Fatalf("ensureNetns over a plain file = %v, %v; want a new namespace", created, err)
	}

	ln, err := listenIn(path, 0)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- serve(ctx, ln, "health endpoint of node a") }()
	defer func() { cancel(); <-done }()
	port := ln.Addr().(*net.TCPAddr).Port
	url := "http://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(port)) + "/hello"

	// The connection is dialled in the namespace; the request and its
	// answer go over it from here.
	conn, err := netnsrun.In(path, func() (net.Conn, error) { return net.Dial("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port))) })
	if err != nil {
		t.Fatalf("dial /hello inside the namespace: %v", err)
	}
	defer conn.Close()
	tr := &http.Transport{DialContext: func(context.Context, string, string) (net.Conn, error) { return conn, nil }}
	resp, err := (&http.Client{Transport: tr}).Get(url)
	var body string
	if err == nil {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		body = string(b)
	}
	if err != nil || body != "cellium health endpoint of node a\n" {
		t.Fatalf("GET /hello inside the namespace = %q, %v", body, err)
	}
	if c, err := net.Dial("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port))); err == nil {
		c.Close()
		// Another listener of the host may hold the port by chance: only
		// an answer of ours would be wrong.
		if resp, err := http.Get(url); err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if string(b) == body {
				t.Fatal("the health endpoint's /hello answers on the host's loopback")
			}
		}
	}
}
