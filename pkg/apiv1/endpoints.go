package apiv1

import (
	"net/url"
	"time"
)

// PathEndpoints serves the node's endpoints: GET lists them; GET, PUT and
// DELETE /v1/endpoints/{id} act on one.
//
// GET /v1/endpoints?cni=true lists only the endpoints made through the CNI
// API (PUT), leaving out the agent's own (the node's health endpoint): what
// a CNI GC may delete. DELETE /v1/endpoints/container-id:{cid}?interface=NAME
// deletes the container's endpoint only if its interface is NAME (a CNI DEL
// names an attachment, container and CNI_IFNAME), else answers 404; without
// the parameter it deletes the container's endpoint whatever its
// interface, as before.
const PathEndpoints = "/v1/endpoints"

// Query parameters of PathEndpoints.
const (
	QueryCNI       = "cni"
	QueryInterface = "interface"
)

// ContainerIDPrefix makes an {id} of /v1/endpoints/{id} a container ID:
// "container-id:3f2a..." names the endpoint of that container, a number
// names the endpoint with that ID. PUT takes only the container form: the
// agent picks the endpoint ID.
const ContainerIDPrefix = "container-id:"

// EndpointPath is the path of the endpoint {id} (a number, or
// ContainerIDPrefix and a container ID).
func EndpointPath(id string) string {
	return PathEndpoints + "/" + url.PathEscape(id)
}

// Endpoint states.
const (
	// EndpointReady: the endpoint's interfaces, addresses and routes are in
	// place.
	EndpointReady = "ready"
	// EndpointNotReady: restored, but its interfaces could not be brought
	// back; the error says why. Its addresses stay reserved.
	EndpointNotReady = "not-ready"
	// EndpointDeleting: a DEL failed half way; the error says why. A
	// retried DEL finishes it.
	EndpointDeleting = "deleting"
)

// EndpointCreate is the body of PUT /v1/endpoints/container-id:{cid}: what a
// CNI ADD knows about the container.
type EndpointCreate struct {
	// ContainerID, when set, must be the one in the path.
	ContainerID string `json:"containerID,omitempty"`
	// Netns is the path of the container's network namespace (CNI_NETNS).
	Netns string `json:"netns"`
	// Interface is the name of the interface in the container (CNI_IFNAME).
	Interface    string `json:"interface"`
	PodNamespace string `json:"podNamespace,omitempty"`
	PodName      string `json:"podName,omitempty"`
	// PodUID is the pod's UID (K8S_POD_UID, which containerd and CRI-O
	// send): the ADD waits until the agent's watch has the pod of that UID,
	// not an earlier pod of the same name. Without it, any pod of that name.
	PodUID string `json:"podUID,omitempty"`
}

// Endpoint is one pod network interface that the agent manages.
type Endpoint struct {
	ID          uint16 `json:"id"`
	ContainerID string `json:"containerID"`
	Netns       string `json:"netns"`
	// Interface is the interface's name in the container.
	Interface string `json:"interface"`
	MAC       string `json:"mac"`
	IPv4      string `json:"ipv4,omitempty"`
	IPv6      string `json:"ipv6,omitempty"`
	// IPv4Gateway and IPv6Gateway are the router addresses the container's
	// default routes go through.
	IPv4Gateway string `json:"ipv4Gateway,omitempty"`
	IPv6Gateway string `json:"ipv6Gateway,omitempty"`
	// HostInterface is the host side of the veth pair, lxc<hash>.
	HostInterface string            `json:"hostInterface"`
	HostIfIndex   int               `json:"hostIfIndex"`
	HostMAC       string            `json:"hostMAC"`
	PodNamespace  string            `json:"podNamespace,omitempty"`
	PodName       string            `json:"podName,omitempty"`
	Labels        map[string]string `json:"labels,omitempty"`
	// ServiceAccount and NamespaceLabels are the pod's service account and
	// its namespace's labels, which with Labels make its identity.
	ServiceAccount  string            `json:"serviceAccount,omitempty"`
	NamespaceLabels map[string]string `json:"namespaceLabels,omitempty"`
	// Health marks the node's health endpoint (no pod; identity health).
	Health bool `json:"health,omitempty"`
	// Identity is the security identity of the endpoint's labels;
	// IdentityPending says it is provisional until the allocator answers.
	Identity        uint32 `json:"identity"`
	IdentityPending bool   `json:"identityPending,omitempty"`
	State           string `json:"state"`
	// Error says why a not-ready endpoint is not ready, or why the DEL of
	// a deleting one failed.
	Error   string    `json:"error,omitempty"`
	Created time.Time `json:"created"`
	// Datapath says whether the datapath has the endpoint: its entries in
	// the BPF endpoint map and its programs on the host-side interface.
	// Error (with DatapathError) if either failed, else Done once both
	// are, else Pending or Refreshing.
	Datapath      string `json:"datapath,omitempty"`
	DatapathError string `json:"datapathError,omitempty"`
	// Policy is the endpoint's network policy as the policy maps hold it;
	// absent in an agent without policy, or before the endpoint's policy
	// is computed.
	Policy *EndpointPolicy `json:"policy,omitempty"`
}

// EndpointDeleted is the answer of DELETE /v1/endpoints/{id}. A DELETE of a
// container the agent knows nothing about is a 404, which a CNI DEL treats
// as done.
type EndpointDeleted struct {
	// Endpoint is the endpoint that was deleted; nil when only leftovers of
	// an ADD that did not finish were cleaned up.
	Endpoint *Endpoint `json:"endpoint,omitempty"`
	// ReleasedIPs are the addresses that went back to the pool.
	ReleasedIPs []string `json:"releasedIPs,omitempty"`
}

// EndpointCheck is the answer of GET /v1/endpoints/{id}/check: whether the
// endpoint's interfaces, addresses and routes are as the agent made them.
type EndpointCheck struct {
	Endpoint Endpoint `json:"endpoint"`
	// Problems lists each difference; empty when the endpoint is intact.
	Problems []string `json:"problems,omitempty"`
}

// EndpointPolicy is how an endpoint's network policy stands.
type EndpointPolicy struct {
	// Revision is the policy revision the endpoint's entries were last
	// computed from.
	Revision uint64 `json:"revision"`
	// Ingress and Egress say whether the endpoint is isolated (enforced)
	// in each direction: only what its entries allow passes.
	Ingress bool `json:"ingress"`
	Egress  bool `json:"egress"`
	// Entries counts its allows.
	Entries int `json:"entries"`
	// Realized: the entries and enforcement are all in the policy maps;
	// else Error says what failed, if anything did (else they are being
	// written).
	Realized bool   `json:"realized"`
	Error    string `json:"error,omitempty"`
}
