package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/cellium/cellium/cells/loader/socklbtest"
	"github.com/cellium/cellium/pkg/apiv1"
	"github.com/cellium/cellium/pkg/client"
	"github.com/cellium/cellium/pkg/polltest"
)

// svc is a Service with one port, named p, and its EndpointSlice.
type svc struct {
	name, clusterIP string
	port            int
	proto           string
	targetPort      int
	nodePort        int      // set: type NodePort
	affinity        bool     // sessionAffinity: ClientIP
	backends        []string // ready endpoints
}

func (s svc) manifest() string {
	spec, portExtra := "", ""
	if s.nodePort > 0 {
		spec += "  type: NodePort\n"
		portExtra = fmt.Sprintf(", nodePort: %d", s.nodePort)
	}
	if s.affinity {
		spec += "  sessionAffinity: ClientIP\n"
	}
	return service(s.name, s.clusterIP, s.port, s.proto, s.targetPort, s.backends, spec, portExtra)
}

// service is the manifest of a Service with one port and its
// EndpointSlice; spec goes into the Service's spec, portExtra into its port.
func service(name, clusterIP string, port int, proto string, targetPort int, backends []string, spec, portExtra string) string {
	var endpoints strings.Builder
	for _, be := range backends {
		fmt.Fprintf(&endpoints, "  - addresses: [%q]\n    conditions: {ready: true}\n", be)
	}
	eps := endpoints.String()
	if eps == "" {
		eps = "  []\n"
	}
	return fmt.Sprintf(`apiVersion: v1
kind: Service
metadata: {name: %[1]s, namespace: default}
spec:
  clusterIP: %[2]s
  ports: [{name: p, port: %[3]d, protocol: %[4]s, targetPort: %[5]d%[8]s}]
%[7]s---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: %[1]s-1
  namespace: default
  labels: {kubernetes.io/service-name: %[1]s}
addressType: IPv4
ports: [{name: p, port: %[5]d, protocol: %[4]s}]
endpoints:
%[6]s`, name, clusterIP, port, proto, targetPort, eps, spec, portExtra)
}

// writeManifest writes a file atomically, as an editor or a ConfigMap would.
func writeManifest(t *testing.T, dir, name, content string) {
	t.Helper()
	tmp := filepath.Join(dir, "."+name+".tmp")
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
		t.Fatal(err)
	}
}

// frontendRow is what the test reads of `agent db show frontends -o json`.
type frontendRow struct {
	Address  string   `json:"address"`
	Backends []string `json:"backends"`
	Status   struct {
		Kind  string  `json:"kind"`
		Error *string `json:"error"`
	} `json:"status"`
}

// waitFrontends waits until the agent's frontends table matches want
// (address → backends) and every row is in the kernel (Done).
func waitFrontends(t *testing.T, c *client.Client, want map[string][]string) {
	t.Helper()
	poll(t, fmt.Sprintf("frontends %v", want), func() (bool, string) {
		objs, err := c.TableObjects(context.Background(), "frontends", client.TableQuery{})
		return err == nil && frontendsMatch(objs, want), fmt.Sprintf("%s %v", objs, err)
	})
}

// frontendsMatch is whether objs are want and Done. NodePort frontends on
// node addresses (the host's, whatever they are) are not in want: any
// frontend of port 30080 is accepted.
func frontendsMatch(objs apiv1.TableObjects, want map[string][]string) bool {
	got := map[string][]string{}
	for _, raw := range objs {
		var fe frontendRow
		if json.Unmarshal(raw, &fe) != nil || fe.Status.Kind != "Done" {
			return false
		}
		got[fe.Address] = fe.Backends
	}
	for addr, backends := range want {
		g, ok := got[addr]
		if !ok || strings.Join(g, ",") != strings.Join(backends, ",") {
			return false
		}
	}
	for addr := range got {
		if _, ok := want[addr]; !ok && !strings.HasSuffix(addr, ":30080/TCP") {
			return false
		}
	}
	return true
}

// nodeAddress is one of the node's IPv4 addresses, as the devices cell sees
// them, if it has any.
func nodeAddress(t *testing.T, c *client.Client) (netip.Addr, bool) {
	t.Helper()
	objs, err := c.TableObjects(context.Background(), "node-addresses", client.TableQuery{})
	if err != nil {
		t.Fatal(err)
	}
	for _, raw := range objs {
		var na struct{ Addr netip.Addr }
		if json.Unmarshal(raw, &na) == nil && na.Addr.Is4() {
			return na.Addr, true
		}
	}
	return netip.Addr{}, false
}

// poll calls ok every 50ms until it is true, for up to 60s: the agent has
// no push API for table and health changes yet.
func poll(t *testing.T, what string, ok func() (bool, string)) {
	t.Helper()
	polltest.Until(t, what, 60*time.Second, 50*time.Millisecond, ok)
}

// waitHealth waits until module is Degraded with a message or error
// mentioning substr.
func waitHealth(t *testing.T, c *client.Client, module, substr string) {
	t.Helper()
	poll(t, module+" degraded about "+substr, func() (bool, string) {
		h, err := c.Health(context.Background())
		if err != nil {
			return false, err.Error()
		}
		var found bool
		var walk func([]apiv1.HealthNode)
		walk = func(nodes []apiv1.HealthNode) {
			for _, n := range nodes {
				if strings.HasPrefix(n.ID, module) && n.Level == apiv1.LevelDegraded &&
					(strings.Contains(n.Message, substr) || strings.Contains(n.Error, substr)) {
					found = true
				}
				walk(n.Children)
			}
		}
		walk(h.Modules)
		return found, fmt.Sprint(h.Modules)
	})
}

// waitDumpWithout waits until no entry of the map mentions substr.
func waitDumpWithout(t *testing.T, socket, name, substr string) {
	t.Helper()
	poll(t, name+" without "+substr, func() (bool, string) {
		out, errOut, code := agentCmd(t, "map", "dump", name, "--api-socket", socket)
		return code == 0 && !strings.Contains(out, substr), out + errOut
	})
}

// backendsOf counts the backends the calls reached; failures count under
// their errno.
func backendsOf(results []socklbtest.Result) map[string]int {
	seen := map[string]int{}
	for _, r := range results {
		if r.Errno != "" {
			seen[r.Errno]++
		} else {
			seen[r.Backend]++
		}
	}
	return seen
}

func metric(t *testing.T, metricsAddr, name string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + metricsAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	if f, ok := families[name]; ok {
		for _, m := range f.GetMetric() {
			sum += m.GetCounter().GetValue()
		}
	}
	return sum
}

var (
	clusterIP = netip.MustParseAddrPort("10.96.0.10:80")
	dnsIP     = netip.MustParseAddrPort("10.96.0.11:53")
	emptyIP   = netip.MustParseAddrPort("10.96.0.12:80")
	stickyIP  = netip.MustParseAddrPort("10.96.0.13:80")
)

// TestServiceLoadBalancing runs the agent binary on a manifests directory
// and checks, with real sockets of clients in a cgroup and network
// namespace of the test's own, that Services reach their backends, that
// changes to the files converge, and that traffic keeps flowing through an
// agent restart that rewrites nothing.
func TestServiceLoadBalancing(t *testing.T) {
	requireRoot(t)
	sock := socklbtest.New(t)
	env := newAgentEnv(t)
	env.cgroup = sock.Cgroup
	manifests := t.TempDir()
	flags := append(env.runFlags(), "--k8s-manifests-dir", manifests)

	be := netip.MustParseAddrPort
	sock.ServeTCP(be("127.0.0.2:8080"), be("127.0.0.3:8080"), be("127.0.0.5:8080"), be("127.0.0.6:8080"), be("127.0.0.7:8080"))
	sock.ServeUDP(be("127.0.0.4:5353"))

	web := svc{name: "web", clusterIP: "10.96.0.10", port: 80, proto: "TCP", targetPort: 8080, backends: []string{"127.0.0.2", "127.0.0.3"}}
	writeManifest(t, manifests, "web.yaml", web.manifest())
	writeManifest(t, manifests, "dns.yaml", svc{name: "dns", clusterIP: "10.96.0.11", port: 53, proto: "UDP", targetPort: 5353, backends: []string{"127.0.0.4"}}.manifest())
	writeManifest(t, manifests, "empty.yaml", svc{name: "empty", clusterIP: "10.96.0.12", port: 80, proto: "TCP", targetPort: 8080}.manifest())
	writeManifest(t, manifests, "sticky.yaml", svc{name: "sticky", clusterIP: "10.96.0.13", port: 80, proto: "TCP", targetPort: 8080,
		affinity: true, backends: []string{"127.0.0.5", "127.0.0.6"}}.manifest())
	writeManifest(t, manifests, "np.yaml", svc{name: "np", clusterIP: "10.96.0.14", port: 80, proto: "TCP", targetPort: 8080,
		nodePort: 30080, backends: []string{"127.0.0.7"}}.manifest())

	agent := startAgent(t, flags...)
	agent.waitFor("Started hive")
	c := client.New(env.socket)
	want := map[string][]string{
		"10.96.0.10:80/TCP": {"127.0.0.2:8080/TCP", "127.0.0.3:8080/TCP"},
		"10.96.0.11:53/UDP": {"127.0.0.4:5353/UDP"},
		"10.96.0.12:80/TCP": {},
		"10.96.0.13:80/TCP": {"127.0.0.5:8080/TCP", "127.0.0.6:8080/TCP"},
		"10.96.0.14:80/TCP": {"127.0.0.7:8080/TCP"},
		"0.0.0.0:30080/TCP": {"127.0.0.7:8080/TCP"},
	}
	waitFrontends(t, c, want)

	t.Run("clusterIP spreads over every backend", func(t *testing.T) {
		seen := backendsOf(sock.Run(socklbtest.Repeat(40, socklbtest.Call{Op: socklbtest.TCP, To: clusterIP})...))
		for _, r := range sock.Run(socklbtest.Call{Op: socklbtest.TCP, To: clusterIP}) {
			if r.Peer != clusterIP {
				t.Errorf("getpeername = %v, want the service address %v", r.Peer, clusterIP)
			}
		}
		if len(seen) != 2 || seen["127.0.0.2:8080"] == 0 || seen["127.0.0.3:8080"] == 0 {
			t.Fatalf("40 connects reached %v, want both backends", seen)
		}
	})
	t.Run("udp reply comes from the service address", func(t *testing.T) {
		r := sock.Run(socklbtest.Call{Op: socklbtest.UDP, To: dnsIP})[0]
		if r.Backend != "127.0.0.4:5353" || r.From != dnsIP {
			t.Fatalf("UDP to %v = %v, want backend 127.0.0.4:5353 answering from the service address", dnsIP, r)
		}
	})
	t.Run("no backends refuses", func(t *testing.T) {
		r := sock.Run(socklbtest.Call{Op: socklbtest.TCP, To: emptyIP})[0]
		if r.Errno != "ECONNREFUSED" {
			t.Fatalf("connect to a service without backends = %v, want ECONNREFUSED", r)
		}
	})
	t.Run("affinity keeps a client on one backend", func(t *testing.T) {
		if seen := backendsOf(sock.Run(socklbtest.Repeat(20, socklbtest.Call{Op: socklbtest.TCP, To: stickyIP})...)); len(seen) != 1 {
			t.Fatalf("20 connects with ClientIP affinity reached %v, want one backend", seen)
		}
	})
	t.Run("nodeport on loopback and a node address", func(t *testing.T) {
		targets := []netip.AddrPort{netip.MustParseAddrPort("127.0.0.1:30080")}
		if node, ok := nodeAddress(t, c); ok {
			targets = append(targets, netip.AddrPortFrom(node, 30080))
		}
		for _, to := range targets {
			if r := sock.Run(socklbtest.Call{Op: socklbtest.TCP, To: to})[0]; r.Backend != "127.0.0.7:8080" {
				t.Errorf("NodePort via %v = %v, want backend 127.0.0.7:8080", to, r)
			}
		}
	})
	t.Run("a removed backend gets no new connections", func(t *testing.T) {
		web.backends = []string{"127.0.0.2"}
		writeManifest(t, manifests, "web.yaml", web.manifest())
		want["10.96.0.10:80/TCP"] = []string{"127.0.0.2:8080/TCP"}
		waitFrontends(t, c, want)
		if seen := backendsOf(sock.Run(socklbtest.Repeat(20, socklbtest.Call{Op: socklbtest.TCP, To: clusterIP})...)); len(seen) != 1 || seen["127.0.0.2:8080"] != 20 {
			t.Fatalf("after removing 127.0.0.3 from the slice, 20 connects reached %v", seen)
		}
	})
	t.Run("a broken manifest disturbs nothing", func(t *testing.T) {
		writeManifest(t, manifests, "broken.yaml", "apiVersion: v1\nkind: Service\nmetadata: {name: [oops\n")
		waitHealth(t, c, "k8s-client", "broken.yaml")
		if r := sock.Run(socklbtest.Call{Op: socklbtest.TCP, To: clusterIP})[0]; r.Backend != "127.0.0.2:8080" {
			t.Fatalf("service after a broken manifest = %v", r)
		}
		os.Remove(filepath.Join(manifests, "broken.yaml"))
	})

	// Restart: with the agent stopped, the pinned maps and programs keep
	// serving; a change made meanwhile converges after the restart, IDs are
	// kept and nothing unchanged is rewritten.
	servicesBefore, _, _ := agentCmd(t, "map", "dump", "cellium_lb4_services", "--api-socket", env.socket)
	agent.stop()
	if r := sock.Run(socklbtest.Call{Op: socklbtest.TCP, To: clusterIP})[0]; r.Backend != "127.0.0.2:8080" {
		t.Fatalf("connect with the agent stopped = %v, want the service to keep working", r)
	}
	os.Remove(filepath.Join(manifests, "dns.yaml"))
	web.backends = []string{"127.0.0.2", "127.0.0.3"}
	writeManifest(t, manifests, "web.yaml", web.manifest())
	delete(want, "10.96.0.11:53/UDP")
	want["10.96.0.10:80/TCP"] = []string{"127.0.0.2:8080/TCP", "127.0.0.3:8080/TCP"}

	agent = startAgent(t, flags...)
	agent.waitFor("Started hive")
	waitFrontends(t, c, want)
	waitDumpWithout(t, env.socket, "cellium_lb4_services", "10.96.0.11:53")
	servicesAfter, _, _ := agentCmd(t, "map", "dump", "cellium_lb4_services", "--api-socket", env.socket)
	for _, line := range strings.Split(servicesBefore, "\n") {
		// Every master entry (slot 0) that is not web's or dns's is
		// unchanged, reverse NAT index included.
		if strings.Contains(line, "slot 0") && !strings.Contains(line, "10.96.0.10:80") && !strings.Contains(line, "10.96.0.11:53") &&
			!strings.Contains(servicesAfter, line) {
			t.Errorf("master entry changed across the restart: %q\nafter:\n%s", line, servicesAfter)
		}
	}
	// web regained a backend: its backend entry, slot 2 and its master.
	if w := metric(t, env.metricsAddr, "cellium_lbmaps_writes_total"); w != 3 {
		t.Errorf("the restart wrote %v map entries, want 3 (web's new backend, its slot and its master)", w)
	}
	seen := backendsOf(sock.Run(socklbtest.Repeat(40, socklbtest.Call{Op: socklbtest.TCP, To: clusterIP})...))
	if len(seen) != 2 {
		t.Fatalf("after the restart, 40 connects reached %v, want both backends again", seen)
	}
	agent.stop()
}
