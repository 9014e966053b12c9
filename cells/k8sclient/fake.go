package k8sclient

import (
	"fmt"
	"slices"
	"strings"
	"sync"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/cellium/cellium/pkg/kubeclient"
)

// Action is a call on the embedded API server, as its reactors see it and
// Fake.Actions records it: a typed client's request (kubeclient.Request).
type Action struct {
	kubeclient.Request
	// streamed marks the list of EmbeddedListEach, which the watch hub
	// answers with the store's objects as they are stored.
	streamed bool
}

// ReactionFunc answers an action, or leaves it to the next reactor
// (handled false).
type ReactionFunc func(Action) (handled bool, ret runtime.Object, err error)

// WatchReactionFunc answers a watch, or leaves it to the next reactor.
type WatchReactionFunc func(Action) (handled bool, ret watch.Interface, err error)

type reactor struct {
	verb, resource string
	react          ReactionFunc
}

type watchReactor struct {
	resource string
	react    WatchReactionFunc
}

// Fake is the embedded API server, as the Clientset's typed clients and a
// test reach it: a chain of reactors that answer each call in turn (the
// store's last; a test may put its own before), the record of the calls,
// and the typed clients, through which a test writes. It has the shape of
// client-go's testing.Fake without linking it (see pkg/kubeclient).
//
// Calls are serialized: each holds the Fake while its reactors run, so no
// write slips in between the steps of a list or a watch.
type Fake struct {
	mu            sync.Mutex
	reactors      []reactor
	watchReactors []watchReactor
	actions       []Action
	groups        *groups
}

var _ kubeclient.Server = (*Fake)(nil)

func newFake() *Fake {
	f := &Fake{}
	f.groups = servedGroups(f)
	return f
}

func (f *Fake) CoreV1() CoreV1             { return f.groups.coreV1 }
func (f *Fake) DiscoveryV1() DiscoveryV1   { return f.groups.discoveryV1 }
func (f *Fake) NetworkingV1() NetworkingV1 { return f.groups.networkingV1 }

// PrependReactor puts react first in the chain for the actions of verb on
// resource ("*" for any; "resource/subresource" for a subresource's).
func (f *Fake) PrependReactor(verb, resource string, react ReactionFunc) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reactors = slices.Insert(f.reactors, 0, reactor{verb, resource, react})
}

// AddReactor puts react last in the chain.
func (f *Fake) AddReactor(verb, resource string, react ReactionFunc) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reactors = append(f.reactors, reactor{verb, resource, react})
}

// PrependWatchReactor puts react first in the chain of watches of
// resource ("*" for any).
func (f *Fake) PrependWatchReactor(resource string, react WatchReactionFunc) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.watchReactors = slices.Insert(f.watchReactors, 0, watchReactor{resource, react})
}

// WatchChain answers a watch as the watch reactors of now do: for a
// test's reactor that wraps what they answer (the Fake is held while it
// runs, so it calls them directly).
func (f *Fake) WatchChain() WatchReactionFunc {
	f.mu.Lock()
	chain := slices.Clone(f.watchReactors)
	f.mu.Unlock()
	return func(a Action) (bool, watch.Interface, error) {
		for _, r := range chain {
			if !covers(r.resource, a) {
				continue
			}
			if handled, w, err := r.react(a); handled {
				return true, w, err
			}
		}
		return false, nil, nil
	}
}

// Actions are the calls made since the last ClearActions.
func (f *Fake) Actions() []Action {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.actions)
}

// ClearActions forgets the calls made.
func (f *Fake) ClearActions() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.actions = nil
}

// Invoke answers a request of any verb but watch.
func (f *Fake) Invoke(req kubeclient.Request) (runtime.Object, error) {
	return f.invoke(Action{Request: req})
}

// InvokeWatch answers a watch.
func (f *Fake) InvokeWatch(req kubeclient.Request) (watch.Interface, error) {
	a := Action{Request: req}
	a.Verb = "watch"
	f.mu.Lock()
	defer f.mu.Unlock()
	f.actions = append(f.actions, a)
	for _, r := range f.watchReactors {
		if !covers(r.resource, a) {
			continue
		}
		if handled, w, err := r.react(a); handled {
			return w, err
		}
	}
	return nil, fmt.Errorf("watch %s: no reactor answered", a.Resource.Resource)
}

// invoke runs the reactors on a copy of a: the caller's object is its
// own again once the call returns.
func (f *Fake) invoke(a Action) (runtime.Object, error) {
	if a.Object != nil {
		a.Object = a.Object.DeepCopyObject()
	}
	a.Patch = slices.Clone(a.Patch)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.actions = append(f.actions, a)
	for _, r := range f.reactors {
		if (r.verb != "*" && r.verb != a.Verb) || !covers(r.resource, a) {
			continue
		}
		if handled, ret, err := r.react(a); handled {
			return ret, err
		}
	}
	return nil, fmt.Errorf("%s %s: no reactor answered", a.Verb, a.Resource.Resource)
}

// covers says whether a reactor of resource answers a.
func covers(resource string, a Action) bool {
	if resource == "*" || resource == a.Resource.Resource {
		return true
	}
	r, sub, ok := strings.Cut(resource, "/")
	return ok && r == a.Resource.Resource && sub == a.Subresource
}

// objectReaction answers the actions from the store, as an API server
// would (without admission, defaults or field management): the reactor
// last in the chain.
func objectReaction(s *objectStore) ReactionFunc {
	return func(a Action) (bool, runtime.Object, error) {
		switch a.Verb {
		case "get":
			obj, err := s.Get(a.Resource, a.Namespace, a.Name)
			return true, obj, err
		case "list":
			obj, err := s.List(a.Resource, a.Kind, a.Namespace)
			return true, obj, err
		case "create", "update":
			if a.Verb == "create" && a.Subresource != "" {
				return true, nil, fmt.Errorf("create %s/%s: the embedded API server creates no subresources", a.Resource.Resource, a.Subresource)
			}
			acc, err := meta.Accessor(a.Object)
			if err != nil {
				return true, nil, err
			}
			// An update of status replaces the whole object, as
			// client-go's fake did.
			if err := s.add(a.Resource, a.Object, a.Namespace, a.Verb == "update"); err != nil {
				return true, nil, err
			}
			obj, err := s.Get(a.Resource, a.Namespace, acc.GetName())
			return true, obj, err
		case "delete":
			return true, nil, s.Delete(a.Resource, a.Namespace, a.Name)
		case "patch":
			obj, err := s.patch(a.Request)
			return true, obj, err
		}
		return true, nil, fmt.Errorf("%s %s: the embedded API server does not serve %q", a.Verb, a.Resource.Resource, a.Verb)
	}
}
