package apiv1

import "time"

// PathClusterHealth serves the last probes of every node (GET).
const PathClusterHealth = "/v1/cluster-health"

// ClusterHealth is what this node's probes found of every node.
type ClusterHealth struct {
	// Summary reads "Cluster health: 2/3 reachable", naming the paths
	// that failed.
	Summary string       `json:"summary"`
	Nodes   []NodeHealth `json:"nodes"`
}

// NodeHealth is the last probes of one node.
type NodeHealth struct {
	Node         string      `json:"node"`
	Local        bool        `json:"local"`
	Reachable    bool        `json:"reachable"`
	HostICMP     HealthProbe `json:"hostICMP"`
	HostHTTP     HealthProbe `json:"hostHTTP"`
	EndpointHTTP HealthProbe `json:"endpointHTTP"`
	LastProbe    time.Time   `json:"lastProbe"`
}

// HealthProbe is one probe of one path: its address (empty when there
// was nothing to probe), whether it answered, in how long, or why not.
type HealthProbe struct {
	Addr           string  `json:"addr,omitempty"`
	OK             bool    `json:"ok"`
	LatencySeconds float64 `json:"latencySeconds,omitempty"`
	Error          string  `json:"error,omitempty"`
}
