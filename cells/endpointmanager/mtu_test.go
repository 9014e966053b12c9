package endpointmanager

import (
	"net/netip"
	"testing"

	"github.com/cilium/statedb"

	"github.com/cellium/cellium/cells/devices"
)

// The automatic MTU is the lowest MTU of the devices holding node
// addresses, less the tunnel's overhead in tunnel mode (over IPv6 when the
// node has IPv6 addresses only); --endpoint-mtu overrides it.
func TestAutomaticMTU(t *testing.T) {
	db := statedb.New()
	devs, err := statedb.NewTable(db, devices.DevicesTableName, devices.DeviceIfIndex, devices.DeviceName)
	if err != nil {
		t.Fatal(err)
	}
	addrs, err := statedb.NewTable(db, devices.NodeAddressesTableName, devices.NodeAddressAddr)
	if err != nil {
		t.Fatal(err)
	}
	m := &Manager{db: db}
	tunnel, native := TunnelOverhead{IPv4: 50, IPv6: 70}, TunnelOverhead{}
	if got := m.mtu(0, tunnel, devs, addrs); got != 1450 {
		t.Errorf("tunnel, no node address: %d, want 1450", got)
	}
	txn := db.WriteTxn(devs, addrs)
	devs.Insert(txn, &devices.Device{Index: 2, Name: "eth0", MTU: 9000})
	devs.Insert(txn, &devices.Device{Index: 3, Name: "eth1", MTU: 1500})
	devs.Insert(txn, &devices.Device{Index: 4, Name: "eth2", MTU: 1200})
	addrs.Insert(txn, &devices.NodeAddress{Addr: netip.MustParseAddr("fd00::1"), Device: "eth0"})
	txn.Commit()
	for _, tc := range []struct {
		name       string
		configured int
		cfg        TunnelOverhead
		want       int
	}{
		{"tunnel over IPv6 only", 0, tunnel, 9000 - 70},
		{"native", 0, native, 9000},
		{"configured", 1400, tunnel, 1400},
	} {
		if got := m.mtu(tc.configured, tc.cfg, devs, addrs); got != tc.want {
			t.Errorf("%s: %d, want %d", tc.name, got, tc.want)
		}
	}
	txn = db.WriteTxn(addrs)
	addrs.Insert(txn, &devices.NodeAddress{Addr: netip.MustParseAddr("192.0.2.1"), Device: "eth1"})
	txn.Commit()
	if got := m.mtu(0, tunnel, devs, addrs); got != 1450 {
		t.Errorf("tunnel, the lowest node-address device at 1500: %d, want 1450", got)
	}
}
