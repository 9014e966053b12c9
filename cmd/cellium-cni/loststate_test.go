package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/cellium/cellium/cells/endpointmanager"
)

// The agent dies and a running pod's state file is truncated meanwhile:
// after the restart the pod keeps its addresses (they are in use, not
// unclaimed, so the leak grace never hands them to another pod), `agent
// status` names the moved file and the container, and the runtime's DEL
// removes the pod's veth pair and releases them.
func TestLostStateFileKeepsPodAddresses(t *testing.T) {
	n := newNode(t)
	n.start()
	p := n.newPod("kept")
	v4, v6 := n.add(p)
	dirs := n.stateDirs()
	if len(dirs) != 1 {
		t.Fatalf("endpoint state = %v, want one endpoint", dirs)
	}
	n.kill()
	file := filepath.Join(n.dir, "state", "endpoints", dirs[0], "endpoint.json")
	if err := os.Truncate(file, 17); err != nil {
		t.Fatal(err)
	}

	n.start("--ipam-leak-grace", "1ms")
	n.agent.waitLog(t, "Kept the addresses of a container whose endpoint state is lost but whose interface exists; a CNI DEL of the container removes it")
	want := []string{v4.String() + " " + p.id + " in-use", v6.String() + " " + p.id + " in-use"}
	if got := n.allocations(); !slices.Equal(got, want) {
		t.Fatalf("allocations after the restart = %q, want %q", got, want)
	}
	other := n.newPod("other")
	if o4, o6 := n.add(other); o4 == v4 || o6 == v6 {
		t.Fatalf("another pod got %s/%s, which the pod with the lost state holds", o4, o6)
	}
	status := n.agentCLI("status")
	for _, s := range []string{"state", file, "unexpected EOF", p.id, endpointmanager.HostIfName(p.id)} {
		if !strings.Contains(status, s) {
			t.Errorf("agent status does not name %q:\n%s", s, status)
		}
	}

	if err := n.cni.DelNetworkList(t.Context(), n.conflist(), p.runtimeConf()); err != nil {
		t.Fatalf("the runtime's DEL of the pod with the lost state: %v", err)
	}
	if n.hostLink(endpointmanager.HostIfName(p.id)) {
		t.Errorf("%s still exists after the DEL", endpointmanager.HostIfName(p.id))
	}
	for _, a := range n.allocations() {
		if strings.Contains(a, p.id) {
			t.Errorf("allocation %q left after the DEL", a)
		}
	}
	if status := n.agentCLI("status"); strings.Contains(status, p.id) {
		t.Errorf("agent status still names %s after its DEL:\n%s", p.id, status)
	}
}
