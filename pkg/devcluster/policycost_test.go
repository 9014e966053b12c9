package devcluster_test

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/cellium/cellium/pkg/client"
	"github.com/cellium/cellium/pkg/devcluster"
	"github.com/cellium/cellium/pkg/devcluster/devclustertest"
	"github.com/cellium/cellium/pkg/nettest"
	"github.com/cellium/cellium/pkg/polltest"
	"github.com/cellium/cellium/pkg/procstat"
)

// Ports of the policy datapath benchmark's server pod.
const (
	policyRRPort   = 8080 // "seen", then echoes lines: round trips
	policyCRRPort  = 8081 // "seen", then closes: a connection per request
	policyBulkPort = 5001 // a sink: throughput
)

// policyCostManifest isolates both ends of the benchmark's path and
// allows it: the server's ingress from app=client and the client's egress
// to app=server, on the three ports. Every new connection then pays a
// policy decision in the client's from-endpoint program and one in the
// server's to-endpoint program.
const policyCostManifest = `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: server-from-client, namespace: default}
spec:
  podSelector: {matchLabels: {app: server}}
  ingress:
  - from: [{podSelector: {matchLabels: {app: client}}}]
    ports: [{port: 8080}, {port: 8081}, {port: 5001}]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: client-to-server, namespace: default}
spec:
  podSelector: {matchLabels: {app: client}}
  policyTypes: [Egress]
  egress:
  - to: [{podSelector: {matchLabels: {app: server}}}]
    ports: [{port: 8080}, {port: 8081}, {port: 5001}]
`

// BenchmarkPolicyDatapath: what enforcing an allow policy costs the
// datapath, pod to pod on one node (a client and a server pod, each in
// its network namespace behind its veth with the agent's programs). The
// same three measurements with no policy and with policyCostManifest,
// which isolates both pods and allows the client's traffic to the
// server, alternating in one run (rounds of both, the order swapped each
// round) so that the machine's load drifts over both alike:
//
//   - rr: request/response round trips on one TCP connection, opened
//     afresh in each phase (a policy decision on its first packet, none
//     after: conntrack marks the connection);
//   - crr: a new TCP connection per request (connect, read a line, the
//     server closes), so every request pays the decisions;
//   - bulk: TCP throughput, one connection, and the machine's busy CPU
//     seconds per Gbit (see bulk).
//
// Before each phase the policy's state is checked in the datapath: with
// the policy, a third pod cannot reach the server (ingress isolated) and
// the client cannot reach the third pod (egress isolated); without, both
// can. Each measurement's BPF run statistics give the endpoint programs'
// mean run time (the four programs of the two pods' veths, the kernel's
// BPF_STATS_RUN_TIME, on for the benchmark), and /proc the agent's CPU
// time. Prints `policy-datapath-bench rr_ratio=... crr_ratio=...
// gbps_ratio=...`, each the median over the rounds of the round's policy
// figure over its no-policy one, then each side's figures (means over
// the rounds, the slowest p99), the programs' mean run time in each
// measurement (`*_prog_ns`), per new connection and per Gbit sent, and
// the load average.
//
//	go test ./pkg/devcluster -run '^$' -bench PolicyDatapath -benchtime 1x
func BenchmarkPolicyDatapath(b *testing.B) {
	const (
		d      = time.Second
		rounds = 11
	)
	c := devclustertest.Start(b, devcluster.Options{Nodes: 1})
	server := c.AddPod("node-1", "server", map[string]string{"app": "server"})
	client := c.AddPod("node-1", "client", map[string]string{"app": "client"})
	other := c.AddPod("node-1", "other", map[string]string{"app": "other"})
	serveSeen(b, server.NetNS, policyRRPort, true)
	serveSeen(b, server.NetNS, policyCRRPort, false)
	c.Sink(devclustertest.Where{Pod: "server"}, policyBulkPort)
	c.ServeProbes("other", 80)
	fromOther, fromClient := c.Prober("other"), c.Prober("client")
	load0 := procstat.LoadAverage()

	// setPolicy writes or removes the manifest and waits until the
	// datapath enforces it, or not; then until settle has passed since it
	// began. Checking that the policy is in force takes probes that time
	// out (600 ms), checking that it is gone takes a few ms: on a loaded
	// machine the policy phases, which followed that pause, made up to 2.6
	// times the new connections of the others (likely the scheduler's
	// credit for the time the benchmark's processes slept). Both phases
	// now follow the same pause.
	const settle = 1500 * time.Millisecond
	setPolicy := func(on bool) {
		b.Helper()
		start := time.Now()
		defer func() { time.Sleep(time.Until(start.Add(settle))) }()
		if on {
			c.WriteManifest("policy-cost.yaml", policyCostManifest)
		} else if err := c.RemoveManifest("policy-cost.yaml"); err != nil {
			b.Fatal(err)
		}
		polltest.Until(b, fmt.Sprintf("policy on=%v in force", on), 30*time.Second, 0, func() (bool, string) {
			toServer := fromOther.Run([]devclustertest.Probe{{Protocol: devclustertest.TCP, To: netip.AddrPortFrom(server.IPv4, policyRRPort), Timeout: 300 * time.Millisecond}})[0]
			toOther := fromClient.Run([]devclustertest.Probe{{Protocol: devclustertest.TCP, To: netip.AddrPortFrom(other.IPv4, 80), Timeout: 300 * time.Millisecond}})[0]
			return toServer.OK != on && toOther.OK != on, fmt.Sprintf("other->server %+v, client->other %+v", toServer, toOther)
		})
	}

	type side struct {
		rrs, crrs, gbit, busy, seconds float64
		// Each round's figures, for the ratios of the rounds.
		rr, crr, gbps []float64
		rrP99, crrP99 time.Duration
		// The endpoint programs' runs and run time in each measurement,
		// and the agent's CPU time over the three.
		rrProg, crrProg, bulkProg progRuns
		conns                     int
		agentCPU                  time.Duration
	}
	stats, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
	if err != nil {
		b.Fatalf("enable BPF run time statistics: %v", err)
	}
	defer stats.Close()
	node := c.Node("node-1")
	agentCPUNow := func() time.Duration {
		d, err := procstat.CPU(node.Agent.PID)
		if err != nil {
			b.Fatal(err)
		}
		return d
	}
	hostIfs := []int{hostIfIndex(b, c, server), hostIfIndex(b, c, client)}
	var sides [2]side // [0] no policy, [1] policy
	b.ResetTimer()
	for range b.N {
		for round := range rounds {
			for k := range 2 {
				on := (k+round)%2 == 1
				b.StopTimer()
				setPolicy(on)
				b.StartTimer()
				s := &sides[0]
				if on {
					s = &sides[1]
				}
				progs := endpointPrograms(b, node.NetNS, hostIfs)
				cpu0 := agentCPUNow()
				cn, err := dialFrom(client.NetNS, netip.AddrPortFrom(server.IPv4, policyRRPort))
				if err != nil {
					b.Fatal(err)
				}
				if _, err := cn.line(); err != nil {
					b.Fatal(err)
				}
				p0 := progs.runs(b)
				rps, p99 := roundTrips(b, cn, d)
				p1 := progs.runs(b)
				cn.Close()
				crps, conns, crrP99 := connectRoundTrips(b, client.NetNS, netip.AddrPortFrom(server.IPv4, policyCRRPort), d)
				p2 := progs.runs(b)
				before := machineBusy(b)
				r := c.Send(devclustertest.Where{Pod: "client"}, netip.AddrPortFrom(server.IPv4, policyBulkPort), d)
				s.busy += (machineBusy(b) - before).Seconds()
				p3 := progs.runs(b)
				s.agentCPU += agentCPUNow() - cpu0
				progs.close()
				s.rrProg.add(p1.sub(p0))
				s.crrProg.add(p2.sub(p1))
				s.conns += conns
				s.bulkProg.add(p3.sub(p2))
				s.gbit += float64(r.Bytes) * 8 / 1e9
				s.seconds += r.Seconds
				s.rrs += rps / rounds
				s.crrs += crps / rounds
				s.rr, s.crr, s.gbps = append(s.rr, rps), append(s.crr, crps), append(s.gbps, r.BitsPerSecond()/1e9)
				s.rrP99 = max(s.rrP99, p99)
				s.crrP99 = max(s.crrP99, crrP99)
			}
		}
	}
	b.StopTimer()
	none, pol := sides[0], sides[1]
	gbps := func(s side) float64 { return s.gbit / s.seconds }
	perGbit := func(s side) float64 { return float64(s.bulkProg.runtime.Microseconds()) / 1000 / s.gbit }
	perConn := func(s side) float64 { return float64(s.crrProg.runtime.Nanoseconds()) / 1000 / float64(s.conns) }
	// ratio is the median over the rounds of policy over no policy:
	// the two sides of a round ran one after the other.
	ratio := func(pol, none []float64) float64 {
		rs := make([]float64, len(pol))
		for i := range pol {
			rs[i] = pol[i] / none[i]
		}
		slices.Sort(rs)
		return rs[len(rs)/2]
	}
	fmt.Printf("policy-datapath-bench rounds=%d rr_ratio=%.3f crr_ratio=%.3f gbps_ratio=%.3f"+
		" rps=%.0f policy_rps=%.0f p99_us=%d policy_p99_us=%d"+
		" crr_per_s=%.0f policy_crr_per_s=%.0f crr_p99_us=%d policy_crr_p99_us=%d"+
		" gbps=%.2f policy_gbps=%.2f cpu_s_per_gbit=%.3f policy_cpu_s_per_gbit=%.3f"+
		" rr_prog_ns=%.0f policy_rr_prog_ns=%.0f crr_prog_ns=%.0f policy_crr_prog_ns=%.0f crr_prog_us_per_conn=%.2f policy_crr_prog_us_per_conn=%.2f bulk_prog_ns=%.0f policy_bulk_prog_ns=%.0f bulk_prog_ms_per_gbit=%.2f policy_bulk_prog_ms_per_gbit=%.2f"+
		" agent_cpu_s=%.2f policy_agent_cpu_s=%.2f load=%s..%s\n",
		rounds, ratio(pol.rr, none.rr), ratio(pol.crr, none.crr), ratio(pol.gbps, none.gbps),
		none.rrs, pol.rrs, none.rrP99.Microseconds(), pol.rrP99.Microseconds(),
		none.crrs, pol.crrs, none.crrP99.Microseconds(), pol.crrP99.Microseconds(),
		gbps(none), gbps(pol), none.busy/none.gbit, pol.busy/pol.gbit,
		none.rrProg.ns(), pol.rrProg.ns(), none.crrProg.ns(), pol.crrProg.ns(), perConn(none), perConn(pol), none.bulkProg.ns(), pol.bulkProg.ns(), perGbit(none), perGbit(pol),
		none.agentCPU.Seconds(), pol.agentCPU.Seconds(), load0, procstat.LoadAverage())
}

// connectRoundTrips opens a connection from the namespace nsPath to a
// serveSeen server that closes after its line, reads the line, closes,
// again and again for d; it returns the rate, the connections made and the
// 99th percentile of the connect-to-line times.
func connectRoundTrips(b *testing.B, nsPath string, to netip.AddrPort, d time.Duration) (perSecond float64, n int, p99 time.Duration) {
	var took []time.Duration
	var elapsed time.Duration
	err := nettest.Do(nsPath, func() error {
		buf := make([]byte, 64)
		start := time.Now()
		for time.Since(start) < d {
			t0 := time.Now()
			c, err := net.DialTimeout("tcp", to.String(), 5*time.Second)
			if err != nil {
				return err
			}
			c.SetReadDeadline(time.Now().Add(5 * time.Second))
			n, err := c.Read(buf)
			c.Close()
			if err != nil || !strings.HasPrefix(string(buf[:n]), "seen ") {
				return fmt.Errorf("read %q: %v", buf[:n], err)
			}
			took = append(took, time.Since(t0))
		}
		elapsed = time.Since(start)
		return nil
	})
	if err != nil {
		b.Fatalf("connections to %s: %v", to, err)
	}
	return float64(len(took)) / elapsed.Seconds(), len(took), percentile(took, 99)
}

// percentile is the p-th percentile of ds (sorted in place).
func percentile(ds []time.Duration, p int) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	slices.Sort(ds)
	return ds[(len(ds)*p+99)/100-1]
}

// progRuns is how often BPF programs ran and for how long in all.
type progRuns struct {
	count   uint64
	runtime time.Duration
}

func (r progRuns) sub(o progRuns) progRuns {
	return progRuns{count: r.count - o.count, runtime: r.runtime - o.runtime}
}

func (r *progRuns) add(o progRuns) { r.count += o.count; r.runtime += o.runtime }

// ns is the mean run time in nanoseconds.
func (r progRuns) ns() float64 {
	if r.count == 0 {
		return 0
	}
	return float64(r.runtime.Nanoseconds()) / float64(r.count)
}

// programs are the BPF programs attached to some interfaces.
type programs []*ebpf.Program

// endpointPrograms are the programs attached to the interfaces (ifindexes
// in the namespace nsPath), in each direction: the endpoints' from- and
// to-endpoint programs, as bpf filters of a clsact qdisc (what the loader
// attaches) or tcx links (what an earlier agent pinned).
func endpointPrograms(b *testing.B, nsPath string, ifindexes []int) programs {
	var ids []ebpf.ProgramID
	err := nettest.Do(nsPath, func() error {
		for _, ifindex := range ifindexes {
			for _, at := range []ebpf.AttachType{ebpf.AttachTCXIngress, ebpf.AttachTCXEgress} {
				res, err := link.QueryPrograms(link.QueryOptions{Target: ifindex, Attach: at})
				if err != nil {
					return fmt.Errorf("query %s of ifindex %d: %w", at, ifindex, err)
				}
				for _, p := range res.Programs {
					ids = append(ids, p.ID)
				}
			}
			for _, parent := range []uint32{netlink.HANDLE_MIN_INGRESS, netlink.HANDLE_MIN_EGRESS} {
				filters, err := netlink.FilterList(&netlink.Device{LinkAttrs: netlink.LinkAttrs{Index: ifindex}}, parent)
				if err != nil {
					continue // no clsact qdisc
				}
				for _, f := range filters {
					if bf, ok := f.(*netlink.BpfFilter); ok {
						ids = append(ids, ebpf.ProgramID(bf.Id))
					}
				}
			}
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	if len(ids) < 2*len(ifindexes) {
		b.Fatalf("%d programs attached to %d interfaces, want one in each direction", len(ids), len(ifindexes))
	}
	var out programs
	for _, id := range ids {
		prog, err := ebpf.NewProgramFromID(id)
		if err != nil {
			out.close()
			b.Fatalf("program %d: %v", id, err)
		}
		out = append(out, prog)
	}
	return out
}

// runs is the programs' run statistics summed.
func (ps programs) runs(b *testing.B) progRuns {
	var r progRuns
	for _, p := range ps {
		st, err := p.Stats()
		if err != nil {
			b.Fatal(err)
		}
		r.count += st.RunCount
		r.runtime += st.Runtime
	}
	return r
}

func (ps programs) close() {
	for _, p := range ps {
		p.Close()
	}
}

// hostIfIndex is the ifindex of a pod's host-side veth, in its node's
// namespace.
func hostIfIndex(b *testing.B, c *devclustertest.Cluster, p devcluster.Pod) int {
	cl, err := c.Cluster.Client(p.Node)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	e, err := cl.Endpoint(ctx, client.ContainerEndpointID(p.ContainerID))
	if err != nil {
		b.Fatal(err)
	}
	return e.HostIfIndex
}
