package loadbalancer

import (
	"fmt"
	"iter"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/index"
	"github.com/cilium/statedb/reconciler"

	"github.com/cellium/cellium/cells/internal/tables"
)

// Table names.
const (
	ServicesTableName  = "services"
	FrontendsTableName = "frontends"
	BackendsTableName  = "backends"
)

// Initializers the cell registers on its tables. A table is initialized once
// the initial listing of each source it depends on has been written.
const (
	// InitK8sServices is done once the initial LIST of Services is in the
	// services and frontends tables.
	InitK8sServices = "k8s-services"
	// InitK8sEndpointSlices is done once the initial LIST of EndpointSlices
	// is in the backends and frontends tables.
	InitK8sEndpointSlices = "k8s-endpointslices"
	// InitNodeAddresses is done once the NodePort frontends cover the
	// initialized node-addresses table.
	InitNodeAddresses = "node-addresses"
)

// Service is one Kubernetes Service, in the compact form the load balancer
// needs. Rows are immutable once inserted. The fields are in the order that
// packs them in 144 bytes.
type Service struct {
	Name ServiceName `json:"name"`
	Type ServiceType `json:"type"`
	// SessionAffinity is sessionAffinity ClientIP: a client keeps its
	// backend for AffinityTimeout after its last packet.
	SessionAffinity bool `json:"sessionAffinity,omitempty"`
	// ExtTrafficPolicyLocal restricts NodePort, ExternalIP and LoadBalancer
	// frontends to backends on this node.
	ExtTrafficPolicyLocal bool `json:"extTrafficPolicyLocal,omitempty"`
	// IntTrafficPolicyLocal restricts ClusterIP frontends to backends on
	// this node.
	IntTrafficPolicyLocal bool `json:"intTrafficPolicyLocal,omitempty"`
	// HealthCheckNodePort is spec.healthCheckNodePort, 0 when the service
	// has none: the port on which the lb-healthcheck cell tells external
	// load balancers how many of the service's endpoints are on this node.
	HealthCheckNodePort uint16 `json:"healthCheckNodePort,omitempty"`
	// ClusterIPs is empty for headless and ExternalName services.
	ClusterIPs      []netip.Addr  `json:"clusterIPs,omitempty"`
	ExternalIPs     []netip.Addr  `json:"externalIPs,omitempty"`
	LoadBalancerIPs []netip.Addr  `json:"loadBalancerIPs,omitempty"`
	Ports           []ServicePort `json:"ports,omitempty"`
	AffinityTimeout time.Duration `json:"affinityTimeout,omitempty"`
}

// ServicePort is one of spec.ports.
type ServicePort struct {
	Name string `json:"name,omitempty"`
	Port uint16 `json:"port"`
	// NodePort is 0 when the port has none.
	NodePort uint16  `json:"nodePort,omitempty"`
	Protocol L4Proto `json:"protocol"`
}

func (p ServicePort) String() string {
	s := strconv.Itoa(int(p.Port))
	if p.NodePort != 0 {
		s += ":" + strconv.Itoa(int(p.NodePort))
	}
	s += "/" + p.Protocol.String()
	if p.Name != "" {
		s = p.Name + "=" + s
	}
	return s
}

func (s *Service) equal(o *Service) bool {
	return s.Name == o.Name && s.Type == o.Type &&
		slices.Equal(s.ClusterIPs, o.ClusterIPs) &&
		slices.Equal(s.ExternalIPs, o.ExternalIPs) &&
		slices.Equal(s.LoadBalancerIPs, o.LoadBalancerIPs) &&
		slices.Equal(s.Ports, o.Ports) &&
		s.SessionAffinity == o.SessionAffinity && s.AffinityTimeout == o.AffinityTimeout &&
		s.ExtTrafficPolicyLocal == o.ExtTrafficPolicyLocal &&
		s.IntTrafficPolicyLocal == o.IntTrafficPolicyLocal &&
		s.HealthCheckNodePort == o.HealthCheckNodePort
}

var (
	_ statedb.TableWritable = &Service{}
	_ statedb.TableWritable = &Frontend{}
	_ statedb.TableWritable = &SliceBackends{}
)

func (s *Service) TableHeader() []string {
	return []string{"Name", "Type", "ClusterIPs", "ExternalIPs", "LoadBalancerIPs", "Ports", "Affinity", "TrafficPolicy"}
}

func (s *Service) TableRow() []string {
	return []string{
		s.Name.String(),
		s.Type.String(),
		joinStrings(s.ClusterIPs),
		joinStrings(s.ExternalIPs),
		joinStrings(s.LoadBalancerIPs),
		joinStrings(s.Ports),
		affinityString(s.SessionAffinity, s.AffinityTimeout),
		trafficPolicyString(s.ExtTrafficPolicyLocal, s.IntTrafficPolicyLocal, s.HealthCheckNodePort),
	}
}

func affinityString(on bool, timeout time.Duration) string {
	if !on {
		return ""
	}
	return "ClientIP " + timeout.String()
}

func trafficPolicyString(extLocal, intLocal bool, healthCheckNodePort uint16) string {
	policy := func(local bool) string {
		if local {
			return "Local"
		}
		return "Cluster"
	}
	s := "ext=" + policy(extLocal) + " int=" + policy(intLocal)
	if healthCheckNodePort != 0 {
		s += " healthCheckNodePort=" + strconv.Itoa(int(healthCheckNodePort))
	}
	return s
}

// Frontend is an address the datapath load-balances, with everything the
// datapath needs to program it: the lb-maps reconciler reads nothing else.
// Rows are immutable once inserted.
//
// The fields are in the order that packs them in 144 bytes (a frontend is
// kept per Service address), the status packed (see tables.PackedStatus).
type Frontend struct {
	// Address is the primary key. NodePort frontends exist at every node
	// address and at the wildcard 0.0.0.0 / ::, which the datapath serves
	// for loopback destinations.
	Address     L3n4Addr    `json:"address"`
	ServiceName ServiceName `json:"serviceName"`
	PortName    string      `json:"portName,omitempty"`
	// Backends are the backends to use, sorted by address, of the
	// frontend's address family: filtered by the traffic policy (Local:
	// only this node's), terminating ones only when no active one exists,
	// never quarantined ones. Empty means reject connections.
	Backends        []L3n4Addr    `json:"backends"`
	AffinityTimeout time.Duration `json:"affinityTimeout,omitempty"`
	// Status is Pending whenever anything above changed; the lb-maps
	// reconciler sets Done or Error. GetStatus unpacks it.
	Status          tables.PackedStatus `json:"status"`
	Type            FrontendType        `json:"type"`
	SessionAffinity bool                `json:"sessionAffinity,omitempty"`
	// TrafficPolicyLocal: Backends are this node's only (the service's
	// external policy for NodePort, ExternalIP and LoadBalancer frontends,
	// its internal one for ClusterIP). A NodePort without any then drops,
	// where one of a service with no backends at all refuses.
	TrafficPolicyLocal bool `json:"trafficPolicyLocal,omitempty"`
}

// sameContent is whether f and o differ in anything but Status.
func (f *Frontend) sameContent(o *Frontend) bool {
	return f.Address == o.Address && f.Type == o.Type && f.ServiceName == o.ServiceName &&
		f.PortName == o.PortName && slices.Equal(f.Backends, o.Backends) &&
		f.SessionAffinity == o.SessionAffinity && f.AffinityTimeout == o.AffinityTimeout &&
		f.TrafficPolicyLocal == o.TrafficPolicyLocal
}

func (f *Frontend) TableHeader() []string {
	return []string{"Address", "Type", "Service", "Port", "Backends", "Affinity", "Status", "Error"}
}

// maxBackendsShown keeps a frontend's row readable when it has many backends.
const maxBackendsShown = 4

func (f *Frontend) TableRow() []string {
	return []string{
		f.Address.String(),
		f.Type.String(),
		f.ServiceName.String(),
		f.PortName,
		backendsString(f.Backends),
		affinityString(f.SessionAffinity, f.AffinityTimeout),
		f.Status.Kind().String(),
		f.GetStatus().GetError(),
	}
}

func backendsString(backends []L3n4Addr) string {
	if len(backends) == 0 {
		return "none (reject)"
	}
	return shownList(backends)
}

// shownList joins xs, or the first few of them and how many there are.
func shownList[T fmt.Stringer](xs []T) string {
	if len(xs) <= maxBackendsShown {
		return joinStrings(xs)
	}
	return fmt.Sprintf("%s, ... (%d in all)", joinStrings(xs[:maxBackendsShown-1]), len(xs))
}

// Clone, SetStatus and GetStatus are what reconciler.Register needs.
func (f *Frontend) Clone() *Frontend {
	c := *f
	return &c
}

func (f *Frontend) SetStatus(s reconciler.Status) *Frontend {
	f.Status = tables.PackStatus(s)
	return f
}

func (f *Frontend) GetStatus() reconciler.Status { return f.Status.Unpack() }

// SliceBackends are the backends one EndpointSlice lists for its service:
// the backends table has a row per slice, not per backend. A service's
// backends are its rows (BackendsOf), found by the primary key's prefix;
// an update of a slice replaces one row. Rows are immutable once inserted.
type SliceBackends struct {
	ServiceName ServiceName `json:"serviceName"`
	// EndpointSlice is the name of the slice, in the service's namespace.
	EndpointSlice string `json:"endpointSlice"`
	// Backends are sorted by address and then port name, each pair once.
	Backends []Backend `json:"backends"`
}

// Backend is an address:port that an EndpointSlice lists for one port of
// its service. An address listed by two slices of the same service (as
// happens while endpoints move between slices) is in both rows, so that
// removing one slice keeps the other.
type Backend struct {
	Address  L3n4Addr `json:"address"`
	PortName string   `json:"portName,omitempty"`
	NodeName string   `json:"nodeName,omitempty"`
	// State is active or terminating, as the slice says.
	State BackendState `json:"state"`
	// Quarantined backends are never used; see [BackendHealth].
	Quarantined bool `json:"quarantined,omitempty"`
}

// EffectiveState is the backend's state, quarantine included.
func (b Backend) EffectiveState() BackendState {
	if b.Quarantined {
		return BackendQuarantined
	}
	return b.State
}

// String is "address [port-name] state [node]".
func (b Backend) String() string {
	parts := []string{b.Address.String(), b.PortName, b.EffectiveState().String(), b.NodeName}
	return strings.Join(slices.DeleteFunc(parts, func(p string) bool { return p == "" }), " ")
}

func (b *SliceBackends) equal(o *SliceBackends) bool {
	return b.ServiceName == o.ServiceName && b.EndpointSlice == o.EndpointSlice && slices.Equal(b.Backends, o.Backends)
}

func (b *SliceBackends) key() SliceKey { return SliceKey{b.ServiceName, b.EndpointSlice} }

func (b *SliceBackends) TableHeader() []string {
	return []string{"Service", "Slice", "Backends"}
}

// TableRow lists the backends as "address port-name state node".
func (b *SliceBackends) TableRow() []string {
	return []string{b.ServiceName.String(), b.EndpointSlice, shownList(b.Backends)}
}

func joinStrings[T fmt.Stringer](xs []T) string {
	parts := make([]string, len(xs))
	for i, x := range xs {
		parts[i] = x.String()
	}
	return strings.Join(parts, ", ")
}

var (
	// ServiceByName indexes the services table by namespace/name.
	ServiceByName = statedb.Index[*Service, ServiceName]{
		Name:       "name",
		FromObject: func(s *Service) index.KeySet { return index.NewKeySet(s.Name.key()) },
		FromKey:    ServiceName.key,
		FromString: serviceNameKey,
		Unique:     true,
	}

	// FrontendByAddress indexes the frontends table by address, e.g.
	// "10.96.0.10:53/UDP".
	FrontendByAddress = statedb.Index[*Frontend, L3n4Addr]{
		Name:       "address",
		FromObject: func(f *Frontend) index.KeySet { return index.NewKeySet(f.Address.key()) },
		FromKey:    L3n4Addr.key,
		FromString: l3n4AddrKey,
		Unique:     true,
	}
	// FrontendNodePortsByService indexes the NodePort frontends by
	// service: the frontends whose addresses depend on the node's, which
	// the service's row alone does not tell. [FrontendsOf] finds the
	// others at the addresses the row names; indexing them too cost 116
	// bytes per frontend (5.8 MB at 50,000 Services).
	FrontendNodePortsByService = statedb.Index[*Frontend, ServiceName]{
		Name: "nodeport",
		FromObject: func(f *Frontend) index.KeySet {
			if f.Type != FrontendNodePort {
				return index.EmptyKeySet
			}
			return index.NewKeySet(f.ServiceName.key())
		},
		FromKey:    ServiceName.key,
		FromString: serviceNameKey,
	}
	// FrontendByStatus indexes the frontends that are not Done by
	// reconciliation status (see tables.UnsettledStatusIndex).
	FrontendByStatus = tables.UnsettledStatusIndex((*Frontend).GetStatus)

	// BackendsBySlice is the backends table's primary index:
	// "namespace/service/slice". BackendsOf lists a service's rows by its
	// prefix.
	BackendsBySlice = statedb.Index[*SliceBackends, SliceKey]{
		Name:       "slice",
		FromObject: func(b *SliceBackends) index.KeySet { return index.NewKeySet(b.key().key()) },
		FromKey:    SliceKey.key,
		FromString: sliceKeyKey,
		Unique:     true,
	}
)

// SliceKey is the primary key of a backends row: a service and one of its
// EndpointSlices. With no slice it is the prefix of every row of the
// service.
type SliceKey struct {
	Service ServiceName
	Slice   string
}

// key is "namespace/service/slice": "/" cannot occur in any part.
func (k SliceKey) key() index.Key {
	return index.String(k.Service.Namespace + "/" + k.Service.Name + "/" + k.Slice)
}

func sliceKeyKey(s string) (index.Key, error) {
	svc, slice, ok := strings.Cut(s, "/")
	if ok {
		var name string
		name, slice, ok = strings.Cut(slice, "/")
		svc += "/" + name
	}
	n, err := ParseServiceName(svc)
	if !ok || err != nil || slice == "" || strings.Contains(slice, "/") {
		return nil, fmt.Errorf("invalid backends key %q: want NAMESPACE/SERVICE/ENDPOINTSLICE", s)
	}
	return SliceKey{n, slice}.key(), nil
}

// BackendsOf are the rows of the service's backends in txn.
func BackendsOf(txn statedb.ReadTxn, backends statedb.Table[*SliceBackends], name ServiceName) iter.Seq2[*SliceBackends, statedb.Revision] {
	return backends.Prefix(txn, BackendsBySlice.Query(SliceKey{Service: name}))
}

func serviceNameKey(s string) (index.Key, error) {
	n, err := ParseServiceName(s)
	if err != nil {
		return nil, err
	}
	return n.key(), nil
}

func l3n4AddrKey(s string) (index.Key, error) {
	a, err := ParseL3n4Addr(s)
	if err != nil {
		return nil, err
	}
	return a.key(), nil
}

// lbTables are the cell's three tables and the done-functions of their
// initializers.
type lbTables struct {
	services  statedb.RWTable[*Service]
	frontends statedb.RWTable[*Frontend]
	backends  statedb.RWTable[*SliceBackends]

	// servicesSynced and slicesSynced are done with the services and
	// backends of the initial listings; frontendsSynced once the frontends
	// of every listed service are computed, which may be transactions later.
	servicesSynced, slicesSynced, frontendsSynced, nodeAddressesSynced func(statedb.WriteTxn)
}

// NewServicesTable and NewFrontendsTable make the tables as the cell does,
// with no initializer: for tests that fill them in its place.
func NewServicesTable(db *statedb.DB) (statedb.RWTable[*Service], error) {
	return statedb.NewTable(db, ServicesTableName, ServiceByName)
}

func NewFrontendsTable(db *statedb.DB) (statedb.RWTable[*Frontend], error) {
	return statedb.NewTable(db, FrontendsTableName, FrontendByAddress, FrontendNodePortsByService, FrontendByStatus)
}

func newTables(db *statedb.DB) (*lbTables, error) {
	services, err := NewServicesTable(db)
	if err != nil {
		return nil, err
	}
	frontends, err := NewFrontendsTable(db)
	if err != nil {
		return nil, err
	}
	backends, err := statedb.NewTable(db, BackendsTableName, BackendsBySlice)
	if err != nil {
		return nil, err
	}
	t := &lbTables{services: services, frontends: frontends, backends: backends}

	// Registered before anyone can read the tables, so that nobody (the
	// lb-maps reconciler's pruning above all) mistakes a table still
	// waiting for Kubernetes for an empty one.
	txn := db.WriteTxn(services, frontends, backends)
	svcDone := services.RegisterInitializer(txn, InitK8sServices)
	feSvcDone := frontends.RegisterInitializer(txn, InitK8sServices)
	beDone := backends.RegisterInitializer(txn, InitK8sEndpointSlices)
	feBeDone := frontends.RegisterInitializer(txn, InitK8sEndpointSlices)
	t.nodeAddressesSynced = frontends.RegisterInitializer(txn, InitNodeAddresses)
	txn.Commit()
	t.servicesSynced, t.slicesSynced = svcDone, beDone
	t.frontendsSynced = func(txn statedb.WriteTxn) { feSvcDone(txn); feBeDone(txn) }
	return t, nil
}
