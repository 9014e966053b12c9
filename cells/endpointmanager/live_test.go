package endpointmanager_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/vishvananda/netlink"

	"github.com/cellium/cellium/cells/endpointmanager"
	"github.com/cellium/cellium/cells/health"
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
	return n.createReqAsync(context.Background(), p.req())
}

// createReqAsync runs req's ADD in a goroutine of its own.
func (n *node) createReqAsync(ctx context.Context, req endpointmanager.CreateRequest) <-chan createResult {
	done := make(chan createResult, 1)
	go func() {
		ep, err := n.mgr.Create(ctx, req)
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

// stepObserved is the count and sum of the histogram
// cellium_endpoint_create_step_seconds{step=step}.
func stepObserved(t *testing.T, reg *prometheus.Registry, step string) (uint64, float64) {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != "cellium_endpoint_create_step_seconds" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "step" && l.GetValue() == step {
					return m.GetHistogram().GetSampleCount(), m.GetHistogram().GetSampleSum()
				}
			}
		}
	}
	return 0, 0
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
	checkRouted(t, ep, false)
	// The creation counts itself waiting once the condition it asked
	// has answered: after asked is closed.
	celltest.Eventually(t, "cellium_endpoints_waiting{for=gate} 1 while the creation waits", func() (bool, string) {
		n := waiting(t, n.metrics, "gate")
		return n == 1, fmt.Sprint(n, " waiting")
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
	checkRouted(t, r.ep, true)
	if got := waiting(t, n.metrics, "gate"); got != 0 {
		t.Errorf("cellium_endpoints_waiting{for=gate} = %v after the creation, want 0", got)
	}
	// Each step of the creation is observed once; the wait for the
	// gate is in the step "live".
	for _, step := range []string{"netns", "ipam", "state", "veth", "live", "route", "state-ready", "ready"} {
		if count, sum := stepObserved(t, n.metrics, step); count != 1 || step == "live" && sum <= 0 {
			t.Errorf("cellium_endpoint_create_step_seconds{step=%s}: %d observations, %v s in all; want one", step, count, sum)
		}
	}
	g.mu.Lock()
	revs := g.revs
	g.mu.Unlock()
	if len(revs) == 0 || revs[0] == 0 {
		t.Errorf("the condition was asked with revisions %v, want the endpoint's row's", revs)
	}
}

// checkRouted checks that ep's host side is up, with the host's routes to
// the pod through it (ready), or down without them (before it is live).
func checkRouted(t *testing.T, ep *endpointmanager.Endpoint, ready bool) {
	t.Helper()
	for _, ip := range ep.IPs() {
		switch r := hostRoute(t, ep, ip); {
		case ready && r == nil:
			t.Errorf("no host route to %s through %s once the endpoint is ready", ip, ep.HostIfName)
		case !ready && r != nil:
			t.Errorf("the host routes to %s through %s before the endpoint is live: %s", ip, ep.HostIfName, r)
		}
	}
	if up := hostUp(t, ep); up != ready {
		t.Errorf("the host side %s is up=%v, want %v (endpoint %s)", ep.HostIfName, up, ready, ep.State)
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

// attacher is a ProgramsAttacher that records the host sides it was asked
// to attach to, and fails while fail is set.
type attacher struct {
	mu    sync.Mutex
	fail  error
	calls []attachCall
}

type attachCall struct {
	ifindex int
	up      bool
}

func (a *attacher) AttachPrograms(_ *netlink.Handle, ep *endpointmanager.Endpoint) error {
	l, err := netlink.LinkByIndex(ep.HostIfIndex)
	a.mu.Lock()
	defer a.mu.Unlock()
	a.calls = append(a.calls, attachCall{ep.HostIfIndex, err == nil && l.Attrs().Flags&net.FlagUp != 0})
	if err != nil {
		return err
	}
	return a.fail
}

func (a *attacher) setFail(err error) {
	a.mu.Lock()
	a.fail = err
	a.mu.Unlock()
}

func (a *attacher) taken() []attachCall {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]attachCall(nil), a.calls...)
}

// TestCreateAttachesPrograms: with the loader's attach step
// (ProgramsAttacher), a creation attaches its endpoint's programs itself,
// to the host side while it is down, and the endpoint enters the table
// with its Programs status done: the "programs" live condition holds with
// no reconciler running (none runs here), so no ADD waits for another's.
// When the step fails the status is pending, and the creation waits for
// the reconciler (here the test, which marks it done).
func TestCreateAttachesPrograms(t *testing.T) {
	a := &attacher{}
	var rw statedb.RWTable[*endpointmanager.Endpoint]
	programs := cell.Group(
		cell.Provide(func() endpointmanager.ProgramsAttacher { return a }),
		cell.Provide(func() endpointmanager.LiveOut {
			return endpointmanager.StatusCondition("programs", func(ep *endpointmanager.Endpoint) reconciler.Status { return ep.ProgramStatus })
		}),
		cell.Invoke(func(tbl statedb.RWTable[*endpointmanager.Endpoint]) { rw = tbl }),
	)
	tn := newTestNet(t)
	n := tn.start(t, nodeOpts{extra: []cell.Cell{programs}})

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ep, err := n.mgr.Create(ctx, newPod(t).req())
	if err != nil {
		t.Fatalf("Create with its programs attached in its own path: %v", err)
	}
	if calls := a.taken(); len(calls) != 1 || calls[0] != (attachCall{ep.HostIfIndex, false}) {
		t.Fatalf("attach calls %+v, want one for ifindex %d with the host side down", calls, ep.HostIfIndex)
	}
	if ep.ProgramStatus.Kind != reconciler.StatusKindDone {
		t.Errorf("created endpoint's programs status %s, want done", ep.ProgramStatus)
	}

	a.setFail(errors.New("test: the attach fails"))
	p := newPod(t)
	done := n.createAsync(p)
	celltest.Eventually(t, "the endpoint whose attach failed in the table, its programs pending", func() (bool, string) {
		ep, found := n.mgr.Lookup(endpointmanager.Selector{ContainerID: p.id})
		if !found {
			return false, "not in the table"
		}
		return ep.ProgramStatus.Kind == reconciler.StatusKindPending, fmt.Sprintf("programs %s", ep.ProgramStatus)
	})
	select {
	case r := <-done:
		t.Fatalf("Create returned while its programs were pending: %+v, %v", r.ep, r.err)
	default:
	}
	// What the loader's reconciler does with it.
	txn := n.db.WriteTxn(rw)
	cur, _, _ := rw.Get(txn, endpointmanager.EndpointContainerID.Query(p.id))
	cur = cur.Clone()
	cur.ProgramStatus = reconciler.StatusDone()
	if _, _, err := rw.Insert(txn, cur); err != nil {
		t.Fatal(err)
	}
	txn.Commit()
	if r := <-done; r.err != nil || r.ep.State != endpointmanager.Ready {
		t.Fatalf("Create once the reconciler attached: %+v, %v; want ready", r.ep, r.err)
	}
}

// endpointOfStoppedAgentWithoutVeth creates a pod's endpoint on an agent
// of tn, stops the agent and deletes the endpoint's veth pair: the next
// agent's restore makes it again.
func endpointOfStoppedAgentWithoutVeth(t *testing.T, tn *testNet) (pod, *endpointmanager.Endpoint) {
	t.Helper()
	first := tn.start(t, nodeOpts{})
	p := newPod(t)
	before := first.create(t, p)
	first.stop()
	if err := netlink.LinkDel(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: before.HostIfName}}); err != nil {
		t.Fatal(err)
	}
	return p, before
}

// TestRestoreRemadeVethWaitsForLive: a restored endpoint whose veth pair
// was deleted while the agent was down gets a new one, as a creation
// does: in the table as starting, its host side down and without the
// host's route to the pod while a live condition (its programs, its
// policy) does not hold, so that nothing reaches the pod unchecked; then
// up, routed and ready.
func TestRestoreRemadeVethWaitsForLive(t *testing.T) {
	tn := newTestNet(t)
	p, before := endpointOfStoppedAgentWithoutVeth(t, tn)

	g := newGate()
	n := tn.start(t, nodeOpts{extra: []cell.Cell{g.cell()}})
	// The restore has put it in the table, and the gate holds.
	n.waitRestored(t)
	ep, found := n.mgr.Lookup(endpointmanager.Selector{ContainerID: p.id})
	if !found || ep.State != endpointmanager.Starting || ep.HostIfIndex == before.HostIfIndex {
		t.Fatalf("while the live condition does not hold, the restored endpoint is %+v (found %v), want it starting on a new veth pair", ep, found)
	}
	checkRouted(t, ep, false)

	g.openIt()
	celltest.Eventually(t, "the restored endpoint ready once live", func() (bool, string) {
		ep, found = n.mgr.Lookup(endpointmanager.Selector{ContainerID: p.id})
		if !found {
			return false, "not in the table"
		}
		return ep.State == endpointmanager.Ready, fmt.Sprintf("state %v", ep.State)
	})
	checkRouted(t, ep, true)
	if _, problems, err := n.mgr.Check(context.Background(), endpointmanager.Selector{ContainerID: p.id}); err != nil || len(problems) > 0 {
		t.Errorf("check of the restored endpoint: %v, %v", problems, err)
	}
}

// TestRestoredEndpointNotLiveIsInHealth: a restored endpoint on a remade
// veth pair that is not live within the bound stays starting, and the
// endpoint manager's health is Degraded naming it and what it waits for;
// once it is live, it is ready and health is OK again.
func TestRestoredEndpointNotLiveIsInHealth(t *testing.T) {
	tn := newTestNet(t)
	p, _ := endpointOfStoppedAgentWithoutVeth(t, tn)

	g := newGate()
	n := tn.start(t, nodeOpts{extra: []cell.Cell{g.cell()},
		endpoints: func(c *endpointmanager.Config) { c.EndpointRestoreLiveReport = time.Millisecond }})
	row := n.waitHealth(t, "endpoint-manager.restore-live", func(s *health.Status) bool { return s != nil && s.Level == cell.StatusDegraded })
	for _, want := range []string{p.id, "gate: the test holds it"} {
		if !strings.Contains(row.Error, want) {
			t.Errorf("health %q (%s) does not name %q", row.Message, row.Error, want)
		}
	}
	if ep, found := n.mgr.Lookup(endpointmanager.Selector{ContainerID: p.id}); !found || ep.State != endpointmanager.Starting {
		t.Fatalf("while not live, the restored endpoint is %+v (found %v), want it starting", ep, found)
	}

	g.openIt()
	n.waitHealth(t, "endpoint-manager.restore-live", func(s *health.Status) bool { return s != nil && s.Level == cell.StatusOK })
	ep, found := n.mgr.Lookup(endpointmanager.Selector{ContainerID: p.id})
	if !found || ep.State != endpointmanager.Ready {
		t.Fatalf("once live, the restored endpoint is %+v (found %v), want it ready", ep, found)
	}
	checkRouted(t, ep, true)
}

// TestRestoredEndpointDeleteDuringLiveWait: while a restored endpoint on a
// remade veth pair waits to be live, its container's lock is free. A
// retried ADD of the container is answered at once with ErrExists (the
// endpoint is starting; nothing changes), and its DEL returns at once and
// removes it: no row, no veth pair, no route, no state, no address held.
// Once the live condition then holds, the endpoint is not routed.
func TestRestoredEndpointDeleteDuringLiveWait(t *testing.T) {
	tn := newTestNet(t)
	p, _ := endpointOfStoppedAgentWithoutVeth(t, tn)

	g := newGate()
	n := tn.start(t, nodeOpts{extra: []cell.Cell{g.cell()}})
	n.waitRestored(t)
	<-g.asked // the restore waits for it
	ep, found := n.mgr.Lookup(endpointmanager.Selector{ContainerID: p.id})
	if !found || ep.State != endpointmanager.Starting {
		t.Fatalf("restored endpoint %+v (found %v), want it starting", ep, found)
	}
	allocations := n.allocations()

	// The deadlines bound the test; neither operation may wait for the
	// live condition, which does not hold until the test opens it.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if got, err := n.mgr.Create(ctx, p.req()); !errors.Is(err, endpointmanager.ErrExists) || !strings.Contains(err.Error(), "starting") {
		t.Errorf("ADD retried while the restored endpoint is starting = %+v, %v; want ErrExists saying it is starting", got, err)
	}
	if cur, found := n.mgr.Lookup(endpointmanager.Selector{ContainerID: p.id}); !found || cur.State != endpointmanager.Starting || cur.HostIfIndex != ep.HostIfIndex {
		t.Fatalf("after the retried ADD the endpoint is %+v (found %v), want it unchanged", cur, found)
	}
	if got := n.allocations(); !slices.Equal(got, allocations) {
		t.Fatalf("the retried ADD changed the allocations: %q, were %q", got, allocations)
	}

	ctx, cancel = context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	del, err := n.mgr.Delete(ctx, endpointmanager.Selector{ContainerID: p.id})
	if err != nil {
		t.Fatalf("DEL of the restored endpoint while it waits to be live: %v", err)
	}
	if del.Endpoint == nil || del.Endpoint.ID != ep.ID || len(del.Released) != len(ep.IPs()) {
		t.Errorf("DEL removed %+v, want endpoint %d with its addresses %v", del, ep.ID, ep.IPs())
	}
	checkDeleted := func() {
		t.Helper()
		if cur, found := n.mgr.Lookup(endpointmanager.Selector{ContainerID: p.id}); found {
			t.Errorf("endpoint still in the table: %+v", cur)
		}
		if hostLinkExists(ep.HostIfName) {
			t.Errorf("host side %s still exists", ep.HostIfName)
		}
		for _, ip := range ep.IPs() {
			if r := hostRouteTo(t, ip); r != nil {
				t.Errorf("the host still routes to %s: %s", ip, r)
			}
		}
		if got := n.allocations(); len(got) != 0 {
			t.Errorf("addresses still held: %q", got)
		}
		if dirs := n.stateDirs(); len(dirs) != 0 {
			t.Errorf("state left: %q", dirs)
		}
	}
	checkDeleted()

	// The wait ends with the row; then the condition holds, too late.
	celltest.Eventually(t, "the restore's wait for the deleted endpoint ended", func() (bool, string) {
		return n.logs.Find("Restored endpoint deleted while it waited to be live; not routed", "container", p.id) != nil, "not logged"
	})
	g.openIt()
	n.stop()
	checkDeleted()
}

// hostRouteTo is the host's route to ip alone (a /32 or /128), through
// any link; nil when there is none.
func hostRouteTo(t *testing.T, ip netip.Addr) *netlink.Route {
	t.Helper()
	fam := netlink.FAMILY_V4
	if ip.Is6() {
		fam = netlink.FAMILY_V6
	}
	dst := &net.IPNet{IP: ip.AsSlice(), Mask: net.CIDRMask(ip.BitLen(), ip.BitLen())}
	routes, err := netlink.RouteListFiltered(fam, &netlink.Route{Dst: dst}, netlink.RT_FILTER_DST)
	if err != nil {
		t.Fatal(err)
	}
	if len(routes) > 0 {
		return &routes[0]
	}
	return nil
}
