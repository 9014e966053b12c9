package devices_test

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/hivetest"
	"github.com/cilium/statedb"

	"github.com/cellium/cellium/cells/devices"
	"github.com/cellium/cellium/cells/internal/celltest"
)

// agent is a hive of the devices cell watching ns, and its tables.
type agent struct {
	db        *statedb.DB
	devices   statedb.Table[*devices.Device]
	addresses statedb.Table[*devices.NodeAddress]
}

func startAgent(t testing.TB, ns *testNetns, configure func(*devices.Config), extra ...cell.Cell) *agent {
	t.Helper()
	a := &agent{}
	h := celltest.New(append([]cell.Cell{
		devices.Cell,
		cell.Invoke(func(db *statedb.DB, d statedb.Table[*devices.Device], n statedb.Table[*devices.NodeAddress]) {
			a.db, a.devices, a.addresses = db, d, n
		}),
	}, extra...)...)
	hive.AddConfigOverride(h, func(c *devices.Config) {
		c.DevicesNetns = ns.path
		if configure != nil {
			configure(c)
		}
	})
	celltest.Start(t, h)
	return a
}

// waitInitialized waits until both tables are initialized.
func (a *agent) waitInitialized(t testing.TB) {
	t.Helper()
	for _, initialized := range []func(statedb.ReadTxn) (bool, <-chan struct{}){a.devices.Initialized, a.addresses.Initialized} {
		if ok, watch := initialized(a.db.ReadTxn()); !ok {
			select {
			case <-watch:
			case <-time.After(10 * time.Second):
				t.Fatal("tables not initialized after 10s")
			}
		}
	}
}

// waitFor waits until cond holds for the tables, re-checking whenever
// either changes. It fails after 10s, printing what cond last said.
func (a *agent) waitFor(t testing.TB, cond func(statedb.ReadTxn) (bool, string)) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		txn := a.db.ReadTxn()
		_, devWatch := a.devices.AllWatch(txn)
		_, addrWatch := a.addresses.AllWatch(txn)
		ok, why := cond(txn)
		if ok {
			return
		}
		select {
		case <-devWatch:
		case <-addrWatch:
		case <-deadline:
			t.Fatalf("condition not met after 10s: %s", why)
		}
	}
}

// txnCounter counts the write transactions on the node-addresses table. It
// counts them when they begin, so a transaction that closed a watch channel
// has been counted by the time the watcher wakes.
type txnCounter struct {
	statedb.NopMetrics
	txns atomic.Int64
}

func (c *txnCounter) WriteTxnTableAcquisition(_ string, table string, _ time.Duration) {
	if table == devices.NodeAddressesTableName {
		c.txns.Add(1)
	}
}

func (c *txnCounter) cell() cell.Cell {
	return cell.Provide(func() statedb.Metrics { return c })
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestInitialListingIsCompleteWhenInitialized: once the tables are
// initialized, everything that existed at start is in them, written in one
// transaction.
func TestInitialListingIsCompleteWhenInitialized(t *testing.T) {
	ns := newTestNetns(t)
	const pairs = 20
	for i := range pairs {
		name := fmt.Sprintf("eth%d", i)
		must(t, ns.addVeth(name, fmt.Sprintf("peer%d", i)))
		must(t, ns.addAddr(name, fmt.Sprintf("192.168.%d.2/24", i), devices.ScopeGlobal))
		must(t, ns.addAddr(name, fmt.Sprintf("fd00:%d::2/64", i), devices.ScopeGlobal))
		must(t, ns.setUp(name, true))
	}

	var counter txnCounter
	a := startAgent(t, ns, nil, counter.cell())
	a.waitInitialized(t)
	txn := a.db.ReadTxn()
	// One transaction registers the initializers, one writes the listing.
	if n := counter.txns.Load(); n != 2 {
		t.Errorf("%d write transactions until initialized, want 2", n)
	}

	if n := a.devices.NumObjects(txn); n != 1+2*pairs {
		t.Errorf("%d devices, want %d (lo and %d veth pairs)", n, 1+2*pairs, pairs)
	}
	for i := range pairs {
		for _, s := range []string{fmt.Sprintf("192.168.%d.2", i), fmt.Sprintf("fd00:%d::2", i)} {
			addr, _, found := a.addresses.Get(txn, devices.NodeAddressAddr.Query(netip.MustParseAddr(s)))
			if !found {
				t.Errorf("node address %s missing", s)
				continue
			}
			if want := (devices.NodeAddress{Addr: netip.MustParseAddr(s), Device: fmt.Sprintf("eth%d", i), Primary: true}); *addr != want {
				t.Errorf("node address %s = %+v, want %+v", s, *addr, want)
			}
		}
	}
}

// TestNodeAddressesWatch is how the load balancer follows node addresses:
// list with a watch channel, and list again when it closes.
func TestNodeAddressesWatch(t *testing.T) {
	ns := newTestNetns(t)
	must(t, ns.addVeth("eth0", "peer0"))
	must(t, ns.setUp("eth0", true))
	a := startAgent(t, ns, nil)
	a.waitInitialized(t)

	addrs, watch := a.addresses.AllWatch(a.db.ReadTxn())
	if n := len(slices.Collect(statedb.ToSeq(addrs))); n != 0 {
		t.Fatalf("%d node addresses before any was added", n)
	}
	must(t, ns.addAddr("eth0", "192.168.10.2/24", devices.ScopeGlobal))
	select {
	case <-watch:
	case <-time.After(10 * time.Second):
		t.Fatal("watch channel not closed 10s after an address was added")
	}
	got := slices.Collect(statedb.ToSeq(a.addresses.All(a.db.ReadTxn())))
	want := []*devices.NodeAddress{{Addr: netip.MustParseAddr("192.168.10.2"), Device: "eth0", Primary: true}}
	if len(got) != 1 || *got[0] != *want[0] {
		t.Errorf("node addresses = %v, want %v", got, want)
	}
}

// TestUpdatesAgreeWithListing: an agent that followed every update and one
// that starts afterwards and lists the kernel end up with the same rows, down
// to the order of addresses and so the choice of primaries. The agent that
// restarts must not pick other primaries than the one that ran.
func TestUpdatesAgreeWithListing(t *testing.T) {
	ns := newTestNetns(t)
	running := startAgent(t, ns, nil)
	running.waitInitialized(t)

	must(t, ns.addVeth("eth0", "peer0"))
	must(t, ns.addVeth("eth1", "peer1"))
	for _, step := range []func() error{
		func() error { return ns.setUp("eth0", true) },
		func() error { return ns.addAddr("eth0", "192.168.10.2/24", devices.ScopeGlobal) },
		func() error { return ns.addAddr("eth0", "192.168.10.3/24", devices.ScopeGlobal) },
		func() error { return ns.addAddr("eth0", "192.168.10.4/24", devices.ScopeGlobal) },
		func() error { return ns.addAddr("eth0", "10.60.0.2/16", devices.ScopeLink) },
		func() error { return ns.addAddr("eth0", "10.70.0.2/16", devices.ScopeHost) },
		func() error { return ns.addAddr("eth0", "10.50.0.2/16", devices.ScopeGlobal) },
		func() error { return ns.addAddr("eth0", "10.61.0.2/16", devices.ScopeLink) },
		func() error { return ns.addAddr("eth0", "fd00:10::2/64", devices.ScopeGlobal) },
		func() error { return ns.addAddr("eth0", "fe80::2/64", devices.ScopeLink) },
		func() error { return ns.addAddr("eth0", "fd00:10::3/64", devices.ScopeGlobal) },
		func() error { return ns.addAddr("eth0", "fec0::2/64", devices.ScopeGlobal) },
		func() error { return ns.addAddr("eth0", "fd00:11::2/64", devices.ScopeGlobal) },
		// Promotes 192.168.10.3.
		func() error { return ns.delAddr("eth0", "192.168.10.2/24") },
		func() error { return ns.addAddr("eth1", "192.168.11.2/24", devices.ScopeGlobal) },
		func() error { return ns.setUp("eth1", true) },
		func() error { return ns.setUp("eth1", false) },
		func() error { return ns.rename("eth1", "uplink1") },
		func() error { return ns.setUp("uplink1", true) },
		func() error { return ns.delAddr("eth0", "fd00:10::3/64") },
	} {
		must(t, step())
	}

	listed := startAgent(t, ns, nil)
	listed.waitInitialized(t)
	want := rows(listed, listed.db.ReadTxn())
	running.waitFor(t, func(txn statedb.ReadTxn) (bool, string) {
		got := rows(running, txn)
		return got == want, fmt.Sprintf("the running agent has\n%s\nthe listing has\n%s", got, want)
	})
}

// rows prints both tables, one row per line.
func rows(a *agent, txn statedb.ReadTxn) string {
	var b strings.Builder
	for d := range a.devices.All(txn) {
		fmt.Fprintln(&b, strings.Join(d.TableRow(), " "))
	}
	for n := range a.addresses.All(txn) {
		fmt.Fprintln(&b, strings.Join(n.TableRow(), " "))
	}
	return b.String()
}

func TestInvalidDevicesFlag(t *testing.T) {
	for _, tc := range []struct {
		devices []string
		err     string
	}{
		{[]string{"eth["}, `invalid --devices pattern "eth[": syntax error in pattern; want a name or a glob such as eth*`},
		{[]string{"eth0", "", "eth1"}, `invalid --devices "eth0,,eth1": empty device name; want comma-separated names or globs such as eth0,ens*`},
	} {
		h := celltest.New(devices.Cell)
		hive.AddConfigOverride(h, func(c *devices.Config) { c.Devices = tc.devices })
		err := h.Populate(hivetest.Logger(t))
		if err == nil || !strings.Contains(err.Error(), tc.err) {
			t.Errorf("--devices=%s: error %v, want %q", strings.Join(tc.devices, ","), err, tc.err)
		}
	}
}

// BenchmarkAddressUpdates measures how fast added and removed addresses
// reach the node-addresses table, end to end through the kernel, and how
// many updates share a write transaction.
func BenchmarkAddressUpdates(b *testing.B) {
	ns := newTestNetns(b)
	must(b, ns.addVeth("eth0", "peer0"))
	must(b, ns.setUp("eth0", true))
	var counter txnCounter
	a := startAgent(b, ns, nil, counter.cell())
	a.waitInitialized(b)
	const perRound = 256
	start := counter.txns.Load()
	for b.Loop() {
		for i := range perRound {
			must(b, ns.addAddr("eth0", fmt.Sprintf("10.%d.%d.1/32", 100+i/250, i%250), devices.ScopeGlobal))
		}
		a.waitFor(b, func(txn statedb.ReadTxn) (bool, string) {
			n := a.addresses.NumObjects(txn)
			return n == perRound, fmt.Sprintf("%d of %d node addresses", n, perRound)
		})
		for i := range perRound {
			must(b, ns.delAddr("eth0", fmt.Sprintf("10.%d.%d.1/32", 100+i/250, i%250)))
		}
		a.waitFor(b, func(txn statedb.ReadTxn) (bool, string) {
			n := a.addresses.NumObjects(txn)
			return n == 0, fmt.Sprintf("%d node addresses left", n)
		})
	}
	b.ReportMetric(float64(2*perRound*b.N)/b.Elapsed().Seconds(), "updates/s")
	b.ReportMetric(float64(2*perRound*b.N)/float64(counter.txns.Load()-start), "updates/txn")
}
