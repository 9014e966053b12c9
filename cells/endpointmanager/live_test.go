package endpointmanager_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/vishvananda/netlink"

	"github.com/cellium/cellium/cells/endpointmanager"
	"github.com/cellium/cellium/cells/internal/celltest"
)

// gate is a live condition the test opens.
type gate struct {
	mu     sync.Mutex
	open   bool
	opened chan struct{}
	// asked is closed the first time the condition is asked about.
	asked     chan struct{}
	askedOnce sync.Once
	// revs are the revisions it was asked about.
	revs []statedb.Revision
}

func newGate() *gate { return &gate{opened: make(chan struct{}), asked: make(chan struct{})} }

func (g *gate) cell() cell.Cell {
	return cell.Provide(func() endpointmanager.LiveOut {
		return endpointmanager.LiveOut{Condition: endpointmanager.LiveCondition{Name: "gate", Live: g.live}}
	})
}

func (g *gate) live(_ *endpointmanager.Endpoint, rev statedb.Revision) (bool, string, <-chan struct{}) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.revs = append(g.revs, rev)
	g.askedOnce.Do(func() { close(g.asked) })
	if g.open {
		return true, "", nil
	}
	return false, "the test holds it", g.opened
}

func (g *gate) openIt() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.open = true
	close(g.opened)
}

// createResult is what a Create returned.
type createResult struct {
	ep  *endpointmanager.Endpoint
	err error
}

// createAsync creates p's endpoint in a goroutine of its own.
func (n *node) createAsync(p pod) <-chan createResult {
	done := make(chan createResult, 1)
	go func() {
		ep, err := n.mgr.Create(context.Background(), p.req())
		done <- createResult{ep, err}
	}()
	return done
}

// waiting is cellium_endpoints_waiting{for=name}.
func waiting(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	v, _ := celltest.Value(t, reg, "cellium_endpoints_waiting", "for", name)
	return v
}

// TestCreateWaitsForLive: a creation puts the endpoint in the table as
// starting, with no host route to the pod and its host side down (the
// loader attaches its programs so, see cells/loader/tc.go), and waits
// while a live condition (the datapath's, the policy's) does not hold,
// counted as waiting; once it holds the host side comes up with the host
// route, the endpoint is ready and the creation returns.
func TestCreateWaitsForLive(t *testing.T) {
	g := newGate()
	tn := newTestNet(t)
	n := tn.start(t, nodeOpts{extra: []cell.Cell{g.cell()}})
	p := newPod(t)

	done := n.createAsync(p)
	select {
	case <-g.asked:
	case r := <-done:
		t.Fatalf("Create returned before the live condition held: %+v, %v", r.ep, r.err)
	case <-time.After(30 * time.Second):
		t.Fatal("Create did not ask the live condition within 30s")
	}
	ep, found := n.mgr.Lookup(endpointmanager.Selector{ContainerID: p.id})
	if !found || ep.State != endpointmanager.Starting {
		t.Fatalf("while the creation waits, the endpoint is %+v (found %v), want it starting", ep, found)
	}
	for _, ip := range ep.IPs() {
		if r := hostRoute(t, ep, ip); r != nil {
			t.Errorf("the host routes to %s through %s before the endpoint is live: %s", ip, ep.HostIfName, r)
		}
	}
	if hostUp(t, ep) {
		t.Errorf("the host side %s is up before the endpoint is live", ep.HostIfName)
	}
	// The creation counts itself waiting once the condition it asked
	// has answered: after asked is closed.
	celltest.Eventually(t, "cellium_endpoints_waiting{for=gate} 1 while the creation waits", func() bool {
		return waiting(t, n.metrics, "gate") == 1
	})
	select {
	case r := <-done:
		t.Fatalf("Create returned before the live condition held: %+v, %v", r.ep, r.err)
	default:
	}

	g.openIt()
	r := <-done
	if r.err != nil {
		t.Fatalf("Create: %v", r.err)
	}
	if r.ep.State != endpointmanager.Ready {
		t.Fatalf("created endpoint is %s, want ready", r.ep.State)
	}
	for _, ip := range r.ep.IPs() {
		if hostRoute(t, r.ep, ip) == nil {
			t.Errorf("no host route to %s through %s once the endpoint is ready", ip, r.ep.HostIfName)
		}
	}
	if !hostUp(t, r.ep) {
		t.Errorf("the host side %s is down once the endpoint is ready", r.ep.HostIfName)
	}
	if got := waiting(t, n.metrics, "gate"); got != 0 {
		t.Errorf("cellium_endpoints_waiting{for=gate} = %v after the creation, want 0", got)
	}
	g.mu.Lock()
	revs := g.revs
	g.mu.Unlock()
	if len(revs) == 0 || revs[0] == 0 {
		t.Errorf("the condition was asked with revisions %v, want the endpoint's row's", revs)
	}
}

// TestCreateLiveTimeout: a creation whose endpoint never becomes live
// fails when its context ends, saying what it waited for, and leaves
// nothing: no row, no veth pair, no address.
func TestCreateLiveTimeout(t *testing.T) {
	g := newGate()
	tn := newTestNet(t)
	n := tn.start(t, nodeOpts{extra: []cell.Cell{g.cell()}})
	p := newPod(t)
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		<-g.asked
		cancel()
	}()
	_, err := n.mgr.Create(ctx, p.req())
	if !errors.Is(err, endpointmanager.ErrNotReady) {
		t.Fatalf("Create = %v, want ErrNotReady", err)
	}
	if want := "gate: the test holds it"; !strings.Contains(err.Error(), want) {
		t.Errorf("error %q does not say %q", err, want)
	}
	if ids := n.endpointIDs(); len(ids) != 0 {
		t.Errorf("endpoints %v left after a failed creation", ids)
	}
	n.waitAllocations(t)
	if got := waiting(t, n.metrics, "gate"); got != 0 {
		t.Errorf("cellium_endpoints_waiting{for=gate} = %v after the creation failed, want 0", got)
	}
	if link := hostLinkExists(endpointmanager.HostIfName(p.id)); link {
		t.Errorf("host side %s left after a failed creation", endpointmanager.HostIfName(p.id))
	}
}

// hostUp says whether ep's host side is up.
func hostUp(t *testing.T, ep *endpointmanager.Endpoint) bool {
	t.Helper()
	l, err := netlink.LinkByIndex(ep.HostIfIndex)
	if err != nil {
		t.Fatalf("host side %s (ifindex %d): %v", ep.HostIfName, ep.HostIfIndex, err)
	}
	return l.Attrs().Flags&net.FlagUp != 0
}

func hostLinkExists(name string) bool {
	_, err := netlink.LinkByName(name)
	return err == nil
}
