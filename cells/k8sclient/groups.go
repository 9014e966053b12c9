package k8sclient

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/flowcontrol"

	"github.com/cellium/cellium/pkg/kubeclient"
)

// The typed clients of the kinds the agent's cells use, by API group, as
// client-go's Clientset has them (cs.CoreV1().Services(ns)), built on
// pkg/kubeclient rather than client-go's generated clients: those link
// client-go's scheme of every API group (see pkg/kubeclient). A cell that
// needs another kind adds it here, and its group to kubeclient.Scheme.
type (
	ServiceClient       = kubeclient.Client[*corev1.Service, *corev1.ServiceList]
	NodeClient          = kubeclient.Client[*corev1.Node, *corev1.NodeList]
	PodClient           = kubeclient.Client[*corev1.Pod, *corev1.PodList]
	NamespaceClient     = kubeclient.Client[*corev1.Namespace, *corev1.NamespaceList]
	EndpointSliceClient = kubeclient.Client[*discoveryv1.EndpointSlice, *discoveryv1.EndpointSliceList]
	NetworkPolicyClient = kubeclient.Client[*networkingv1.NetworkPolicy, *networkingv1.NetworkPolicyList]
)

// CoreV1 is the core API group's clients.
type CoreV1 struct{ src kubeclient.Source }

func (c CoreV1) Services(ns string) ServiceClient {
	return kubeclient.New(c.src, "services", "Service", ns, func(l *corev1.ServiceList) *[]corev1.Service { return &l.Items })
}

func (c CoreV1) Nodes() NodeClient {
	return kubeclient.New(c.src, "nodes", "Node", "", func(l *corev1.NodeList) *[]corev1.Node { return &l.Items })
}

func (c CoreV1) Pods(ns string) PodClient {
	return kubeclient.New(c.src, "pods", "Pod", ns, func(l *corev1.PodList) *[]corev1.Pod { return &l.Items })
}

func (c CoreV1) Namespaces() NamespaceClient {
	return kubeclient.New(c.src, "namespaces", "Namespace", "", func(l *corev1.NamespaceList) *[]corev1.Namespace { return &l.Items })
}

// RESTClient is the group's REST client; nil in embedded mode.
func (c CoreV1) RESTClient() rest.Interface { return c.src.RESTClient() }

// DiscoveryV1 is discovery.k8s.io/v1's clients.
type DiscoveryV1 struct{ src kubeclient.Source }

func (c DiscoveryV1) EndpointSlices(ns string) EndpointSliceClient {
	return kubeclient.New(c.src, "endpointslices", "EndpointSlice", ns, func(l *discoveryv1.EndpointSliceList) *[]discoveryv1.EndpointSlice { return &l.Items })
}

// NetworkingV1 is networking.k8s.io/v1's clients.
type NetworkingV1 struct{ src kubeclient.Source }

func (c NetworkingV1) NetworkPolicies(ns string) NetworkPolicyClient {
	return kubeclient.New(c.src, "networkpolicies", "NetworkPolicy", ns, func(l *networkingv1.NetworkPolicyList) *[]networkingv1.NetworkPolicy { return &l.Items })
}

// groups are the API groups' clients.
type groups struct {
	coreV1       CoreV1
	discoveryV1  DiscoveryV1
	networkingV1 NetworkingV1
}

func (g *groups) CoreV1() CoreV1             { return g.coreV1 }
func (g *groups) DiscoveryV1() DiscoveryV1   { return g.discoveryV1 }
func (g *groups) NetworkingV1() NetworkingV1 { return g.networkingV1 }

// newGroups builds the groups' clients for a real API server, as
// kubernetes.NewForConfig builds its own: one HTTP client and one rate
// limiter for all of them.
func newGroups(rc *rest.Config) (*groups, error) {
	cfg := *rc
	if cfg.RateLimiter == nil && cfg.QPS > 0 {
		cfg.RateLimiter = flowcontrol.NewTokenBucketRateLimiter(cfg.QPS, cfg.Burst)
	}
	httpClient, err := rest.HTTPClientFor(&cfg)
	if err != nil {
		return nil, err
	}
	var g groups
	core, err := kubeclient.NewRESTSource(&cfg, httpClient, corev1.SchemeGroupVersion)
	if err != nil {
		return nil, fmt.Errorf("core/v1 client: %w", err)
	}
	disc, err := kubeclient.NewRESTSource(&cfg, httpClient, discoveryv1.SchemeGroupVersion)
	if err != nil {
		return nil, fmt.Errorf("discovery.k8s.io/v1 client: %w", err)
	}
	netw, err := kubeclient.NewRESTSource(&cfg, httpClient, networkingv1.SchemeGroupVersion)
	if err != nil {
		return nil, fmt.Errorf("networking.k8s.io/v1 client: %w", err)
	}
	g.coreV1, g.discoveryV1, g.networkingV1 = CoreV1{core}, DiscoveryV1{disc}, NetworkingV1{netw}
	return &g, nil
}

// servedGroups are the groups' clients answered by the embedded API
// server.
func servedGroups(server kubeclient.Server) *groups {
	return &groups{
		coreV1:       CoreV1{kubeclient.NewServedSource(server, corev1.SchemeGroupVersion)},
		discoveryV1:  DiscoveryV1{kubeclient.NewServedSource(server, discoveryv1.SchemeGroupVersion)},
		networkingV1: NetworkingV1{kubeclient.NewServedSource(server, networkingv1.SchemeGroupVersion)},
	}
}
