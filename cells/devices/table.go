package devices

import (
	"net"
	"net/netip"
	"strconv"
	"strings"

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/index"
	"golang.org/x/sys/unix"
)

// Device is one network device of the agent's network namespace, as the
// kernel last reported it.
type Device struct {
	Index int    `json:"index"`
	Name  string `json:"name"`
	// Type is the netlink link kind: veth, bridge, vxlan, macvlan, and
	// "device" for loopback and physical NICs.
	Type         string       `json:"type"`
	HardwareAddr HardwareAddr `json:"hardwareAddr,omitempty"`
	MTU          int          `json:"mtu"`
	// Flags are the interface flags; net.FlagUp is the administrative
	// state that selection looks at.
	Flags net.Flags `json:"flags"`
	// Addrs are in the kernel's order, primary IPv4 addresses before
	// secondary ones.
	Addrs []DeviceAddress `json:"addrs"`
	// Selected devices are those whose addresses are node addresses: see the
	// package documentation.
	Selected bool `json:"selected"`
}

// Up reports whether the device is administratively up.
func (d *Device) Up() bool { return d.Flags&net.FlagUp != 0 }

var (
	_ statedb.TableWritable = &Device{}
	_ statedb.TableWritable = &NodeAddress{}
)

func (d *Device) TableHeader() []string {
	return []string{"Name", "Index", "Type", "MAC", "MTU", "Flags", "Addresses", "Selected"}
}

func (d *Device) TableRow() []string {
	addrs := make([]string, len(d.Addrs))
	for i, a := range d.Addrs {
		addrs[i] = a.String()
	}
	return []string{
		d.Name,
		strconv.Itoa(d.Index),
		d.Type,
		d.HardwareAddr.String(),
		strconv.Itoa(d.MTU),
		d.Flags.String(),
		strings.Join(addrs, ","),
		strconv.FormatBool(d.Selected),
	}
}

// HardwareAddr is a link-layer address that encodes as text
// ("aa:bb:cc:dd:ee:ff"), not as base64 bytes.
type HardwareAddr net.HardwareAddr

func (a HardwareAddr) String() string { return net.HardwareAddr(a).String() }

func (a HardwareAddr) MarshalText() ([]byte, error) { return []byte(a.String()), nil }

// DeviceAddress is an IP address assigned to a device.
type DeviceAddress struct {
	Addr      netip.Addr `json:"addr"`
	PrefixLen int        `json:"prefixLen"`
	Scope     Scope      `json:"scope"`
	// Secondary IPv4 addresses are extra addresses in the subnet of a
	// primary one. IPv6 has no such notion.
	Secondary bool `json:"secondary,omitempty"`
}

// String is the address in CIDR form, marked when secondary.
func (a DeviceAddress) String() string {
	s := netip.PrefixFrom(a.Addr, a.PrefixLen).String()
	if a.Secondary {
		s += "(secondary)"
	}
	return s
}

// isNodeAddress reports whether other hosts can reach the node at a: global
// scope, and not loopback, link-local or multicast.
func (a DeviceAddress) isNodeAddress() bool {
	return a.Scope == ScopeGlobal && a.Addr.IsGlobalUnicast()
}

// Scope is an address's scope as the kernel reports it (RT_SCOPE_*).
type Scope uint8

// The scopes the kernel assigns to addresses.
const (
	ScopeGlobal Scope = unix.RT_SCOPE_UNIVERSE
	ScopeSite   Scope = unix.RT_SCOPE_SITE
	ScopeLink   Scope = unix.RT_SCOPE_LINK
	ScopeHost   Scope = unix.RT_SCOPE_HOST
)

func (s Scope) String() string {
	switch s {
	case ScopeGlobal:
		return "global"
	case ScopeSite:
		return "site"
	case ScopeLink:
		return "link"
	case ScopeHost:
		return "host"
	}
	return strconv.Itoa(int(s))
}

var (
	// DeviceIfIndex indexes the devices table by interface index.
	DeviceIfIndex = statedb.Index[*Device, int]{
		Name:       "ifindex",
		FromObject: func(d *Device) index.KeySet { return index.NewKeySet(index.Int(d.Index)) },
		FromKey:    index.Int,
		FromString: index.IntString,
		Unique:     true,
	}
	// DeviceName indexes the devices table by name. Names are unique in a
	// network namespace, but a rename may briefly hand a name from one
	// device to another, so the index does not insist.
	DeviceName = statedb.Index[*Device, string]{
		Name:       "name",
		FromObject: func(d *Device) index.KeySet { return index.NewKeySet(index.String(d.Name)) },
		FromKey:    index.String,
		FromString: index.FromString,
	}
	// DeviceSelected indexes the devices table by whether a device is
	// selected.
	DeviceSelected = statedb.Index[*Device, bool]{
		Name:       "selected",
		FromObject: func(d *Device) index.KeySet { return index.NewKeySet(index.Bool(d.Selected)) },
		FromKey:    index.Bool,
		FromString: index.BoolString,
	}
)

// DevicesTableName is the name of the devices table.
const DevicesTableName = "devices"

// NodeAddress is an address other hosts can reach this node at: a global
// unicast address of a selected device.
type NodeAddress struct {
	Addr netip.Addr `json:"addr"`
	// Device is the name of the device that holds the address. An address
	// on several selected devices is listed once, for the device with the
	// lowest interface index.
	Device string `json:"device"`
	// Primary is true for the first global address of its family on the
	// device, in the kernel's order.
	Primary bool `json:"primary"`
}

func (a *NodeAddress) TableHeader() []string { return []string{"Address", "Device", "Primary"} }

func (a *NodeAddress) TableRow() []string {
	return []string{a.Addr.String(), a.Device, strconv.FormatBool(a.Primary)}
}

var (
	// NodeAddressAddr indexes the node-addresses table by address.
	NodeAddressAddr = statedb.Index[*NodeAddress, netip.Addr]{
		Name:       "addr",
		FromObject: func(a *NodeAddress) index.KeySet { return index.NewKeySet(index.NetIPAddr(a.Addr)) },
		FromKey:    index.NetIPAddr,
		FromString: index.NetIPAddrString,
		Unique:     true,
	}
	// NodeAddressDevice indexes the node-addresses table by device name.
	NodeAddressDevice = statedb.Index[*NodeAddress, string]{
		Name:       "device",
		FromObject: func(a *NodeAddress) index.KeySet { return index.NewKeySet(index.String(a.Device)) },
		FromKey:    index.String,
		FromString: index.FromString,
	}
)

// NodeAddressesTableName is the name of the node-addresses table.
const NodeAddressesTableName = "node-addresses"

func newDeviceTable(db *statedb.DB) (statedb.RWTable[*Device], error) {
	return statedb.NewTable(db, DevicesTableName, DeviceIfIndex, DeviceName, DeviceSelected)
}

func newNodeAddressTable(db *statedb.DB) (statedb.RWTable[*NodeAddress], error) {
	return statedb.NewTable(db, NodeAddressesTableName, NodeAddressAddr, NodeAddressDevice)
}
