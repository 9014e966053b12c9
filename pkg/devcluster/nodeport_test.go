package devcluster_test

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cellium/cellium/pkg/devcluster"
	"github.com/cellium/cellium/pkg/devcluster/devclustertest"
	"github.com/cellium/cellium/pkg/nettest"
	"github.com/cellium/cellium/pkg/polltest"
)

// serveUDPSeen answers every datagram to port in the namespace at nsPath
// with "seen <address>", the sender's address as the server sees it.
func serveUDPSeen(t *testing.T, nsPath string, port uint16) {
	t.Helper()
	var pc net.PacketConn
	err := nettest.Do(nsPath, func() error {
		var err error
		pc, err = net.ListenPacket("udp4", fmt.Sprintf("0.0.0.0:%d", port))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 1500)
		for {
			_, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			addr := netip.MustParseAddrPort(from.String()).Addr().Unmap()
			pc.WriteTo([]byte("seen "+addr.String()), from)
		}
	}()
}

// udpSeenAs sends a datagram from the namespace at nsPath to to, on a
// connected socket, which takes replies from to alone, and returns what
// the answer says.
func udpSeenAs(nsPath string, to netip.AddrPort) string {
	var c net.Conn
	err := nettest.Do(nsPath, func() error {
		var err error
		c, err = net.Dial("udp4", to.String())
		return err
	})
	if err != nil {
		return "dial: " + err.Error()
	}
	defer c.Close()
	buf := make([]byte, 1500)
	// A datagram may be lost before the first one set up the path
	// (neighbour resolution): a few tries.
	for range 5 {
		if _, err := c.Write([]byte("ping")); err != nil {
			return "write: " + err.Error()
		}
		c.SetReadDeadline(time.Now().Add(time.Second))
		n, err := c.Read(buf)
		if err == nil {
			return strings.TrimPrefix(string(buf[:n]), "seen ")
		}
	}
	return "no answer"
}

// TestNodePortFromOutside: on a two-node dev-cluster (tunnel and native
// routing), a
// client outside the cluster (the outside namespace) reaches NodePort
// Services at node-1's address over TCP and UDP: one whose backend is a pod
// on node-1, which sees the client's own address, and one whose backend is
// a pod on node-2, which sees node-1's (SNAT). The replies come back from
// node-1's address and NodePort: the client's TCP handshake and its
// connected UDP socket would take nothing else. Established connections
// keep working across a restart of node-1's agent. With
// externalTrafficPolicy: Local, only the node with the backend answers, and
// the backend sees the client. A pod of node-2 reaches node-1's NodePort
// with a local backend too: in tunnel mode the reply leaves through the
// tunnel device.
func TestNodePortFromOutside(t *testing.T) {
	for _, mode := range []string{"tunnel", "native"} {
		t.Run(mode, func(t *testing.T) { nodePortFromOutside(t, mode) })
	}
}

func nodePortFromOutside(t *testing.T, mode string) {
	c := devclustertest.Start(t, devcluster.Options{Nodes: 2, RoutingMode: mode})
	web := c.AddPod("node-1", "web", map[string]string{"app": "web"})
	remote := c.AddPod("node-2", "remote", map[string]string{"app": "remote"})
	client := c.AddPod("node-2", "client", nil)
	out := c.AddOutside()
	n1 := c.Node("node-1")
	for _, pod := range []devcluster.Pod{web, remote} {
		serveSeen(t, pod.NetNS, 8080, true)
		serveUDPSeen(t, pod.NetNS, 8053)
	}
	c.WriteManifest("web.yaml", nodePortService("web", "10.96.0.61", 30080, 30053, web.IPv4, "node-1"))
	c.WriteManifest("remote.yaml", nodePortService("remote", "10.96.0.62", 30090, 30063, remote.IPv4, "node-2"))
	c.WriteManifest("local.yaml", nodePortServicePolicy("local", "10.96.0.63", "Local", 30100, 30073, remote.IPv4, "node-2"))
	c.WaitService("node-1", "default", "web")
	c.WaitService("node-1", "default", "remote")
	c.WaitService("node-2", "default", "local")

	for _, x := range []struct {
		name      string
		tcp, udp  uint16
		wantSeen  netip.Addr
		backendOn string
	}{
		// A local backend sees the client.
		{"local backend", 30080, 30053, out.IPv4, "node-1"},
		// A backend on another node sees node-1, which the reply must
		// come back through.
		{"remote backend", 30090, 30063, n1.IPv4, "node-2"},
	} {
		t.Run(x.name+"/TCP", func(t *testing.T) {
			waitSeenAs(t, "outside -> node-1 (backend on "+x.backendOn+")", devcluster.Pod{NetNS: out.NetNS}, netip.AddrPortFrom(n1.IPv4, x.tcp), x.wantSeen)
		})
		t.Run(x.name+"/UDP", func(t *testing.T) {
			to := netip.AddrPortFrom(n1.IPv4, x.udp)
			if got := udpSeenAs(out.NetNS, to); got != x.wantSeen.String() {
				t.Fatalf("outside -> node-1 %s/udp (backend on %s): answer %q, want %s", to, x.backendOn, got, x.wantSeen)
			}
		})
	}

	// A pod of node-2 is a client from outside node-1 too; in tunnel
	// mode the reply goes back through the tunnel device.
	t.Run("pod of another node", func(t *testing.T) {
		waitSeenAs(t, "client pod (node-2) -> node-1 (backend on node-1)", client, netip.AddrPortFrom(n1.IPv4, 30080), client.IPv4)
		if got := udpSeenAs(client.NetNS, netip.AddrPortFrom(n1.IPv4, 30053)); got != client.IPv4.String() {
			t.Errorf("client pod (node-2) -> node-1 :30053/udp (backend on node-1): answer %q, want the pod's %s", got, client.IPv4)
		}
	})

	// externalTrafficPolicy: Local: the node with the backend sends the
	// client to it with its own address; the node without one drops the
	// packets (a timeout, not the refusal of a port nothing translated).
	t.Run("externalTrafficPolicy Local", func(t *testing.T) {
		n2 := c.Node("node-2")
		waitSeenAs(t, "outside -> node-2 (Local, backend on node-2)", devcluster.Pod{NetNS: out.NetNS}, netip.AddrPortFrom(n2.IPv4, 30100), out.IPv4)
		if got := udpSeenAs(out.NetNS, netip.AddrPortFrom(n2.IPv4, 30073)); got != out.IPv4.String() {
			t.Errorf("outside -> node-2 :30073/udp (Local, backend on node-2): answer %q, want the client's %s", got, out.IPv4)
		}
		// Until node-1 has the frontend (without backends), nothing
		// translates and its stack refuses: poll for the drop.
		to := netip.AddrPortFrom(n1.IPv4, 30100)
		polltest.Until(t, fmt.Sprintf("outside -> node-1 %s (Local, no backend on node-1): the packets dropped (a dial timeout)", to), 20*time.Second, 100*time.Millisecond, func() (bool, string) {
			got := seenAs(t, devcluster.Pod{NetNS: out.NetNS}, to)
			return strings.HasPrefix(got, "dial:") && strings.Contains(got, "timeout"), got
		})
	})

	// The links and the NAT map are pinned: a connection keeps its
	// translation while node-1's agent restarts.
	t.Run("connections outlive a restart", func(t *testing.T) {
		var conns []*conn
		for _, port := range []uint16{30080, 30090} {
			cn, err := dialFrom(out.NetNS, netip.AddrPortFrom(n1.IPv4, port))
			if err != nil {
				t.Fatal(err)
			}
			defer cn.Close()
			if l, err := cn.line(); err != nil || !strings.HasPrefix(l, "seen ") {
				t.Fatalf("NodePort %d: %q (%v), want the backend's greeting", port, l, err)
			}
			conns = append(conns, cn)
		}
		echo := func(when string) {
			t.Helper()
			for i, cn := range conns {
				fmt.Fprintln(cn, when)
				if l, err := cn.line(); err != nil || l != when {
					t.Fatalf("%s: connection %d echoed %q (%v), want %q", when, i, l, err, when)
				}
			}
		}
		echo("before")
		c.RestartAgent("node-1")
		echo("after-restart")
	})
}

// nodePortService is a NodePort Service with a TCP port 80 (NodePort tcp,
// target 8080) and a UDP port 53 (NodePort udp, target 8053), and its
// EndpointSlice with the one backend, a pod on node.
func nodePortService(name, clusterIP string, tcp, udp uint16, backend netip.Addr, node string) string {
	return nodePortServicePolicy(name, clusterIP, "Cluster", tcp, udp, backend, node)
}

// nodePortServicePolicy is nodePortService with the externalTrafficPolicy
// policy.
func nodePortServicePolicy(name, clusterIP, policy string, tcp, udp uint16, backend netip.Addr, node string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Service
metadata: {name: %[1]s, namespace: default}
spec:
  type: NodePort
  externalTrafficPolicy: %[6]s
  clusterIP: %[2]s
  ports:
  - {name: http, port: 80, targetPort: 8080, nodePort: %[3]d, protocol: TCP}
  - {name: dns, port: 53, targetPort: 8053, nodePort: %[4]d, protocol: UDP}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: %[1]s-1, namespace: default, labels: {kubernetes.io/service-name: %[1]s}}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}, {name: dns, port: 8053, protocol: UDP}]
endpoints:
- addresses: [%[5]s]
  nodeName: %[7]s
  conditions: {ready: true}
`, name, clusterIP, tcp, udp, backend, policy, node)
}

// BenchmarkNodePort: request/response round trips on one TCP connection
// from the outside namespace through node-1's NodePort to a backend on
// node-2 (DNAT and SNAT on node-1, then the tunnel), beside the same round
// trips from node-1 straight to the backend pod (the same tunnel hop, no
// translation). Then bulk TCP for d along the same two paths, with the
// machine's busy CPU time per Gbit sent (see bulk). Prints `nodeport-bench
// rps=... p99_us=... direct_rps=... direct_p99_us=... ratio=... gbps=...
// cpu_s_per_gbit=... direct_gbps=... direct_cpu_s_per_gbit=...`, ratio
// being rps over direct_rps.
func BenchmarkNodePort(b *testing.B) { benchNodePort(b, "snat") }

// benchNodePort is BenchmarkNodePort with the agents' --lb-mode lbMode;
// a mode other than snat is named in the line (`nodeport-bench
// mode=dsr ...`).
func benchNodePort(b *testing.B, lbMode string) {
	const d = 3 * time.Second
	c := devclustertest.Start(b, devcluster.Options{Nodes: 2, RoutingMode: "tunnel", AgentArgs: []string{"--lb-mode=" + lbMode}})
	remote := c.AddPod("node-2", "remote", map[string]string{"app": "remote"})
	out := c.AddOutside()
	n1 := c.Node("node-1")
	serveSeen(b, remote.NetNS, 8080, true)
	c.Sink(devclustertest.Where{Pod: "remote"}, bulkPort)
	c.WriteManifest("remote.yaml", nodePortService("remote", "10.96.0.62", 30090, 30063, remote.IPv4, "node-2"))
	c.WriteManifest("bulk.yaml", bulkService(remote.IPv4, "node-2"))
	c.WaitService("node-1", "default", "remote")
	c.WaitService("node-1", "default", "bulk")

	nodePort := netip.AddrPortFrom(n1.IPv4, 30090)
	var viaNodePort *conn
	polltest.Until(b, fmt.Sprintf("outside -> %s: a greeting", nodePort), 10*time.Second, 100*time.Millisecond, func() (bool, string) {
		cn, err := dialFrom(out.NetNS, nodePort)
		if err != nil {
			return false, err.Error()
		}
		if _, err := cn.line(); err != nil {
			cn.Close()
			return false, err.Error()
		}
		viaNodePort = cn
		return true, ""
	})
	defer viaNodePort.Close()
	direct, err := dialFrom(n1.NetNS, netip.AddrPortFrom(remote.IPv4, 8080))
	if err != nil {
		b.Fatal(err)
	}
	defer direct.Close()
	if _, err := direct.line(); err != nil {
		b.Fatal(err)
	}

	b.ResetTimer()
	rps, p99 := roundTrips(b, viaNodePort, d)
	directRPS, directP99 := roundTrips(b, direct, d)
	gbps, cpuPerGbit := bulk(b, c, devclustertest.Where{NetNS: out.NetNS}, netip.AddrPortFrom(n1.IPv4, bulkNodePort), d)
	directGbps, directCPUPerGbit := bulk(b, c, devclustertest.Where{Node: "node-1"}, netip.AddrPortFrom(remote.IPv4, bulkPort), d)
	b.StopTimer()
	mode := ""
	if lbMode != "snat" {
		mode = " mode=" + lbMode
	}
	fmt.Printf("nodeport-bench%s rps=%.0f p99_us=%d direct_rps=%.0f direct_p99_us=%d ratio=%.2f gbps=%.2f cpu_s_per_gbit=%.3f direct_gbps=%.2f direct_cpu_s_per_gbit=%.3f\n",
		mode, rps, p99.Microseconds(), directRPS, directP99.Microseconds(), rps/directRPS,
		gbps, cpuPerGbit, directGbps, directCPUPerGbit)
}

// The bulk phase's sink in the backend pod, and the NodePort to it.
const (
	bulkPort     = 5001
	bulkNodePort = 30120
)

// bulkService is a NodePort Service whose TCP port 80 (NodePort
// bulkNodePort) goes to bulkPort of backend, a pod on node.
func bulkService(backend netip.Addr, node string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Service
metadata: {name: bulk, namespace: default}
spec:
  type: NodePort
  clusterIP: 10.96.0.64
  ports:
  - {name: bulk, port: 80, targetPort: %[1]d, nodePort: %[2]d, protocol: TCP}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: bulk-1, namespace: default, labels: {kubernetes.io/service-name: bulk}}
addressType: IPv4
ports: [{name: bulk, port: %[1]d, protocol: TCP}]
endpoints:
- addresses: [%[3]s]
  nodeName: %[4]s
  conditions: {ready: true}
`, bulkPort, bulkNodePort, backend, node)
}

// bulk sends TCP from w to `to` for d and returns the rate in Gbit/s and
// the machine's busy CPU seconds per Gbit sent. Every namespace of the
// dev-cluster shares one kernel, so the softirq work of each hop (veths,
// bridge, BPF, tunnel) lands on whichever CPU ran it: the whole machine's
// busy time (/proc/stat) is the only complete count. It includes the
// sender's and sink's own work, starting the sender (a few ms), and
// whatever else the machine ran meanwhile.
func bulk(b *testing.B, c *devclustertest.Cluster, w devclustertest.Where, to netip.AddrPort, d time.Duration) (gbps, cpuSecondsPerGbit float64) {
	before := machineBusy(b)
	r := c.Send(w, to, d)
	busy := machineBusy(b) - before
	gbit := float64(r.Bytes) * 8 / 1e9
	return r.BitsPerSecond() / 1e9, busy.Seconds() / gbit
}

// userHZ is the unit of /proc/stat's times (USER_HZ, 100 on Linux).
const userHZ = 100

// machineBusy is the time every CPU of the machine has been busy since
// boot: the first line of /proc/stat, all but idle and iowait (guest time
// is in user already).
func machineBusy(b *testing.B) time.Duration {
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		b.Fatal(err)
	}
	line, _, _ := strings.Cut(string(data), "\n")
	fields := strings.Fields(line)
	if len(fields) < 9 || fields[0] != "cpu" {
		b.Fatalf("/proc/stat: first line %q, want cpu and at least 8 times", line)
	}
	var ticks int64
	for i, f := range fields[1:9] {
		if i == 3 || i == 4 { // idle, iowait
			continue
		}
		v, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			b.Fatalf("/proc/stat: %q: %v", line, err)
		}
		ticks += v
	}
	return time.Duration(ticks) * time.Second / userHZ
}

// roundTrips sends a line and waits for its echo, again and again for d,
// and returns the rate and the 99th percentile of the round trips.
func roundTrips(b *testing.B, cn *conn, d time.Duration) (float64, time.Duration) {
	var took []time.Duration
	start := time.Now()
	for time.Since(start) < d {
		t0 := time.Now()
		if _, err := fmt.Fprintln(cn, "ping"); err != nil {
			b.Fatal(err)
		}
		if l, err := cn.line(); err != nil || l != "ping" {
			b.Fatalf("echo %q (%v), want ping", l, err)
		}
		took = append(took, time.Since(t0))
	}
	elapsed := time.Since(start)
	slices.Sort(took)
	return float64(len(took)) / elapsed.Seconds(), took[len(took)*99/100]
}
