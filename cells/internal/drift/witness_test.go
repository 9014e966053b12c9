package drift

import (
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// LinkWitness is a link subscriber of a namespace beside the one a test
// looks at (the devices watcher, another program), keeping what netlink
// reports to it. Exported for the external tests.
type LinkWitness struct {
	Updates chan netlink.LinkUpdate

	mu   sync.Mutex
	errs []error
}

// NewLinkWitness subscribes to ns's link updates until the test ends.
func NewLinkWitness(t *testing.T, ns netns.NsHandle) *LinkWitness {
	t.Helper()
	w := &LinkWitness{Updates: make(chan netlink.LinkUpdate, 64)}
	done := make(chan struct{})
	err := netlink.LinkSubscribeWithOptions(w.Updates, done, netlink.LinkSubscribeOptions{
		Namespace: &ns,
		ErrorCallback: func(err error) {
			w.mu.Lock()
			w.errs = append(w.errs, err)
			w.mu.Unlock()
		},
	})
	if err != nil {
		t.Fatalf("subscribe the witness: %v", err)
	}
	t.Cleanup(func() {
		close(done)
		for range w.Updates {
		}
	})
	return w
}

// Errors are what netlink reported to the witness so far.
func (w *LinkWitness) Errors() []error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]error(nil), w.errs...)
}

// AddMarker adds the veth pair marker0/marker1 to ns: once a subscriber
// has its update, it has every message sent to it before.
func AddMarker(t *testing.T, ns netns.NsHandle) {
	t.Helper()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatalf("handle: %v", err)
	}
	defer h.Close()
	if err := h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "marker0"}, PeerName: "marker1"}); err != nil {
		t.Fatalf("add marker0: %v", err)
	}
}

// AwaitMarker waits, 10 s at most, until updates (who's) bring marker0.
func AwaitMarker(t *testing.T, who string, updates <-chan netlink.LinkUpdate) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case u := <-updates:
			if u.Attrs().Name == "marker0" {
				return
			}
		case <-deadline:
			t.Fatalf("%s did not see marker0 after 10s", who)
		}
	}
}
