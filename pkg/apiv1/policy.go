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
	// Notes name the parts of the policy that select nothing yet.
	Notes []string `json:"notes,omitempty"`
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
