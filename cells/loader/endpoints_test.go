package loader_test

import (
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/hivetest"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"
	"github.com/vishvananda/netlink"

	"github.com/cellium/cellium/bpf"
	"github.com/cellium/cellium/cells/bpfmaps/bpfmapstest"
	"github.com/cellium/cellium/cells/ctmaps"
	"github.com/cellium/cellium/cells/devices"
	"github.com/cellium/cellium/cells/endpointmanager"
	"github.com/cellium/cellium/cells/health"
	"github.com/cellium/cellium/cells/internal/celltest"
	"github.com/cellium/cellium/cells/internal/logtest"
	"github.com/cellium/cellium/cells/lbmaps"
	"github.com/cellium/cellium/cells/loader"
	"github.com/cellium/cellium/cells/loader/socklbtest"
	"github.com/cellium/cellium/pkg/ctmap"
	"github.com/cellium/cellium/pkg/nettest"
)

// hooks are the endpoint hooks: pin suffix (of the tcx links of agents
// before the filters), their tcx attach type, the filter's clsact parent
// and the name of the program that runs there.
var hooks = []struct {
	name, program string
	attach        ebpf.AttachType
	parent        uint32
}{
	{"ingress", bpf.LXCProgCelliumFromEndpoint, ebpf.AttachTCXIngress, netlink.HANDLE_MIN_INGRESS},
	{"egress", bpf.LXCProgCelliumToEndpoint, ebpf.AttachTCXEgress, netlink.HANDLE_MIN_EGRESS},
}

// datapath is one run of the datapath cells with an endpoints table the
// test fills.
type datapath struct {
	eps    *socklbtest.Endpoints
	ct     *ctmaps.Maps
	health statedb.Table[*health.Status]
	logs   *logtest.Recorder
	stop   func()
	// attach is the endpoint manager's attach step of a creation.
	attach endpointmanager.ProgramsAttacher
}

func startDatapath(t *testing.T, env *socklbtest.Env, root string) *datapath {
	t.Helper()
	var (
		d    datapath
		maps *lbmaps.Maps
	)
	h := env.Datapath(root, &maps, cell.Invoke(func(eps *socklbtest.Endpoints, ct *ctmaps.Maps, status statedb.Table[*health.Status], attach endpointmanager.ProgramsAttacher) {
		d.eps, d.ct, d.health, d.attach = eps, ct, status, attach
	}))
	d.logs = logtest.NewRecorder(hivetest.Logger(t).Handler())
	d.stop = startLogging(t, h, slog.New(d.logs))
	return &d
}

// pod is a veth pair: the host side in the test's network namespace, as an
// endpoint's, eth0 in a namespace of the pod's own.
type pod struct {
	netns string
	host  netlink.Link
}

func newPod(t *testing.T) *pod {
	t.Helper()
	host, netnsPath := loader.NewHostVeth(t)
	return &pod{netns: netnsPath, host: host}
}

func (p *pod) endpoint(id uint16) *endpointmanager.Endpoint {
	return &endpointmanager.Endpoint{
		ID: id, ContainerID: fmt.Sprintf("container-%d", id), Netns: p.netns, IfName: "eth0",
		HostIfName: p.host.Attrs().Name, HostIfIndex: p.host.Attrs().Index,
		State: endpointmanager.Ready, Created: time.Now(),
	}
}

// put inserts ep as the endpoint manager does: pending in the datapath.
func (d *datapath) put(t *testing.T, ep *endpointmanager.Endpoint) {
	t.Helper()
	ep = ep.Clone()
	ep.MapStatus, ep.ProgramStatus = reconciler.StatusPending(), reconciler.StatusPending()
	txn := d.eps.DB.WriteTxn(d.eps.Table)
	if _, _, err := d.eps.Table.Insert(txn, ep); err != nil {
		t.Fatal(err)
	}
	txn.Commit()
}

func (d *datapath) delete(t *testing.T, id uint16) {
	t.Helper()
	txn := d.eps.DB.WriteTxn(d.eps.Table)
	if _, _, err := d.eps.Table.Delete(txn, &endpointmanager.Endpoint{ID: id}); err != nil {
		t.Fatal(err)
	}
	txn.Commit()
}

// waitPrograms waits until endpoint id's ProgramStatus is of kind and
// returns the row.
func (d *datapath) waitPrograms(t *testing.T, id uint16, kind reconciler.StatusKind) *endpointmanager.Endpoint {
	t.Helper()
	return d.waitRow(t, id, "programs", func(ep *endpointmanager.Endpoint) reconciler.Status { return ep.ProgramStatus }, kind)
}

// waitInDatapath waits until endpoint id's programs are attached and its
// addresses are in the endpoint map, from which the programs read its ID.
func (d *datapath) waitInDatapath(t *testing.T, id uint16) {
	t.Helper()
	d.waitPrograms(t, id, reconciler.StatusKindDone)
	d.waitRow(t, id, "endpoint map", func(ep *endpointmanager.Endpoint) reconciler.Status { return ep.MapStatus }, reconciler.StatusKindDone)
}

// waitRow waits until the status that status reads of endpoint id's row is
// of kind.
func (d *datapath) waitRow(t *testing.T, id uint16, what string, status func(*endpointmanager.Endpoint) reconciler.Status, kind reconciler.StatusKind) *endpointmanager.Endpoint {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		ep, _, watch, found := d.eps.Table.GetWatch(d.eps.DB.ReadTxn(), endpointmanager.EndpointID.Query(id))
		if found && status(ep).Kind == kind {
			return ep
		}
		select {
		case <-watch:
		case <-deadline:
			if !found {
				t.Fatalf("endpoint %d: no row", id)
			}
			t.Fatalf("endpoint %d: %s %s, want %s", id, what, status(ep), kind)
		}
	}
}

// tcxLink is what a pinned endpoint link holds.
type tcxLink struct {
	id      link.ID
	program ebpf.ProgramID
	ifindex uint32
	attach  ebpf.AttachType
}

func endpointLinksDir(root string) string {
	return filepath.Join(root, "cellium", "links", "endpoints")
}

// pinnedEndpointLinks reads every pin of the endpoint links directory.
func pinnedEndpointLinks(t *testing.T, root string) map[string]tcxLink {
	t.Helper()
	entries, err := os.ReadDir(endpointLinksDir(root))
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]tcxLink{}
	for _, e := range entries {
		l, err := link.LoadPinnedLink(filepath.Join(endpointLinksDir(root), e.Name()), nil)
		if err != nil {
			t.Fatalf("pin %s: %v", e.Name(), err)
		}
		info, err := l.Info()
		l.Close()
		if err != nil {
			t.Fatal(err)
		}
		tcx := info.TCX()
		if tcx == nil {
			t.Fatalf("pin %s holds a %v link, want tcx", e.Name(), info.Type)
		}
		out[e.Name()] = tcxLink{id: info.ID, program: info.Program, ifindex: tcx.Ifindex, attach: ebpf.AttachType(tcx.AttachType)}
	}
	return out
}

// onInterface is what runs at one tcx hook of an interface.
type onInterface struct {
	programs []ebpf.ProgramID
	links    []link.ID
	revision uint64
}

func attachedTCX(t *testing.T, ifindex int, at ebpf.AttachType) onInterface {
	t.Helper()
	res, err := link.QueryPrograms(link.QueryOptions{Target: ifindex, Attach: at})
	if err != nil {
		t.Fatalf("query %s on ifindex %d: %v", at, ifindex, err)
	}
	out := onInterface{revision: res.Revision}
	for _, p := range res.Programs {
		out.programs = append(out.programs, p.ID)
		id, _ := p.LinkID()
		out.links = append(out.links, id)
	}
	return out
}

func programName(t *testing.T, id ebpf.ProgramID) string {
	t.Helper()
	p, err := ebpf.NewProgramFromID(id)
	if err != nil {
		t.Fatalf("program %d: %v", id, err)
	}
	defer p.Close()
	info, err := p.Info()
	if err != nil {
		t.Fatal(err)
	}
	return info.Name
}

// filterOn is the program of the endpoint filter at hook h of ifindex,
// checking that it is the only filter there and ours; 0 when there is
// none.
func filterOn(t *testing.T, ifindex int, h int) ebpf.ProgramID {
	t.Helper()
	filters, err := netlink.FilterList(&netlink.Device{LinkAttrs: netlink.LinkAttrs{Index: ifindex}}, hooks[h].parent)
	if err != nil {
		return 0 // no clsact qdisc
	}
	switch len(filters) {
	case 0:
		return 0
	case 1:
	default:
		t.Fatalf("%s of ifindex %d has filters %v, want one at most", hooks[h].name, ifindex, filters)
	}
	bf, ok := filters[0].(*netlink.BpfFilter)
	if !ok || !bf.DirectAction || bf.Name != "cellium-"+hooks[h].name {
		t.Fatalf("%s of ifindex %d: filter %+v, want a direct-action bpf filter named cellium-%s", hooks[h].name, ifindex, filters[0], hooks[h].name)
	}
	return ebpf.ProgramID(bf.Id)
}

// wantAttached checks that ep's host interface runs the programs as its
// only filters, and no tcx program, and returns the programs by hook.
func wantAttached(t *testing.T, ep *endpointmanager.Endpoint) map[string]ebpf.ProgramID {
	t.Helper()
	out := map[string]ebpf.ProgramID{}
	for i, h := range hooks {
		id := filterOn(t, ep.HostIfIndex, i)
		if id == 0 {
			t.Fatalf("no %s filter on ifindex %d", h.name, ep.HostIfIndex)
		}
		if got := programName(t, id); got != h.program {
			t.Fatalf("%s runs program %q, want %q", h.name, got, h.program)
		}
		if on := attachedTCX(t, ep.HostIfIndex, h.attach); len(on.programs) != 0 {
			t.Fatalf("%s of ifindex %d runs tcx programs %v besides the filter", h.name, ep.HostIfIndex, on.programs)
		}
		out[h.name] = id
	}
	return out
}

// wantDetached checks that no program runs on ifindex and that endpoint
// id has no pins.
func wantDetached(t *testing.T, root string, id uint16, ifindex int) {
	t.Helper()
	for i, h := range hooks {
		if on := attachedTCX(t, ifindex, h.attach); len(on.programs) != 0 {
			t.Fatalf("%s of ifindex %d still runs programs %v", h.name, ifindex, on.programs)
		}
		if prog := filterOn(t, ifindex, i); prog != 0 {
			t.Fatalf("%s of ifindex %d still runs program %d as a filter", h.name, ifindex, prog)
		}
		name := fmt.Sprintf("%d-%s", id, h.name)
		if _, err := os.Stat(filepath.Join(endpointLinksDir(root), name)); !os.IsNotExist(err) {
			t.Fatalf("pin %s left: %v", name, err)
		}
	}
}

func unpinned(root string, id uint16) func() (bool, string) {
	return func() (bool, string) {
		for _, h := range hooks {
			link := filepath.Join(endpointLinksDir(root), fmt.Sprintf("%d-%s", id, h.name))
			if _, err := os.Stat(link); !os.IsNotExist(err) {
				return false, fmt.Sprintf("%s: %v", link, err)
			}
		}
		return true, ""
	}
}

// An endpoint's programs follow its row: attached while it is ready,
// detached when it is not, and when the row goes.
func TestEndpointPrograms(t *testing.T) {
	env := socklbtest.New(t)
	root := bpfmapstest.Root(t)
	d := startDatapath(t, env, root)
	p := newPod(t)
	ep := p.endpoint(1)
	ifindex := ep.HostIfIndex

	d.put(t, ep)
	d.waitPrograms(t, 1, reconciler.StatusKindDone)
	wantAttached(t, ep)

	notReady := ep.Clone()
	notReady.State, notReady.Error = endpointmanager.NotReady, "veth pair could not be made"
	d.put(t, notReady)
	d.waitPrograms(t, 1, reconciler.StatusKindDone)
	wantDetached(t, root, 1, ifindex)

	d.put(t, ep)
	d.waitPrograms(t, 1, reconciler.StatusKindDone)
	wantAttached(t, ep)

	d.delete(t, 1)
	celltest.Eventually(t, "the deleted endpoint's filters are removed", func() (bool, string) {
		f0, f1 := filterOn(t, ifindex, 0), filterOn(t, ifindex, 1)
		return f0 == 0 && f1 == 0, fmt.Sprintf("programs %d and %d attached", f0, f1)
	})
	wantDetached(t, root, 1, ifindex)
}

// The attach step of a creation (ProgramsAttacher) makes a new host side,
// with the clsact qdisc the endpoint manager made with it, run both
// programs as its only filters; on a host side without the qdisc it
// falls back to the reconciler's attach, which adds it.
func TestAttachProgramsOfNewEndpoint(t *testing.T) {
	env := socklbtest.New(t)
	d := startDatapath(t, env, bpfmapstest.Root(t))
	withQdisc := newPod(t).endpoint(1)
	if err := endpointmanager.AddClsact(withQdisc.HostIfIndex); err != nil {
		t.Fatal(err)
	}
	if err := d.attach.AttachPrograms(&netlink.Handle{}, withQdisc); err != nil {
		t.Fatalf("attach to a new host side with its qdisc: %v", err)
	}
	wantAttached(t, withQdisc)

	without := newPod(t).endpoint(2)
	if err := d.attach.AttachPrograms(&netlink.Handle{}, without); err != nil {
		t.Fatalf("attach to a host side without a qdisc: %v", err)
	}
	wantAttached(t, without)
}

// A restarted agent moves the filters to its own programs in place,
// without a moment with no program on the interface, nor two.
func TestEndpointProgramsRestart(t *testing.T) {
	env := socklbtest.New(t)
	root := bpfmapstest.Root(t)
	d := startDatapath(t, env, root)
	kept := newPod(t).endpoint(1)
	d.put(t, kept)
	d.waitPrograms(t, 1, reconciler.StatusKindDone)
	before := wantAttached(t, kept)

	// Watch the kept endpoint's interface through the restart: one filter
	// must run at each hook all along, never none (a detach before the
	// attach) nor two (an attach before the detach).
	var (
		watchDone = make(chan struct{})
		watching  sync.WaitGroup
		gaps      []string
	)
	watching.Go(func() {
		for {
			for _, h := range hooks {
				filters, err := netlink.FilterList(&netlink.Device{LinkAttrs: netlink.LinkAttrs{Index: kept.HostIfIndex}}, h.parent)
				if err != nil || len(filters) != 1 {
					gaps = append(gaps, fmt.Sprintf("%s: %v %v", h.name, filters, err))
				}
			}
			select {
			case <-watchDone:
				return
			default:
			}
		}
	})

	d.stop()
	wantAttached(t, kept) // the agent is down: the filters stay

	d = startDatapath(t, env, root)
	d.put(t, kept) // the restore
	d.eps.Restored()
	d.waitPrograms(t, 1, reconciler.StatusKindDone)
	close(watchDone)
	watching.Wait()
	if len(gaps) > 0 {
		t.Fatalf("a hook of the interface ran other than one filter %d times during the restart, first: %v", len(gaps), gaps[0])
	}
	after := wantAttached(t, kept)
	for _, h := range hooks {
		if after[h.name] == before[h.name] {
			t.Errorf("%s: still program %d after the restart, want the new run's", h.name, after[h.name])
		}
	}
}

// The endpoints an agent before the filters attached through tcx links
// pinned in the endpoint links directory keep their links, which take the
// new programs in place; the links of an endpoint deleted while the agent
// was down are removed once the restore is done; and an endpoint whose
// veth was recreated gets filters on the new interface, its pinned link
// detached.
func TestEndpointProgramsFromTCX(t *testing.T) {
	env := socklbtest.New(t)
	root := bpfmapstest.Root(t)
	kept, gone, moved := newPod(t).endpoint(1), newPod(t).endpoint(2), newPod(t).endpoint(3)
	// An earlier agent: the bpf filesystem mounted, the links pinned.
	startDatapath(t, env, root).stop()
	old := doNothing(t)
	if err := os.MkdirAll(endpointLinksDir(root), 0o700); err != nil {
		t.Fatal(err)
	}
	links := map[string]link.ID{}
	for _, ep := range []*endpointmanager.Endpoint{kept, gone, moved} {
		for i, h := range hooks {
			l, err := link.AttachTCX(link.TCXOptions{Interface: ep.HostIfIndex, Program: old[i], Attach: h.attach})
			if err != nil {
				t.Fatal(err)
			}
			name := fmt.Sprintf("%d-%s", ep.ID, h.name)
			if err := l.Pin(filepath.Join(endpointLinksDir(root), name)); err != nil {
				t.Fatal(err)
			}
			info, err := l.Info()
			if err != nil {
				t.Fatal(err)
			}
			links[name] = info.ID
			l.Close()
		}
	}

	d := startDatapath(t, env, root)
	recreated := moved.Clone()
	p := newPod(t)
	recreated.HostIfName, recreated.HostIfIndex = p.host.Attrs().Name, p.host.Attrs().Index
	d.put(t, kept)
	d.put(t, recreated)
	d.eps.Restored()
	d.waitPrograms(t, 1, reconciler.StatusKindDone)
	d.waitPrograms(t, 3, reconciler.StatusKindDone)
	celltest.Eventually(t, "the links of the endpoint deleted while the agent was down are pruned", unpinned(root, 2))

	pins := pinnedEndpointLinks(t, root)
	for i, h := range hooks {
		name := fmt.Sprintf("1-%s", h.name)
		l, ok := pins[name]
		if !ok || l.id != links[name] {
			t.Fatalf("pin %s: %+v, want link %d kept", name, l, links[name])
		}
		if got := programName(t, l.program); got != h.program {
			t.Errorf("%s: the pinned link runs %q, want %q", h.name, got, h.program)
		}
		on := attachedTCX(t, kept.HostIfIndex, h.attach)
		if len(on.programs) != 1 || on.programs[0] != l.program {
			t.Errorf("%s of ifindex %d runs %v, want only the pinned link's program %d", h.name, kept.HostIfIndex, on.programs, l.program)
		}
		if prog := filterOn(t, kept.HostIfIndex, i); prog != 0 {
			t.Errorf("%s of ifindex %d also has a filter running %d", h.name, kept.HostIfIndex, prog)
		}
	}
	wantAttached(t, recreated)
	wantDetached(t, root, 3, moved.HostIfIndex)
	wantDetached(t, root, 2, gone.HostIfIndex)
}

// doNothing are two SchedCLS programs that do nothing, one per hook, as
// an earlier agent's.
func doNothing(t *testing.T) []*ebpf.Program {
	t.Helper()
	var out []*ebpf.Program
	for range hooks {
		p, err := ebpf.NewProgram(&ebpf.ProgramSpec{
			Type: ebpf.SchedCLS, License: "GPL",
			Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, -1), asm.Return()},
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close() })
		out = append(out, p)
	}
	return out
}

// An endpoint whose veth was recreated gets filters on the new interface.
func TestEndpointProgramsNewVeth(t *testing.T) {
	env := socklbtest.New(t)
	root := bpfmapstest.Root(t)
	d := startDatapath(t, env, root)
	ep := newPod(t).endpoint(1)
	d.put(t, ep)
	d.waitPrograms(t, 1, reconciler.StatusKindDone)
	wantAttached(t, ep)

	p := newPod(t)
	recreated := ep.Clone()
	recreated.HostIfName, recreated.HostIfIndex = p.host.Attrs().Name, p.host.Attrs().Index
	d.put(t, recreated)
	d.waitPrograms(t, 1, reconciler.StatusKindDone)
	wantAttached(t, recreated)
}

// An interface that does not exist is an error in the endpoint's row and in
// the loader's health, naming the endpoint and the ifindex.
func TestEndpointProgramsNoInterface(t *testing.T) {
	env := socklbtest.New(t)
	root := bpfmapstest.Root(t)
	d := startDatapath(t, env, root)
	ep := &endpointmanager.Endpoint{ID: 3, ContainerID: "c3", HostIfName: "lxcmissing", HostIfIndex: 1 << 30, State: endpointmanager.Ready}
	d.put(t, ep)
	row := d.waitPrograms(t, 3, reconciler.StatusKindError)
	want := "endpoint 3: attach the ingress program to lxcmissing (ifindex 1073741824): add clsact qdisc: no such device"
	if got := row.ProgramStatus.GetError(); got != want {
		t.Fatalf("program status error %q, want %q", got, want)
	}
	// The operator sees it in the log too, with the endpoint and the
	// interface.
	line := d.logs.Find("Attaching an endpoint's program failed; retrying", "endpoint", "3", "ifindex", "1073741824", "hook", "ingress")
	if line == nil || !strings.Contains(line["error"], "no such device") {
		t.Fatalf("no warning naming endpoint 3 and its ifindex: %v", line)
	}
	// And in health, for as long as the endpoint's programs are in error
	// (the reconciler's own row turns OK again the round after).
	const healthRow = "loader.job-endpoint-programs-status"
	s := d.waitHealth(t, healthRow, func(s *health.Status) bool { return s.Level == cell.StatusDegraded })
	if !strings.Contains(s.Error, "endpoint 3 (lxcmissing): "+want) {
		t.Fatalf("health %s = %s %q, want Degraded naming endpoint 3 and its error", healthRow, s.Level, s.Error)
	}
	d.delete(t, 3)
	d.waitHealth(t, healthRow, func(s *health.Status) bool { return s.Level == cell.StatusOK })
}

// waitHealth waits until the health row id satisfies cond, and returns it.
func (d *datapath) waitHealth(t *testing.T, id string, cond func(*health.Status) bool) *health.Status {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for {
		s, _, watch, found := d.health.GetWatch(d.eps.DB.ReadTxn(), health.StatusID.Query(id))
		if found && cond(s) {
			return s
		}
		select {
		case <-watch:
		case <-deadline:
			t.Fatalf("health row %s did not reach the expected state in 30s; last: %+v", id, s)
		}
	}
}

// Packets of a pod go through the programs: a ping and a TCP connection
// attempt from the pod to the host side leave conntrack entries.
func TestEndpointTraffic(t *testing.T) {
	env := socklbtest.New(t)
	root := bpfmapstest.Root(t)
	d := startDatapath(t, env, root)
	v4, _ := nettest.Ranges(t)
	router, podIP := v4.Addr().Next(), v4.Addr().Next().Next()
	p := newPod(t)
	p.address(t, router, podIP)

	ep := p.endpoint(1)
	ep.IPv4 = podIP
	d.put(t, ep)
	d.waitInDatapath(t, 1)

	if err := nettest.Ping(p.netns, router, 5*time.Second); err != nil {
		t.Fatalf("ping from the pod: %v", err)
	}
	icmp := ctEntries(t, d.ct.Any4, podIP, router, 1)
	if len(icmp) == 0 {
		t.Fatalf("no ICMP conntrack entry from %s to %s", podIP, router)
	}

	// Nobody listens: the host answers the SYN with a RST.
	err := nettest.Do(p.netns, func() error {
		c, err := net.DialTimeout("tcp", netip.AddrPortFrom(router, 9).String(), 5*time.Second)
		if err == nil {
			c.Close()
		}
		return err
	})
	if err == nil || !strings.Contains(err.Error(), "connection refused") {
		t.Fatalf("connect from the pod: %v, want connection refused", err)
	}
	tcp := ctEntries(t, d.ct.TCP4, podIP, router, 6)
	if len(tcp) == 0 {
		t.Fatalf("no TCP conntrack entry from %s to %s", podIP, router)
	}
	// From-endpoint counted the request, to-endpoint the reply.
	for _, e := range append(icmp, tcp...) {
		if e.EndpointID != 1 || e.PacketsTx == 0 || e.PacketsRx == 0 {
			t.Errorf("conntrack entry %+v, want endpoint 1 with packets both ways", e)
		}
	}
}

// address gives the pod podIP and a route to router through eth0, and the
// host side router and a route back to the pod: the addresses are in a
// blackholed test range.
func (p *pod) address(t *testing.T, router, podIP netip.Addr) {
	t.Helper()
	host32 := func(a netip.Addr) *net.IPNet { return &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(32, 32)} }
	if err := netlink.AddrAdd(p.host, &netlink.Addr{IPNet: host32(router)}); err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkSetUp(p.host); err != nil {
		t.Fatal(err)
	}
	if err := netlink.RouteAdd(&netlink.Route{LinkIndex: p.host.Attrs().Index, Dst: host32(podIP), Scope: netlink.SCOPE_LINK}); err != nil {
		t.Fatal(err)
	}
	err := nettest.Do(p.netns, func() error {
		eth0, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		if err := netlink.AddrAdd(eth0, &netlink.Addr{IPNet: host32(podIP)}); err != nil {
			return err
		}
		if err := netlink.LinkSetUp(eth0); err != nil {
			return err
		}
		return netlink.RouteAdd(&netlink.Route{LinkIndex: eth0.Attrs().Index, Dst: host32(router), Scope: netlink.SCOPE_LINK})
	})
	if err != nil {
		t.Fatalf("pod addresses: %v", err)
	}
}

// ctEntries are the entries of m for connections from src to dst.
func ctEntries(t *testing.T, m *ctmaps.Map4, src, dst netip.Addr, proto uint8) []ctmap.Entry {
	t.Helper()
	var out []ctmap.Entry
	err := m.Iterate(func(k ctmap.Key4, e ctmap.Entry) bool {
		if k.Proto == proto && netip.AddrFrom4(k.SrcAddr) == src && netip.AddrFrom4(k.DstAddr) == dst {
			out = append(out, e)
		}
		return true
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// `agent cleanup` removes the endpoints' filters too, from the interfaces
// named as endpoints' host sides.
func TestEndpointCleanup(t *testing.T) {
	env := socklbtest.New(t)
	root := bpfmapstest.Root(t)
	d := startDatapath(t, env, root)
	host, netnsPath := loader.NewVeth(t, fmt.Sprintf("%s%08x", devices.EndpointHostPrefix, rand.Uint32()))
	ep := (&pod{netns: netnsPath, host: host}).endpoint(1)
	d.put(t, ep)
	d.waitPrograms(t, 1, reconciler.StatusKindDone)
	wantAttached(t, ep)
	d.stop()

	text, _ := agentCleanup(t, env, root)
	for _, h := range hooks {
		want := fmt.Sprintf("removed tc filter cellium-%s of %s (ifindex %d)", h.name, ep.HostIfName, ep.HostIfIndex)
		if !strings.Contains(text, want) {
			t.Errorf("cleanup report does not say %q:\n%s", want, text)
		}
	}
	wantDetached(t, root, 1, ep.HostIfIndex)
}
