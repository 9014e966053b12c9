package k8sapi

import (
	"context"
	"fmt"
	"net/http"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/cellium/cellium/pkg/kubeclient"
)

// Scheme holds the kinds of cellium.io/v1alpha1 and nothing else. It is
// made on first use, not at the agent's start: only the crd identity mode
// and the dev-cluster use it.
var Scheme = sync.OnceValue(func() *runtime.Scheme {
	s := runtime.NewScheme()
	if err := AddToScheme(s); err != nil {
		panic(err)
	}
	return s
})

// Client reads and writes the custom resources, and installs their CRDs.
type Client struct {
	rest     rest.Interface
	dyn      dynamic.Interface
	coord    kubeclient.Source
	requests *prometheus.CounterVec
}

// NewClient makes a Client for the API server of cfg. It does no I/O.
func NewClient(cfg *rest.Config) (*Client, error) {
	requests := newRequests()
	cfg = rest.CopyConfig(cfg)
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { return counting{next: rt, requests: requests} })
	rc := rest.CopyConfig(cfg)
	rc.GroupVersion = &GroupVersion
	rc.APIPath = "/apis"
	rc.ContentType = runtime.ContentTypeJSON
	rc.NegotiatedSerializer = serializer.NewCodecFactory(Scheme()).WithoutConversion()
	r, err := rest.RESTClientFor(rc)
	if err != nil {
		return nil, fmt.Errorf("%s client for %s: %w", GroupVersion, cfg.Host, err)
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("dynamic client for %s: %w", cfg.Host, err)
	}
	httpClient, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("HTTP client for %s: %w", cfg.Host, err)
	}
	coord, err := kubeclient.NewRESTSource(cfg, httpClient, coordinationv1.SchemeGroupVersion)
	if err != nil {
		return nil, fmt.Errorf("coordination client for %s: %w", cfg.Host, err)
	}
	return &Client{rest: r, dyn: dyn, coord: coord, requests: requests}, nil
}

// Leases is the client of the Leases in namespace (the identity
// collector's election).
func (c *Client) Leases(namespace string) kubeclient.Client[*coordinationv1.Lease, *coordinationv1.LeaseList] {
	return kubeclient.New(c.coord, "leases", "Lease", namespace, func(l *coordinationv1.LeaseList) *[]coordinationv1.Lease { return &l.Items })
}

// CreateIdentity creates an identity; an error satisfying
// apierrors.IsAlreadyExists when its number is taken.
func (c *Client) CreateIdentity(ctx context.Context, id *CelliumIdentity) (*CelliumIdentity, error) {
	return create(ctx, c, "", ResourceIdentities, id, &CelliumIdentity{})
}

// GetIdentity reads the identity named name.
func (c *Client) GetIdentity(ctx context.Context, name string) (*CelliumIdentity, error) {
	out := &CelliumIdentity{}
	return out, c.rest.Get().Resource(ResourceIdentities).Name(name).Do(ctx).Into(out)
}

// DeleteIdentity deletes the identity named name if its resource version
// is still resourceVersion ("" for any): a conflict error otherwise.
func (c *Client) DeleteIdentity(ctx context.Context, name, resourceVersion string) error {
	return c.delete(ctx, "", ResourceIdentities, name, metav1.Preconditions{ResourceVersion: ptrUnlessEmpty(resourceVersion)})
}

// CreateEndpoint creates an endpoint in its namespace.
func (c *Client) CreateEndpoint(ctx context.Context, ep *CelliumEndpoint) (*CelliumEndpoint, error) {
	return create(ctx, c, ep.Namespace, ResourceEndpoints, ep, &CelliumEndpoint{})
}

// UpdateEndpoint replaces an endpoint (its resource version set: a
// conflict error when it changed meanwhile).
func (c *Client) UpdateEndpoint(ctx context.Context, ep *CelliumEndpoint) (*CelliumEndpoint, error) {
	out := &CelliumEndpoint{}
	return out, c.rest.Put().Namespace(ep.Namespace).Resource(ResourceEndpoints).Name(ep.Name).Body(ep).Do(ctx).Into(out)
}

// DeleteEndpoint deletes the endpoint namespace/name if its UID is still
// uid ("" for any).
func (c *Client) DeleteEndpoint(ctx context.Context, namespace, name string, uid types.UID) error {
	var pre metav1.Preconditions
	if uid != "" {
		pre.UID = &uid
	}
	return c.delete(ctx, namespace, ResourceEndpoints, name, pre)
}

// IdentityListWatch lists (in pages, kubeclient.Paged) and watches every
// identity.
func (c *Client) IdentityListWatch() cache.ListerWatcher {
	return kubeclient.Paged(cache.NewListWatchFromClient(c.rest, ResourceIdentities, metav1.NamespaceAll, fields.Everything()))
}

// EndpointListWatch lists and watches the endpoints of every namespace,
// those matching labelSelector when it is not "".
func (c *Client) EndpointListWatch(labelSelector string) cache.ListerWatcher {
	return kubeclient.Paged(cache.NewFilteredListWatchFromClient(c.rest, ResourceEndpoints, metav1.NamespaceAll, func(o *metav1.ListOptions) {
		o.LabelSelector = labelSelector
	}))
}

// ListEndpoints lists the endpoints matching labelSelector, in every
// namespace.
func (c *Client) ListEndpoints(ctx context.Context, labelSelector string) (*CelliumEndpointList, error) {
	out := &CelliumEndpointList{}
	return out, c.rest.Get().Resource(ResourceEndpoints).
		VersionedParams(&metav1.ListOptions{LabelSelector: labelSelector}, metav1.ParameterCodec).Do(ctx).Into(out)
}

// ListIdentities lists every identity.
func (c *Client) ListIdentities(ctx context.Context) (*CelliumIdentityList, error) {
	out := &CelliumIdentityList{}
	return out, c.rest.Get().Resource(ResourceIdentities).Do(ctx).Into(out)
}

func create[T runtime.Object](ctx context.Context, c *Client, namespace, resource string, obj, out T) (T, error) {
	err := c.rest.Post().NamespaceIfScoped(namespace, namespace != "").Resource(resource).Body(obj).Do(ctx).Into(out)
	return out, err
}

func (c *Client) delete(ctx context.Context, namespace, resource, name string, pre metav1.Preconditions) error {
	opts := metav1.DeleteOptions{Preconditions: &pre}
	return c.rest.Delete().NamespaceIfScoped(namespace, namespace != "").Resource(resource).Name(name).Body(&opts).Do(ctx).Error()
}

func ptrUnlessEmpty(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}
