package nodes

import (
	"context"
	"log/slog"
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"
)

// The kvstore's keys come in batches. Rows merged before the last one
// (claims.listing) hold no pod CIDR: a key read first must not hold a CIDR
// that an older key of another node, read in a later batch, has the
// stronger claim on. Once listed, the rows' CIDRs are held, and a newcomer
// cannot take one, however old its key says it is.
func TestClaimsHoldNothingWhileListing(t *testing.T) {
	cidr := netip.MustParsePrefix("10.200.1.0/24")
	spec := Spec{Addresses: []Address{{Type: InternalIP, IP: netip.MustParseAddr("192.0.2.1")}}, PodCIDRs: []netip.Prefix{cidr}}
	owner := func(c *claims) string {
		t.Helper()
		var who []string
		for name, n := range c.rows() {
			if len(n.PodCIDRs) == 1 && n.PodCIDRs[0] == cidr {
				who = append(who, name)
			}
		}
		if len(who) != 1 {
			t.Fatalf("%s held by %v, want one node", cidr, who)
		}
		return who[0]
	}

	c := newClaims("local", true)
	// The first batch: the key that sorts first, created later.
	c.setCreated("node-a", 20)
	c.set("node-a", SourceKVStore, spec, true)
	if got := owner(c); got != "node-a" {
		t.Fatalf("first batch: %s held by %s, want node-a, its only claimant", cidr, got)
	}
	// The second batch: an older key with the same CIDR.
	c.setCreated("node-b", 10)
	c.set("node-b", SourceKVStore, spec, true)
	c.listed(func(statedb.WriteTxn) {})
	if got := owner(c); got != "node-b" {
		t.Fatalf("listed: %s held by %s, want node-b, whose key is older (a row of a partial listing held it)", cidr, got)
	}

	// Listed: a newcomer whose key says it is older still cannot take it.
	c.setCreated("node-0", 5)
	c.set("node-0", SourceKVStore, spec, true)
	if got := owner(c); got != "node-b" {
		t.Fatalf("after the listing: %s taken by %s, want it kept by node-b, which held it", cidr, got)
	}
}

// mergeHealth is the cell.Health the merge reports to.
type mergeHealth struct{ cell.Health }

func (mergeHealth) OK(string)              {}
func (mergeHealth) Degraded(string, error) {}

// TestInitializedWithTheRows: a source's initializer, given to the claims
// once the source has given every claim it had at start (the kvstore's
// listing, the Node objects' sync), is marked by the merge in the
// transaction that writes the rows of those claims. No snapshot of the
// table is initialized without them: the routing prunes the routes of
// every node the initialized table lacks, so a restart whose table was
// initialized first removed, and wrote again, the routes to every other
// node.
func TestInitializedWithTheRows(t *testing.T) {
	spec := Spec{Addresses: []Address{{Type: InternalIP, IP: netip.MustParseAddr("192.0.2.31")}}, PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.21.0/24")}}
	for _, tc := range []struct {
		source   Source
		init     string
		complete func(*claims, func(statedb.WriteTxn))
	}{
		{SourceKVStore, initKVStore, (*claims).listed},
		{SourceK8s, initK8s, (*claims).synced},
	} {
		t.Run(tc.init, func(t *testing.T) {
			db := statedb.New()
			tbl, err := NewTable(db)
			if err != nil {
				t.Fatal(err)
			}
			txn := db.WriteTxn(tbl)
			initialized := tbl.RegisterInitializer(txn, tc.init)
			txn.Commit()
			n := &nodes{log: slog.New(slog.DiscardHandler), db: db, tbl: tbl, name: "node-a", claims: newClaims("node-a", true)}
			ctx, cancel := context.WithCancel(context.Background())
			stopped := make(chan struct{})
			go func() { defer close(stopped); n.merge(ctx, mergeHealth{}) }()
			t.Cleanup(func() { cancel(); <-stopped })

			// What the source does at start: its claims, then that it is
			// complete, before the merge has run.
			n.claims.set("node-b", tc.source, spec, true)
			tc.complete(n.claims, initialized)
			for {
				rtxn := db.ReadTxn()
				init, watch := tbl.Initialized(rtxn)
				if init {
					if row, _, found := tbl.Get(rtxn, ByName.Query("node-b")); !found || len(row.PodCIDRs) != 1 {
						t.Fatalf("the table is initialized without node-b's row and pod CIDR (found %v)", found)
					}
					return
				}
				select {
				case <-watch:
				case <-time.After(10 * time.Second):
					t.Fatal("the table is not initialized 10 s after the source said it was complete")
				}
			}
		})
	}
}
