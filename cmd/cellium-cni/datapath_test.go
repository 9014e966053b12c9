package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cellium/cellium/cells/loader/socklbtest"
	"github.com/cellium/cellium/pkg/apiv1"
	"github.com/cellium/cellium/pkg/client"
	"github.com/cellium/cellium/pkg/nettest"
	"github.com/cellium/cellium/pkg/polltest"
)

// flowLine is what the test reads of a line of `agent observe -o json`:
// Hubble's GetFlowsResponse in protojson.
type flowLine struct {
	Flow *struct {
		Verdict string `json:"verdict"`
		IP      struct {
			Source      string `json:"source"`
			Destination string `json:"destination"`
		} `json:"IP"`
		L4 struct {
			TCP *struct {
				DestinationPort uint32 `json:"destinationPort"`
			} `json:"TCP"`
			UDP *struct {
				DestinationPort uint32 `json:"destinationPort"`
			} `json:"UDP"`
			ICMPv4 *struct {
				Type uint32 `json:"type"`
			} `json:"ICMPv4"`
		} `json:"l4"`
		Source      *flowEndpoint                     `json:"source"`
		Destination *flowEndpoint                     `json:"destination"`
		DestService *struct{ Name, Namespace string } `json:"destinationService"`
		Summary     string                            `json:"Summary"`
	} `json:"flow"`
}

type flowEndpoint struct {
	PodName, Namespace string
	Identity           uint32
	Labels             []string
}

// observe is `agent observe -o json` with args, against the node's agent:
// the flows, and the output they came from.
func (n *node) observe(args ...string) ([]flowLine, string) {
	n.t.Helper()
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(filepath.Join(binDir, "agent"),
		append([]string{"observe", "-o", "json", "--run-dir", filepath.Join(n.dir, "run")}, args...)...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		n.t.Fatalf("agent observe %v: %v\n%s", args, err, stderr.String())
	}
	var flows []flowLine
	for _, line := range strings.Split(strings.TrimSpace(stdout.String()), "\n") {
		if line == "" {
			continue
		}
		var f flowLine
		if err := json.Unmarshal([]byte(line), &f); err != nil {
			n.t.Fatalf("agent observe printed %q: %v", line, err)
		}
		if f.Flow != nil {
			flows = append(flows, f)
		}
	}
	return flows, stdout.String()
}

// waitFlow polls `agent observe` until a flow satisfies ok, and says how
// long after since it first saw one.
func (n *node) waitFlow(what string, since time.Time, ok func(flowLine) bool) time.Duration {
	n.t.Helper()
	var took time.Duration
	poll(n.t, "a flow of "+what+" in agent observe", func() (bool, string) {
		flows, out := n.observe("--last", "1000")
		for _, f := range flows {
			if ok(f) {
				took = time.Since(since)
				return true, ""
			}
		}
		return false, "\n" + out
	})
	return took
}

// conntrack is `agent ct list -o json`.
func (n *node) conntrack() []apiv1.ConntrackEntry {
	n.t.Helper()
	var list apiv1.ConntrackEntries
	if err := json.Unmarshal([]byte(n.agentCLI("ct", "list", "-o", "json")), &list); err != nil {
		n.t.Fatal(err)
	}
	return list.Entries
}

func hasEntry(entries []apiv1.ConntrackEntry, proto, dir, src, dst string, dport uint16) bool {
	for _, e := range entries {
		if e.Protocol == proto && e.Direction == dir && e.Source == src && e.Destination == dst && e.DstPort == dport && e.PacketsRx > 0 {
			return true
		}
	}
	return false
}

// Two pods exchange TCP, UDP and ICMP through the agent's TC programs: the
// conntrack maps hold the connections in both pods' directions, Hubble
// shows the flows with pod names, and a connection to a Service shows the
// socket translation.
func TestDatapathConntrackAndFlows(t *testing.T) {
	n := newNode(t)
	manifests := t.TempDir()
	// The pods' objects, for their labels.
	const nodeName = "cellium-flows"
	pods := ""
	for _, name := range []string{"client", "server"} {
		pods += fmt.Sprintf("---\napiVersion: v1\nkind: Pod\nmetadata: {name: %[1]s, namespace: default, labels: {app: %[1]s}}\n"+
			"spec: {nodeName: %s, containers: [{name: c, image: c}]}\n", name, nodeName)
	}
	if err := os.WriteFile(filepath.Join(manifests, "pods.yaml"), []byte(pods), 0o644); err != nil {
		t.Fatal(err)
	}
	n.start("--k8s-manifests-dir", manifests, "--node-name", nodeName)
	a, b := n.newPod("client"), n.newPod("server")
	a4, _ := n.add(a)
	b4, b6 := n.add(b)

	server := socklbtest.At(t, n.cgroup, b.ns.Path())
	server.ServeTCP(netip.AddrPortFrom(b4, 8080))
	server.ServeUDP(netip.AddrPortFrom(b4, 5353))
	clients := socklbtest.At(t, n.cgroup, a.ns.Path())

	start := time.Now()
	results := clients.Run(
		socklbtest.Call{Op: socklbtest.TCP, To: netip.AddrPortFrom(b4, 8080)},
		socklbtest.Call{Op: socklbtest.UDP, To: netip.AddrPortFrom(b4, 5353)},
	)
	for _, r := range results {
		if r.Errno != "" || r.Backend == "" {
			t.Fatalf("pod to pod: %v", r)
		}
	}
	for _, dst := range []netip.Addr{b4, b6} {
		if err := nettest.Ping(a.ns.Path(), dst, 5*time.Second); err != nil {
			t.Fatal(err)
		}
	}

	t.Run("conntrack", func(t *testing.T) {
		entries := n.conntrack()
		for _, want := range []struct {
			proto, dir string
			dst        netip.Addr
			port       uint16
		}{
			{"TCP", "out", b4, 8080}, {"TCP", "in", b4, 8080},
			{"UDP", "out", b4, 5353}, {"UDP", "in", b4, 5353},
			{"ICMP", "out", b4, 0}, {"ICMP", "in", b4, 0},
		} {
			if !hasEntry(entries, want.proto, want.dir, a4.String(), want.dst.String(), want.port) {
				t.Errorf("no %s %s entry %s -> %s:%d with replies in agent ct list", want.proto, want.dir, a4, want.dst, want.port)
			}
		}
		var icmp6 bool
		for _, e := range entries {
			icmp6 = icmp6 || (e.Protocol == "ICMPv6" && e.Destination == b6.String() && e.PacketsRx > 0)
		}
		if !icmp6 {
			t.Errorf("no ICMPv6 echo entry to %s", b6)
		}
		if t.Failed() {
			t.Logf("agent ct list:\n%s", n.agentCLI("ct", "list"))
		}
	})

	podToPod := func(f flowLine) bool {
		return f.Flow.Source != nil && f.Flow.Source.PodName == "client" && f.Flow.Source.Namespace == "default" &&
			f.Flow.Destination != nil && f.Flow.Destination.PodName == "server" && f.Flow.Verdict == "FORWARDED"
	}
	t.Run("flows", func(t *testing.T) {
		took := n.waitFlow("TCP client -> server:8080", start, func(f flowLine) bool {
			return podToPod(f) && f.Flow.L4.TCP != nil && f.Flow.L4.TCP.DestinationPort == 8080
		})
		t.Logf("first TCP flow in agent observe %s after the connection", took.Round(time.Millisecond))
		n.waitFlow("UDP client -> server:5353", start, func(f flowLine) bool {
			return podToPod(f) && f.Flow.L4.UDP != nil && f.Flow.L4.UDP.DestinationPort == 5353
		})
		n.waitFlow("ICMP echo client -> server", start, func(f flowLine) bool {
			return podToPod(f) && f.Flow.L4.ICMPv4 != nil && f.Flow.L4.ICMPv4.Type == 8
		})
	})

	// Both pods have a node-local identity (no kvstore), the same as the
	// ipcache gives their addresses, and flows carry it.
	t.Run("identities", func(t *testing.T) {
		// The endpoints have their pods' labels (the agent may have seen
		// the pods after their ADDs), then new traffic.
		poll(t, "the endpoints with their pods' labels", func() (bool, string) {
			var eps []struct {
				PodName         string
				Labels          map[string]string
				IdentityPending bool
			}
			out := n.agentCLI("endpoint", "list", "-o", "json")
			if err := json.Unmarshal([]byte(out), &eps); err != nil {
				return false, err.Error()
			}
			labelled := 0
			for _, ep := range eps {
				if ep.Labels["app"] == ep.PodName && !ep.IdentityPending {
					labelled++
				}
			}
			return labelled == 2, out
		})
		start := time.Now()
		if err := nettest.Ping(a.ns.Path(), b4, 5*time.Second); err != nil {
			t.Fatal(err)
		}
		var entry struct {
			Identity uint32
			Source   string
		}
		if err := json.Unmarshal([]byte(n.agentCLI("ipcache", "get", a4.String(), "-o", "json")), &entry); err != nil {
			t.Fatal(err)
		}
		if entry.Identity < 1<<24 || entry.Source != "local" {
			t.Fatalf("agent ipcache get %s = %+v, want a local endpoint with a node-local identity", a4, entry)
		}
		var eps []struct {
			IPv4     string
			Identity uint32
		}
		if err := json.Unmarshal([]byte(n.agentCLI("endpoint", "list", "-o", "json")), &eps); err != nil {
			t.Fatal(err)
		}
		for _, ep := range eps {
			if ep.IPv4 == a4.String() && ep.Identity != entry.Identity {
				t.Fatalf("agent endpoint list gives %s identity %d, the ipcache %d", a4, ep.Identity, entry.Identity)
			}
		}
		n.waitFlow("TCP client -> server with identities", start, func(f flowLine) bool {
			return podToPod(f) && f.Flow.Source.Identity == entry.Identity && f.Flow.Destination.Identity >= 1<<24
		})

		// Flows carry the identities' labels, and Hubble's label and
		// identity filters select on them.
		hasLabel := func(ep *flowEndpoint, l string) bool { return ep != nil && slices.Contains(ep.Labels, l) }
		n.waitFlow("client -> server with the pods' labels", start, func(f flowLine) bool {
			return podToPod(f) && hasLabel(f.Flow.Source, "k8s:app=client") && hasLabel(f.Flow.Destination, "k8s:app=server")
		})
		for _, filter := range [][]string{
			{"--from-label", "app=client", "--to-label", "k8s:app=server"},
			{"--from-identity", strconv.Itoa(int(entry.Identity)), "--to-label", "app=server"},
		} {
			flows, out := n.observe(append([]string{"--last", "1000"}, filter...)...)
			if len(flows) == 0 {
				t.Fatalf("agent observe %v: no flows", filter)
			}
			for _, f := range flows {
				if f.Flow == nil || f.Flow.Source.Identity != entry.Identity || !hasLabel(f.Flow.Destination, "k8s:app=server") {
					t.Fatalf("agent observe %v gave a flow it should not have:\n%s", filter, out)
				}
			}
		}
	})

	t.Run("service translation", func(t *testing.T) {
		// The monitor stream is open before the connection, so it sees
		// the translation event.
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		mon := exec.CommandContext(ctx, filepath.Join(binDir, "agent"), "monitor", "-o", "json", "-t", "sock-lb", "--api-socket", n.socket)
		stdout, err := mon.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		mon.Stderr = os.Stderr
		if err := mon.Start(); err != nil {
			t.Fatal(err)
		}
		defer func() {
			cancel()
			mon.Wait()
		}()

		clusterIP := netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 96, n.v4.Addr().As4()[2], 10}), 80)
		writeServiceManifest(t, manifests, clusterIP, b4, 8080)
		poll(t, "the web frontend in the datapath", func() (bool, string) {
			objs, err := n.client().TableObjects(context.Background(), "frontends", client.TableQuery{})
			if err != nil {
				return false, err.Error()
			}
			for _, raw := range objs {
				var fe struct {
					Address string `json:"address"`
					Status  struct {
						Kind string `json:"kind"`
					} `json:"status"`
				}
				if json.Unmarshal(raw, &fe) == nil && fe.Address == clusterIP.String()+"/TCP" && fe.Status.Kind == "Done" {
					return true, ""
				}
			}
			return false, fmt.Sprintf("frontends %s", objs)
		})
		since := time.Now()
		r := clients.Run(socklbtest.Call{Op: socklbtest.TCP, To: clusterIP})[0]
		if want := netip.AddrPortFrom(b4, 8080).String(); r.Backend != want || r.Peer != clusterIP {
			t.Fatalf("connect to the service %s: %v, want backend %s and the service as peer", clusterIP, r, want)
		}

		// Killing the monitor ends the scan below if the event never comes.
		timeout := time.AfterFunc(10*time.Second, cancel)
		defer timeout.Stop()
		lines := bufio.NewScanner(stdout)
		found := false
		for !found && lines.Scan() {
			var msg apiv1.MonitorMessage
			if err := json.Unmarshal(lines.Bytes(), &msg); err != nil {
				t.Fatalf("agent monitor printed %q: %v", lines.Text(), err)
			}
			found = msg.Kind == "sock-lb" && strings.Contains(string(msg.Event), clusterIP.String()) &&
				strings.Contains(string(msg.Event), netip.AddrPortFrom(b4, 8080).String())
		}
		if !found {
			t.Errorf("agent monitor ended without the translation of %s: %v", clusterIP, lines.Err())
		}
		n.waitFlow("the socket translation to the service", since, func(f flowLine) bool {
			return f.Flow.Verdict == "TRANSLATED" && f.Flow.DestService != nil && f.Flow.DestService.Name == "web"
		})
	})
}

func writeServiceManifest(t *testing.T, dir string, clusterIP netip.AddrPort, backend netip.Addr, port int) {
	t.Helper()
	manifest := fmt.Sprintf(`apiVersion: v1
kind: Service
metadata: {name: web, namespace: default}
spec:
  clusterIP: %[1]s
  ports: [{name: p, port: %[2]d, protocol: TCP, targetPort: %[4]d}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-1
  namespace: default
  labels: {kubernetes.io/service-name: web}
addressType: IPv4
ports: [{name: p, port: %[4]d, protocol: TCP}]
endpoints:
  - addresses: [%[3]q]
    conditions: {ready: true}
`, clusterIP.Addr(), clusterIP.Port(), backend, port)
	tmp := filepath.Join(dir, ".web.yaml.tmp")
	if err := os.WriteFile(tmp, []byte(manifest), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, "web.yaml")); err != nil {
		t.Fatal(err)
	}
}

// poll calls ok every 20ms until it is true, for up to 10s, and fails
// the test with what ok last said otherwise.
func poll(t testing.TB, what string, ok func() (bool, string)) {
	t.Helper()
	polltest.Until(t, what, 10*time.Second, 20*time.Millisecond, ok)
}
