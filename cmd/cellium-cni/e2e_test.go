package main

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cellium/cellium/cells/endpointmanager"
	"github.com/cellium/cellium/pkg/nettest"
)

// Three pods get distinct addresses from the built plugin and agent, as a
// runtime would drive them (libcni with the agent's configuration), reach
// each other and the router over IPv4 and IPv6, pass CHECK, and DEL removes
// the veth pair, the addresses and the state; a second DEL, a DEL of an
// unknown container and a DEL without netns succeed.
func TestThreePods(t *testing.T) {
	n := newNode(t)
	n.start()
	list := n.conflist()
	if len(list.Plugins) != 1 || list.Plugins[0].Network.Type != "cellium-cni" || list.CNIVersion != "1.1.0" {
		t.Fatalf("the agent's CNI configuration: %s", list.Bytes)
	}

	pods := []*pod{n.newPod("a"), n.newPod("b"), n.newPod("c")}
	addrs := map[*pod][2]netip.Addr{}
	seen := map[netip.Addr]bool{}
	for _, p := range pods {
		v4, v6 := n.add(p)
		if !n.v4.Contains(v4) || !n.v6.Contains(v6) || seen[v4] || seen[v6] {
			t.Fatalf("pod %s got %s and %s: want distinct addresses in %s and %s", p.name, v4, v6, n.v4, n.v6)
		}
		seen[v4], seen[v6] = true, true
		addrs[p] = [2]netip.Addr{v4, v6}
	}

	eps := n.endpoints()
	if len(eps) != 3 {
		t.Fatalf("agent endpoint list: %d endpoints, want 3", len(eps))
	}
	for i, ep := range eps {
		if ep.ID == 0 || ep.ContainerID != pods[i].id || ep.IPv4 != addrs[pods[i]][0].String() ||
			ep.IPv6 != addrs[pods[i]][1].String() || ep.Interface != "eth0" || ep.State != "ready" || ep.PodName != pods[i].name {
			t.Errorf("endpoint %d = %+v, want pod %s's", i, ep, pods[i].name)
		}
	}
	if out := n.agentCLI("endpoint", "get", pods[0].id); !strings.Contains(out, addrs[pods[0]][0].String()) {
		t.Errorf("agent endpoint get %s:\n%s", pods[0].id, out)
	}

	for _, src := range pods {
		dsts := []netip.Addr{router(n.v4), router(n.v6)}
		for _, dst := range pods {
			if dst != src {
				dsts = append(dsts, addrs[dst][0], addrs[dst][1])
			}
		}
		for _, dst := range dsts {
			if err := nettest.Ping(src.ns.Path(), dst, 5*time.Second); err != nil {
				t.Errorf("pod %s: %v", src.name, err)
			}
		}
		if err := n.cni.CheckNetworkList(context.Background(), list, src.runtimeConf()); err != nil {
			t.Errorf("CNI CHECK of pod %s: %v", src.name, err)
		}
	}

	gone := pods[0]
	hostIf := endpointmanager.HostIfName(gone.id)
	if !n.hostLink(hostIf) {
		t.Fatalf("the node has no %s for pod a", hostIf)
	}
	if err := n.cni.DelNetworkList(context.Background(), list, gone.runtimeConf()); err != nil {
		t.Fatalf("CNI DEL: %v", err)
	}
	if n.hostLink(hostIf) {
		t.Errorf("%s still exists after DEL", hostIf)
	}
	if dirs := n.stateDirs(); len(dirs) != 2 || slices.Contains(dirs, strconv.Itoa(int(eps[0].ID))) {
		t.Errorf("endpoint state after DEL: %v, want only the two other pods'", dirs)
	}
	for _, a := range n.allocations() {
		if strings.Contains(a, gone.id) {
			t.Errorf("address still allocated after DEL: %s", a)
		}
	}
	if err := nettest.Ping(pods[1].ns.Path(), addrs[gone][0], 300*time.Millisecond); err == nil {
		t.Errorf("pod b still reaches the deleted pod's address %s", addrs[gone][0])
	}

	// DEL is idempotent: again, for a container the agent never saw, and
	// without a netns.
	if err := n.cni.DelNetworkList(context.Background(), list, gone.runtimeConf()); err != nil {
		t.Errorf("second CNI DEL: %v", err)
	}
	for _, env := range []map[string]string{
		{"CNI_COMMAND": "DEL", "CNI_CONTAINERID": "never-seen", "CNI_IFNAME": "eth0", "CNI_NETNS": "/nonexistent/netns"},
		{"CNI_COMMAND": "DEL", "CNI_CONTAINERID": gone.id, "CNI_IFNAME": "eth0"},
	} {
		if _, cniErr := cniExec(t, env, n.pluginConf("1.0.0")); cniErr != nil {
			t.Errorf("DEL %v: %+v", env, cniErr)
		}
	}
	if got := len(n.endpoints()); got != 2 {
		t.Errorf("%d endpoints after the DELs, want 2", got)
	}
}

// STATUS and VERSION, as a CNI 1.1 runtime asks them.
func TestStatusAndVersion(t *testing.T) {
	n := newNode(t)
	env := map[string]string{"CNI_COMMAND": "STATUS"}
	if _, cniErr := cniExec(t, env, n.pluginConf("1.1.0")); cniErr == nil || cniErr.Code != 50 || !strings.Contains(cniErr.Details, n.socket) {
		t.Fatalf("STATUS with no agent = %+v, want code 50 naming the socket", cniErr)
	}
	n.start()
	if _, cniErr := cniExec(t, env, n.pluginConf("1.1.0")); cniErr != nil {
		t.Fatalf("STATUS of a ready agent = %+v", cniErr)
	}
	out, cniErr := cniExec(t, map[string]string{"CNI_COMMAND": "VERSION"}, n.pluginConf("1.1.0"))
	if cniErr != nil || !strings.Contains(string(out), `"supportedVersions":["1.0.0","1.1.0"]`) {
		t.Fatalf("VERSION = %s, %+v", out, cniErr)
	}
}

// GC with the attachments a CNI 1.1 runtime still has: the endpoint of a
// container the runtime forgot (its DEL lost) is deleted and its addresses
// released; the others stay. (The plugin is run directly: libcni's GC
// would DEL what its own cache holds first.)
func TestGC(t *testing.T) {
	n := newNode(t)
	n.start()
	kept, lost := n.newPod("kept"), n.newPod("lost")
	n.add(kept)
	lostV4, _ := n.add(lost)
	gc := func(valid string) {
		t.Helper()
		if _, cniErr := cniExec(t, map[string]string{"CNI_COMMAND": "GC"}, []byte(`{"cniVersion":"1.1.0","name":"cellium","type":"cellium-cni","socket":"`+n.socket+
			`","cni.dev/valid-attachments":`+valid+`}`)); cniErr != nil {
			t.Fatalf("GC = %+v", cniErr)
		}
	}
	gc(`[{"containerID":"` + kept.id + `","ifname":"eth0"}]`)
	eps := n.endpoints()
	if len(eps) != 1 || eps[0].ContainerID != kept.id {
		t.Fatalf("endpoints after GC = %+v, want only %s's", eps, kept.id)
	}
	if slices.ContainsFunc(n.allocations(), func(a string) bool { return strings.HasPrefix(a, lostV4.String()+" ") }) {
		t.Errorf("the lost pod's address %s is still allocated after GC: %v", lostV4, n.allocations())
	}

	// An attachment the runtime lists with another interface is not the
	// endpoint's: GC deletes it too.
	gc(`[{"containerID":"` + kept.id + `","ifname":"eth1"}]`)
	if eps := n.endpoints(); len(eps) != 0 {
		t.Fatalf("endpoints after a GC listing none of them = %+v", eps)
	}
}

// With the embedded API server (a manifests directory) and --ipam=kubernetes,
// pods get addresses from their Node's spec.podCIDRs and their endpoints
// carry their labels.
func TestKubernetesMode(t *testing.T) {
	n := newNode(t)
	manifests := t.TempDir()
	nodeName := "cellium-e2e-" + strconv.Itoa(int(n.v4.Addr().As4()[2]))
	manifest := fmt.Sprintf(`apiVersion: v1
kind: Node
metadata:
  name: %[1]s
spec:
  podCIDRs: [%[2]q]
---
apiVersion: v1
kind: Pod
metadata:
  namespace: shop
  name: web
  labels: {app: web, tier: front}
spec:
  nodeName: %[1]s
  containers: [{name: web, image: web}]
`, nodeName, n.v4.String())
	if err := os.WriteFile(filepath.Join(manifests, "cluster.yaml"), []byte(manifest), 0o644); err != nil {
		t.Fatal(err)
	}
	n.podCIDR = "192.0.2.0/24" // ignored with --ipam=kubernetes
	a := n.start("--ipam", "kubernetes", "--k8s-mode", "embedded", "--k8s-manifests-dir", manifests, "--node-name", nodeName)
	a.waitLog(t, "Watching the pods of this node and the namespaces for their labels")

	p := n.newPod("web")
	conf := p.runtimeConf()
	conf.Args = [][2]string{{"K8S_POD_NAMESPACE", "shop"}, {"K8S_POD_NAME", "web"}}
	res, err := n.cni.AddNetworkList(context.Background(), n.conflist(), conf)
	if err != nil {
		t.Fatal(err)
	}
	if v4, v6 := resultAddrs(t, res); v4 != router(n.v4).Next() || v6.IsValid() {
		t.Fatalf("ADD got %s and %s, want %s from the Node's only pod CIDR", v4, v6, router(n.v4).Next())
	}
	eps := n.endpoints()
	if len(eps) != 1 || eps[0].PodNamespace != "shop" || eps[0].Labels["app"] != "web" || eps[0].Labels["tier"] != "front" {
		t.Fatalf("endpoints = %+v, want the pod's with its labels", eps)
	}
	if err := nettest.Ping(p.ns.Path(), router(n.v4), 5*time.Second); err != nil {
		t.Fatal(err)
	}
}
