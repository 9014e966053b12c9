package k8sapi

import (
	"context"
	"sync"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/watchlist"
)

// Inform is the one list-and-watch loop of the custom resources (the
// identity allocator's CelliumIdentity objects, k8s-endpoints'
// CelliumEndpoint objects). It runs an informer of lw's objects, each of
// the type of example and trimmed by lean before the informer stores it,
// until ctx ends. Every object added or updated goes to apply with deleted
// false, every one deleted (a DeletedFinalStateUnknown unwrapped) with
// deleted true.
//
// listed is called once, when the first list has gone to apply and no
// failure is outstanding, just before state's first nil: the moment a
// caller marks its table initialized. A failure between the first list
// and the watch holds it back until the watch is established.
//
// state says how the watch goes: nil once the first list has gone to
// apply (the objects are listed and watched); the error each time a list
// or watch request or the list-and-watch fails (the API server gone,
// access revoked, an answer it cannot read: the informer retries with
// backoff), before the first list too; and nil again once a watch is
// established after such a failure, when the first list is done. Neither
// listed nor state is called concurrently with the other or itself.
// Inform returns once the informer has stopped.
func Inform[T runtime.Object](ctx context.Context, lw cache.ListerWatcher, example T, lean func(T) T, apply func(obj T, deleted bool), listed func(), state func(err error)) error {
	w := &watchState{report: state, onListed: listed}
	inf := cache.NewSharedIndexInformer(w.wrap(lw), example, 0, cache.Indexers{})
	err := inf.SetTransform(func(obj any) (any, error) {
		if o, ok := obj.(T); ok {
			return lean(o), nil
		}
		return obj, nil
	})
	if err != nil {
		return err
	}
	if err := inf.SetWatchErrorHandlerWithContext(func(ctx context.Context, r *cache.Reflector, err error) {
		cache.DefaultWatchErrorHandler(ctx, r, err)
		w.failed(err)
	}); err != nil {
		return err
	}
	handle := func(obj any, deleted bool) {
		if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = d.Obj
		}
		if o, ok := obj.(T); ok {
			apply(o, deleted)
		}
	}
	reg, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { handle(obj, false) },
		UpdateFunc: func(_, obj any) { handle(obj, false) },
		DeleteFunc: func(obj any) { handle(obj, true) },
	})
	if err != nil {
		return err
	}
	done := make(chan struct{})
	go func() { defer close(done); inf.RunWithContext(ctx) }()
	// Waits on the handler's channel: WaitForCacheSync looks every
	// 100 ms, which a start waited for.
	if cache.WaitFor(ctx, "", reg.HasSyncedChecker()) {
		w.synced()
	}
	<-done
	return nil
}

// watchState turns the informer's failures and its later successful
// requests into Inform's state calls.
type watchState struct {
	report   func(error)
	onListed func()

	mu sync.Mutex
	// listed is set once the first list has gone to apply (a failure
	// seen before Inform notices it keeps it from saying nil); broken
	// while the last list-and-watch failed and no request has succeeded
	// since.
	listed, broken bool
	// told is set once onListed has been called.
	told bool
}

// ok reports nil, telling onListed first the first time. w.mu is held.
func (w *watchState) ok() {
	if !w.told {
		w.told = true
		w.onListed()
	}
	w.report(nil)
}

func (w *watchState) synced() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.listed = true
	if !w.broken {
		w.ok()
	}
}

func (w *watchState) failed(err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.broken = true
	w.report(err)
}

// answered is a list or watch request's outcome. A failed one is a
// failure of its own: the informer retries a refused connection without
// calling its watch error handler. A request ended by ctx is no failure.
// A watch that is answered mends a failure (a list is not enough: its
// answer may be one the informer cannot read, and it would say nil
// between the failures of each retry).
func (w *watchState) answered(ctx context.Context, err error) {
	if err != nil {
		if ctx.Err() == nil {
			w.failed(err)
		}
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.broken && w.listed {
		w.ok()
	}
	w.broken = false
}

// wrap is lw with each request's outcome noted.
func (w *watchState) wrap(lw cache.ListerWatcher) cache.ListerWatcher {
	inner := cache.ToListerWatcherWithContext(lw)
	return &notingLW{inner: inner, w: w, noWatchList: watchlist.DoesClientNotSupportWatchListSemantics(lw)}
}

// notingLW is a ListerWatcher that tells its watchState how each request
// went. It keeps whether the wrapped one supports the WatchList
// semantics (the fake clientset's does not).
type notingLW struct {
	inner       cache.ListerWatcherWithContext
	w           *watchState
	noWatchList bool
}

func (l *notingLW) ListWithContext(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
	obj, err := l.inner.ListWithContext(ctx, opts)
	if err != nil {
		l.w.answered(ctx, err)
	}
	return obj, err
}

func (l *notingLW) WatchWithContext(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	wi, err := l.inner.WatchWithContext(ctx, opts)
	l.w.answered(ctx, err)
	return wi, err
}

func (l *notingLW) List(opts metav1.ListOptions) (runtime.Object, error) {
	return l.ListWithContext(context.Background(), opts)
}

func (l *notingLW) Watch(opts metav1.ListOptions) (watch.Interface, error) {
	return l.WatchWithContext(context.Background(), opts)
}

func (l *notingLW) IsWatchListSemanticsUnSupported() bool { return l.noWatchList }
