package apiv1

// PathNodes serves the nodes table: GET lists every node, GET
// PathNodes/{name} shows one.
const PathNodes = "/v1/nodes"

// Node is a node of the cluster as the agent knows it.
type Node struct {
	Name string `json:"name"`
	// Local is the agent's own node.
	Local bool `json:"local"`
	// Source is where the description comes from: local, k8s or kvstore.
	Source    string        `json:"source"`
	Addresses []NodeAddress `json:"addresses"`
	PodCIDRs  []string      `json:"podCIDRs,omitempty"`
	HealthIPs []string      `json:"healthIPs,omitempty"`
	// Problems say what of the description is ignored, and why.
	Problems []string `json:"problems,omitempty"`
}

// NodeAddress is an address of a node: InternalIP or ExternalIP.
type NodeAddress struct {
	Type string `json:"type"`
	IP   string `json:"ip"`
}
