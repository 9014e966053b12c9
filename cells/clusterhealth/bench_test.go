package clusterhealth

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/hive/hivetest"
	"github.com/cilium/statedb"
	"github.com/vishvananda/netlink"

	"github.com/cellium/cellium/cells/nodes"
	"github.com/cellium/cellium/pkg/icmpprobe"
	"github.com/cellium/cellium/pkg/nettest"
)

const peersEnv = "CELLIUM_PROBE_BENCH_PEERS"

// BenchmarkProbeCost: one agent's probe round of 100 and of 1,000 peers,
// simulated as addresses in one network namespace that answer ICMP and
// /hello on each, at the interval the formula gives for that many nodes
// (default --cluster-health-interval). Each size runs in a process of its
// own, inside the namespace. Prints per size `probe-bench peers=...
// interval_s=... round_s=... cpu_ms=... cpu_ms_per_peer=... heap_kb=...`.
func BenchmarkProbeCost(b *testing.B) {
	if n := os.Getenv(peersEnv); n != "" {
		peers, _ := strconv.Atoi(n)
		probeRound(b, peers)
		return
	}
	nettest.RequireRoot(b)
	for _, peers := range []int{100, 1000} {
		ns := nettest.NewNS(b)
		self, err := os.Executable()
		if err != nil {
			b.Fatal(err)
		}
		cmd := exec.Command("nsenter", "--net="+ns.Path(), "--", self, "-test.run=^$", "-test.bench=^BenchmarkProbeCost$", "-test.benchtime=1x")
		cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%d", peersEnv, peers))
		out, err := cmd.CombinedOutput()
		if err != nil {
			b.Fatalf("%v: %v\n%s", cmd.Args, err, out)
		}
		for _, line := range strings.Split(string(out), "\n") {
			if strings.HasPrefix(line, "probe-bench ") {
				fmt.Println(line)
			}
		}
	}
}

// probeRound runs in the benchmark's own namespace.
func probeRound(b *testing.B, peers int) {
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		b.Fatal(err)
	}
	if err := netlink.LinkSetUp(lo); err != nil {
		b.Fatal(err)
	}
	db := statedb.New()
	nodeTbl, err := nodes.NewTable(db)
	if err != nil {
		b.Fatal(err)
	}
	tbl, err := newTable(db)
	if err != nil {
		b.Fatal(err)
	}
	txn := db.WriteTxn(nodeTbl)
	for i := range peers {
		ip := netip.AddrFrom4([4]byte{10, 199, byte(i >> 8), byte(i)})
		if err := netlink.AddrAdd(lo, &netlink.Addr{IPNet: &net.IPNet{IP: ip.AsSlice(), Mask: net.CIDRMask(32, 32)}}); err != nil {
			b.Fatal(err)
		}
		nodeTbl.Insert(txn, &nodes.Node{Name: fmt.Sprintf("peer-%d", i), Spec: nodes.Spec{
			Addresses: []nodes.Address{{Type: nodes.InternalIP, IP: ip}}, HealthIPs: []netip.Addr{ip}}})
	}
	txn.Commit()
	ln, err := net.Listen("tcp", ":4240")
	if err != nil {
		b.Fatal(err)
	}
	go serve(context.Background(), ln, "bench")
	pinger, err := icmpprobe.New()
	if err != nil {
		b.Fatal(err)
	}
	defer pinger.Close()
	p := &prober{log: hivetest.Logger(b), db: db, tbl: tbl, nodes: nodeTbl, port: 4240, base: defaultConfig.ClusterHealthInterval}

	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	var ru0, ru1 syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru0)
	b.ResetTimer()
	start := time.Now()
	rows, every := p.roundNow(context.Background(), pinger)
	took := time.Since(start)
	b.StopTimer()
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru1)
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	ok := 0
	for _, r := range rows {
		if r.Reachable() {
			ok++
		}
	}
	if ok != peers {
		b.Fatalf("%d of %d peers reachable: %s", ok, peers, Summary(rows))
	}
	cpu := time.Duration(ru1.Utime.Nano()+ru1.Stime.Nano()-ru0.Utime.Nano()-ru0.Stime.Nano()) * time.Nanosecond
	fmt.Printf("probe-bench peers=%d interval_s=%.0f round_s=%.1f cpu_ms=%d cpu_ms_per_peer=%.2f heap_kb=%d\n",
		peers, every.Seconds(), took.Seconds(), cpu.Milliseconds(), float64(cpu.Microseconds())/1000/float64(peers),
		(int64(after.HeapAlloc)-int64(before.HeapAlloc))/1024)
}
