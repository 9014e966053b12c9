package hubble

import (
	"maps"
	"net/netip"
	"slices"
	"strings"

	"github.com/cilium/cilium/api/v1/flow"
	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"

	"github.com/cellium/cellium/cells/endpointmanager"
	idalloc "github.com/cellium/cellium/cells/identity"
	"github.com/cellium/cellium/cells/ipcache"
	"github.com/cellium/cellium/cells/loadbalancer"
	"github.com/cellium/cellium/cells/policy"
	"github.com/cellium/cellium/pkg/identity"
)

// labelSourceK8s is the source of the endpoints' labels, which all come
// from their pods; labelPodNamespace is the label that carries the pod's
// namespace.
const (
	labelSourceK8s    = "k8s"
	labelPodNamespace = "io.kubernetes.pod.namespace"
)

// Tables are the agent's tables a flow is enriched from.
type Tables struct {
	cell.In

	Endpoints  statedb.Table[*endpointmanager.Endpoint]
	Frontends  statedb.Table[*loadbalancer.Frontend]
	IPCache    statedb.Table[*ipcache.Entry]
	Identities statedb.Table[*idalloc.Identity]
	// PolicyEntries name the policies behind a policy verdict's cookie.
	PolicyEntries statedb.Table[*policy.Entry] `optional:"true"`
}

// enricher looks up what the agent's tables know about a flow's addresses:
// the local endpoint (pod) at an address, the pod and identity another
// node published for it, the service at an address and port. It is used by
// one goroutine only.
type enricher struct {
	Tables
	// known holds each endpoint's flow form, made once per row: rows are
	// immutable, so a new row (a changed endpoint or identity) makes a new
	// one. Flows share these: nothing changes a flow once it is in the
	// ring.
	known map[uint16]knownEndpoint
	// labels holds each identity row's labels in flow form.
	labels map[*idalloc.Identity][]string
}

type knownEndpoint struct {
	row *endpointmanager.Endpoint
	id  *idalloc.Identity
	pb  *flow.Endpoint
}

func newEnricher(t Tables) *enricher {
	return &enricher{Tables: t, known: map[uint16]knownEndpoint{}, labels: map[*idalloc.Identity][]string{}}
}

// endpointAt is the local endpoint with address addr, or nil.
func (e *enricher) endpointAt(txn statedb.ReadTxn, addr netip.Addr) *flow.Endpoint {
	if !addr.IsValid() {
		return nil
	}
	row, _, found := e.Endpoints.Get(txn, endpointmanager.EndpointIP.Query(addr.Unmap()))
	if !found {
		return nil
	}
	return e.endpointPB(txn, row)
}

// peerAt is the flow endpoint at addr: the local endpoint there, or, for
// any other address, the identity the datapath found for it (id, from the
// ipcache) with its labels ("reserved:<name>" for a reserved one), and the
// namespace and pod another node published for the address. Nil when
// neither is known.
func (e *enricher) peerAt(txn statedb.ReadTxn, addr netip.Addr, id uint32) *flow.Endpoint {
	if pb := e.endpointAt(txn, addr); pb != nil {
		return pb
	}
	if id == 0 {
		return nil
	}
	n := identity.NumericIdentity(id)
	pb := &flow.Endpoint{Identity: id, Labels: e.identityLabels(txn, n)}
	if !n.IsReserved() && addr.IsValid() {
		if entry, found := ipcache.Lookup(txn, e.IPCache, addr); found {
			if w := entry.Winner(); w.Identity == n {
				pb.Namespace, pb.PodName = w.Namespace, w.PodName
			}
		}
	}
	return pb
}

// identityLabels are the labels of identity n, in flow form; nil when the
// node does not know it.
func (e *enricher) identityLabels(txn statedb.ReadTxn, n identity.NumericIdentity) []string {
	if name := n.ReservedName(); name != "" {
		return []string{"reserved:" + name}
	}
	row, _, found := e.Identities.Get(txn, idalloc.ByID.Query(n))
	if !found {
		return nil
	}
	if ls, ok := e.labels[row]; ok {
		return ls
	}
	if len(e.labels) > 4096 {
		clear(e.labels) // rows replaced by newer ones are never asked for again
	}
	ls := row.Labels.Strings()
	e.labels[row] = ls
	return ls
}

// endpointRow is the endpoint with id, or nil.
func (e *enricher) endpointRow(txn statedb.ReadTxn, id uint16) *endpointmanager.Endpoint {
	if id == 0 {
		return nil
	}
	row, _, _ := e.Endpoints.Get(txn, endpointmanager.EndpointID.Query(id))
	return row
}

// endpointPB is a local endpoint in flow form. Its labels are those of its
// identity, as on every node that names it; while the identity is not
// resolved yet (init), its pod's labels and namespace.
func (e *enricher) endpointPB(txn statedb.ReadTxn, row *endpointmanager.Endpoint) *flow.Endpoint {
	var id *idalloc.Identity
	if !row.Identity.IsReserved() {
		id, _, _ = e.Identities.Get(txn, idalloc.ByID.Query(row.Identity))
	}
	if k, ok := e.known[row.ID]; ok && k.row == row && k.id == id {
		return k.pb
	}
	var labels []string
	if id != nil {
		labels = e.identityLabels(txn, row.Identity)
	} else {
		// Labels in Cilium's form, "source:key=value", with the pod's
		// namespace as Cilium adds it, so that label filters written for
		// Cilium's Hubble work here.
		labels = make([]string, 0, len(row.Labels)+1)
		for _, k := range slices.Sorted(maps.Keys(row.Labels)) {
			labels = append(labels, labelSourceK8s+":"+k+"="+row.Labels[k])
		}
		if row.PodNamespace != "" {
			labels = append(labels, labelSourceK8s+":"+labelPodNamespace+"="+row.PodNamespace)
			slices.Sort(labels)
		}
	}
	pb := &flow.Endpoint{
		ID:        uint32(row.ID),
		Identity:  uint32(row.Identity),
		Namespace: row.PodNamespace,
		PodName:   row.PodName,
		Labels:    labels,
	}
	e.known[row.ID] = knownEndpoint{row, id, pb}
	return pb
}

// serviceAt is the service with a frontend at addr:port/proto, or nil.
func (e *enricher) serviceAt(txn statedb.ReadTxn, addr netip.Addr, port uint16, proto loadbalancer.L4Proto) *flow.Service {
	if !addr.IsValid() || port == 0 || proto == 0 {
		return nil
	}
	fe, _, found := e.Frontends.Get(txn, loadbalancer.FrontendByAddress.Query(loadbalancer.L3n4Addr{Addr: addr.Unmap(), Port: port, Protocol: proto}))
	if !found {
		return nil
	}
	return &flow.Service{Name: fe.ServiceName.Name, Namespace: fe.ServiceName.Namespace}
}

// allowedBy are the policies a policy verdict's cookie names, in flow
// form as Hubble shows Kubernetes NetworkPolicies; the host's own allow
// (reserved:host) is no policy and is left out.
func (e *enricher) allowedBy(txn statedb.ReadTxn, cookie uint32) []*flow.Policy {
	if e.PolicyEntries == nil {
		return nil
	}
	var out []*flow.Policy
	for _, name := range policy.AllowedBy(txn, e.PolicyEntries, cookie) {
		ns, n, ok := strings.Cut(name, "/")
		if !ok {
			continue
		}
		out = append(out, &flow.Policy{Name: n, Namespace: ns, Kind: "NetworkPolicy", Labels: []string{
			"k8s:io.cilium.k8s.policy.derived-from=NetworkPolicy",
			"k8s:io.cilium.k8s.policy.name=" + n,
			"k8s:io.cilium.k8s.policy.namespace=" + ns,
		}})
	}
	return out
}
