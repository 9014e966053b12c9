package endpointmanager_test

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"
	"github.com/vishvananda/netlink"

	"github.com/cellium/cellium/cells/devices"
	"github.com/cellium/cellium/cells/endpointmanager"
	"github.com/cellium/cellium/cells/health"
	"github.com/cellium/cellium/pkg/nettest"
)

// nodeDevices stands in for the devices cell: the devices and
// node-addresses tables, with a node address on a device of MTU mtu once
// listed. The devices cell lists them in a job of its own, which nothing
// orders before the endpoint restore; list is that first listing, which a
// test may hold back.
type nodeDevices struct {
	mtu   int
	db    *statedb.DB
	devs  statedb.RWTable[*devices.Device]
	addrs statedb.RWTable[*devices.NodeAddress]
	done  []func(statedb.WriteTxn)
}

// cell provides the tables; listed lists them at once.
func (d *nodeDevices) cell(listed bool) cell.Cell {
	return cell.Provide(func(db *statedb.DB) (statedb.Table[*devices.Device], statedb.Table[*devices.NodeAddress], error) {
		devs, err := statedb.NewTable(db, devices.DevicesTableName, devices.DeviceIfIndex, devices.DeviceName)
		if err != nil {
			return nil, nil, err
		}
		addrs, err := statedb.NewTable(db, devices.NodeAddressesTableName, devices.NodeAddressAddr)
		if err != nil {
			return nil, nil, err
		}
		d.db, d.devs, d.addrs = db, devs, addrs
		txn := db.WriteTxn(devs, addrs)
		d.done = []func(statedb.WriteTxn){devs.RegisterInitializer(txn, "netlink-dump"), addrs.RegisterInitializer(txn, "netlink-dump")}
		txn.Commit()
		if listed {
			d.list()
		}
		return devs, addrs, nil
	})
}

// list is the devices' first listing.
func (d *nodeDevices) list() {
	txn := d.db.WriteTxn(d.devs, d.addrs)
	d.devs.Insert(txn, &devices.Device{Index: 1000, Name: "jumbo0", MTU: d.mtu})
	d.addrs.Insert(txn, &devices.NodeAddress{Addr: netip.MustParseAddr("192.0.2.1"), Device: "jumbo0"})
	for _, done := range d.done {
		done(txn)
	}
	txn.Commit()
}

// waitRestoreWaitsForDevices waits until the restore says it waits for
// the devices' listing, failing if it ends instead.
func (n *node) waitRestoreWaitsForDevices(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		txn := n.db.ReadTxn()
		restored, restoredWatch := n.eps.Initialized(txn)
		if restored {
			t.Fatal("the endpoints are restored before the node's devices are listed")
		}
		s, _, watch, _ := n.health.GetWatch(txn, health.StatusID.Query("endpoint-manager.job-restore"))
		if s != nil && strings.Contains(s.Message, "Waiting for the node's devices") {
			return
		}
		select {
		case <-watch:
		case <-restoredWatch:
		case <-ctx.Done():
			t.Fatalf("the restore neither ended nor said it waits for the node's devices: %+v", s)
		}
	}
}

// vethMTU is the MTU of an endpoint's host side and of its pod side.
func vethMTU(t *testing.T, p pod, ep *endpointmanager.Endpoint) (host, pod int) {
	t.Helper()
	l, err := netlink.LinkByName(ep.HostIfName)
	if err != nil {
		t.Fatal(err)
	}
	err = nettest.Do(p.ns.Path(), func() error {
		l, err := netlink.LinkByName(ep.IfName)
		if err == nil {
			pod = l.Attrs().MTU
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return l.Attrs().MTU, pod
}

// A restore that makes a veth pair again waits for the node's devices to
// be listed first: the automatic MTU comes from them, and before their
// first listing it is the 1500 fallback, which the pair made again would
// get (here 9000 before the restart). The intact pair keeps its own. With
// --endpoint-mtu it does not wait, and sets that MTU on every pair.
func TestRestoreWaitsForDevices(t *testing.T) {
	nettest.RequireRoot(t)
	tn := newTestNet(t)
	first := tn.start(t, nodeOpts{extra: []cell.Cell{(&nodeDevices{mtu: 9000}).cell(true)}})
	intact, remade := newPod(t), newPod(t)
	intactEP, remadeEP := first.create(t, intact), first.create(t, remade)
	if host, pod := vethMTU(t, intact, intactEP); host != 9000 || pod != 9000 {
		t.Fatalf("new endpoint's MTU: host %d, pod %d, want 9000 (the node's device)", host, pod)
	}
	first.stop()
	// One pod's veth pair goes while the agent is down: the restore makes
	// it again.
	if l, err := netlink.LinkByName(remadeEP.HostIfName); err != nil || netlink.LinkDel(l) != nil {
		t.Fatalf("delete %s: %v", remadeEP.HostIfName, err)
	}

	devs := &nodeDevices{mtu: 9000}
	second := tn.start(t, nodeOpts{extra: []cell.Cell{devs.cell(false)}})
	second.waitRestoreWaitsForDevices(t)
	devs.list()
	second.waitRestored(t)
	for _, c := range []struct {
		name string
		p    pod
		ep   *endpointmanager.Endpoint
	}{{"intact", intact, intactEP}, {"remade", remade, remadeEP}} {
		if host, pod := vethMTU(t, c.p, c.ep); host != 9000 || pod != 9000 {
			t.Errorf("%s endpoint's MTU after the restore: host %d, pod %d, want 9000 (the node's device)", c.name, host, pod)
		}
	}
	second.stop()

	// With --endpoint-mtu the devices are not waited for.
	third := tn.start(t, nodeOpts{extra: []cell.Cell{(&nodeDevices{mtu: 9000}).cell(false)},
		endpoints: func(c *endpointmanager.Config) { c.EndpointMTU = 1400 }})
	third.waitRestored(t)
	if host, pod := vethMTU(t, intact, intactEP); host != 1400 || pod != 1400 {
		t.Errorf("with --endpoint-mtu 1400 the restored endpoint's MTU: host %d, pod %d", host, pod)
	}
}

// CHECK during the restore waits for it: before, a running pod's endpoint
// is not in the table, and the runtime would be told the container is
// unknown. The restore is held back here by the devices' listing, which
// the veth pair it makes again waits for.
func TestCheckWaitsForRestore(t *testing.T) {
	nettest.RequireRoot(t)
	tn := newTestNet(t)
	first := tn.start(t, nodeOpts{extra: []cell.Cell{(&nodeDevices{mtu: 1500}).cell(true)}})
	p := newPod(t)
	ep := first.create(t, p)
	first.stop()

	devs := &nodeDevices{mtu: 1500}
	// The pod's veth pair goes while the agent is down: the restore makes
	// it again, with the MTU the devices give.
	if l, err := netlink.LinkByName(ep.HostIfName); err != nil || netlink.LinkDel(l) != nil {
		t.Fatalf("delete %s: %v", ep.HostIfName, err)
	}
	second := tn.start(t, nodeOpts{extra: []cell.Cell{devs.cell(false)}})
	second.waitRestoreWaitsForDevices(t)
	// The restore cannot end while the devices are not listed: a CHECK
	// that waits for it gives up at its deadline.
	short, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	sel := endpointmanager.Selector{ContainerID: p.id}
	if _, _, err := second.mgr.Check(short, sel); !errors.Is(err, endpointmanager.ErrNotReady) {
		t.Fatalf("CHECK during the restore = %v, want ErrNotReady once it gave up waiting", err)
	}
	devs.list()
	// Known once restored; its veth pair, made again, is routed after
	// (the problems say it is starting until then).
	got, problems, err := second.mgr.Check(context.Background(), sel)
	if err != nil || got.ID != ep.ID {
		t.Fatalf("CHECK of the restored endpoint = %+v, %v, %v", got, problems, err)
	}
}

// A restore leaves an intact endpoint's MTU as it is when the MTU is
// automatic: here the node's device went from 9000 to 1500 while the agent
// was down; the running pod keeps 9000, a new pod gets 1500. Reading no
// MTU, a restore whose endpoints are all intact does not wait for the
// node's devices: the endpoints, their addresses and the agent's readiness
// do not wait for the devices' first listing.
func TestRestoreKeepsIntactEndpointMTU(t *testing.T) {
	nettest.RequireRoot(t)
	tn := newTestNet(t)
	first := tn.start(t, nodeOpts{extra: []cell.Cell{(&nodeDevices{mtu: 9000}).cell(true)}})
	running := newPod(t)
	runningEP := first.create(t, running)
	first.stop()

	devs := &nodeDevices{mtu: 1500}
	second := tn.start(t, nodeOpts{extra: []cell.Cell{devs.cell(false)}})
	second.waitRestored(t) // the devices not listed yet
	if host, pod := vethMTU(t, running, runningEP); host != 9000 || pod != 9000 {
		t.Errorf("the running pod's MTU after the restore: host %d, pod %d, want 9000 as it was", host, pod)
	}
	devs.list()
	fresh := newPod(t)
	if host, pod := vethMTU(t, fresh, second.create(t, fresh)); host != 1500 || pod != 1500 {
		t.Errorf("a new pod's MTU: host %d, pod %d, want 1500 (the node's device now)", host, pod)
	}
}
