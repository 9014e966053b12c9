package clusterhealth

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/cilium/statedb"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/cellium/cellium/cells/daemon"
)

func TestInterval(t *testing.T) {
	for _, tc := range []struct {
		nodes int
		want  time.Duration
	}{{1, 10 * time.Second}, {250, 10 * time.Second}, {251, 10040 * time.Millisecond}, {1000, 40 * time.Second}} {
		if got := interval(10*time.Second, tc.nodes); got != tc.want {
			t.Errorf("interval of %d nodes = %s, want %s", tc.nodes, got, tc.want)
		}
	}
}

// The summary counts reachable nodes and names each failed path; a node
// without health endpoint is reachable on its host paths alone.
func TestSummary(t *testing.T) {
	ip := netip.MustParseAddr
	ok := func(a string) Probe { return Probe{Addr: ip(a), OK: true, Latency: time.Millisecond} }
	rows := []*NodeHealth{
		{Node: "a", Local: true, HostICMP: ok("10.0.0.1"), HostHTTP: ok("10.0.0.1"), EndpointHTTP: ok("10.244.1.2")},
		{Node: "b", HostICMP: ok("10.0.0.2"), HostHTTP: ok("10.0.0.2")},
		{Node: "c", HostICMP: ok("10.0.0.3"), HostHTTP: ok("10.0.0.3"), EndpointHTTP: Probe{Addr: ip("10.244.3.2"), Error: "no answer"}},
	}
	got := Summary(rows)
	if want := "Cluster health: 2/3 reachable; unreachable: c (endpoint HTTP: no answer)"; got != want {
		t.Fatalf("Summary = %q, want %q", got, want)
	}
}

// The metrics come from the table at each scrape: a path that answered has
// status 1 and a latency, one that did not status 0, one not probed none.
func TestMetrics(t *testing.T) {
	db := statedb.New()
	tbl, err := newTable(db)
	if err != nil {
		t.Fatal(err)
	}
	txn := db.WriteTxn(tbl)
	tbl.Insert(txn, &NodeHealth{Node: "b", HostICMP: Probe{Addr: netip.MustParseAddr("10.0.0.2"), OK: true, Latency: 2 * time.Millisecond},
		HostHTTP: Probe{Addr: netip.MustParseAddr("10.0.0.2"), Error: "refused"}})
	txn.Commit()
	reg := prometheus.NewRegistry()
	reg.MustRegister(newMetrics(db, tbl, daemon.NodeName("a")).Collectors...)
	want := `
# HELP cellium_node_connectivity_latency_seconds Round trip of the last probe of a path to a node that answered
# TYPE cellium_node_connectivity_latency_seconds gauge
cellium_node_connectivity_latency_seconds{protocol="icmp",source_node="a",target_node="b",type="node"} 0.002
# HELP cellium_node_connectivity_status Whether the last probe of a path to a node answered (1) or not (0); type node or endpoint, protocol icmp or http
# TYPE cellium_node_connectivity_status gauge
cellium_node_connectivity_status{protocol="http",source_node="a",target_node="b",type="node"} 0
cellium_node_connectivity_status{protocol="icmp",source_node="a",target_node="b",type="node"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want)); err != nil {
		t.Fatal(err)
	}
}
