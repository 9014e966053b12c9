package metrics_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/cilium/hive"
	"github.com/cilium/hive/hivetest"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/cellium/cellium/cells/health"
	"github.com/cellium/cellium/cells/metrics"
	"github.com/cellium/cellium/pkg/netlimit"
	"github.com/cellium/cellium/pkg/netlimit/netlimittest"
	"github.com/cellium/cellium/pkg/nettest"
)

// With the default configuration the kubelet probes are served on
// 127.0.0.1:9879 only, and /metrics on 127.0.0.1:9962 only, never on the
// probes' port (issue 25). The agent runs in a namespace of the test's, so
// the fixed ports are free, with a second address that it must not serve.
func TestDefaultListeners(t *testing.T) {
	netns := nettest.NewNS(t)
	const other = "192.0.2.1"
	err := netns.Do(func(ns.NetNS) error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		return netlink.AddrAdd(lo, &netlink.Addr{IPNet: netlink.NewIPNet(net.ParseIP(other))})
	})
	if err != nil {
		t.Fatalf("add %s to lo: %v", other, err)
	}

	opts := hive.DefaultOptions()
	opts.ModuleDecorators = health.ModuleDecorators
	h := hive.NewWithOptions(opts, statedb.Cell, job.Cell, health.Cell, metrics.Cell, health.StartedMarker)
	log := hivetest.Logger(t)
	// The start hooks open the listeners, in the namespace of the thread.
	if err := netns.Do(func(ns.NetNS) error { return h.Start(log, context.Background()) }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Stop(log, context.Background()) })

	// get returns the status of GET path on addr, or the dial's error.
	get := func(addr, path string) (status int, err error) {
		err = netns.Do(func(ns.NetNS) error {
			conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
			if err != nil {
				return err
			}
			defer conn.Close()
			conn.SetDeadline(time.Now().Add(10 * time.Second))
			fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n", path)
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			if err != nil {
				return err
			}
			io.Copy(io.Discard, resp.Body)
			status = resp.StatusCode
			return nil
		})
		return status, err
	}
	for _, tc := range []struct {
		addr, path string
		want       int // 0: connection refused
	}{
		{"127.0.0.1:9879", "/healthz", http.StatusOK},
		{"127.0.0.1:9879", "/metrics", http.StatusNotFound},
		{"127.0.0.1:9962", "/metrics", http.StatusOK},
		{other + ":9879", "/healthz", 0},
		{other + ":9962", "/metrics", 0},
	} {
		status, err := get(tc.addr, tc.path)
		switch {
		case tc.want == 0 && err == nil:
			t.Errorf("GET %s%s = %d, want connection refused", tc.addr, tc.path, status)
		case tc.want != 0 && err != nil:
			t.Errorf("GET %s%s: %v, want %d", tc.addr, tc.path, err, tc.want)
		case tc.want != 0 && status != tc.want:
			t.Errorf("GET %s%s = %d, want %d", tc.addr, tc.path, status, tc.want)
		}
	}
}

// /metrics may be bound to a node address (the DaemonSet does): it caps the
// header and the connections it serves at once.
func TestMetricsServerLimits(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	opts := hive.DefaultOptions()
	opts.ModuleDecorators = health.ModuleDecorators
	h := hive.NewWithOptions(opts, statedb.Cell, job.Cell, health.Cell, metrics.Cell, health.StartedMarker)
	hive.AddConfigOverride(h, func(c *health.Config) { c.HealthAddr = "" })
	hive.AddConfigOverride(h, func(c *metrics.Config) { c.MetricsAddr = addr })
	log := hivetest.Logger(t)
	if err := h.Start(log, context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Stop(log, context.Background()) })
	netlimittest.HeaderCapped(t, addr, "/metrics", netlimit.Default.MaxHeaderBytes)
	netlimittest.ConnCapped(t, addr, "/metrics", netlimit.Default.MaxConns)
}
