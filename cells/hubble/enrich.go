package hubble

import (
	"maps"
	"net/netip"
	"slices"

	"github.com/cilium/cilium/api/v1/flow"
	"github.com/cilium/statedb"

	"github.com/cellium/cellium/cells/endpointmanager"
	"github.com/cellium/cellium/cells/loadbalancer"
	"github.com/cellium/cellium/pkg/identity"
)

// labelSourceK8s is the source of the endpoints' labels, which all come
// from their pods; labelPodNamespace is the label that carries the pod's
// namespace.
const (
	labelSourceK8s    = "k8s"
	labelPodNamespace = "io.kubernetes.pod.namespace"
)

// enricher looks up what the agent's tables know about a flow's addresses:
// the local endpoint (pod) at an address, the service at an address and
// port. It is used by one goroutine only.
type enricher struct {
	endpoints statedb.Table[*endpointmanager.Endpoint]
	frontends statedb.Table[*loadbalancer.Frontend]
	// known holds each endpoint's flow form, made once per row: rows are
	// immutable, so a new row (a changed endpoint) makes a new one. Flows
	// share these: nothing changes a flow once it is in the ring.
	known map[uint16]knownEndpoint
}

type knownEndpoint struct {
	row *endpointmanager.Endpoint
	pb  *flow.Endpoint
}

func newEnricher(endpoints statedb.Table[*endpointmanager.Endpoint], frontends statedb.Table[*loadbalancer.Frontend]) *enricher {
	return &enricher{endpoints: endpoints, frontends: frontends, known: map[uint16]knownEndpoint{}}
}

// endpointAt is the local endpoint with address addr, or nil.
func (e *enricher) endpointAt(txn statedb.ReadTxn, addr netip.Addr) *flow.Endpoint {
	if !addr.IsValid() {
		return nil
	}
	row, _, found := e.endpoints.Get(txn, endpointmanager.EndpointIP.Query(addr.Unmap()))
	if !found {
		return nil
	}
	return e.endpointPB(row)
}

// peerAt is the flow endpoint at addr: the local endpoint there, or, for
// any other address, the identity the datapath found for it (id, from
// the ipcache), named "reserved:<name>" when it is a reserved one. Nil
// when neither is known.
func (e *enricher) peerAt(txn statedb.ReadTxn, addr netip.Addr, id uint32) *flow.Endpoint {
	if pb := e.endpointAt(txn, addr); pb != nil {
		return pb
	}
	if id == 0 {
		return nil
	}
	pb := &flow.Endpoint{Identity: id}
	if name := identity.NumericIdentity(id).ReservedName(); name != "" {
		pb.Labels = []string{"reserved:" + name}
	}
	return pb
}

// endpointRow is the endpoint with id, or nil.
func (e *enricher) endpointRow(txn statedb.ReadTxn, id uint16) *endpointmanager.Endpoint {
	if id == 0 {
		return nil
	}
	row, _, _ := e.endpoints.Get(txn, endpointmanager.EndpointID.Query(id))
	return row
}

func (e *enricher) endpointPB(row *endpointmanager.Endpoint) *flow.Endpoint {
	if k, ok := e.known[row.ID]; ok && k.row == row {
		return k.pb
	}
	// Labels in Cilium's form, "source:key=value", with the pod's
	// namespace as Cilium adds it, so that label filters written for
	// Cilium's Hubble work here.
	labels := make([]string, 0, len(row.Labels)+1)
	for _, k := range slices.Sorted(maps.Keys(row.Labels)) {
		labels = append(labels, labelSourceK8s+":"+k+"="+row.Labels[k])
	}
	if row.PodNamespace != "" {
		labels = append(labels, labelSourceK8s+":"+labelPodNamespace+"="+row.PodNamespace)
		slices.Sort(labels)
	}
	pb := &flow.Endpoint{
		ID:        uint32(row.ID),
		Identity:  uint32(row.Identity),
		Namespace: row.PodNamespace,
		PodName:   row.PodName,
		Labels:    labels,
	}
	e.known[row.ID] = knownEndpoint{row, pb}
	return pb
}

// serviceAt is the service with a frontend at addr:port/proto, or nil.
func (e *enricher) serviceAt(txn statedb.ReadTxn, addr netip.Addr, port uint16, proto loadbalancer.L4Proto) *flow.Service {
	if !addr.IsValid() || port == 0 || proto == 0 {
		return nil
	}
	fe, _, found := e.frontends.Get(txn, loadbalancer.FrontendByAddress.Query(loadbalancer.L3n4Addr{Addr: addr.Unmap(), Port: port, Protocol: proto}))
	if !found {
		return nil
	}
	return &flow.Service{Name: fe.ServiceName.Name, Namespace: fe.ServiceName.Namespace}
}
