package loader

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/hive/hivetest"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/cellium/cellium/cells/endpointmanager"
	"github.com/cellium/cellium/pkg/nettest"
)

// testPrograms are two do-nothing SchedCLS programs, one per hook.
type testPrograms map[endpointHook]*ebpf.Program

func newTestPrograms(t *testing.T) testPrograms {
	t.Helper()
	progs := testPrograms{}
	for _, h := range endpointHooks {
		p, err := ebpf.NewProgram(&ebpf.ProgramSpec{
			Name: "test_" + h.name, Type: ebpf.SchedCLS, License: "GPL",
			// TC_ACT_UNSPEC: carry on as if there were no program.
			Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, -1), asm.Return()},
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close() })
		progs[h] = p
	}
	return progs
}

func (p testPrograms) program(h endpointHook) (*ebpf.Program, ebpf.ProgramID) {
	return p[h], programID(p[h])
}

func programID(p *ebpf.Program) ebpf.ProgramID {
	info, err := p.Info()
	if err != nil {
		panic(err)
	}
	id, _ := info.ID()
	return id
}

// newHostVeth makes a veth pair with its host side in the test's network
// namespace, as an endpoint's, and eth0 in a namespace of the test's own,
// and returns the host side and the path of that namespace.
func newHostVeth(t *testing.T) (host netlink.Link, netnsPath string) {
	t.Helper()
	return newVeth(t, fmt.Sprintf("cltest%08x", rand.Uint32()))
}

// newVeth is newHostVeth with the host side named name.
func newVeth(t *testing.T, name string) (host netlink.Link, netnsPath string) {
	t.Helper()
	pod := nettest.NewNS(t)
	podNS, err := netns.GetFromPath(pod.Path())
	if err != nil {
		t.Fatal(err)
	}
	defer podNS.Close()
	veth := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: name},
		PeerName:      "eth0",
		PeerNamespace: netlink.NsFd(podNS),
	}
	if err := netlink.LinkAdd(veth); err != nil {
		t.Fatalf("veth pair %s: %v", name, err)
	}
	t.Cleanup(func() { netlink.LinkDel(veth) })
	host, err = netlink.LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	return host, pod.Path()
}

// bpfFilters are the IDs of the programs of the bpf filters at a hook's
// clsact parent, checking that each is direct-action and ours.
func bpfFilters(t *testing.T, host netlink.Link, h endpointHook) []int {
	t.Helper()
	filters, err := netlink.FilterList(host, h.parent)
	if err != nil {
		t.Fatal(err)
	}
	var ids []int
	for _, f := range filters {
		bf, ok := f.(*netlink.BpfFilter)
		if !ok {
			t.Fatalf("%s: filter %v is no bpf filter", h.name, f)
		}
		if !bf.DirectAction || bf.Name != tcFilterName(h) {
			t.Fatalf("%s: filter %+v, want direct-action and named cellium-%s", h.name, bf, h.name)
		}
		ids = append(ids, bf.Id)
	}
	return ids
}

// The programs are tc filters: attached, replaced in place by the next
// agent's programs, removed with the endpoint.
func TestFilters(t *testing.T) {
	host, _ := newHostVeth(t)
	ep := &endpointmanager.Endpoint{ID: 7, HostIfName: host.Attrs().Name, HostIfIndex: host.Attrs().Index, State: endpointmanager.Ready}
	ctx := context.Background()
	newOps := func(progs testPrograms) *endpointLinks {
		return &endpointLinks{log: hivetest.Logger(t), dir: t.TempDir(), progs: progs}
	}

	first := newTestPrograms(t)
	ops := newOps(first)
	if err := ops.Update(ctx, nil, 0, ep); err != nil {
		t.Fatal(err)
	}
	for _, h := range endpointHooks {
		if got, want := bpfFilters(t, host, h), int(programID(first[h])); len(got) != 1 || got[0] != want {
			t.Fatalf("%s filters run programs %v, want only %d", h.name, got, want)
		}
	}
	// Again: nothing to do.
	for _, h := range endpointHooks {
		if how, err := ops.attach(ep, h); err != nil || how != "" {
			t.Fatalf("attach %s again = %q, %v; want nothing done", h.name, how, err)
		}
	}

	// The next agent: the same filters take its programs.
	second := newTestPrograms(t)
	ops = newOps(second)
	if err := ops.Update(ctx, nil, 0, ep); err != nil {
		t.Fatal(err)
	}
	for _, h := range endpointHooks {
		if got, want := bpfFilters(t, host, h), int(programID(second[h])); len(got) != 1 || got[0] != want {
			t.Fatalf("%s filters run programs %v after the restart, want only %d", h.name, got, want)
		}
	}

	third := newOps(newTestPrograms(t))
	if err := third.Delete(ctx, nil, 0, ep); err != nil {
		t.Fatal(err)
	}
	for _, h := range endpointHooks {
		if got := bpfFilters(t, host, h); len(got) != 0 {
			t.Fatalf("%s filters %v left after delete", h.name, got)
		}
	}
	// Deleting again, or an endpoint whose interface is gone, is done.
	if err := ops.Delete(ctx, nil, 0, ep); err != nil {
		t.Fatalf("second delete: %v", err)
	}
	if err := netlink.LinkDel(host); err != nil {
		t.Fatal(err)
	}
	if err := ops.Delete(ctx, nil, 0, ep); err != nil {
		t.Fatalf("delete with the interface gone: %v", err)
	}
}

// Deleting an endpoint that has neither pins nor filters (its programs
// were never attached) is done: the look for filters finds no clsact
// qdisc.
func TestDetachNeverAttached(t *testing.T) {
	host, _ := newHostVeth(t)
	ep := &endpointmanager.Endpoint{ID: 9, HostIfName: host.Attrs().Name, HostIfIndex: host.Attrs().Index, State: endpointmanager.Ready}
	ops := &endpointLinks{log: hivetest.Logger(t), dir: t.TempDir(), progs: newTestPrograms(t)}
	if err := ops.Delete(context.Background(), nil, 0, ep); err != nil {
		t.Fatalf("delete of an endpoint never attached: %v", err)
	}
}
