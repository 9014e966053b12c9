package loadbalancer_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/cilium/hive/script"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/cellium/cellium/cells/k8sclient"
	"github.com/cellium/cellium/cells/k8sclient/k8sclienttest"
)

// fakeK8s drives the fake clientset of k8sclienttest.Cell for the tests:
// it creates, updates and deletes objects, holds LISTs (to see the tables
// wait for the initial sync), fails them, and expires watches (to make the
// reflectors relist).
type fakeK8s struct {
	cs *k8sclient.Fake

	mu       sync.Mutex
	listGate chan struct{}
	// listErr, when set, is the answer to every LIST.
	listErr error
	watches []*expirableWatch
	// calls counts the LISTs and WATCHes per resource ("list services");
	// called is closed and replaced on each.
	calls  map[string]int
	called chan struct{}
}

func newFakeK8s(t testing.TB) *fakeK8s {
	f := &fakeK8s{
		listGate: make(chan struct{}),
		calls:    map[string]int{},
		called:   make(chan struct{}),
	}
	close(f.listGate)
	t.Cleanup(f.releaseLists)
	return f
}

// attach puts the test's reactors in front of the clientset's own. Invoke
// it from the hive, which builds the clientset.
func (f *fakeK8s) attach(cs *k8sclient.Fake) {
	f.cs = cs
	watchers := cs.WatchChain()
	cs.PrependReactor("list", "*", func(action k8sclient.Action) (bool, runtime.Object, error) {
		f.mu.Lock()
		gate := f.listGate
		f.mu.Unlock()
		<-gate
		f.count(action)
		f.mu.Lock()
		err := f.listErr
		f.mu.Unlock()
		if err != nil {
			return true, nil, err
		}
		// Not handled: the tracker answers.
		return false, nil, nil
	})
	cs.PrependWatchReactor("*", func(action k8sclient.Action) (bool, watch.Interface, error) {
		handled, inner, err := watchers(action)
		if !handled || err != nil {
			return handled, nil, err
		}
		w := newExpirableWatch(inner)
		f.mu.Lock()
		f.watches = append(f.watches, w)
		f.mu.Unlock()
		f.count(action)
		return true, w, nil
	})
}

func (f *fakeK8s) count(action k8sclient.Action) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls[action.Verb+" "+action.Resource.Resource]++
	close(f.called)
	f.called = make(chan struct{})
}

func (f *fakeK8s) holdLists() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.listGate = make(chan struct{})
}

func (f *fakeK8s) releaseLists() {
	f.mu.Lock()
	defer f.mu.Unlock()
	select {
	case <-f.listGate:
	default:
		close(f.listGate)
	}
}

// expireWatches ends every open watch and returns once none passes events
// on, so whatever the script changes next reaches the reflectors only
// through their relist.
func (f *fakeK8s) expireWatches() {
	f.mu.Lock()
	watches := f.watches
	f.watches = nil
	f.mu.Unlock()
	for _, w := range watches {
		w.expire()
	}
}

// waitCalls waits until Services and EndpointSlices have each seen n calls
// of verb (list or watch).
func (f *fakeK8s) waitCalls(ctx context.Context, verb string, n int) error {
	for {
		f.mu.Lock()
		done := f.calls[verb+" services"] >= n && f.calls[verb+" endpointslices"] >= n
		called := f.called
		f.mu.Unlock()
		if done {
			return nil
		}
		select {
		case <-called:
		case <-ctx.Done():
			return fmt.Errorf("waiting for %d %s calls on services and endpointslices: %w", n, verb, ctx.Err())
		}
	}
}

func (f *fakeK8s) commands() map[string]script.Cmd {
	cmds := k8sclienttest.ScriptCommands(func() *k8sclient.Fake { return f.cs })
	maps.Copy(cmds, map[string]script.Cmd{
		"k8s/hold-lists": script.Command(
			script.CmdUsage{Summary: "Make LISTs wait until k8s/release-lists"},
			func(*script.State, ...string) (script.WaitFunc, error) { f.holdLists(); return nil, nil }),
		"k8s/release-lists": script.Command(
			script.CmdUsage{Summary: "Let held LISTs answer"},
			func(*script.State, ...string) (script.WaitFunc, error) { f.releaseLists(); return nil, nil }),
		"k8s/fail-lists": script.Command(
			script.CmdUsage{Summary: "Answer every LIST with 403 Forbidden until k8s/heal-lists"},
			func(*script.State, ...string) (script.WaitFunc, error) {
				f.mu.Lock()
				defer f.mu.Unlock()
				f.listErr = apierrors.NewForbidden(schema.GroupResource{Resource: "services"}, "", errors.New("RBAC says no"))
				return nil, nil
			}),
		"k8s/heal-lists": script.Command(
			script.CmdUsage{Summary: "Answer LISTs again"},
			func(*script.State, ...string) (script.WaitFunc, error) {
				f.mu.Lock()
				defer f.mu.Unlock()
				f.listErr = nil
				return nil, nil
			}),
		"k8s/expire-watches": script.Command(
			script.CmdUsage{Summary: "End every open watch with 410 Gone, which makes the reflectors relist"},
			func(*script.State, ...string) (script.WaitFunc, error) { f.expireWatches(); return nil, nil }),
		"k8s/wait": script.Command(
			script.CmdUsage{
				Summary: "Wait until Services and EndpointSlices have each seen N calls of VERB (list or watch)",
				Args:    "verb n",
				Detail: []string{
					"The fake clientset loses deletions made between a LIST and the WATCH",
					"that follows it: after a relist, wait for the watches before deleting.",
				},
			},
			func(s *script.State, args ...string) (script.WaitFunc, error) {
				if len(args) != 2 || (args[0] != "list" && args[0] != "watch") {
					return nil, errors.New("want list or watch, and a number")
				}
				n, err := strconv.Atoi(args[1])
				if err != nil {
					return nil, fmt.Errorf("invalid number of calls %q", args[1])
				}
				ctx, cancel := context.WithTimeout(s.Context(), 10*time.Second)
				defer cancel()
				return nil, f.waitCalls(ctx, args[0], n)
			}),
	})
	return cmds
}

// expirableWatch passes a tracker watch through until expire, which ends it
// the way an API server ends a watch whose resource version is too old.
type expirableWatch struct {
	inner    watch.Interface
	out      chan watch.Event
	expired  chan struct{}
	stopped  chan struct{}
	finished chan struct{}
	expireMu sync.Once
	stopMu   sync.Once
}

func newExpirableWatch(inner watch.Interface) *expirableWatch {
	w := &expirableWatch{
		inner:    inner,
		out:      make(chan watch.Event),
		expired:  make(chan struct{}),
		stopped:  make(chan struct{}),
		finished: make(chan struct{}),
	}
	go w.forward()
	return w
}

func (w *expirableWatch) forward() {
	defer close(w.finished)
	defer close(w.out)
	defer w.inner.Stop()
	for {
		// Expiry first: no event may pass once expire was called.
		select {
		case <-w.expired:
			w.sendGone()
			return
		default:
		}
		select {
		case ev, ok := <-w.inner.ResultChan():
			if !ok {
				return
			}
			select {
			case w.out <- ev:
			case <-w.stopped:
				return
			}
		case <-w.expired:
			w.sendGone()
			return
		case <-w.stopped:
			return
		}
	}
}

func (w *expirableWatch) sendGone() {
	gone := &metav1.Status{
		Status:  metav1.StatusFailure,
		Code:    410,
		Reason:  metav1.StatusReasonExpired,
		Message: "the test expired the watch",
	}
	select {
	case w.out <- watch.Event{Type: watch.Error, Object: gone}:
	case <-w.stopped:
	}
}

// expire ends the watch and returns once it passes nothing on.
func (w *expirableWatch) expire() {
	w.expireMu.Do(func() { close(w.expired) })
	<-w.finished
}

func (w *expirableWatch) Stop() { w.stopMu.Do(func() { close(w.stopped) }) }

func (w *expirableWatch) ResultChan() <-chan watch.Event { return w.out }
