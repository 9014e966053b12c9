package k8sapi

import (
	"context"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/cache"
)

// Inform is the one list-and-watch loop of the custom resources (the
// identity allocator's CelliumIdentity objects, k8s-endpoints'
// CelliumEndpoint objects). It runs an informer of lw's objects, each of
// the type of example and trimmed by lean before the informer stores it,
// until ctx ends. Every object added or updated goes to apply with deleted
// false, every one deleted (a DeletedFinalStateUnknown unwrapped) with
// deleted true; synced is called once the first list has gone to apply.
// It returns once the informer has stopped.
func Inform[T runtime.Object](ctx context.Context, lw cache.ListerWatcher, example T, lean func(T) T, apply func(obj T, deleted bool), synced func()) error {
	inf := cache.NewSharedIndexInformer(lw, example, 0, cache.Indexers{})
	err := inf.SetTransform(func(obj any) (any, error) {
		if o, ok := obj.(T); ok {
			return lean(o), nil
		}
		return obj, nil
	})
	if err != nil {
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
		synced()
	}
	<-done
	return nil
}
