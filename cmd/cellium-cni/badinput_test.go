package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/cellium/cellium/cells/endpointmanager"
)

// Bad input gets a CNI error that says what is wrong, and changes nothing:
// malformed configuration or environment, an ADD for a container that has
// an endpoint, an exhausted pool, an agent that does not answer.
func TestBadInput(t *testing.T) {
	n := newNode(t)
	// One pod address: the router and .2.
	n.podCIDR = n.v4.Addr().String() + "/30"
	n.start()
	first := n.newPod("first")
	v4, _ := n.add(first)
	endpoints, allocations, dirs := n.endpoints(), n.allocations(), n.stateDirs()

	other := n.newPod("other")
	notANamespace := filepath.Join(t.TempDir(), "netns")
	os.WriteFile(notANamespace, nil, 0o600)
	add := func(id, netns string) map[string]string {
		return map[string]string{"CNI_COMMAND": "ADD", "CNI_CONTAINERID": id, "CNI_NETNS": netns, "CNI_IFNAME": "eth0"}
	}
	good := n.pluginConf("1.0.0")
	for _, tc := range []struct {
		name  string
		env   map[string]string
		stdin string
		code  uint
		want  string
	}{
		{"stdin not JSON", add(other.id, other.ns.Path()), "{not json", 6, "invalid character"},
		{"no network name", add(other.id, other.ns.Path()), `{"cniVersion":"1.0.0","type":"cellium-cni"}`, 7, "missing network name"},
		{"no type", add(other.id, other.ns.Path()), `{"cniVersion":"1.0.0","name":"cellium"}`, 7, `"type" missing, want cellium-cni`},
		{"another plugin's type", add(other.id, other.ns.Path()), `{"cniVersion":"1.0.0","name":"cellium","type":"bridge"}`, 7, `type "bridge", want cellium-cni`},
		{"relative socket", add(other.id, other.ns.Path()), `{"cniVersion":"1.0.0","name":"cellium","type":"cellium-cni","socket":"agent.sock"}`, 7, `socket "agent.sock" must be an absolute path`},
		{"socket not a string", add(other.id, other.ns.Path()), `{"cniVersion":"1.0.0","name":"cellium","type":"cellium-cni","socket":7}`, 6, "invalid network configuration on stdin"},
		{"old CNI version", add(other.id, other.ns.Path()), `{"cniVersion":"0.3.1","name":"cellium","type":"cellium-cni"}`, 1, "incompatible CNI versions"},
		{"no CNI_NETNS", add(other.id, ""), string(good), 4, "CNI_NETNS"},
		{"netns that is not one", add(other.id, notANamespace), string(good), 4, "is not a namespace (nothing is mounted there)"},
		{"existing container", add(first.id, first.ns.Path()), string(good), 100, "already has endpoint"},
		{"exhausted pool", add(other.id, other.ns.Path()), string(good), 11, "ipv4 pool " + n.podCIDR + " is exhausted"},
		{"agent unreachable", add(other.id, other.ns.Path()),
			`{"cniVersion":"1.0.0","name":"cellium","type":"cellium-cni","socket":"/nonexistent/agent.sock"}`, 11,
			"cellium agent unreachable at /nonexistent/agent.sock: try again later"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, cniErr := cniExec(t, tc.env, []byte(tc.stdin))
			if cniErr == nil {
				t.Fatal("ADD succeeded")
			}
			if cniErr.Code != tc.code || !strings.Contains(cniErr.Msg+" "+cniErr.Details, tc.want) {
				t.Fatalf("ADD = code %d %q (%s), want code %d containing %q", cniErr.Code, cniErr.Msg, cniErr.Details, tc.code, tc.want)
			}
		})
	}

	if got := n.endpoints(); len(got) != 1 || got[0].ContainerID != first.id || got[0].IPv4 != v4.String() || got[0].ID != endpoints[0].ID {
		t.Errorf("endpoints after the bad ADDs = %+v, want only the first pod's, unchanged", got)
	}
	if got := n.allocations(); !slices.Equal(got, allocations) {
		t.Errorf("allocations after the bad ADDs = %v, want %v", got, allocations)
	}
	if got := n.stateDirs(); !slices.Equal(got, dirs) {
		t.Errorf("endpoint state after the bad ADDs = %v, want %v", got, dirs)
	}
	if n.hostLink(endpointmanager.HostIfName(other.id)) {
		t.Error("a failed ADD left a veth pair on the node")
	}
	if _, cniErr := cniExec(t, map[string]string{"CNI_COMMAND": "CHECK", "CNI_CONTAINERID": first.id, "CNI_NETNS": first.ns.Path(), "CNI_IFNAME": "eth0"},
		[]byte(`{"cniVersion":"1.0.0","name":"cellium","type":"cellium-cni","socket":"`+n.socket+`","prevResult":{"cniVersion":"1.0.0","ips":[{"address":"`+v4.String()+`/32"}]}}`)); cniErr != nil {
		t.Errorf("CHECK of the first pod after the bad ADDs: %+v", cniErr)
	}
	// CHECK with a prevResult that is not the endpoint's fails.
	_, cniErr := cniExec(t, map[string]string{"CNI_COMMAND": "CHECK", "CNI_CONTAINERID": first.id, "CNI_NETNS": first.ns.Path(), "CNI_IFNAME": "eth0"},
		[]byte(`{"cniVersion":"1.0.0","name":"cellium","type":"cellium-cni","socket":"`+n.socket+`","prevResult":{"cniVersion":"1.0.0","ips":[{"address":"10.0.0.1/32"}]}}`))
	if cniErr == nil || cniErr.Code != 101 || !strings.Contains(cniErr.Details, "prevResult has addresses [10.0.0.1]") {
		t.Errorf("CHECK with another address = %+v, want code 101 naming it", cniErr)
	}
}
