// Package kubeclient is the agent's typed Kubernetes client: the methods
// of client-go's generated typed clients, over a REST client of a scheme of
// the few API groups the agent reads and writes, or over a Server (the
// embedded API server).
//
// client-go's generated typed clients (k8s.io/client-go/kubernetes/typed/...)
// are not used: each of their packages imports client-go's scheme, whose
// initialization registers every kind of every API group Kubernetes serves
// (~50 groups, ~1,500 types, by reflection), and with it links all of their
// code. That was a fifth of the agent's binary and most of the pages its
// start touched: the agent's idle memory. The types themselves
// (k8s.io/api/<group>/<version>) are the same: only the groups in Scheme are
// linked.
//
// client-go's generic typed client (gentype) is not used either: it
// imports client-go's testing package for its fake clients, and with it
// strategic merge patch, managed fields, structured-merge-diff's typed
// values, kube-openapi and gnostic's OpenAPI models (~50 packages, whose
// initializers an idle agent's pages held). client.go serves the methods
// the agent uses over rest.Interface the same way (the same requests).
package kubeclient

import (
	"context"

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

// typed are the methods of client-go's generated typed clients the agent
// uses.
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

// object is what a client needs of a typed object: *corev1.Service, say,
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
