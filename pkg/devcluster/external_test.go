package devcluster_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/cellium/cellium/pkg/devcluster"
	"github.com/cellium/cellium/pkg/devcluster/devclustertest"
	"github.com/cellium/cellium/pkg/nettest"
	"github.com/cellium/cellium/pkg/polltest"
)

// externalRange holds the LoadBalancer ingress and external IPs of the
// test: inside the dev-cluster's service range, which no interface has and
// the machine's blackhole route covers, so an untranslated packet goes
// nowhere. Only the outside namespace routes it, to node-1.
var externalRange = netip.MustParsePrefix("10.96.200.0/24")

// TestLoadBalancerFromOutside: on a two-node dev-cluster (tunnel and native
// routing), a client outside
// the cluster (the outside namespace, with a route for the external
// addresses via node-1, as a router in front of the cluster would have)
// reaches a LoadBalancer Service at its status.loadBalancer.ingress IP and a
// Service at one of its spec.externalIPs, over TCP (a greeting and an echo:
// data both ways) and UDP, with the backend on node-1 (which sees the
// client) and on node-2 (which sees node-1, the node that translated). Then
// the health check node port of a LoadBalancer Service with
// externalTrafficPolicy Local: the node with the backend answers 200 with
// one local endpoint, the other 503.
func TestLoadBalancerFromOutside(t *testing.T) {
	for _, mode := range []string{"tunnel", "native"} {
		t.Run(mode, func(t *testing.T) { loadBalancerFromOutside(t, mode) })
	}
}

func loadBalancerFromOutside(t *testing.T, mode string) {
	c := devclustertest.Start(t, devcluster.Options{Nodes: 2, RoutingMode: mode})
	web := c.AddPod("node-1", "web", map[string]string{"app": "web"})
	remote := c.AddPod("node-2", "remote", map[string]string{"app": "remote"})
	out := c.AddOutside()
	n1, n2 := c.Node("node-1"), c.Node("node-2")
	for _, pod := range []devcluster.Pod{web, remote} {
		serveSeen(t, pod.NetNS, 8080, true)
		serveUDPSeen(t, pod.NetNS, 8053)
	}
	err := nettest.Do(out.NetNS, func() error {
		return netlink.RouteAdd(&netlink.Route{Dst: prefixNet(externalRange), Gw: n1.IPv4.AsSlice()})
	})
	if err != nil {
		t.Fatalf("outside: route %s via node-1: %v", externalRange, err)
	}

	cases := []struct {
		name      string
		manifest  string
		addr      netip.Addr
		wantSeen  netip.Addr
		backendOn string
	}{
		{"LoadBalancer ingress IP, backend on node-1",
			externalService("lb-local", "10.96.0.71", "LoadBalancer", "", "10.96.200.10", web.IPv4, "node-1"),
			netip.MustParseAddr("10.96.200.10"), out.IPv4, "node-1"},
		{"LoadBalancer ingress IP, backend on node-2",
			externalService("lb-remote", "10.96.0.72", "LoadBalancer", "", "10.96.200.11", remote.IPv4, "node-2"),
			netip.MustParseAddr("10.96.200.11"), n1.IPv4, "node-2"},
		{"external IP, backend on node-1",
			externalService("eip-local", "10.96.0.73", "ClusterIP", "10.96.200.20", "", web.IPv4, "node-1"),
			netip.MustParseAddr("10.96.200.20"), out.IPv4, "node-1"},
		{"external IP, backend on node-2",
			externalService("eip-remote", "10.96.0.74", "ClusterIP", "10.96.200.21", "", remote.IPv4, "node-2"),
			netip.MustParseAddr("10.96.200.21"), n1.IPv4, "node-2"},
	}
	for i, x := range cases {
		c.WriteManifest(fmt.Sprintf("external-%d.yaml", i), x.manifest)
	}
	for _, name := range []string{"lb-local", "lb-remote", "eip-local", "eip-remote"} {
		c.WaitService("node-1", "default", name)
	}

	for _, x := range cases {
		t.Run(x.name+"/TCP", func(t *testing.T) {
			to := netip.AddrPortFrom(x.addr, 80)
			polltest.Until(t, fmt.Sprintf("outside -> %s (backend on %s): the backend seeing %s and echoing", to, x.backendOn, x.wantSeen), 10*time.Second, 100*time.Millisecond, func() (bool, string) {
				got := greetAndEcho(out.NetNS, to)
				return got == "seen "+x.wantSeen.String()+", echoed", got
			})
		})
		t.Run(x.name+"/UDP", func(t *testing.T) {
			to := netip.AddrPortFrom(x.addr, 53)
			if got := udpSeenAs(out.NetNS, to); got != x.wantSeen.String() {
				t.Fatalf("outside -> %s/udp (backend on %s): answer %q, want %s", to, x.backendOn, got, x.wantSeen)
			}
		})
	}

	t.Run("health check node port", func(t *testing.T) {
		const hcPort = 32100
		c.WriteManifest("hc.yaml", strings.Replace(
			externalService("hc", "10.96.0.75", "LoadBalancer", "", "10.96.200.30", remote.IPv4, "node-2"),
			"  type: LoadBalancer\n",
			fmt.Sprintf("  type: LoadBalancer\n  externalTrafficPolicy: Local\n  healthCheckNodePort: %d\n", hcPort), 1))
		for _, x := range []struct {
			node      devcluster.Node
			code, n   int
			backendOn string
		}{{n2, http.StatusOK, 1, "the backend's node"}, {n1, http.StatusServiceUnavailable, 0, "no backend"}} {
			url := fmt.Sprintf("http://%s:%d/healthz", x.node.IPv4, hcPort)
			polltest.Until(t, fmt.Sprintf("outside -> %s (%s, %s): %d with localEndpoints %d", url, x.node.Name, x.backendOn, x.code, x.n), 20*time.Second, 100*time.Millisecond, func() (bool, string) {
				code, body, err := httpGetFrom(out.NetNS, url)
				var got struct {
					Service        struct{ Namespace, Name string }
					LocalEndpoints int
				}
				if err == nil {
					err = json.Unmarshal([]byte(body), &got)
				}
				return err == nil && code == x.code && got.LocalEndpoints == x.n && got.Service.Name == "hc" && got.Service.Namespace == "default",
					fmt.Sprintf("%d %q %v", code, body, err)
			})
		}
	})
}

// externalService is a Service of type typ with a TCP port 80 (target 8080)
// and a UDP port 53 (target 8053), an external IP and a LoadBalancer ingress
// IP when given, and its EndpointSlice with the one backend, a pod on node.
func externalService(name, clusterIP, typ, externalIP, ingressIP string, backend netip.Addr, node string) string {
	var extra, status string
	if externalIP != "" {
		extra = fmt.Sprintf("  externalIPs: [%s]\n", externalIP)
	}
	if ingressIP != "" {
		status = fmt.Sprintf("status:\n  loadBalancer:\n    ingress: [{ip: %s}]\n", ingressIP)
	}
	return fmt.Sprintf(`apiVersion: v1
kind: Service
metadata: {name: %[1]s, namespace: default}
spec:
  type: %[3]s
  clusterIP: %[2]s
%[4]s  ports:
  - {name: http, port: 80, targetPort: 8080, protocol: TCP}
  - {name: dns, port: 53, targetPort: 8053, protocol: UDP}
%[5]s---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: %[1]s-1, namespace: default, labels: {kubernetes.io/service-name: %[1]s}}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}, {name: dns, port: 8053, protocol: UDP}]
endpoints:
- addresses: [%[6]s]
  nodeName: %[7]s
  conditions: {ready: true}
`, name, clusterIP, typ, extra, status, backend, node)
}

// greetAndEcho connects from the namespace at nsPath to `to`, reads the
// backend's greeting and has a line echoed: "seen <address>, echoed" when
// data went both ways, else what went wrong.
func greetAndEcho(nsPath string, to netip.AddrPort) string {
	cn, err := dialFrom(nsPath, to)
	if err != nil {
		return "dial: " + err.Error()
	}
	defer cn.Close()
	greeting, err := cn.line()
	if err != nil {
		return "read: " + err.Error()
	}
	if _, err := fmt.Fprintln(cn, "hello from outside"); err != nil {
		return greeting + ", write: " + err.Error()
	}
	if l, err := cn.line(); err != nil || l != "hello from outside" {
		return fmt.Sprintf("%s, echo %q (%v)", greeting, l, err)
	}
	return greeting + ", echoed"
}

// httpGetFrom GETs url with a connection made in the namespace at nsPath.
func httpGetFrom(nsPath, url string) (int, string, error) {
	tr := &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		return nettest.In(nsPath, func() (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, addr)
		})
	}}
	defer tr.CloseIdleConnections()
	cl := &http.Client{Transport: tr, Timeout: 3 * time.Second}
	resp, err := cl.Get(url)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

func prefixNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}
