package loadbalancer_test

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/cilium/hive/script"
	"github.com/cilium/hive/script/scripttest"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"
	"github.com/spf13/pflag"

	"github.com/cellium/cellium/cells/daemon"
	"github.com/cellium/cellium/cells/devices"
	"github.com/cellium/cellium/cells/internal/celltest"
	"github.com/cellium/cellium/cells/k8sclient/k8sclienttest"
	"github.com/cellium/cellium/cells/loadbalancer"
)

func TestScript(t *testing.T) {
	scripttest.Test(t, context.Background(), newEngine, nil, "testdata/*.txtar")
}

// nodeName is the name of the node the scripts' agent runs on.
const nodeName = "node-1"

// testAgent is the loadbalancer cell over a fake clientset, a
// node-addresses table the test fills, and a stand-in for the lb-maps
// reconciler that marks frontends Done and counts its writes.
type testAgent struct {
	hive      *hive.Hive
	k8s       *fakeK8s
	lbMaps    *fakeLBMaps
	nodeAddrs *nodeAddresses
	db        *statedb.DB
	frontends statedb.Table[*loadbalancer.Frontend]
	health    *loadbalancer.BackendHealth
}

func newTestAgent(t testing.TB, extra ...cell.Cell) *testAgent {
	a := &testAgent{k8s: newFakeK8s(t), lbMaps: &fakeLBMaps{writes: map[string]int{}}}
	a.hive = celltest.New(append([]cell.Cell{
		loadbalancer.Cell,
		k8sclienttest.Cell(),
		cell.Invoke(a.k8s.attach),
		cell.Provide(func() daemon.NodeName { return nodeName }),
		cell.Module("test-devices", "Node addresses the test inserts",
			cell.Config(nodeAddressesConfig{NodeAddressesInitialized: true}),
			cell.Provide(func(cfg nodeAddressesConfig, db *statedb.DB) (statedb.Table[*devices.NodeAddress], error) {
				var err error
				a.nodeAddrs, err = newNodeAddresses(cfg, db)
				if err != nil {
					return nil, err
				}
				return a.nodeAddrs.tbl, nil
			}),
		),
		cell.Invoke(func(db *statedb.DB, fes statedb.Table[*loadbalancer.Frontend], bh *loadbalancer.BackendHealth) {
			a.db, a.frontends, a.health = db, fes, bh
		}),
		cell.Module("test-lb-maps", "Stand-in for the lb-maps reconciler",
			cell.ProvidePrivate(job.Registry.NewGroup),
			cell.Invoke(a.lbMaps.register),
		),
	}, extra...)...)
	return a
}

// newEngine runs a script against a testAgent: the script feeds the fake
// clientset with k8s/add, k8s/update and k8s/delete, fills node-addresses
// with db/insert, and reads the stand-in reconciler's writes with
// lb-maps/writes.
func newEngine(t testing.TB, args []string) *script.Engine {
	a := newTestAgent(t)
	cmds := a.k8s.commands()
	cmds["lb-maps/writes"] = a.lbMaps.writesCmd()
	cmds["node-addresses/initialize"] = script.Command(
		script.CmdUsage{Summary: "Mark the node-addresses table initialized, as the devices cell does after its first dump"},
		func(*script.State, ...string) (script.WaitFunc, error) {
			if a.nodeAddrs == nil {
				return nil, errors.New("hive not started")
			}
			a.nodeAddrs.initialize()
			return nil, nil
		})
	cmds["db/pending-initializers"] = pendingInitializersCmd(&a.db)
	cmds["lb/quarantine"] = quarantineCmd(&a.health, true)
	cmds["lb/unquarantine"] = quarantineCmd(&a.health, false)
	return celltest.ScriptEngine(t, a.hive, args, cmds)
}

// nodeAddressesConfig lets a script hold the node-addresses table
// uninitialized (#! --node-addresses-initialized=false).
type nodeAddressesConfig struct {
	NodeAddressesInitialized bool
}

func (def nodeAddressesConfig) Flags(flags *pflag.FlagSet) {
	flags.Bool("node-addresses-initialized", def.NodeAddressesInitialized, "Start with the node-addresses table initialized")
}

type nodeAddresses struct {
	db   *statedb.DB
	tbl  statedb.RWTable[*devices.NodeAddress]
	done func(statedb.WriteTxn)
}

func newNodeAddresses(cfg nodeAddressesConfig, db *statedb.DB) (*nodeAddresses, error) {
	tbl, err := statedb.NewTable(db, devices.NodeAddressesTableName, devices.NodeAddressAddr)
	if err != nil {
		return nil, err
	}
	n := &nodeAddresses{db: db, tbl: tbl}
	if !cfg.NodeAddressesInitialized {
		txn := db.WriteTxn(tbl)
		n.done = tbl.RegisterInitializer(txn, "test-devices")
		txn.Commit()
	}
	return n, nil
}

func (n *nodeAddresses) initialize() {
	if n.done == nil {
		return
	}
	txn := n.db.WriteTxn(n.tbl)
	n.done(txn)
	txn.Commit()
}

// fakeLBMaps reconciles frontends into nothing, counting the writes per
// frontend: a frontend written again without a change is what the
// loadbalancer cell must avoid.
type fakeLBMaps struct {
	mu     sync.Mutex
	writes map[string]int
}

func (m *fakeLBMaps) register(p reconciler.Params, tbl statedb.RWTable[*loadbalancer.Frontend]) error {
	_, err := reconciler.Register(p, tbl,
		(*loadbalancer.Frontend).Clone, (*loadbalancer.Frontend).SetStatus, (*loadbalancer.Frontend).GetStatus,
		m, nil)
	return err
}

func (m *fakeLBMaps) Update(_ context.Context, _ statedb.ReadTxn, _ statedb.Revision, fe *loadbalancer.Frontend) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.writes[fe.Address.String()]++
	return nil
}

func (m *fakeLBMaps) Delete(context.Context, statedb.ReadTxn, statedb.Revision, *loadbalancer.Frontend) error {
	return nil
}

func (m *fakeLBMaps) Prune(context.Context, statedb.ReadTxn, iter.Seq2[*loadbalancer.Frontend, statedb.Revision]) error {
	return nil
}

func (m *fakeLBMaps) writesCmd() script.Cmd {
	return script.Command(
		script.CmdUsage{Summary: "Print how often the stand-in lb-maps reconciler wrote each frontend"},
		func(*script.State, ...string) (script.WaitFunc, error) {
			m.mu.Lock()
			defer m.mu.Unlock()
			var b strings.Builder
			for _, addr := range slices.Sorted(maps.Keys(m.writes)) {
				fmt.Fprintf(&b, "%s %d\n", addr, m.writes[addr])
			}
			out := b.String()
			return func(*script.State) (string, string, error) { return out, "", nil }, nil
		})
}

func pendingInitializersCmd(db **statedb.DB) script.Cmd {
	return script.Command(
		script.CmdUsage{Summary: "Print the initializers a table still waits for, without waiting", Args: "table"},
		func(s *script.State, args ...string) (script.WaitFunc, error) {
			if len(args) != 1 {
				return nil, errors.New("want a table name")
			}
			if *db == nil {
				return nil, errors.New("hive not started")
			}
			txn := (*db).ReadTxn()
			tbl := (*db).GetTable(txn, args[0])
			if tbl == nil {
				return nil, fmt.Errorf("no table %q", args[0])
			}
			out := "initialized\n"
			if pending := tbl.PendingInitializers(txn); len(pending) > 0 {
				out = strings.Join(pending, " ") + "\n"
			}
			return func(*script.State) (string, string, error) { return out, "", nil }, nil
		})
}

func quarantineCmd(bh **loadbalancer.BackendHealth, quarantine bool) script.Cmd {
	return script.Command(
		script.CmdUsage{Summary: "Take a backend out of service or put it back, as a health checker would", Args: "address"},
		func(s *script.State, args ...string) (script.WaitFunc, error) {
			if len(args) != 1 {
				return nil, errors.New("want a backend address such as 10.244.1.1:8080/TCP")
			}
			if *bh == nil {
				return nil, errors.New("hive not started")
			}
			addr, err := loadbalancer.ParseL3n4Addr(args[0])
			if err != nil {
				return nil, err
			}
			if quarantine {
				err = (*bh).Quarantine(addr)
			} else {
				err = (*bh).Unquarantine(addr)
			}
			return func(*script.State) (string, string, error) {
				if err != nil {
					return "", err.Error() + "\n", err
				}
				return "", "", nil
			}, nil
		})
}
