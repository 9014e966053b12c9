package endpointmaps

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"net/netip"

	"github.com/cilium/ebpf"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"

	"github.com/cellium/cellium/cells/bpfmaps"
	"github.com/cellium/cellium/cells/endpointmanager"
	"github.com/cellium/cellium/cells/health"
)

// Cell declares the endpoint map and reconciles the endpoints table into
// it.
var Cell = cell.Module(
	"endpoint-maps",
	"BPF endpoint map reconciled from the endpoints table",

	cell.ProvidePrivate(job.Registry.NewGroup),
	cell.Provide(newEndpointMap, endpointsWritten, mapLive),
	cell.Invoke(registerReconciler),
)

// MapName is the endpoint map's pin name.
const MapName = "cellium_endpoints"

// MaxEntries bounds the map: an address per family for every endpoint ID.
const MaxEntries = 1 << 17

// Address families of EndpointKey.Family.
const (
	FamilyIPv4 = 4
	FamilyIPv6 = 6
)

// EndpointKey is the endpoint map's key: an address of an endpoint.
type EndpointKey struct {
	// Addr holds an IPv4 address in its first four bytes.
	Addr   [16]byte
	Family uint8
	_      [3]byte
}

// KeyOf is the key of addr.
func KeyOf(addr netip.Addr) EndpointKey {
	var k EndpointKey
	if addr.Is4() {
		a := addr.As4()
		copy(k.Addr[:], a[:])
		k.Family = FamilyIPv4
	} else {
		k.Addr = addr.As16()
		k.Family = FamilyIPv6
	}
	return k
}

// IP is the address of the key.
func (k EndpointKey) IP() netip.Addr {
	if k.Family == FamilyIPv4 {
		return netip.AddrFrom4([4]byte(k.Addr[:4]))
	}
	return netip.AddrFrom16(k.Addr)
}

// EndpointInfo is the endpoint map's value.
type EndpointInfo struct {
	// IfIndex is the host-side interface of the endpoint's veth pair.
	IfIndex    uint32
	EndpointID uint16
	_          [2]byte
	// MAC is the pod side's address, HostMAC the host side's.
	MAC     [6]byte
	HostMAC [6]byte
}

// InfoOf is the value for an endpoint.
func InfoOf(ep *endpointmanager.Endpoint) EndpointInfo {
	info := EndpointInfo{IfIndex: uint32(ep.HostIfIndex), EndpointID: ep.ID}
	copy(info.MAC[:], ep.MAC)
	copy(info.HostMAC[:], ep.HostMAC)
	return info
}

// EndpointMap is the pinned endpoint map.
type EndpointMap = bpfmaps.Map[EndpointKey, EndpointInfo]

func newEndpointMap(lc cell.Lifecycle, reg *bpfmaps.Registry) (*EndpointMap, error) {
	return bpfmaps.NewMap[EndpointKey, EndpointInfo](lc, reg, bpfmaps.Spec{
		Name: MapName, Type: ebpf.Hash, MaxEntries: MaxEntries,
	})
}

func registerReconciler(p reconciler.Params, tbl statedb.RWTable[*endpointmanager.Endpoint], m *EndpointMap) error {
	_, err := reconciler.Register(
		p, tbl,
		(*endpointmanager.Endpoint).Clone,
		func(ep *endpointmanager.Endpoint, s reconciler.Status) *endpointmanager.Endpoint {
			ep.MapStatus = s
			return ep
		},
		func(ep *endpointmanager.Endpoint) reconciler.Status { return ep.MapStatus },
		&ops{m: m},
		nil,
	)
	return err
}

// mapLive holds a new endpoint back until it is in the map (see
// endpointmanager.LiveCondition).
func mapLive() endpointmanager.LiveOut {
	return endpointmanager.StatusCondition("endpoint-map", func(ep *endpointmanager.Endpoint) reconciler.Status { return ep.MapStatus })
}

// ops writes endpoints into the map.
type ops struct{ m *EndpointMap }

func (o *ops) Update(_ context.Context, _ statedb.ReadTxn, _ statedb.Revision, ep *endpointmanager.Endpoint) error {
	if !ep.InDatapath() {
		return o.delete(ep)
	}
	info := InfoOf(ep)
	for _, ip := range ep.IPs() {
		if err := o.m.Put(KeyOf(ip), info); err != nil {
			return fmt.Errorf("endpoint %d, %s: %w", ep.ID, ip, err)
		}
	}
	return nil
}

func (o *ops) Delete(_ context.Context, _ statedb.ReadTxn, _ statedb.Revision, ep *endpointmanager.Endpoint) error {
	return o.delete(ep)
}

// delete removes ep's entries, leaving an address that another endpoint
// has taken over since.
func (o *ops) delete(ep *endpointmanager.Endpoint) error {
	for _, ip := range ep.IPs() {
		info, err := o.m.Lookup(KeyOf(ip))
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			continue
		}
		if err != nil {
			return err
		}
		if info.EndpointID != ep.ID {
			continue
		}
		if err := o.m.Delete(KeyOf(ip)); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("endpoint %d, %s: %w", ep.ID, ip, err)
		}
	}
	return nil
}

// Prune removes the entries of addresses that no ready endpoint has.
func (o *ops) Prune(_ context.Context, _ statedb.ReadTxn, eps iter.Seq2[*endpointmanager.Endpoint, statedb.Revision]) error {
	want := map[EndpointKey]bool{}
	for ep := range eps {
		if ep.InDatapath() {
			for _, ip := range ep.IPs() {
				want[KeyOf(ip)] = true
			}
		}
	}
	return o.m.Prune(func(k EndpointKey) bool { return want[k] }, nil)
}

// WrittenBarrier is the readiness barrier that waits until the restored
// endpoints are in the map.
const WrittenBarrier = "endpoint-map-written"

func endpointsWritten(db *statedb.DB, tbl statedb.RWTable[*endpointmanager.Endpoint]) health.WaitOut {
	return health.Reconciled(WrittenBarrier, db, tbl.ToTable(), func(ep *endpointmanager.Endpoint) reconciler.Status { return ep.MapStatus })
}
