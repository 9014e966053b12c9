package apiv1

// PathPolicy serves the NetworkPolicies as the agent understands them: GET
// lists them with the policy revision, GET PathPolicy/{namespace}/{name}
// shows one. PathPolicySelectors lists the selector cache.
const (
	PathPolicy          = "/v1/policy"
	PathPolicySelectors = "/v1/policy/selectors"
)

// PolicyList is every NetworkPolicy the agent has read, and the policy
// revision: it increases with every change of a NetworkPolicy.
type PolicyList struct {
	Revision uint64   `json:"revision"`
	Policies []Policy `json:"policies"`
}

// Policy is one NetworkPolicy as the agent understands it.
type Policy struct {
	// Name is "namespace/name".
	Name        string `json:"name"`
	PodSelector string `json:"podSelector"`
	// PolicyTypes are the directions the selected pods are isolated in,
	// defaulted as the API server defaults them.
	PolicyTypes []string     `json:"policyTypes"`
	Ingress     []PolicyRule `json:"ingress,omitempty"`
	Egress      []PolicyRule `json:"egress,omitempty"`
	// Revision is the policy revision at which this version was read.
	Revision uint64 `json:"revision"`
	// Applied says whether this version is the one in force. A version
	// with Error is not: the last one that could be applied stays in
	// force, if any (InForce).
	Applied bool `json:"applied"`
	InForce bool `json:"inForce"`
	// Endpoints are the local endpoints the version in force selects.
	Endpoints []uint16 `json:"endpoints,omitempty"`
	Error     string   `json:"error,omitempty"`
}

// PolicyRule is one ingress or egress rule: its peers and ports.
type PolicyRule struct {
	// Peers are selector keys (see PolicySelector), "ipBlock CIDR except
	// ...", or "everyone" when the rule names no peer.
	Peers []string `json:"peers"`
	// Ports are "PORT/PROTO", "FROM-TO/PROTO", "NAME/PROTO", "*/PROTO",
	// or "any" when the rule names no port.
	Ports []string `json:"ports"`
}

// PolicySelector is one selector of the selector cache: the identities it
// selects and the policies that use it.
type PolicySelector struct {
	Selector   string   `json:"selector"`
	Identities []uint32 `json:"identities"`
	Users      []string `json:"users"`
}

// PathPolicyTrace explains the verdict on a connection: GET with from, to
// (each NAMESPACE/POD of a local pod, an address, an identity number or a
// reserved name such as world) and port (PORT/PROTO, PROTO for ICMP).
const PathPolicyTrace = "/v1/policy/trace"

// PolicyTrace is a connection's verdict and why: the source's egress and
// the destination's ingress, each where the peer is a local endpoint.
type PolicyTrace struct {
	From    string `json:"from"`
	To      string `json:"to"`
	Port    string `json:"port"`
	Allowed bool   `json:"allowed"`
	// Sides are the checks made: egress of a local source, ingress of a
	// local destination. Neither local: no check, allowed.
	Sides []PolicyTraceSide `json:"sides"`
}

// PolicyTraceSide is one endpoint's check of the connection.
type PolicyTraceSide struct {
	Endpoint  uint16 `json:"endpoint"`
	Pod       string `json:"pod"`
	Direction string `json:"direction"`
	// Peer is the identity of the other side.
	Peer uint32 `json:"peer"`
	// PeerPrefix is the longest ipBlock prefix of the node's policies
	// that holds the other side's address, when known: ipBlock allows
	// match it.
	PeerPrefix string `json:"peerPrefix,omitempty"`
	// SelectedBy are the policies selecting the endpoint that isolate it
	// in this direction; none: not isolated, everything allowed.
	SelectedBy []string `json:"selectedBy"`
	Isolated   bool     `json:"isolated"`
	// AllowedBy are the policies whose rules allow the connection.
	AllowedBy []string `json:"allowedBy"`
	Allowed   bool     `json:"allowed"`
}
