package routing

import (
	"net"
	"net/netip"
	"strings"

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/index"
	"github.com/cilium/statedb/reconciler"

	"github.com/cellium/cellium/cells/internal/tables"
)

// Route is one row of the table "routes": a route to a remote node's pod
// CIDR. Rows are immutable.
type Route struct {
	Prefix netip.Prefix `json:"prefix"`
	// Gateway is the next hop: the remote node's address (native), or the
	// address standing for its VTEP on the tunnel device (tunnel).
	Gateway netip.Addr `json:"gateway"`
	// Device is the tunnel device, or "" for the one the kernel finds.
	Device string `json:"device,omitempty"`
	// OnLink: the gateway is on Device, whatever its addresses say.
	OnLink bool `json:"onLink,omitempty"`
	// Node is the node the prefix belongs to.
	Node   string            `json:"node"`
	Status reconciler.Status `json:"status"`
}

// Neighbor is one row of the table "neighbors": the MAC address of a
// remote node's VTEP on the tunnel device, for a route's gateway.
type Neighbor struct {
	IP     netip.Addr        `json:"ip"`
	MAC    MAC               `json:"mac"`
	Device string            `json:"device"`
	Node   string            `json:"node"`
	Status reconciler.Status `json:"status"`
}

// FDBEntry is one row of the table "fdb": where the tunnel device sends a
// frame for a remote VTEP's MAC address, the remote node's address.
type FDBEntry struct {
	MAC    MAC               `json:"mac"`
	Dst    netip.Addr        `json:"dst"`
	Device string            `json:"device"`
	Node   string            `json:"node"`
	Status reconciler.Status `json:"status"`
}

// MAC is a link-layer address that reads and writes as aa:bb:cc:dd:ee:ff.
type MAC [6]byte

func (m MAC) String() string { return net.HardwareAddr(m[:]).String() }

func (m MAC) MarshalText() ([]byte, error) { return []byte(m.String()), nil }

func (m *MAC) UnmarshalText(b []byte) error {
	hw, err := net.ParseMAC(string(b))
	if err == nil && len(hw) == 6 {
		copy(m[:], hw)
	}
	return err
}

var (
	_ statedb.TableWritable = &Route{}
	_ statedb.TableWritable = &Neighbor{}
	_ statedb.TableWritable = &FDBEntry{}
)

func (r *Route) TableHeader() []string {
	return []string{"Prefix", "Gateway", "Device", "Node", "Status"}
}

func (r *Route) TableRow() []string {
	dev := r.Device
	if r.OnLink {
		dev += " onlink"
	}
	return []string{r.Prefix.String(), r.Gateway.String(), strings.TrimSpace(dev), r.Node, r.Status.String()}
}

func (n *Neighbor) TableHeader() []string { return []string{"IP", "MAC", "Device", "Node", "Status"} }
func (n *Neighbor) TableRow() []string {
	return []string{n.IP.String(), n.MAC.String(), n.Device, n.Node, n.Status.String()}
}

func (f *FDBEntry) TableHeader() []string { return []string{"MAC", "Dst", "Device", "Node", "Status"} }
func (f *FDBEntry) TableRow() []string {
	return []string{f.MAC.String(), f.Dst.String(), f.Device, f.Node, f.Status.String()}
}

// String is the route as `ip route` shows it.
func (r *Route) String() string {
	s := r.Prefix.String() + " via " + r.Gateway.String()
	if r.Device != "" {
		s += " dev " + r.Device
	}
	if r.OnLink {
		s += " onlink"
	}
	return s
}

// String is the entry as `ip neigh` shows it.
func (n *Neighbor) String() string {
	return n.IP.String() + " lladdr " + n.MAC.String() + " dev " + n.Device
}

// String is the entry as `bridge fdb` shows it.
func (f *FDBEntry) String() string {
	return f.MAC.String() + " dst " + f.Dst.String() + " dev " + f.Device
}

func (r *Route) Clone() *Route       { c := *r; return &c }
func (n *Neighbor) Clone() *Neighbor { c := *n; return &c }
func (f *FDBEntry) Clone() *FDBEntry { c := *f; return &c }

// Table names.
const (
	RoutesTable    = "routes"
	NeighborsTable = "neighbors"
	FDBTable       = "fdb"
)

var (
	// RoutePrefix indexes routes by prefix.
	RoutePrefix = statedb.Index[*Route, netip.Prefix]{
		Name:       "prefix",
		FromObject: func(r *Route) index.KeySet { return index.NewKeySet(index.NetIPPrefix(r.Prefix)) },
		FromKey:    index.NetIPPrefix,
		FromString: index.NetIPPrefixString,
		Unique:     true,
	}
	// NeighborIP indexes neighbors by address.
	NeighborIP = statedb.Index[*Neighbor, netip.Addr]{
		Name:       "ip",
		FromObject: func(n *Neighbor) index.KeySet { return index.NewKeySet(index.NetIPAddr(n.IP)) },
		FromKey:    index.NetIPAddr,
		FromString: index.NetIPAddrString,
		Unique:     true,
	}
	// FDBMAC indexes FDB entries by MAC address.
	FDBMAC = statedb.Index[*FDBEntry, MAC]{
		Name:       "mac",
		FromObject: func(f *FDBEntry) index.KeySet { return index.NewKeySet(index.Key(f.MAC[:])) },
		FromKey:    func(m MAC) index.Key { return index.Key(m[:]) },
		FromString: func(s string) (index.Key, error) {
			hw, err := net.ParseMAC(s)
			return index.Key(hw), err
		},
		Unique: true,
	}
)

func newTables(db *statedb.DB) (statedb.RWTable[*Route], statedb.RWTable[*Neighbor], statedb.RWTable[*FDBEntry], error) {
	routes, err := statedb.NewTable(db, RoutesTable, RoutePrefix, tables.StatusIndex((*Route).status))
	if err != nil {
		return nil, nil, nil, err
	}
	neighbors, err := statedb.NewTable(db, NeighborsTable, NeighborIP, tables.StatusIndex((*Neighbor).status))
	if err != nil {
		return nil, nil, nil, err
	}
	fdb, err := statedb.NewTable(db, FDBTable, FDBMAC, tables.StatusIndex((*FDBEntry).status))
	return routes, neighbors, fdb, err
}

func (r *Route) status() reconciler.Status    { return r.Status }
func (n *Neighbor) status() reconciler.Status { return n.Status }
func (f *FDBEntry) status() reconciler.Status { return f.Status }

// withStatus set the status of a row that is not in a table (a clone).
func (r *Route) withStatus(s reconciler.Status) *Route       { r.Status = s; return r }
func (n *Neighbor) withStatus(s reconciler.Status) *Neighbor { n.Status = s; return n }
func (f *FDBEntry) withStatus(s reconciler.Status) *FDBEntry { f.Status = s; return f }
