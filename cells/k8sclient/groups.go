package k8sclient

import (
	"fmt"

	"k8s.io/client-go/discovery"
	"k8s.io/client-go/kubernetes"
	corev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	discoveryv1 "k8s.io/client-go/kubernetes/typed/discovery/v1"
	networkingv1 "k8s.io/client-go/kubernetes/typed/networking/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/flowcontrol"
)

// groups is a kubernetes.Interface with the typed clients of the API groups
// the agent's cells use, and no others. client-go's Clientset, and its fake,
// build a typed client for each of the ~50 groups Kubernetes serves, which
// links every one of them (their generic clients, apply configurations,
// fakes) into the agent: a fifth of its code, read by the start.
//
// A group not listed here is the nil interface embedded: calling it panics.
// A cell that needs another group adds it here, beside its method.
type groups struct {
	kubernetes.Interface

	discovery    discovery.DiscoveryInterfaces
	coreV1       corev1.CoreV1Interface
	discoveryV1  discoveryv1.DiscoveryV1Interface
	networkingV1 networkingv1.NetworkingV1Interface
}

func (g *groups) Discovery() discovery.DiscoveryInterfaces         { return g.discovery }
func (g *groups) CoreV1() corev1.CoreV1Interface                   { return g.coreV1 }
func (g *groups) DiscoveryV1() discoveryv1.DiscoveryV1Interface    { return g.discoveryV1 }
func (g *groups) NetworkingV1() networkingv1.NetworkingV1Interface { return g.networkingV1 }

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
	if g.discovery, err = discovery.NewDiscoveryClientForConfigAndClient(&cfg, httpClient); err != nil {
		return nil, fmt.Errorf("discovery client: %w", err)
	}
	if g.coreV1, err = corev1.NewForConfigAndClient(&cfg, httpClient); err != nil {
		return nil, fmt.Errorf("core/v1 client: %w", err)
	}
	if g.discoveryV1, err = discoveryv1.NewForConfigAndClient(&cfg, httpClient); err != nil {
		return nil, fmt.Errorf("discovery.k8s.io/v1 client: %w", err)
	}
	if g.networkingV1, err = networkingv1.NewForConfigAndClient(&cfg, httpClient); err != nil {
		return nil, fmt.Errorf("networking.k8s.io/v1 client: %w", err)
	}
	return &g, nil
}
