package devcluster_test

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/cellium/cellium/pkg/apiv1"
	"github.com/cellium/cellium/pkg/client"
	"github.com/cellium/cellium/pkg/ctmap"
	"github.com/cellium/cellium/pkg/devcluster"
	"github.com/cellium/cellium/pkg/devcluster/devclustertest"
	"github.com/cellium/cellium/pkg/nettest"
	"github.com/cellium/cellium/pkg/nodeportmap"
	"github.com/cellium/cellium/pkg/polltest"
)

// TestNodePortNATCollected (issue 14): 10,000 short TCP connections from
// the outside namespace through node-1's NodePort to a backend on node-2
// all succeed, although node-1 has only 4536 ports to send them from
// (61000-65535): a closed connection's NAT entries expire after
// --conntrack-lifetime-close (1s here, so that the run needs fewer live
// ports than that at any time), and a new connection takes an expired
// entry's port over (the test first checks, on the map's pin, that a closed
// connection's entries got the 1s). After the run and a restart of node-1's agent,
// garbage collection passes (`agent ct gc --run` through the API) empty the
// NAT map but for the entries of a connection held open throughout, which
// outlives the restart and the passes. Before the fix, entries never
// expired and connection 4365 failed (its SYNs found no free port).
func TestNodePortNATCollected(t *testing.T) {
	c := devclustertest.Start(t, devcluster.Options{Nodes: 2, AgentArgs: []string{"--conntrack-lifetime-close=1s"}})
	remote := c.AddPod("node-2", "remote", map[string]string{"app": "remote"})
	echo := c.AddPod("node-2", "echo", map[string]string{"app": "echo"})
	out := c.AddOutside()
	n1 := c.Node("node-1")
	// The server closes first: the backend's side of each connection
	// waits in TIME_WAIT, which a reused port's SYN takes over.
	serveSeen(t, remote.NetNS, 8080, false)
	serveSeen(t, echo.NetNS, 8080, true)
	c.WriteManifest("remote.yaml", nodePortService("remote", "10.96.0.64", 30110, 30083, remote.IPv4, "node-2"))
	c.WriteManifest("echo.yaml", nodePortService("echo", "10.96.0.65", 30120, 30093, echo.IPv4, "node-2"))
	c.WaitService("node-1", "default", "remote")
	c.WaitService("node-1", "default", "echo")
	to := netip.AddrPortFrom(n1.IPv4, 30110)
	api := client.New(n1.APISocket)

	// The path works before the run: the first packets may meet
	// neighbour resolution.
	waitSeenAs(t, "outside -> node-1 (backend on node-2)", devcluster.Pod{NetNS: out.NetNS}, to, n1.IPv4)

	// The agent gave the programs its close lifetime: once the warm-up
	// connection's FINs passed both ways, its entries expire a second
	// after their last packet, not the default 10.
	nat := openNATMap(t, api)
	polltest.Until(t, "an entry of a connection closed both ways in "+nodeportmap.MapName+" after the warm-up connection closed", 10*time.Second, 100*time.Millisecond, func() (bool, string) {
		closed, late := closedLifetimes(t, nat)
		if closed > 0 && len(late) > 0 {
			t.Fatalf("entries of connections closed both ways that expire more than 1s after now (%d): %v", ctmap.Now(), late)
		}
		return closed > 0, fmt.Sprintf("%d entries of connections closed both ways, %d entries in all", closed, natMapEntries(t, api))
	})

	echoHeld := holdConn(t, out.NetNS, netip.AddrPortFrom(n1.IPv4, 30120), n1.IPv4)

	const n, batch = 10000, 1000
	start := time.Now()
	peak := 0
	for done := 0; done < n; done += batch {
		err := nettest.Do(out.NetNS, func() error {
			for i := done; i < done+batch; i++ {
				if err := shortConnection(to, n1.IPv4); err != nil {
					return fmt.Errorf("connection %d of %d: %w", i+1, n, err)
				}
			}
			return nil
		})
		if err != nil {
			t.Fatalf("%v (NAT map: %d entries)", err, natMapEntries(t, api))
		}
		peak = max(peak, natMapEntries(t, api))
	}
	took := time.Since(start)
	t.Logf("%d connections in %s (%.0f/s); NAT map entries after each 1000: at most %d",
		n, took.Round(time.Millisecond), n/took.Seconds(), peak)
	if peak == 0 {
		t.Fatalf("no entry in %s during the run: is the count wrong?", nodeportmap.MapName)
	}

	// The NAT map is pinned: a restarted agent's programs use the same
	// entries.
	c.RestartAgent("node-1")
	echoHeld("after a restart")

	// Every other connection closed: its entries expire 1s after its last
	// packet, and a pass deletes them.
	const heldEntries = 2
	polltest.Until(t, fmt.Sprintf("%s down to the held connection's %d entries after the last of %d closed connections (close lifetime 1s)", nodeportmap.MapName, heldEntries, n), 30*time.Second, 500*time.Millisecond, func() (bool, string) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		p, err := api.ConntrackGCRun(ctx)
		cancel()
		if err != nil {
			t.Fatalf("ct gc --run: %v", err)
		}
		left := natMapEntries(t, api)
		for _, m := range p.Maps {
			if m.Map == nodeportmap.MapName {
				t.Logf("pass %d: %s scanned %d, expired %d; %d left", p.Number, m.Map, m.Scanned, m.Expired, left)
			}
		}
		if left < heldEntries {
			t.Fatalf("%d entries in %s: the passes deleted the held connection's", left, nodeportmap.MapName)
		}
		dump, _ := api.MapEntries(context.Background(), nodeportmap.MapName, 10)
		return left == heldEntries, fmt.Sprintf("%d entries, first ones %v", left, dump)
	})
	echoHeld("after the passes")
}

// shortConnection connects to to, reads the server's line, which must say
// it saw seen, and closes.
func shortConnection(to netip.AddrPort, seen netip.Addr) error {
	c, err := net.DialTimeout("tcp", to.String(), 5*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	l, err := bufio.NewReader(c).ReadString('\n')
	if err != nil || strings.TrimSpace(l) != "seen "+seen.String() {
		return fmt.Errorf("server saw %q (%v), want %s", l, err, seen)
	}
	return nil
}

// agentMapInfo is the agent's map called name as the agent describes it
// (its pin path, its number of entries).
func agentMapInfo(t *testing.T, api *client.Client, name string) apiv1.Map {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	maps, err := api.Maps(ctx)
	if err != nil {
		t.Fatalf("list the agent's maps: %v", err)
	}
	for _, m := range maps {
		if m.Name == name {
			return m
		}
	}
	t.Fatalf("the agent has no map %s", name)
	return apiv1.Map{}
}

// openNATMap opens node-1's NodePort NAT map at the pin the agent names.
func openNATMap(t *testing.T, api *client.Client) *ebpf.Map {
	t.Helper()
	em, err := ebpf.LoadPinnedMap(agentMapInfo(t, api, nodeportmap.MapName).PinPath, &ebpf.LoadPinOptions{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { em.Close() })
	return em
}

// closedLifetimes counts the entries of m whose connection saw a FIN both
// ways, and returns those among them that expire more than a second from
// now.
func closedLifetimes(t *testing.T, m *ebpf.Map) (closed int, late []string) {
	t.Helper()
	now := ctmap.Now()
	var (
		k nodeportmap.Key4
		v nodeportmap.NAT4
	)
	it := m.Iterate()
	for it.Next(&k, &v) {
		if v.State&(nodeportmap.StateInFIN|nodeportmap.StateOutFIN) != nodeportmap.StateInFIN|nodeportmap.StateOutFIN {
			continue
		}
		closed++
		if v.Lifetime > now+1 {
			late = append(late, fmt.Sprintf("%v: %v", k, v))
		}
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	return closed, late
}

// natMapEntries is the number of entries of node-1's NodePort NAT map, as
// the agent counts them.
func natMapEntries(t *testing.T, api *client.Client) int {
	t.Helper()
	return agentMapInfo(t, api, nodeportmap.MapName).Entries
}
