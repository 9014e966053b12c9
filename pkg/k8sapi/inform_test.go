package k8sapi

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
)

// states records what Inform reports.
type states struct {
	mu   sync.Mutex
	seen []error
	// listedAt holds, for each call of listed, how many states had
	// been reported before it.
	listedAt []int
	changed  chan struct{}
}

func (s *states) listed() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.listedAt = append(s.listedAt, len(s.seen))
}

// checkListedOnce checks that listed was called once, right before the
// first nil state.
func (s *states) checkListedOnce(t *testing.T) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	first := slices.Index(s.seen, nil)
	if first < 0 || !slices.Equal(s.listedAt, []int{first}) {
		t.Errorf("listed called before states %v of %v, want once, before the first nil (%d)", s.listedAt, s.seen, first)
	}
}

func newStates() *states { return &states{changed: make(chan struct{}, 1)} }

func (s *states) report(err error) {
	s.mu.Lock()
	s.seen = append(s.seen, err)
	s.mu.Unlock()
	select {
	case s.changed <- struct{}{}:
	default:
	}
}

// await waits until the state reported last is an error (broken) or nil,
// and returns it.
func (s *states) await(t *testing.T, broken bool, what string) error {
	t.Helper()
	timeout := time.After(2 * time.Minute)
	for {
		s.mu.Lock()
		n := len(s.seen)
		var last error
		if n > 0 {
			last = s.seen[n-1]
		}
		s.mu.Unlock()
		if n > 0 && (last != nil) == broken {
			return last
		}
		select {
		case <-s.changed:
		case <-timeout:
			t.Fatalf("%s: states reported %v, want the last one broken=%v", what, s.all(), broken)
		}
	}
}

// awaitMore waits until more than n states are reported.
func (s *states) awaitMore(t *testing.T, n int) {
	t.Helper()
	timeout := time.After(2 * time.Minute)
	for len(s.all()) <= n {
		select {
		case <-s.changed:
		case <-timeout:
			t.Fatalf("states reported %v, want more than %d", s.all(), n)
		}
	}
}

func (s *states) all() []error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]error(nil), s.seen...)
}

// inform runs Inform of lw's identities until the test ends.
func inform(t *testing.T, lw interface {
	List(metav1.ListOptions) (runtime.Object, error)
	Watch(metav1.ListOptions) (watch.Interface, error)
}, st *states) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Inform(ctx, lw, &CelliumIdentity{}, func(id *CelliumIdentity) *CelliumIdentity { return id },
			func(*CelliumIdentity, bool) {}, st.listed, st.report)
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
}

// failingLW lists no identities and watches a watcher of its own, or
// fails each request with err while err is set, or answers a list with
// what is no list while garbled is. Like the fake clientset, it does not
// support the WatchList semantics.
type failingLW struct {
	mu      sync.Mutex
	err     error
	garbled bool
	watcher *watch.FakeWatcher
}

func (l *failingLW) List(metav1.ListOptions) (runtime.Object, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err != nil {
		return nil, l.err
	}
	if l.garbled {
		return &CelliumIdentity{}, nil
	}
	return &CelliumIdentityList{ListMeta: metav1.ListMeta{ResourceVersion: "1"}}, nil
}

func (l *failingLW) Watch(metav1.ListOptions) (watch.Interface, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err != nil {
		return nil, l.err
	}
	l.watcher = watch.NewFake()
	if l.garbled {
		// Broken before this watch began (breakWith found none to end):
		// it ends at once, as it would have, so that the next list is
		// one of the unreadable ones.
		l.watcher.Stop()
	}
	return l.watcher, nil
}

func (l *failingLW) IsWatchListSemanticsUnSupported() bool { return true }

// breakWith makes every later request fail with err (or every list
// garbled) and ends the watch; breakWith(nil, false) mends it.
func (l *failingLW) breakWith(err error, garbled bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.err, l.garbled = err, garbled
	if l.watcher != nil {
		l.watcher.Stop()
		l.watcher = nil
	}
}

// Access revoked while watching: the watch, once it ends, cannot be
// listed again; Inform reports the refusal, and nil once the list
// succeeds again.
func TestInformReportsBrokenWatchAndRecovery(t *testing.T) {
	lw := &failingLW{}
	st := newStates()
	inform(t, lw, st)
	st.await(t, false, "first list")

	forbidden := apierrors.NewForbidden(schema.GroupResource{Group: Group, Resource: ResourceIdentities}, "", errors.New("access revoked"))
	lw.breakWith(forbidden, false)
	err := st.await(t, true, "access revoked")
	if !apierrors.IsForbidden(err) {
		t.Errorf("broken watch reported %v, want the list's Forbidden", err)
	}

	lw.breakWith(nil, false)
	st.await(t, false, "access back")
	st.checkListedOnce(t)
}

// A list that is answered but cannot be read fails the list-and-watch
// without a failed request: the informer's watch error handler reports it.
func TestInformReportsUnreadableList(t *testing.T) {
	lw := &failingLW{}
	st := newStates()
	inform(t, lw, st)
	st.await(t, false, "first list")
	lw.breakWith(nil, true)
	err := st.await(t, true, "garbled list")
	if !strings.Contains(err.Error(), "CelliumIdentity") {
		t.Errorf("broken watch reported %v, want the error naming the resource", err)
	}
	// The retry's list is answered too, and is no better: still broken.
	first := len(st.all()) - 1
	st.awaitMore(t, first+1)
	if seen := st.all()[first:]; slices.Contains(seen, nil) {
		t.Errorf("states after the first failure %v: nil while every list is unreadable", seen)
	}
	lw.breakWith(nil, false)
	st.await(t, false, "list readable again")
	st.checkListedOnce(t)
}

// A failure before the first list is reported; nil comes only with the
// first list, not with the first request that succeeds.
func TestInformReportsFailureBeforeFirstList(t *testing.T) {
	lw := &failingLW{err: apierrors.NewForbidden(schema.GroupResource{Group: Group, Resource: ResourceIdentities}, "", errors.New("access revoked"))}
	st := newStates()
	inform(t, lw, st)
	st.await(t, true, "no access")
	lw.breakWith(nil, false)
	st.await(t, false, "access granted")
	for i, err := range st.all() {
		if err == nil && i != len(st.all())-1 {
			t.Errorf("states %v: nil before the last", st.all())
		}
	}
	st.checkListedOnce(t)
}

// Against a real kube-apiserver: stopped, the identities' watch is
// reported broken with the error; restarted, it is reported back.
func TestInformAcrossServerRestart(t *testing.T) {
	agentCfg, _, kas := agentConfig(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	agent, err := NewClient(agentCfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := agent.EnsureCRDs(ctx, slog.New(slog.DiscardHandler)); err != nil {
		t.Fatal(err)
	}
	st := newStates()
	inform(t, agent.IdentityListWatch(), st)
	st.await(t, false, "first list")

	kas.Stop()
	err = st.await(t, true, "kube-apiserver stopped")
	t.Logf("reported while stopped: %v", err)

	kas.Restart(t)
	st.await(t, false, "kube-apiserver restarted")
	st.checkListedOnce(t)
}
