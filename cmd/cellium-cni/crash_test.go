package main

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cellium/cellium/cells/endpointmanager"
	"github.com/cellium/cellium/pkg/apiv1"
	"github.com/cellium/cellium/pkg/nettest"
)

// pinger pings pairs of addresses from pods, over and over, until stopped,
// and counts the pings that got no answer.
type pinger struct {
	stop   chan struct{}
	wg     sync.WaitGroup
	sent   atomic.Int64
	mu     sync.Mutex
	failed []string
}

func startPinger(from []*pod, to []netip.Addr) *pinger {
	p := &pinger{stop: make(chan struct{})}
	for i := range from {
		p.wg.Go(func() {
			tick := time.NewTicker(20 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-p.stop:
					return
				case <-tick.C:
				}
				p.sent.Add(1)
				if err := nettest.Ping(from[i].ns.Path(), to[i], time.Second); err != nil {
					p.mu.Lock()
					p.failed = append(p.failed, fmt.Sprintf("%s: %v", time.Now().Format("15:04:05.000"), err))
					p.mu.Unlock()
				}
			}
		})
	}
	return p
}

func (p *pinger) halt() (sent int64, failed []string) {
	close(p.stop)
	p.wg.Wait()
	return p.sent.Load(), p.failed
}

// kill -9 with 20 endpoints, and a restart: every endpoint comes back with
// its addresses, the pods' traffic (pod to pod, pod to router) never stops,
// and ADDs sent while the agent restores never get a restored address.
func TestCrashWithTwentyEndpoints(t *testing.T) {
	n := newNode(t)
	n.start()
	const count = 20
	var pods []*pod
	before := map[string]string{}
	restored := map[netip.Addr]bool{}
	for i := range count {
		p := n.newPod(fmt.Sprintf("p%d", i))
		v4, v6 := n.add(p)
		pods = append(pods, p)
		before[p.id] = v4.String() + " " + v6.String()
		restored[v4], restored[v6] = true, true
	}

	// Pod to pod (through the node) and pod to router, both families.
	from := []*pod{pods[0], pods[1], pods[2], pods[3]}
	to := []netip.Addr{addr(t, before[pods[1].id], 0), addr(t, before[pods[2].id], 1), router(n.v4), router(n.v6)}
	ping := startPinger(from, to)

	ping.mu.Lock()
	if len(ping.failed) > 0 {
		t.Fatalf("pings failed before the restart: %v", ping.failed)
	}
	ping.mu.Unlock()
	sentBefore := ping.sent.Load()
	n.kill()
	// ADDs issued as soon as the restarted agent serves its API, racing
	// the restore.
	racers := []*pod{n.newPod("racer-1"), n.newPod("racer-2"), n.newPod("racer-3")}
	start := time.Now()
	a := n.startAsync()
	a.waitLog(t, "Serving API")
	results := make(chan [2]netip.Addr, len(racers))
	var wg sync.WaitGroup
	for _, p := range racers {
		wg.Go(func() {
			res, err := n.cni.AddNetworkList(context.Background(), n.conflist(), p.runtimeConf())
			if err != nil {
				t.Errorf("ADD during the restore: %v", err)
				return
			}
			v4, v6 := resultAddrs(t, res)
			results <- [2]netip.Addr{v4, v6}
		})
	}
	a.restored = a.waitLog(t, "Started hive", "Restored endpoints")["Restored endpoints"]
	wg.Wait()
	close(results)
	ready := time.Since(start)
	duringRestart := ping.sent.Load() - sentBefore
	sent, failed := ping.halt()
	t.Logf("restart with %d endpoints: ready after %s, restore took %v ms; %d pings while the agent was down or restoring, %d in all",
		count, ready.Round(time.Millisecond), msOf(n.agent.restored["duration"]), duringRestart, sent)
	if duringRestart == 0 {
		t.Error("no ping was sent while the agent was down: the test proves nothing about connectivity during the restart")
	}
	if len(failed) > 0 {
		t.Errorf("%d of %d pings failed across the crash and restart: %v", len(failed), sent, failed)
	}
	if got := n.agent.restored["restored"]; got != float64(count) {
		t.Errorf("restored %v endpoints, want %d", got, count)
	}

	for r := range results {
		for _, ip := range r {
			if restored[ip] {
				t.Errorf("an ADD racing the restore got %s, which a restored endpoint holds", ip)
			}
		}
	}
	after := map[string]string{}
	for _, ep := range n.endpoints() {
		after[ep.ContainerID] = ep.IPv4 + " " + ep.IPv6
	}
	for id, addrs := range before {
		if after[id] != addrs {
			t.Errorf("endpoint of %s after the restart has %q, want %q", id, after[id], addrs)
		}
	}
	if len(after) != count+len(racers) {
		t.Errorf("%d endpoints after the restart, want %d", len(after), count+len(racers))
	}
	for _, p := range pods {
		if err := n.cni.CheckNetworkList(context.Background(), n.conflist(), p.runtimeConf()); err != nil {
			t.Errorf("CNI CHECK of %s after the restart: %v", p.name, err)
		}
	}
}

// addr is the i-th address of "v4 v6".
func addr(t *testing.T, addrs string, i int) netip.Addr {
	return netip.MustParseAddr(strings.Fields(addrs)[i])
}

func msOf(d any) float64 {
	ns, _ := d.(float64)
	return ns / 1e6
}

// The agent dies in the middle of an ADD (a test-only fault point at each
// step). The runtime's ADD fails with "try again later"; after a restart,
// and the grace period for addresses whose owner never became an endpoint,
// no address, interface or state is left, with or without the runtime's
// DEL.
func TestCrashInTheMiddleOfAdd(t *testing.T) {
	for _, tc := range []struct {
		step string
		// runtimeDEL: the runtime deletes the pod that failed to start
		// before the agent is back.
		runtimeDEL bool
		// log is what the restarted agent logs about the leftover.
		log string
	}{
		{endpointmanager.CrashIPAMAllocated, false, "Released an address allocated before the restart for an owner that never became an endpoint"},
		{endpointmanager.CrashVethCreated, false, "Rolled back an endpoint whose creation did not finish before the agent stopped"},
		{endpointmanager.CrashEndpointPersisted, true, "Deleted endpoint"},
	} {
		t.Run(tc.step, func(t *testing.T) {
			n := newNode(t)
			n.start("--endpoint-test-crash-at", tc.step)
			p := n.newPod("dies")
			env := map[string]string{"CNI_COMMAND": "ADD", "CNI_CONTAINERID": p.id, "CNI_NETNS": p.ns.Path(), "CNI_IFNAME": "eth0"}
			_, cniErr := cniExec(t, env, n.pluginConf("1.0.0"))
			if cniErr == nil || cniErr.Code != 11 || !strings.Contains(cniErr.Msg, n.socket) {
				t.Fatalf("ADD into a dying agent = %+v, want code 11 naming the socket", cniErr)
			}
			if err := n.agent.wait(); !exitedBySIGKILL(err) {
				t.Fatalf("agent exit = %v, want killed by the fault point", err)
			}
			n.agent = nil

			n.start("--ipam-leak-grace", "200ms")
			if tc.runtimeDEL {
				env["CNI_COMMAND"] = "DEL"
				if _, cniErr := cniExec(t, env, n.pluginConf("1.0.0")); cniErr != nil {
					t.Fatalf("the runtime's DEL after the failed ADD: %+v", cniErr)
				}
			}
			n.agent.waitLog(t, tc.log)
			if allocs := n.allocations(); len(allocs) != 0 {
				t.Errorf("addresses allocated after restart and grace: %v, want none", allocs)
			}
			if n.hostLink(endpointmanager.HostIfName(p.id)) {
				t.Errorf("the node still has the dead ADD's %s", endpointmanager.HostIfName(p.id))
			}
			if dirs := n.stateDirs(); len(dirs) != 0 {
				t.Errorf("endpoint state left: %v", dirs)
			}
			// The pod can be added again, and gets the first address.
			v4, _ := n.add(p)
			if want := router(n.v4).Next(); v4 != want {
				t.Errorf("ADD after the crash got %s, want %s", v4, want)
			}
			if eps := n.endpoints(); len(eps) != 1 || !slices.ContainsFunc(eps, func(e apiv1.Endpoint) bool { return e.ContainerID == p.id }) {
				t.Errorf("endpoints after the second ADD: %+v", eps)
			}
		})
	}
}

// A power loss in the middle of an ADD: what the agent did not sync may be
// gone, and the IPAM's files of endpoint addresses are not synced (the
// endpoint's state file is their durable record, ipam.Request.Recorded).
// Two pods run; the agent dies at a step of a third pod's ADD; then every
// IPAM file is removed, more than a power loss can take. After the
// restart the running pods keep their addresses (claimed from their state
// files, in use), the third ADD is rolled back or kept as its state file
// says, nothing of a rolled-back ADD is left on the node, and new pods
// never get an address that a pod holds. The pods' network namespaces
// outlive the "power loss" here, which a real one would not: a harder
// case than the real one.
func TestPowerLossLosesNoAllocation(t *testing.T) {
	for _, tc := range []struct {
		step string
		// kept: the third pod's endpoint is restored (its state file was
		// ready when the agent died).
		kept bool
	}{
		{endpointmanager.CrashIPAMAllocated, false},
		{endpointmanager.CrashVethCreated, false},
		{endpointmanager.CrashEndpointPersisted, true},
	} {
		t.Run(tc.step, func(t *testing.T) {
			n := newNode(t)
			n.start()
			held := map[netip.Addr]string{}
			var want []string
			for _, name := range []string{"a", "b"} {
				p := n.newPod(name)
				v4, v6 := n.add(p)
				held[v4], held[v6] = p.id, p.id
				want = append(want, v4.String()+" "+p.id+" in-use", v6.String()+" "+p.id+" in-use")
			}
			n.kill()

			n.start("--endpoint-test-crash-at", tc.step)
			third := n.newPod("dies")
			env := map[string]string{"CNI_COMMAND": "ADD", "CNI_CONTAINERID": third.id, "CNI_NETNS": third.ns.Path(), "CNI_IFNAME": "eth0"}
			if _, cniErr := cniExec(t, env, n.pluginConf("1.0.0")); cniErr == nil {
				t.Fatal("ADD into a dying agent succeeded")
			}
			if err := n.agent.wait(); !exitedBySIGKILL(err) {
				t.Fatalf("agent exit = %v, want killed by the fault point", err)
			}
			n.agent = nil
			ipamDir := filepath.Join(n.dir, "state", "ipam")
			files, err := os.ReadDir(ipamDir)
			if err != nil {
				t.Fatal(err)
			}
			if len(files) < 4 {
				t.Fatalf("%d IPAM files before the power loss, want the two pods' four at least", len(files))
			}
			for _, f := range files {
				if err := os.Remove(filepath.Join(ipamDir, f.Name())); err != nil {
					t.Fatal(err)
				}
			}

			n.start("--ipam-leak-grace", "1ms")
			n.agent.waitLog(t, "Restored endpoints")
			var thirdAddrs []string
			for _, ep := range n.endpoints() {
				if ep.ContainerID == third.id {
					thirdAddrs = []string{ep.IPv4, ep.IPv6}
					held[netip.MustParseAddr(ep.IPv4)], held[netip.MustParseAddr(ep.IPv6)] = third.id, third.id
					want = append(want, ep.IPv4+" "+third.id+" in-use", ep.IPv6+" "+third.id+" in-use")
				}
			}
			if tc.kept != (thirdAddrs != nil) {
				t.Fatalf("the dead ADD's endpoint restored = %v (%v), want %v", thirdAddrs != nil, thirdAddrs, tc.kept)
			}
			if !tc.kept && n.hostLink(endpointmanager.HostIfName(third.id)) {
				t.Errorf("the node still has the dead ADD's %s", endpointmanager.HostIfName(third.id))
			}
			slices.Sort(want)
			got := n.allocations()
			slices.Sort(got)
			if !slices.Equal(got, want) {
				t.Errorf("allocations after the power loss and restart = %q, want %q", got, want)
			}
			for i := range 3 {
				v4, v6 := n.add(n.newPod(fmt.Sprintf("new%d", i)))
				for _, ip := range []netip.Addr{v4, v6} {
					if owner, ok := held[ip]; ok {
						t.Errorf("a new pod got %s, which container %s holds", ip, owner)
					}
				}
			}
		})
	}
}
