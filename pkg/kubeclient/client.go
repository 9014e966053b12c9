package kubeclient

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
)

// Source makes the clients of one API group version: over a REST client
// of a real API server, or over a Server (the embedded API server).
type Source struct {
	rest   rest.Interface
	server Server
	gv     schema.GroupVersion
}

// Server answers clients' requests in place of an API server: the
// embedded API server. Invoke answers every verb but "watch", which
// InvokeWatch answers.
type Server interface {
	Invoke(req Request) (runtime.Object, error)
	InvokeWatch(req Request) (watch.Interface, error)
}

// Request is one call of a client on a Server.
type Request struct {
	// Verb is get, list, watch, create, update, delete or patch.
	Verb     string
	Resource schema.GroupVersionResource
	// Subresource is "status" for UpdateStatus, and a patch's
	// subresource.
	Subresource string
	// Namespace is "" for all namespaces, or a cluster-scoped resource.
	Namespace string
	// Name is the object of a get, delete or patch.
	Name string
	// Kind is the listed objects' kind (a list).
	Kind schema.GroupVersionKind
	// Object is what a create or an update writes.
	Object runtime.Object
	// ListOptions are a list's or a watch's.
	ListOptions metav1.ListOptions
	// PatchType and Patch are a patch's.
	PatchType types.PatchType
	Patch     []byte
}

// NewRESTSource is the source of group version gv's clients on the API
// server of cfg, through httpClient (shared by the groups, as client-go's
// Clientset shares one).
//
// Its clients talk protobuf (accepting JSON) when cfg names no content
// type, as client-go's generated clients do: lists, watches and the bodies
// of writes; a patch is sent as its patch type. Leave cfg.ContentType
// empty: set, it is used for every request.
func NewRESTSource(cfg *rest.Config, httpClient *http.Client, gv schema.GroupVersion) (Source, error) {
	c := *cfg
	c.GroupVersion = &gv
	c.APIPath = "/apis"
	if gv.Group == "" {
		c.APIPath = "/api"
	}
	c.NegotiatedSerializer = rest.CodecFactoryForGeneratedClient(Scheme, Codecs).WithoutConversion()
	if c.UserAgent == "" {
		c.UserAgent = rest.DefaultKubernetesUserAgent()
	}
	rc, err := rest.RESTClientForConfigAndClient(&c, httpClient)
	if err != nil {
		return Source{}, err
	}
	return Source{rest: rc, gv: gv}, nil
}

// NewServedSource is the source of group version gv's clients answered by
// server.
func NewServedSource(server Server, gv schema.GroupVersion) Source {
	return Source{server: server, gv: gv}
}

// RESTClient is the REST client of a source from NewRESTSource, nil for a
// Server's.
func (s Source) RESTClient() rest.Interface { return s.rest }

// New is the client of resource (of kind, whose list is kind+"List") in
// namespace ns ("" for all or for a cluster-scoped resource), with items
// the Items of its list type.
func New[E any, T object[E], L list[E]](s Source, resource, kind, ns string, items func(L) *[]E) Client[T, L] {
	return &client[E, T, L]{
		rest: s.rest, server: s.server, gvr: s.gv.WithResource(resource), gvk: s.gv.WithKind(kind),
		ns: ns, listKind: kind + "List", items: items,
	}
}

// client is a Client: on a REST client, the requests client-go's generated
// clients make (protobuf preferred); on a Server, its answers.
type client[E any, T object[E], L list[E]] struct {
	// One of rest and server is set.
	rest     rest.Interface
	server   Server
	gvr      schema.GroupVersionResource
	gvk      schema.GroupVersionKind
	ns       string
	listKind string
	items    func(L) *[]E
}

func (c *client[E, T, L]) newObject() T { return T(new(E)) }

func (c *client[E, T, L]) newList() L {
	obj, err := Scheme.New(c.gvk.GroupVersion().WithKind(c.listKind))
	if err != nil {
		panic(err)
	}
	return obj.(L)
}

// request starts a REST request of the client's resource and namespace.
func (c *client[E, T, L]) request(r *rest.Request) *rest.Request {
	return r.UseProtobufAsDefault().NamespaceIfScoped(c.ns, c.ns != "").Resource(c.gvr.Resource)
}

func timeoutOf(opts metav1.ListOptions) time.Duration {
	if opts.TimeoutSeconds == nil {
		return 0
	}
	return time.Duration(*opts.TimeoutSeconds) * time.Second
}

// served is the server's answer to req, of type R (T or L); a zero R for
// none.
func served[R runtime.Object](invoke func(Request) (runtime.Object, error), req Request, empty func() R) (R, error) {
	obj, err := invoke(req)
	if obj == nil {
		return empty(), err
	}
	r, ok := obj.(R)
	if !ok {
		return empty(), fmt.Errorf("%s %s: the embedded API server answered with a %T", req.Verb, req.Resource.Resource, obj)
	}
	return r, err
}

func (c *client[E, T, L]) invoke(req Request) (runtime.Object, error) {
	req.Resource, req.Namespace = c.gvr, c.ns
	return c.server.Invoke(req)
}

func (c *client[E, T, L]) Get(ctx context.Context, name string, opts metav1.GetOptions) (T, error) {
	if c.server != nil {
		return served(c.invoke, Request{Verb: "get", Name: name}, c.newObject)
	}
	result := c.newObject()
	err := c.request(c.rest.Get()).Name(name).VersionedParams(&opts, ParameterCodec).Do(ctx).Into(result)
	return result, err
}

// List lists the resource. A Server's list is filtered by the options'
// label selector here, as client-go's fake clients do; its field
// selector is not applied.
func (c *client[E, T, L]) List(ctx context.Context, opts metav1.ListOptions) (L, error) {
	if c.server != nil {
		l, err := served(c.invoke, Request{Verb: "list", Kind: c.gvk, ListOptions: opts}, c.newList)
		if err != nil || opts.LabelSelector == "" {
			return l, err
		}
		sel, err := labels.Parse(opts.LabelSelector)
		if err != nil {
			return c.newList(), fmt.Errorf("list %s: invalid label selector %q: %w", c.gvr.Resource, opts.LabelSelector, err)
		}
		out := c.newList()
		out.SetResourceVersion(l.GetResourceVersion())
		out.SetContinue(l.GetContinue())
		out.SetRemainingItemCount(l.GetRemainingItemCount())
		out.SetSelfLink(l.GetSelfLink())
		for _, item := range *c.items(l) {
			if acc, err := meta.Accessor(T(&item)); err == nil && sel.Matches(labels.Set(acc.GetLabels())) {
				*c.items(out) = append(*c.items(out), item)
			}
		}
		return out, nil
	}
	result := c.newList()
	err := c.request(c.rest.Get()).VersionedParams(&opts, ParameterCodec).Timeout(timeoutOf(opts)).Do(ctx).Into(result)
	return result, err
}

func (c *client[E, T, L]) Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	opts.Watch = true
	if c.server != nil {
		return c.server.InvokeWatch(Request{Verb: "watch", Resource: c.gvr, Namespace: c.ns, ListOptions: opts})
	}
	return c.request(c.rest.Get()).VersionedParams(&opts, ParameterCodec).Timeout(timeoutOf(opts)).Watch(ctx)
}

func (c *client[E, T, L]) Create(ctx context.Context, obj T, opts metav1.CreateOptions) (T, error) {
	if c.server != nil {
		return served(c.invoke, Request{Verb: "create", Object: obj}, c.newObject)
	}
	result := c.newObject()
	err := c.request(c.rest.Post()).VersionedParams(&opts, ParameterCodec).Body(obj).Do(ctx).Into(result)
	return result, err
}

func (c *client[E, T, L]) Update(ctx context.Context, obj T, opts metav1.UpdateOptions) (T, error) {
	return c.update(ctx, obj, opts, "")
}

func (c *client[E, T, L]) UpdateStatus(ctx context.Context, obj T, opts metav1.UpdateOptions) (T, error) {
	return c.update(ctx, obj, opts, "status")
}

func (c *client[E, T, L]) update(ctx context.Context, obj T, opts metav1.UpdateOptions, subresource string) (T, error) {
	if c.server != nil {
		return served(c.invoke, Request{Verb: "update", Subresource: subresource, Name: obj.GetName(), Object: obj}, c.newObject)
	}
	result := c.newObject()
	r := c.request(c.rest.Put()).Name(obj.GetName())
	if subresource != "" {
		r = r.SubResource(subresource)
	}
	err := r.VersionedParams(&opts, ParameterCodec).Body(obj).Do(ctx).Into(result)
	return result, err
}

func (c *client[E, T, L]) Delete(ctx context.Context, name string, opts metav1.DeleteOptions) error {
	if c.server != nil {
		_, err := c.invoke(Request{Verb: "delete", Name: name})
		return err
	}
	return c.request(c.rest.Delete()).Name(name).Body(&opts).Do(ctx).Error()
}

func (c *client[E, T, L]) Patch(ctx context.Context, name string, pt types.PatchType, data []byte, opts metav1.PatchOptions, subresources ...string) (T, error) {
	if c.server != nil {
		if len(subresources) > 1 {
			return c.newObject(), fmt.Errorf("patch %s %s: subresources %v: at most one", c.gvr.Resource, name, subresources)
		}
		req := Request{Verb: "patch", Name: name, PatchType: pt, Patch: data}
		if len(subresources) == 1 {
			req.Subresource = subresources[0]
		}
		return served(c.invoke, req, c.newObject)
	}
	result := c.newObject()
	err := c.request(c.rest.Patch(pt)).Name(name).SubResource(subresources...).
		VersionedParams(&opts, ParameterCodec).Body(data).Do(ctx).Into(result)
	return result, err
}
