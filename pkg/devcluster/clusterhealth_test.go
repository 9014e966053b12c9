package devcluster_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/cellium/cellium/pkg/apiv1"
	"github.com/cellium/cellium/pkg/devcluster"
	"github.com/cellium/cellium/pkg/devcluster/devclustertest"
	"github.com/cellium/cellium/pkg/polltest"
)

// TestClusterHealth: every node probes every other through the node
// address and through its health endpoint; a node whose link goes down
// shows unreachable on the others within two intervals, naming the paths;
// a health endpoint deleted by hand shows "endpoint" failing while the host
// paths answer, and is made again; a node that leaves leaves the health
// table.
func TestClusterHealth(t *testing.T) {
	const every = 2 * time.Second
	c := devclustertest.Start(t, devcluster.Options{Nodes: 3, AgentArgs: []string{"--cluster-health-interval=" + every.String()}})
	cl, err := c.Client("node-1")
	if err != nil {
		t.Fatal(err)
	}
	status := func(probe bool) apiv1.ClusterHealth {
		t.Helper()
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		h, err := cl.ClusterHealth(ctx, probe)
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	node := func(h apiv1.ClusterHealth, name string) (apiv1.NodeHealth, bool) {
		for _, n := range h.Nodes {
			if n.Node == name {
				return n, true
			}
		}
		return apiv1.NodeHealth{}, false
	}
	waitFor := func(what string, within time.Duration, ok func(apiv1.ClusterHealth) bool) time.Duration {
		t.Helper()
		start := time.Now()
		polltest.Until(t, what, within, 100*time.Millisecond, func() (bool, string) {
			h := status(false)
			return ok(h), fmt.Sprintf("%+v", h)
		})
		return time.Since(start)
	}
	allEndpoints := func(h apiv1.ClusterHealth) bool {
		if len(h.Nodes) != 3 || !strings.HasPrefix(h.Summary, "Cluster health: 3/3 reachable") {
			return false
		}
		for _, n := range h.Nodes {
			if !n.HostICMP.OK || !n.HostHTTP.OK || !n.EndpointHTTP.OK {
				return false
			}
		}
		return true
	}
	// The health endpoints appear with the agents; the first round that
	// knows them all is at most one interval later.
	took := waitFor("all nodes reachable, host and endpoint", 2*every+5*time.Second, allEndpoints)
	t.Logf("all nodes and health endpoints reachable %s after the cluster was up", took.Round(time.Millisecond))

	t.Run("link down", func(t *testing.T) {
		link := func(up bool) {
			h := nlHandle(t, c.Node("node-3").NetNS)
			defer h.Close()
			eth0, err := h.LinkByName("eth0")
			if err != nil {
				t.Fatal(err)
			}
			set := h.LinkSetDown
			if up {
				set = h.LinkSetUp
			}
			if err := set(eth0); err != nil {
				t.Fatal(err)
			}
		}
		link(false)
		took := waitFor("node-3 unreachable after its link went down", 2*every+time.Second, func(h apiv1.ClusterHealth) bool {
			n, ok := node(h, "node-3")
			return ok && !n.Reachable && !n.HostICMP.OK && !n.HostHTTP.OK &&
				strings.Contains(h.Summary, "2/3 reachable") && strings.Contains(h.Summary, "node-3 (host ICMP")
		})
		t.Logf("node-3 unreachable %s after its link went down", took.Round(time.Millisecond))
		link(true)
		waitFor("node-3 reachable again", 2*every+5*time.Second, allEndpoints)
	})

	t.Run("health endpoint deleted by hand", func(t *testing.T) {
		c2, err := c.Client("node-2")
		if err != nil {
			t.Fatal(err)
		}
		health := func() apiv1.Endpoint {
			eps, err := c2.Endpoints(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			for _, ep := range eps {
				if ep.Health {
					return ep
				}
			}
			t.Fatal("node-2 has no health endpoint")
			return apiv1.Endpoint{}
		}
		before := health()
		if before.Identity != 4 {
			t.Errorf("node-2's health endpoint has identity %d, want the reserved health identity 4", before.Identity)
		}
		// The agent makes the endpoint again as soon as it sees it gone
		// (it checks every few seconds); so that the probe below sees it
		// gone, an interface of the endpoint's name in its namespace
		// blocks the new one until the test removes it. Should the agent
		// be quicker than the test, the new endpoint's interface is
		// there: delete it again.
		host, pod := nlHandle(t, c.Node("node-2").NetNS), nlHandle(t, before.Netns)
		defer host.Close()
		defer pod.Close()
		blocker := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: before.Interface}, PeerName: "blocker"}
		for attempt := 1; ; attempt++ {
			if veth, err := host.LinkByName(before.HostInterface); err == nil {
				if err := host.LinkDel(veth); err != nil {
					t.Fatalf("delete %s in node-2: %v", before.HostInterface, err)
				}
			}
			err := pod.LinkAdd(blocker)
			if err == nil {
				break
			}
			if !errors.Is(err, unix.EEXIST) || attempt == 10 {
				t.Fatalf("block %s in %s (attempt %d): %v", before.Interface, before.Netns, attempt, err)
			}
		}
		n, _ := node(status(true), "node-2")
		if n.Reachable || n.EndpointHTTP.OK || !n.HostICMP.OK || !n.HostHTTP.OK {
			t.Fatalf("node-2 with its health endpoint gone: %+v; want the endpoint failing and the host answering", n)
		}
		b, err := pod.LinkByName(before.Interface)
		if err == nil {
			err = pod.LinkDel(b)
		}
		if err != nil {
			t.Fatalf("remove the blocking %s: %v", before.Interface, err)
		}
		waitFor("node-2's health endpoint made again and reachable", 20*time.Second, allEndpoints)
		if after := health(); after.HostIfIndex == before.HostIfIndex {
			t.Errorf("node-2's health endpoint still has host ifindex %d: not made again", after.HostIfIndex)
		}
	})

	t.Run("a node that leaves", func(t *testing.T) {
		c.RemoveNode("node-3")
		waitFor("node-3 gone from node-1's health", 2*every+5*time.Second, func(h apiv1.ClusterHealth) bool {
			_, found := node(h, "node-3")
			return !found && strings.HasPrefix(h.Summary, "Cluster health: 2/2 reachable")
		})
	})
}
