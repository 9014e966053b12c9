package apiv1

// PathServices lists services (GET, ?namespace= to narrow); PathServices +
// "/{namespace}/{name}" is one service.
const PathServices = "/v1/services"

// Service is a Kubernetes Service as the agent load-balances it: its spec
// in brief, the frontends the datapath serves, and every backend the
// service's EndpointSlices list.
type Service struct {
	Namespace       string        `json:"namespace"`
	Name            string        `json:"name"`
	Type            string        `json:"type"`
	ClusterIPs      []string      `json:"clusterIPs,omitempty"`
	ExternalIPs     []string      `json:"externalIPs,omitempty"`
	LoadBalancerIPs []string      `json:"loadBalancerIPs,omitempty"`
	Ports           []ServicePort `json:"ports,omitempty"`
	// AffinityTimeoutSeconds is set when sessionAffinity is ClientIP.
	AffinityTimeoutSeconds int64 `json:"affinityTimeoutSeconds,omitempty"`
	// ExternalTrafficPolicy and InternalTrafficPolicy are "Cluster" or
	// "Local".
	ExternalTrafficPolicy string `json:"externalTrafficPolicy"`
	InternalTrafficPolicy string `json:"internalTrafficPolicy"`
	// HealthCheckNodePort is spec.healthCheckNodePort, omitted when unset.
	HealthCheckNodePort uint16     `json:"healthCheckNodePort,omitempty"`
	Frontends           []Frontend `json:"frontends"`
	Backends            []Backend  `json:"backends"`
}

// ServicePort is one port of a Service.
type ServicePort struct {
	Name     string `json:"name,omitempty"`
	Port     uint16 `json:"port"`
	NodePort uint16 `json:"nodePort,omitempty"`
	Protocol string `json:"protocol"`
}

// Frontend is an address the datapath load-balances, e.g.
// "10.96.0.10:53/UDP" or "[fd00::10]:80/TCP".
type Frontend struct {
	Address  string `json:"address"`
	Type     string `json:"type"`
	PortName string `json:"portName,omitempty"`
	// Backends are the ones the datapath uses, in its order. None means
	// the datapath rejects connections.
	Backends []FrontendBackend `json:"backends"`
	// Status is Pending, Done or Error: whether the frontend is in the
	// datapath's maps yet.
	Status string `json:"status"`
	Error  string `json:"error,omitempty"`
}

// FrontendBackend is a backend a frontend uses.
type FrontendBackend struct {
	Address string `json:"address"`
	// State is "active", or "terminating" when no backend is active.
	State string `json:"state"`
}

// Backend is one backend of a service, for one of its ports, as one
// EndpointSlice lists it.
type Backend struct {
	Address  string `json:"address"`
	PortName string `json:"portName,omitempty"`
	// State is "active", "terminating" or "quarantined".
	State         string `json:"state"`
	NodeName      string `json:"nodeName,omitempty"`
	EndpointSlice string `json:"endpointSlice"`
}
