package masquerade_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/hivetest"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"
	"github.com/google/nftables"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"

	"github.com/cellium/cellium/cells/devices"
	"github.com/cellium/cellium/cells/internal/celltest"
	"github.com/cellium/cellium/cells/internal/logtest"
	"github.com/cellium/cellium/cells/masquerade"
	"github.com/cellium/cellium/cells/masquerade/masqtest"
	"github.com/cellium/cellium/cells/metrics"
	"github.com/cellium/cellium/cells/nodes"
	"github.com/cellium/cellium/pkg/nettest"
	"github.com/cellium/cellium/pkg/polltest"
)

// agent is the masquerade cell, with a nodes table the test writes,
// pointed at a namespace of the test's own.
type agent struct {
	h       *hive.Hive
	db      *statedb.DB
	nodes   statedb.RWTable[*nodes.Node]
	masq    statedb.Table[*masquerade.Prefix]
	metrics *prometheus.Registry
	logs    *logtest.Recorder
}

func newAgent(t *testing.T, nsPath string, seed []*nodes.Node, cfg func(*masquerade.Config)) *agent {
	a := &agent{logs: logtest.NewRecorder(hivetest.Logger(t).Handler())}
	a.h = celltest.New(
		cell.Config(devices.Config{}),
		cell.Provide(nodes.NewTable, statedb.RWTable[*nodes.Node].ToTable),
		metrics.Cell,
		masquerade.Cell,
		cell.Invoke(func(db *statedb.DB, n statedb.RWTable[*nodes.Node], m statedb.Table[*masquerade.Prefix], reg *prometheus.Registry) {
			a.db, a.nodes, a.masq, a.metrics = db, n, m, reg
		}),
	)
	hive.AddConfigOverride(a.h, func(c *devices.Config) { c.DevicesNetns = nsPath })
	if cfg != nil {
		hive.AddConfigOverride(a.h, cfg)
	}
	if err := a.h.Populate(slog.New(a.logs)); err != nil {
		t.Fatal(err)
	}
	a.setNodes(seed...)
	return a
}

func (a *agent) start(t *testing.T) {
	t.Helper()
	if err := a.h.Start(slog.New(a.logs), context.Background()); err != nil {
		t.Fatalf("start: %v", err)
	}
}

func (a *agent) stop(t *testing.T) {
	t.Helper()
	if err := a.h.Stop(hivetest.Logger(t), context.Background()); err != nil {
		t.Fatalf("stop: %v", err)
	}
}

func (a *agent) setNodes(ns ...*nodes.Node) {
	txn := a.db.WriteTxn(a.nodes)
	a.nodes.DeleteAll(txn)
	for _, n := range ns {
		a.nodes.Insert(txn, n)
	}
	txn.Commit()
}

// reconciled waits until the masquerade table is initialized and every
// row is in the kernel, and returns the rows.
func (a *agent) reconciled(t *testing.T) []*masquerade.Prefix {
	t.Helper()
	var rows []*masquerade.Prefix
	celltest.Eventually(t, "the masquerade rows reconciled", func() (bool, string) {
		txn := a.db.ReadTxn()
		if init, _ := a.masq.Initialized(txn); !init {
			return false, "table not initialized"
		}
		rows = statedb.Collect(a.masq.All(txn))
		for _, r := range rows {
			if r.Status.Kind != reconciler.StatusKindDone {
				return false, fmt.Sprintf("%+v", r)
			}
		}
		return true, ""
	})
	return rows
}

func node(name string, local bool, ip string, cidrs ...string) *nodes.Node {
	n := &nodes.Node{Name: name, Local: local}
	n.Addresses = []nodes.Address{{Type: nodes.InternalIP, IP: netip.MustParseAddr(ip)}}
	for _, c := range cidrs {
		n.PodCIDRs = append(n.PodCIDRs, netip.MustParsePrefix(c))
	}
	return n
}

// ruleset reads the agent's table in the namespace as text: the sets'
// ranges and the rules' tags.
func ruleset(t *testing.T, ns int) string {
	t.Helper()
	got, err := readRuleset(ns)
	// The library does not always wrap the errno.
	if err != nil && (errors.Is(err, unix.ENOENT) || strings.Contains(err.Error(), unix.ENOENT.Error())) {
		return "no table" // removed while it was read
	}
	if err != nil {
		t.Fatal(err)
	}
	return got
}

func readRuleset(ns int) (string, error) {
	c, err := nftables.New(nftables.WithNetNSFd(ns))
	if err != nil {
		return "", err
	}
	tables, err := c.ListTablesOfFamily(nftables.TableFamilyINet)
	if err != nil {
		return "", err
	}
	if !slices.ContainsFunc(tables, func(x *nftables.Table) bool { return x.Name == masquerade.TableName }) {
		return "no table", nil
	}
	tbl := &nftables.Table{Name: masquerade.TableName, Family: nftables.TableFamilyINet}
	var out []string
	sets, err := c.GetSets(tbl)
	if err != nil {
		return "", err
	}
	for _, s := range sets {
		els, err := c.GetSetElements(s)
		if err != nil {
			return "", err
		}
		var starts, ends []netip.Addr
		for _, e := range els {
			a, _ := netip.AddrFromSlice(e.Key)
			if e.IntervalEnd {
				ends = append(ends, a)
			} else {
				starts = append(starts, a)
			}
		}
		slices.SortFunc(starts, netip.Addr.Compare)
		slices.SortFunc(ends, netip.Addr.Compare)
		out = append(out, fmt.Sprintf("set %s starts %v ends %v", s.Name, starts, ends))
	}
	chain, err := c.ListChain(tbl, masquerade.ChainName)
	if err != nil {
		return "", err
	}
	rules, err := c.GetRules(tbl, chain)
	if err != nil {
		return "", err
	}
	for _, r := range rules {
		out = append(out, "rule "+string(r.UserData))
	}
	slices.Sort(out)
	return strings.Join(out, "\n"), nil
}

// TestCellReconcilesRuleset: the nodes table becomes the sets of the
// agent's nftables table; a node that joins or leaves changes the sets in
// place; a restart writes nothing; --enable-masquerade=false removes the
// table; Remove (agent cleanup) removes it.
func TestCellReconcilesRuleset(t *testing.T) {
	n := nettest.NewNS(t)
	fd := int(n.Fd())
	n1 := node("node-1", true, "10.90.0.11", "10.244.1.0/24", "fd00:10:244:1::/64")
	n2 := node("node-2", false, "10.90.0.12", "10.244.2.0/24", "fd00:10:244:2::/64")
	a := newAgent(t, n.Path(), []*nodes.Node{n1, n2}, func(c *masquerade.Config) {
		c.NativeRoutingCIDR = []string{"192.168.0.0/16"}
	})
	a.start(t)
	rows := a.reconciled(t)
	if len(rows) != 9 {
		t.Errorf("rows: %d, want 2 sources and 7 excluded (4 pod CIDRs, 2 node addresses, 1 native)", len(rows))
	}
	want := strings.Join([]string{
		"rule cellium-masquerade-v4-v1",
		"rule cellium-masquerade-v6-v1",
		"set nomasq4 starts [10.90.0.11 10.244.1.0 192.168.0.0] ends [10.90.0.13 10.244.3.0 192.169.0.0]",
		"set nomasq6 starts [fd00:10:244:1:: fd00:10:244:2::] ends [fd00:10:244:1:: fd00:10:244:3::]",
		"set pods4 starts [10.244.1.0] ends [10.244.2.0]",
		"set pods6 starts [fd00:10:244:1::] ends [fd00:10:244:2::]",
	}, "\n")
	// v6 node addresses: none; the v6 excluded set holds the two pod /64s,
	// which touch and merge into one range.
	want = strings.Replace(want, "starts [fd00:10:244:1:: fd00:10:244:2::] ends [fd00:10:244:1:: fd00:10:244:3::]",
		"starts [fd00:10:244:1::] ends [fd00:10:244:3::]", 1)
	if got := ruleset(t, fd); got != want {
		t.Fatalf("ruleset:\n%s\nwant:\n%s", got, want)
	}

	t.Run("a node joins and leaves", func(t *testing.T) {
		n3 := node("node-3", false, "10.90.0.20", "10.244.7.0/24")
		a.setNodes(n1, n2, n3)
		celltest.Eventually(t, "node-3 in the excluded set", func() (bool, string) {
			got := ruleset(t, fd)
			return strings.Contains(got, "set nomasq4 starts [10.90.0.11 10.90.0.20 10.244.1.0 10.244.7.0 192.168.0.0] ends [10.90.0.13 10.90.0.21 10.244.3.0 10.244.8.0 192.169.0.0]"), got
		})
		a.setNodes(n1, n2)
		celltest.Eventually(t, "node-3 gone from the sets", func() (bool, string) { got := ruleset(t, fd); return got == want, got })
	})

	t.Run("a restart writes nothing", func(t *testing.T) {
		a.stop(t)
		if got := ruleset(t, fd); got != want {
			t.Fatalf("the table changed when the agent stopped:\n%s", got)
		}
		changes := masqtest.WatchNFT(t, fd)
		b := newAgent(t, n.Path(), []*nodes.Node{n1, n2}, func(c *masquerade.Config) {
			c.NativeRoutingCIDR = []string{"192.168.0.0/16"}
		})
		b.start(t)
		b.reconciled(t)
		if got := changes(); len(got) > 0 {
			t.Errorf("nftables changes while the agent restarted: %v", got)
		}
		b.stop(t)
	})

	t.Run("a stray rule is pruned", func(t *testing.T) {
		c, _ := nftables.New(nftables.WithNetNSFd(fd))
		tbl := &nftables.Table{Name: masquerade.TableName, Family: nftables.TableFamilyINet}
		c.AddChain(&nftables.Chain{Name: "stray", Table: tbl})
		if err := c.Flush(); err != nil {
			t.Fatal(err)
		}
		b := newAgent(t, n.Path(), []*nodes.Node{n1, n2}, func(c *masquerade.Config) {
			c.NativeRoutingCIDR = []string{"192.168.0.0/16"}
		})
		b.start(t)
		b.reconciled(t)
		celltest.Eventually(t, "the stray chain removed", func() (bool, string) { got := ruleset(t, fd); return got == want, got })
		b.stop(t)
	})

	t.Run("no pod CIDR keeps the table with empty sources", func(t *testing.T) {
		bare := node("node-1", true, "10.90.0.11")
		b := newAgent(t, n.Path(), []*nodes.Node{bare, n2}, nil)
		b.start(t)
		celltest.Eventually(t, "the sources emptied", func() (bool, string) {
			got := ruleset(t, fd)
			return strings.Contains(got, "set pods4 starts [] ends []") && strings.Contains(got, "set pods6 starts [] ends []") &&
				strings.Contains(got, "rule cellium-masquerade-v4-v1"), got
		})
		b.stop(t)
	})

	t.Run("disabled removes the table", func(t *testing.T) {
		b := newAgent(t, n.Path(), []*nodes.Node{n1, n2}, func(c *masquerade.Config) { c.EnableMasquerade = false })
		b.start(t)
		polltest.Until(t, "the table gone with --enable-masquerade=false", 10*time.Second, 10*time.Millisecond, func() (bool, string) {
			rs := ruleset(t, fd)
			return rs == "no table", rs
		})
		b.stop(t)
	})

	t.Run("cleanup removes the table", func(t *testing.T) {
		k := masquerade.NewKernel(fd)
		if _, err := k.Sync(masquerade.Ruleset{Enabled: true, V4: masquerade.Want{Source: []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24")}}}); err != nil {
			t.Fatal(err)
		}
		removed, err := masquerade.Remove(devices.Config{DevicesNetns: n.Path()})
		if err != nil || len(removed) != 1 || ruleset(t, fd) != "no table" {
			t.Fatalf("Remove: %v %v; ruleset now %q", removed, err, ruleset(t, fd))
		}
		if removed, err := masquerade.Remove(devices.Config{DevicesNetns: n.Path()}); err != nil || len(removed) != 0 {
			t.Fatalf("second Remove: %v %v, want nothing", removed, err)
		}
	})
}

func TestBadNativeRoutingCIDR(t *testing.T) {
	h := celltest.New(cell.Config(devices.Config{}), cell.Provide(nodes.NewTable, statedb.RWTable[*nodes.Node].ToTable), masquerade.Cell)
	hive.AddConfigOverride(h, func(c *masquerade.Config) { c.NativeRoutingCIDR = []string{"10.0.0.0/33"} })
	err := h.Populate(hivetest.Logger(t))
	if err == nil || !strings.Contains(err.Error(), `invalid --native-routing-cidr "10.0.0.0/33"`) {
		t.Fatalf("populate with a bad --native-routing-cidr: %v", err)
	}
}
