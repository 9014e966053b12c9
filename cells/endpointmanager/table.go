package endpointmanager

import (
	"fmt"
	"maps"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/index"
	"github.com/cilium/statedb/reconciler"

	"github.com/cellium/cellium/cells/internal/tables"
	"github.com/cellium/cellium/pkg/identity"
)

// State is an endpoint's state in the table.
type State string

const (
	// Starting: a creation in progress. The veth pair, the pod's addresses
	// and routes are in place and the datapath takes the endpoint in (its
	// map entry, programs and policy), but the host has no route to the
	// pod yet: nothing reaches the pod before its programs and policy are
	// in place. The state file still says "creating".
	Starting State = "starting"
	// Ready: interfaces, addresses and routes are in place, and the
	// datapath had the endpoint and its policy when it became ready.
	Ready State = "ready"
	// NotReady: restored, but its interfaces could not be brought back;
	// Error says why. Its addresses stay reserved until it is deleted.
	NotReady State = "not-ready"
	// Deleting: a DEL failed half way; Error says why. What is left of it
	// goes when a DEL of it is retried and finishes.
	Deleting State = "deleting"
)

// MAC is a link-layer address that reads and writes as aa:bb:cc:dd:ee:ff.
type MAC net.HardwareAddr

func (m MAC) String() string { return net.HardwareAddr(m).String() }

func (m MAC) MarshalText() ([]byte, error) { return []byte(m.String()), nil }

func (m *MAC) UnmarshalText(b []byte) error {
	if len(b) == 0 {
		*m = nil
		return nil
	}
	hw, err := net.ParseMAC(string(b))
	if err != nil {
		return err
	}
	*m = MAC(hw)
	return nil
}

// Endpoint is one row of the table "endpoints": a pod's network interface.
// Rows are immutable: change a copy (Clone) and insert it.
type Endpoint struct {
	// ID is the agent's number for the endpoint, unique on the node.
	ID          uint16 `json:"id" yaml:"id"`
	ContainerID string `json:"containerID" yaml:"containerID"`
	// Netns is the path of the pod's network namespace.
	Netns string `json:"netns" yaml:"netns"`
	// IfName is the interface's name in the pod (CNI_IFNAME).
	IfName string     `json:"ifName" yaml:"ifName"`
	MAC    MAC        `json:"mac" yaml:"mac"`
	IPv4   netip.Addr `json:"ipv4,omitzero" yaml:"ipv4,omitempty"`
	IPv6   netip.Addr `json:"ipv6,omitzero" yaml:"ipv6,omitempty"`
	// HostIfName is the host side of the veth pair: see HostIfName.
	HostIfName   string            `json:"hostIfName" yaml:"hostIfName"`
	HostIfIndex  int               `json:"hostIfIndex" yaml:"hostIfIndex"`
	HostMAC      MAC               `json:"hostMAC" yaml:"hostMAC"`
	PodNamespace string            `json:"podNamespace,omitempty" yaml:"podNamespace,omitempty"`
	PodName      string            `json:"podName,omitempty" yaml:"podName,omitempty"`
	Labels       map[string]string `json:"labels,omitempty" yaml:"labels,omitempty"`
	// ServiceAccount and NamespaceLabels are the pod's service account and
	// its namespace's labels: with Labels, what its identity is made of.
	ServiceAccount  string            `json:"serviceAccount,omitempty" yaml:"serviceAccount,omitempty"`
	NamespaceLabels map[string]string `json:"namespaceLabels,omitempty" yaml:"namespaceLabels,omitempty"`
	// Health marks the node's health endpoint: its identity is the
	// reserved health identity.
	Health bool `json:"health,omitempty" yaml:"health,omitempty"`
	// Identity is the security identity of the endpoint's label set:
	// identity.Init until the allocator has resolved it.
	Identity identity.NumericIdentity `json:"identity,omitempty" yaml:"identity,omitempty"`
	// IdentityPending: Identity is provisional (init, or the number from
	// before a restart) until the allocator answers.
	IdentityPending bool  `json:"identityPending,omitempty" yaml:"identityPending,omitempty"`
	State           State `json:"state" yaml:"state"`
	// Error says why a not-ready endpoint is not ready, or why the DEL of
	// a deleting one failed.
	Error   string    `json:"error,omitempty" yaml:"error,omitempty"`
	Created time.Time `json:"created" yaml:"created"`
	// MapStatus says whether the endpoint is in the BPF endpoint map (the
	// endpoint-maps cell reconciles it).
	MapStatus reconciler.Status `json:"mapStatus" yaml:"mapStatus"`
	// ProgramStatus says whether the datapath programs are attached to the
	// host-side interface (the loader cell reconciles it).
	ProgramStatus reconciler.Status `json:"programStatus" yaml:"programStatus"`
}

// Clone is a copy of e that may be changed.
func (e *Endpoint) Clone() *Endpoint {
	c := *e
	c.Labels = maps.Clone(e.Labels)
	c.NamespaceLabels = maps.Clone(e.NamespaceLabels)
	return &c
}

// InDatapath says whether the datapath has the endpoint, in the endpoint
// map and with programs on its host interface: a ready or starting one. A
// not-ready endpoint's host interface may be gone.
func (e *Endpoint) InDatapath() bool {
	return (e.State == Ready || e.State == Starting) && e.HostIfIndex > 0
}

// routed says whether the host has routes to the endpoint: it is ready.
func (e *Endpoint) routed() bool { return e.State == Ready && e.HostIfIndex > 0 }

// IPs are the endpoint's addresses, IPv4 first.
func (e *Endpoint) IPs() []netip.Addr {
	var ips []netip.Addr
	for _, ip := range []netip.Addr{e.IPv4, e.IPv6} {
		if ip.IsValid() {
			ips = append(ips, ip)
		}
	}
	return ips
}

var _ statedb.TableWritable = &Endpoint{}

func (e *Endpoint) TableHeader() []string {
	return []string{"ID", "ContainerID", "Pod", "Identity", "Interface", "IPv4", "IPv6", "Host", "State", "Map", "Programs", "Error"}
}

func (e *Endpoint) TableRow() []string {
	pod := ""
	if e.PodName != "" {
		pod = e.PodNamespace + "/" + e.PodName
	}
	if e.Health {
		pod = "(node health)"
	}
	addr := func(a netip.Addr) string {
		if a.IsValid() {
			return a.String()
		}
		return ""
	}
	return []string{
		strconv.Itoa(int(e.ID)), shortID(e.ContainerID), pod, e.identityString(), e.IfName, addr(e.IPv4), addr(e.IPv6),
		fmt.Sprintf("%s (%d)", e.HostIfName, e.HostIfIndex), string(e.State),
		e.MapStatus.Kind.String(), e.ProgramStatus.Kind.String(), strings.Join(e.problems(), "; "),
	}
}

func (e *Endpoint) identityString() string {
	if e.IdentityPending {
		return e.Identity.String() + " (pending)"
	}
	return e.Identity.String()
}

// problems are why the endpoint is not ready and why the datapath does not
// have it (map, then programs), in that order.
func (e *Endpoint) problems() []string {
	var errs []string
	for _, err := range []string{e.Error, e.MapStatus.GetError(), e.ProgramStatus.GetError()} {
		if err != "" {
			errs = append(errs, err)
		}
	}
	return errs
}

// shortID is the first 12 characters of a container ID, as runtimes show it.
func shortID(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}

var (
	// EndpointID indexes the endpoints table by endpoint ID.
	EndpointID = statedb.Index[*Endpoint, uint16]{
		Name:       "id",
		FromObject: func(e *Endpoint) index.KeySet { return index.NewKeySet(index.Uint16(e.ID)) },
		FromKey:    index.Uint16,
		FromString: index.Uint16String,
		Unique:     true,
	}
	// EndpointContainerID indexes the endpoints table by container ID.
	EndpointContainerID = statedb.Index[*Endpoint, string]{
		Name:       "container-id",
		FromObject: func(e *Endpoint) index.KeySet { return index.NewKeySet(index.String(e.ContainerID)) },
		FromKey:    index.String,
		FromString: index.FromString,
		Unique:     true,
	}
	// EndpointIP indexes the endpoints table by address.
	EndpointIP = statedb.Index[*Endpoint, netip.Addr]{
		Name: "ip",
		FromObject: func(e *Endpoint) index.KeySet {
			var keys []index.Key
			for _, ip := range e.IPs() {
				keys = append(keys, index.NetIPAddr(ip))
			}
			if len(keys) == 0 {
				return index.EmptyKeySet
			}
			return index.NewKeySet(keys[0], keys[1:]...)
		},
		FromKey:    index.NetIPAddr,
		FromString: index.NetIPAddrString,
	}
	// EndpointPod indexes the endpoints table by pod, "namespace/name".
	EndpointPod = statedb.Index[*Endpoint, string]{
		Name: "pod",
		FromObject: func(e *Endpoint) index.KeySet {
			if e.PodName == "" {
				return index.EmptyKeySet
			}
			return index.NewKeySet(index.String(e.PodNamespace + "/" + e.PodName))
		},
		FromKey:    index.String,
		FromString: index.FromString,
	}
	// EndpointHealth indexes the node's health endpoints (Query(true));
	// other endpoints are not in it, so a watch on it (the local node's)
	// wakes for health endpoints only, not for each pod's.
	EndpointHealth = statedb.Index[*Endpoint, bool]{
		Name: "health",
		FromObject: func(e *Endpoint) index.KeySet {
			if !e.Health {
				return index.EmptyKeySet
			}
			return index.NewKeySet(index.Bool(true))
		},
		FromKey:    index.Bool,
		FromString: index.BoolString,
	}
	// EndpointMapStatus indexes the endpoints table by whether the endpoint
	// is in the BPF endpoint map yet.
	EndpointMapStatus = tables.StatusIndex(func(e *Endpoint) reconciler.Status { return e.MapStatus })
)

// TableName is the name of the endpoints table.
const TableName = "endpoints"

// NewTable registers the endpoints table. The endpoint-manager cell
// provides it; tests of the cells that read it may register it themselves.
func NewTable(db *statedb.DB) (statedb.RWTable[*Endpoint], error) {
	return statedb.NewTable(db, TableName, EndpointID, EndpointContainerID, EndpointIP, EndpointPod, EndpointHealth, EndpointMapStatus)
}
