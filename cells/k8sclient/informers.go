package k8sclient

import (
	"context"
	"sync"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"

	"github.com/cellium/cellium/pkg/kubeclient"
)

// NewInformer is a shared index informer of the objects (of example's
// type) that c lists and watches, with tweak (when not nil) applied to
// every list and watch, and the namespace index: what client-go's informer
// factory makes for a kind. The factory is not used: it knows every kind
// of every API group, which links all of their informers, listers and
// clients into the agent. It lists in pages, never a streaming list
// (kubeclient.Paged).
func NewInformer[T, L runtime.Object](cs Clientset, c kubeclient.Client[T, L], example T, tweak func(*metav1.ListOptions)) cache.SharedIndexInformer {
	opts := func(o metav1.ListOptions) metav1.ListOptions {
		if tweak != nil {
			tweak(&o)
		}
		return o
	}
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return c.List(ctx, opts(o))
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return c.Watch(ctx, opts(o))
		},
	}
	return cache.NewSharedIndexInformerWithOptions(kubeclient.Paged(lw), example,
		cache.SharedIndexInformerOptions{Indexers: cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc}})
}

// Informers runs a cell's informers: Start runs each until its context
// ends, Shutdown waits for them to have stopped (client-go's informer
// factory's Start and Shutdown).
type Informers struct {
	mu      sync.Mutex
	started map[cache.SharedIndexInformer]bool
	wg      sync.WaitGroup
	all     []cache.SharedIndexInformer
}

// NewInformers runs informers.
func NewInformers(informers ...cache.SharedIndexInformer) *Informers {
	return &Informers{all: informers, started: map[cache.SharedIndexInformer]bool{}}
}

// Start runs the informers not yet started until ctx ends.
func (f *Informers) Start(ctx context.Context) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, inf := range f.all {
		if !f.started[inf] {
			f.started[inf] = true
			f.wg.Go(func() { inf.RunWithContext(ctx) })
		}
	}
}

// Shutdown returns once every started informer has stopped (their
// context has ended).
func (f *Informers) Shutdown() { f.wg.Wait() }
