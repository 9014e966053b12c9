package devcluster_test

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	"github.com/cellium/cellium/pkg/apiv1"
	"github.com/cellium/cellium/pkg/client"
	"github.com/cellium/cellium/pkg/devcluster"
	"github.com/cellium/cellium/pkg/devcluster/devclustertest"
	"github.com/cellium/cellium/pkg/ipcachemap"
	"github.com/cellium/cellium/pkg/k8sapi"
	"github.com/cellium/cellium/pkg/kubeapiserver"
	"github.com/cellium/cellium/pkg/polltest"
)

// TestCRDIdentities: a cluster in crd mode (a real kube-apiserver, the
// agents authenticated as deploy/rbac.yaml's ServiceAccount, no kvstore),
// pods with one label set on both nodes. The agents install the CRDs
// (the cluster applies only the RBAC); the label set has one number on
// both nodes, held by a CelliumIdentity; each node's ipcache, table and
// BPF map, has the other node's pods with their identity, from their
// CelliumEndpoint objects (source k8s), behind that node's address.
func TestCRDIdentities(t *testing.T) {
	if _, err := kubeapiserver.Binary(); err != nil {
		t.Skip(err)
	}
	c := devclustertest.Start(t, devcluster.Options{Nodes: 2, IdentityMode: devcluster.IdentityCRD})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cfg, err := c.KubeRESTConfig()
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}

	for _, n := range c.Nodes() {
		conf, err := client.New(n.APISocket).Config(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if conf["kvstore"] != "" || conf["identity-allocation-mode"] != "crd" || conf["k8s-mode"] != "kubeconfig" {
			t.Errorf("%s's agent runs with kvstore %q, identity-allocation-mode %q, k8s-mode %q; want none, crd, kubeconfig",
				n.Name, conf["kvstore"], conf["identity-allocation-mode"], conf["k8s-mode"])
		}
	}
	crds := dyn.Resource(schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"})
	for _, name := range []string{k8sapi.ResourceIdentities + "." + k8sapi.Group, k8sapi.ResourceEndpoints + "." + k8sapi.Group} {
		crd, err := crds.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("CRD %s: %v", name, err)
		}
		if !established(crd) {
			t.Errorf("CRD %s is not established: %v", name, crd.Object["status"])
		}
	}

	web := map[string]string{"app": "web"}
	defer func() {
		// agent status's Identities line: the backend, its store, and
		// the two label sets' identities known (with the namespace's).
		ib, err := client.New(c.Node("node-2").APISocket).IdentityBackend(ctx)
		if err != nil || ib.Mode != "crd" || ib.Store != "CelliumIdentity objects" || ib.State != "watching" || ib.Known < 2 {
			t.Errorf("node-2's identity backend: %+v (%v), want crd, CelliumIdentity objects, watching, 2 or more known", ib, err)
		}
		// Every module says how it is in this mode: a scope that never
		// reports (a refused-objects scope with nothing refused, the
		// Kubernetes client's module without manifests) keeps the
		// agent's level Unknown.
		for _, n := range c.Nodes() {
			polltest.Until(t, n.Name+"'s agent health OK", 30*time.Second, 100*time.Millisecond, func() (bool, string) {
				h, err := client.New(n.APISocket).Health(ctx)
				if err != nil {
					return false, err.Error()
				}
				return h.Level == apiv1.LevelOK, fmt.Sprintf("level %s, modules not OK: %s", h.Level, notOK(h.Modules))
			})
		}
	}()
	a := c.AddPod("node-1", "a", web)
	b := c.AddPod("node-2", "b", web)
	d := c.AddPod("node-1", "d", map[string]string{"app": "db"})
	idA, idB, idD := endpointIdentity(t, c, a), endpointIdentity(t, c, b), endpointIdentity(t, c, d)
	if idA != idB || idA == idD || idA < 256 {
		t.Fatalf("identities: a (node-1, app=web) %d, b (node-2, app=web) %d, d (node-1, app=db) %d; want a's and b's one cluster number, d's another", idA, idB, idD)
	}
	obj, err := dyn.Resource(k8sapi.GroupVersion.WithResource(k8sapi.ResourceIdentities)).Get(ctx, strconv.Itoa(int(idA)), metav1.GetOptions{})
	if err != nil {
		t.Fatalf("CelliumIdentity %d: %v", idA, err)
	}
	if labels, _, _ := unstructured.NestedStringSlice(obj.Object, "spec", "labels"); !slices.Contains(labels, "k8s:app=web") {
		t.Errorf("CelliumIdentity %d has labels %v, want k8s:app=web among them", idA, labels)
	}

	// Each node knows the other's pods: in its ipcache table from their
	// CelliumEndpoint objects, and in its BPF map.
	for _, w := range []struct {
		node string
		pod  devcluster.Pod
		id   uint32
		via  string
	}{{"node-2", a, idA, "node-1"}, {"node-2", d, idD, "node-1"}, {"node-1", b, idB, "node-2"}} {
		n, via := c.Node(w.node), c.Node(w.via)
		cl := client.New(n.APISocket)
		pinned, err := ebpf.LoadPinnedMap(agentMapInfo(t, cl, ipcachemap.MapName).PinPath, &ebpf.LoadPinOptions{ReadOnly: true})
		if err != nil {
			t.Fatal(err)
		}
		defer pinned.Close()
		for _, ip := range []netip.Addr{w.pod.IPv4, w.pod.IPv6} {
			polltest.Until(t, fmt.Sprintf("%s's ipcache has pod %s's %s as identity %d", w.node, w.pod.Name, ip, w.id), 30*time.Second, 50*time.Millisecond, func() (bool, string) {
				e, err := cl.IPCacheLookup(ctx, ip.String())
				if err != nil {
					return false, err.Error()
				}
				if e.Identity != w.id || e.Source != "k8s" || e.HostIP != via.IPv4.String() {
					return false, fmt.Sprintf("table: %+v", e)
				}
				var v ipcachemap.Value
				if err := pinned.Lookup(ipcachemap.KeyOf(netip.PrefixFrom(ip, ip.BitLen())), &v); err != nil {
					return false, fmt.Sprintf("table: %+v; map: %v", e, err)
				}
				if v.Identity != w.id || v.TunnelAddr() != via.IPv4 {
					return false, fmt.Sprintf("table: %+v; map: identity %d, tunnel endpoint %s", e, v.Identity, v.TunnelAddr())
				}
				return true, ""
			})
		}
	}
}

func established(crd *unstructured.Unstructured) bool {
	conds, _, _ := unstructured.NestedSlice(crd.Object, "status", "conditions")
	for _, c := range conds {
		if m, ok := c.(map[string]any); ok && m["type"] == "Established" && m["status"] == "True" {
			return true
		}
	}
	return false
}

// endpointIdentity is the identity p's node's agent gave p's endpoint.
func endpointIdentity(t *testing.T, c *devclustertest.Cluster, p devcluster.Pod) uint32 {
	t.Helper()
	ep, err := client.New(c.Node(p.Node).APISocket).Endpoint(context.Background(), client.ContainerEndpointID(p.ContainerID))
	if err != nil {
		t.Fatalf("pod %s's endpoint: %v", p.Name, err)
	}
	return ep.Identity
}

// notOK names the scopes of nodes whose own level is not OK.
func notOK(nodes []apiv1.HealthNode) string {
	var out []string
	var walk func([]apiv1.HealthNode)
	walk = func(ns []apiv1.HealthNode) {
		for _, n := range ns {
			if len(n.Children) == 0 && n.Level != apiv1.LevelOK {
				out = append(out, n.ID+" "+n.Level)
			}
			walk(n.Children)
		}
	}
	walk(nodes)
	return strings.Join(out, ", ")
}
