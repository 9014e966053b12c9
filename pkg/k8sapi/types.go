// Package k8sapi is Cellium's own Kubernetes API, group cellium.io version
// v1alpha1: the custom resources through which agents share security
// identities and endpoints with no kvstore (--identity-allocation-mode=crd).
//
//   - CelliumIdentity, cluster-scoped, is named by its number (decimal, in
//     the cluster range) and holds the full label set, the identity's key.
//   - CelliumEndpoint, namespaced, is one per pod, named as the pod and
//     owned by it (Kubernetes deletes it with the pod). Its status holds the
//     pod's identity, addresses and named ports and its node's name and
//     address; the pod's node agent writes it.
//
// The types are hand-written with their DeepCopy; the client is a
// rest.Interface over a scheme of just these kinds (NewClient). CRDs
// returns the CustomResourceDefinitions, the same as deploy/crds.yaml;
// EnsureCRDs installs them.
package k8sapi

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// Group and Version of the custom resources.
const (
	Group   = "cellium.io"
	Version = "v1alpha1"
)

// GroupVersion is cellium.io/v1alpha1.
var GroupVersion = schema.GroupVersion{Group: Group, Version: Version}

// Resources (plural names) of the kinds.
const (
	ResourceIdentities = "celliumidentities"
	ResourceEndpoints  = "celliumendpoints"
)

// LabelNode labels each CelliumEndpoint with the name of the node whose
// agent wrote it, so an agent lists its own with a label selector.
const LabelNode = "cellium.io/node"

// CelliumIdentity is a cluster-wide security identity: its name is the
// number, its spec the label set.
type CelliumIdentity struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              IdentitySpec `json:"spec"`
}

// IdentitySpec is an identity's label set.
type IdentitySpec struct {
	// Labels are the label set's labels, each source:key=value, sorted:
	// the canonical form of pkg/labels.
	Labels []string `json:"labels"`
}

// CelliumIdentityList is a list of identities.
type CelliumIdentityList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []CelliumIdentity `json:"items"`
}

// CelliumEndpoint is a pod as its node's agent sees it: the pod's name and
// namespace, owned by the pod.
type CelliumEndpoint struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Status            EndpointStatus `json:"status"`
}

// EndpointStatus is what other nodes learn about a pod.
type EndpointStatus struct {
	// Identity is the pod's security identity number.
	Identity uint32 `json:"identity"`
	// Addresses are the pod's IP addresses.
	Addresses []string `json:"addresses"`
	// NodeName and NodeIP are the pod's node and its address (the tunnel
	// endpoint of the pod's traffic).
	NodeName string `json:"nodeName"`
	NodeIP   string `json:"nodeIP,omitempty"`
	// NamedPorts are the pod's named container ports.
	NamedPorts []NamedPort `json:"namedPorts,omitempty"`
}

// NamedPort is a named container port.
type NamedPort struct {
	Name     string `json:"name"`
	Port     uint16 `json:"port"`
	Protocol string `json:"protocol"`
}

// CelliumEndpointList is a list of endpoints.
type CelliumEndpointList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []CelliumEndpoint `json:"items"`
}

// AddToScheme adds the kinds to a scheme.
func AddToScheme(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion, &CelliumIdentity{}, &CelliumIdentityList{}, &CelliumEndpoint{}, &CelliumEndpointList{})
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}
