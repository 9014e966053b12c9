package clusterhealth

import (
	"net"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cilium/hive/hivetest"
	"github.com/cilium/statedb"

	"github.com/cellium/cellium/cells/nodes"
	"github.com/cellium/cellium/pkg/icmpprobe"
	"github.com/cellium/cellium/pkg/nettest"
)

// A round probes each node's address (ICMP, HTTP) and health endpoint
// (HTTP), on loopback: a path that answers is OK with a latency, one
// refused or silent fails within its share of the interval, naming why;
// the table holds one row per node, and a node that left loses its row.
func TestProberRound(t *testing.T) {
	nettest.RequireRoot(t) // ICMP probes use a raw socket
	ctx := t.Context()
	hello, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go serve(ctx, hello, "node a")
	port := uint16(hello.Addr().(*net.TCPAddr).Port)
	// An endpoint that takes the connection and never answers.
	silent, err := net.Listen("tcp", netip.AddrPortFrom(netip.MustParseAddr("127.0.0.3"), port).String())
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	go func() {
		for {
			c, err := silent.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()

	db := statedb.New()
	tbl, err := newTable(db)
	if err != nil {
		t.Fatal(err)
	}
	nodeTbl, err := nodes.NewTable(db)
	if err != nil {
		t.Fatal(err)
	}
	node := func(name string, local bool, endpoint string) *nodes.Node {
		n := &nodes.Node{Name: name, Local: local}
		n.Addresses = []nodes.Address{{Type: nodes.InternalIP, IP: netip.MustParseAddr("127.0.0.1")}}
		n.HealthIPs = []netip.Addr{netip.MustParseAddr(endpoint)}
		return n
	}
	txn := db.WriteTxn(nodeTbl)
	nodeTbl.Insert(txn, node("a", true, "127.0.0.1"))
	nodeTbl.Insert(txn, node("refused", false, "127.0.0.2"))
	nodeTbl.Insert(txn, node("silent", false, "127.0.0.3"))
	txn.Commit()

	pinger, err := icmpprobe.New()
	if err != nil {
		t.Fatal(err)
	}
	defer pinger.Close()
	p := &prober{log: hivetest.Logger(t), db: db, tbl: tbl, nodes: nodeTbl, port: port, base: time.Second}
	rows, every := p.roundNow(ctx, pinger)
	if every != time.Second || len(rows) != 3 {
		t.Fatalf("round of %d rows every %s, want 3 every 1s", len(rows), every)
	}
	got := map[string]*NodeHealth{}
	for r := range tbl.All(db.ReadTxn()) {
		got[r.Node] = r
	}
	a := got["a"]
	if a == nil || !a.Local || !a.Reachable() || !a.HostICMP.OK || !a.HostHTTP.OK || !a.EndpointHTTP.OK || a.HostICMP.Latency <= 0 {
		t.Fatalf("node a, every path answering: %+v", a)
	}
	refused := got["refused"]
	if refused == nil || refused.Reachable() || !refused.HostHTTP.OK || refused.EndpointHTTP.OK ||
		!strings.Contains(refused.EndpointHTTP.Error, "refused") || refused.EndpointHTTP.Latency != 0 {
		t.Fatalf("node refused, endpoint refusing: %+v", refused)
	}
	silentRow := got["silent"]
	if silentRow == nil || silentRow.EndpointHTTP.OK || !strings.Contains(silentRow.EndpointHTTP.Error, "no answer") ||
		!strings.Contains(silentRow.EndpointHTTP.Error, "127.0.0.3:"+strconv.Itoa(int(port))) {
		t.Fatalf("node silent, endpoint never answering: %+v", silentRow)
	}

	txn = db.WriteTxn(nodeTbl)
	nodeTbl.Delete(txn, node("silent", false, "127.0.0.3"))
	txn.Commit()
	p.roundNow(ctx, pinger)
	if _, _, found := tbl.Get(db.ReadTxn(), NodeHealthNode.Query("silent")); found {
		t.Fatal("the row of a node that left is still there")
	}
	if n := tbl.NumObjects(db.ReadTxn()); n != 2 {
		t.Fatalf("%d rows after a node left, want 2", n)
	}
}
