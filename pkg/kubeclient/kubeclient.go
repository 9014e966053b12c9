// Package kubeclient is the agent's typed Kubernetes client: client-go's
// generic typed client (gentype) over a scheme of the few API groups the
// agent reads and writes.
//
// client-go's generated typed clients (k8s.io/client-go/kubernetes/typed/...)
// are not used: each of their packages imports client-go's scheme, whose
// initialization registers every kind of every API group Kubernetes serves
// (~50 groups, ~1,500 types, by reflection), and with it links all of their
// code. That was a fifth of the agent's binary and most of the pages its
// start touched: the agent's idle memory. The types themselves
// (k8s.io/api/<group>/<version>) are the same: only the groups in Scheme are
// linked.
package kubeclient

import (
	"context"
	"net/http"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/gentype"
	"k8s.io/client-go/rest"
	k8stesting "k8s.io/client-go/testing"
)

// Scheme holds the kinds of the API groups the agent uses: core/v1,
// discovery.k8s.io/v1, networking.k8s.io/v1 and coordination.k8s.io/v1
// (the identity collector's Lease), and the meta kinds of every version.
var Scheme = runtime.NewScheme()

// Codecs and ParameterCodec are Scheme's.
var (
	Codecs         = serializer.NewCodecFactory(Scheme)
	ParameterCodec = runtime.NewParameterCodec(Scheme)
)

// GroupVersions are the API groups of Scheme.
var GroupVersions = []schema.GroupVersion{
	corev1.SchemeGroupVersion,
	discoveryv1.SchemeGroupVersion,
	networkingv1.SchemeGroupVersion,
	coordinationv1.SchemeGroupVersion,
}

func init() {
	metav1.AddToGroupVersion(Scheme, schema.GroupVersion{Version: "v1"})
	for _, add := range []func(*runtime.Scheme) error{
		corev1.AddToScheme, discoveryv1.AddToScheme, networkingv1.AddToScheme, coordinationv1.AddToScheme,
	} {
		if err := add(Scheme); err != nil {
			panic(err)
		}
	}
}

// Client is a typed client of one resource (in one namespace, or all):
// the methods the agent uses of client-go's generated ones (PatchStatus is
// Patch with the "status" subresource), and ListPages.
type Client[T, L runtime.Object] interface {
	typed[T, L]
	// ListPages lists every page of a listing (opts.Limit objects each),
	// decoding the objects one at a time and calling each with every one
	// in turn, and returns the last page's list metadata. obj is only
	// valid until each returns: the next object is decoded into it, so
	// each keeps none of its pointers (its strings are its own). A page
	// is never a typed list in memory; the next is asked for while one is
	// decoded (at most one page ahead). The objects come without their
	// managed fields (nothing in the agent reads them) and with only the
	// labels and annotations trim keeps.
	ListPages(ctx context.Context, opts metav1.ListOptions, trim Trim, each func(obj T) error) (metav1.ListMeta, error)
}

// typed are the methods of client-go's generic typed client.
type typed[T, L runtime.Object] interface {
	Get(ctx context.Context, name string, opts metav1.GetOptions) (T, error)
	List(ctx context.Context, opts metav1.ListOptions) (L, error)
	Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error)
	Create(ctx context.Context, obj T, opts metav1.CreateOptions) (T, error)
	Update(ctx context.Context, obj T, opts metav1.UpdateOptions) (T, error)
	UpdateStatus(ctx context.Context, obj T, opts metav1.UpdateOptions) (T, error)
	Delete(ctx context.Context, name string, opts metav1.DeleteOptions) error
	Patch(ctx context.Context, name string, pt types.PatchType, data []byte, opts metav1.PatchOptions, subresources ...string) (T, error)
}

// object is what gentype needs of a typed object: *corev1.Service, say,
// and its protobuf decoding (every type of k8s.io/api has it).
type object[E any] interface {
	*E
	runtime.Object
	metav1.Object
	Unmarshal(data []byte) error
}

// list is a typed list of E: *corev1.ServiceList, say.
type list[E any] interface {
	runtime.Object
	metav1.ListInterface
}

// Source makes the clients of one API group version: over a REST client
// of a real API server, or over the reactors of an embedded fake.
type Source struct {
	rest rest.Interface
	fake *k8stesting.Fake
	gv   schema.GroupVersion
}

// NewRESTSource is the source of group version gv's clients on the API
// server of cfg, through httpClient (shared by the groups, as client-go's
// Clientset shares one).
//
// Its clients talk protobuf (accepting JSON) when cfg names no content
// type, as client-go's generated clients do: lists, watches and the bodies
// of writes (New's clients prefer protobuf, gentype.PrefersProtobuf); a
// patch is sent as its patch type. Leave cfg.ContentType empty: set, it is
// used for every request. Requests built on RESTClient directly are JSON
// unless they ask otherwise.
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

// NewFakeSource is the source of group version gv's clients answered by
// fake's reactors.
func NewFakeSource(fake *k8stesting.Fake, gv schema.GroupVersion) Source {
	return Source{fake: fake, gv: gv}
}

// RESTClient is the REST client of a source from NewRESTSource, nil for a
// fake.
func (s Source) RESTClient() rest.Interface { return s.rest }

// New is the client of resource (of kind, whose list is kind+"List") in
// namespace ns ("" for all or for a cluster-scoped resource), with items
// the Items of its list type.
func New[E any, T object[E], L list[E]](s Source, resource, kind, ns string, items func(L) *[]E) Client[T, L] {
	newObj := func() T { return T(new(E)) }
	newList := func() L {
		obj, err := Scheme.New(s.gv.WithKind(kind + "List"))
		if err != nil {
			panic(err)
		}
		return obj.(L)
	}
	if s.fake != nil {
		fake := gentype.NewFakeClientWithList[T, L](s.fake, ns,
			s.gv.WithResource(resource), s.gv.WithKind(kind), newObj, newList,
			func(dst, src L) {
				dst.SetResourceVersion(src.GetResourceVersion())
				dst.SetContinue(src.GetContinue())
				dst.SetRemainingItemCount(src.GetRemainingItemCount())
				dst.SetSelfLink(src.GetSelfLink())
			},
			func(l L) []T {
				out := make([]T, len(*items(l)))
				for i := range *items(l) {
					out[i] = &(*items(l))[i]
				}
				return out
			},
			func(l L, ts []T) {
				out := make([]E, len(ts))
				for i, t := range ts {
					out[i] = *t
				}
				*items(l) = out
			})
		return &client[E, T, L]{typed: fake, items: items}
	}
	return &client[E, T, L]{
		typed: gentype.NewClientWithList[T, L](resource, s.rest, ParameterCodec, ns, newObj, newList, gentype.PrefersProtobuf[T]()),
		rest:  s.rest, resource: resource, ns: ns, listKind: kind + "List", newList: newList, items: items,
	}
}

// client is a Client: client-go's generic typed client, and ListPages.
type client[E any, T object[E], L list[E]] struct {
	typed[T, L]
	// rest is nil for a fake's client.
	rest     rest.Interface
	resource string
	ns       string
	listKind string
	newList  func() L
	items    func(L) *[]E
}
