package masquerade_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/google/nftables"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/cellium/cellium/cells/internal/celltest"
	"github.com/cellium/cellium/cells/internal/drift/drifttest"
	"github.com/cellium/cellium/cells/masquerade"
	"github.com/cellium/cellium/cells/masquerade/masqtest"
	"github.com/cellium/cellium/cells/nodes"
	"github.com/cellium/cellium/pkg/nettest"
)

// prunes is how many prunes the nftables reconciler ran.
func prunes(t *testing.T, reg *prometheus.Registry) uint64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != "cellium_reconciler_prune_duration_seconds" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "reconciler" && l.GetValue() == "nftables" {
					return m.GetHistogram().GetSampleCount()
				}
			}
		}
	}
	return 0
}

// TestDrift: what is removed from the agent's nftables table behind its
// back (the table, the rules, a set's elements) is put back without a
// restart, logged and counted; a comparison with a table that is right
// writes nothing.
func TestDrift(t *testing.T) {
	n := nettest.NewNS(t)
	fd := int(n.Fd())
	n1 := node("node-1", true, "10.90.0.11", "10.244.1.0/24", "fd00:10:244:1::/64")
	n2 := node("node-2", false, "10.90.0.12", "10.244.2.0/24", "fd00:10:244:2::/64")
	a := newAgent(t, n.Path(), []*nodes.Node{n1, n2}, nil)
	a.start(t)
	t.Cleanup(func() { a.stop(t) })
	a.reconciled(t)
	want := ruleset(t, fd)
	repairs := func() float64 { return drifttest.Repairs(t, a.metrics, "masquerade", "nft") }
	if got := repairs(); got != 0 {
		t.Fatalf("repairs before any drift: %v", got)
	}

	tbl := &nftables.Table{Name: masquerade.TableName, Family: nftables.TableFamilyINet}
	change := func(what string, fn func(c *nftables.Conn)) {
		t.Helper()
		c, err := nftables.New(nftables.WithNetNSFd(fd))
		if err != nil {
			t.Fatal(err)
		}
		fn(c)
		if err := c.Flush(); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	putBack := func(what string, count float64, log string) {
		t.Helper()
		celltest.Eventually(t, what+" put back", func() (bool, string) {
			got, r := ruleset(t, fd), repairs()
			return got == want && r == count, fmt.Sprintf("%v repairs; ruleset:\n%s", r, got)
		})
		if a.logs.Find("Put back kernel state changed behind the agent's back", "object", "nft", "what", log) == nil {
			t.Errorf("no log line for the repair %q", log)
		}
	}

	// nft delete table inet cellium
	change("delete the table", func(c *nftables.Conn) { c.DelTable(tbl) })
	putBack("the table with its sets and rules", 1, "created table inet cellium")

	// nft flush chain inet cellium postrouting
	change("flush the chain", func(c *nftables.Conn) {
		c.FlushChain(&nftables.Chain{Name: masquerade.ChainName, Table: tbl})
	})
	putBack("the rules", 2, "rules of chain postrouting")

	// nft flush set inet cellium nomasq4
	change("flush a set", func(c *nftables.Conn) {
		c.FlushSet(&nftables.Set{Name: "nomasq4", Table: tbl})
	})
	putBack("the set's elements", 3, "set nomasq4: [10.90.0.11-10.90.0.12 10.244.1.0-10.244.2.255]")

	// No drift: an element added to a set of another table is an update
	// that does not name its table, so the agent compares its own table,
	// which is right: nothing is written.
	other := &nftables.Table{Name: "other", Family: nftables.TableFamilyINet}
	set := &nftables.Set{Table: other, Name: "s", KeyType: nftables.TypeIPAddr}
	change("another table", func(c *nftables.Conn) {
		c.AddTable(other)
		if err := c.AddSet(set, nil); err != nil {
			t.Fatal(err)
		}
	})
	changes := masqtest.WatchNFT(t, fd)
	before := prunes(t, a.metrics)
	change("an element of another table", func(c *nftables.Conn) {
		if err := c.SetAddElements(set, []nftables.SetElement{{Key: []byte{10, 0, 0, 1}}}); err != nil {
			t.Fatal(err)
		}
	})
	celltest.Eventually(t, "a comparison after the other table's change", func() (bool, string) { n := prunes(t, a.metrics); return n > before, fmt.Sprint(n, " comparisons") })
	for _, c := range changes() {
		if !strings.Contains(c, "{Key:[10 0 0 1]") {
			t.Errorf("the agent changed nftables with nothing to put right: %s", c)
		}
	}
	if got := repairs(); got != 3 {
		t.Fatalf("repairs after no drift: %v, want still 3", got)
	}
}
