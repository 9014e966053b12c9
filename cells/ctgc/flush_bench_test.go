package ctgc

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"

	"github.com/cellium/cellium/cells/bpfmaps"
	"github.com/cellium/cellium/cells/bpfmaps/bpfmapstest"
	"github.com/cellium/cellium/cells/ctmaps"
	"github.com/cellium/cellium/cells/daemon"
	"github.com/cellium/cellium/cells/endpointmanager"
	"github.com/cellium/cellium/cells/internal/celltest"
	"github.com/cellium/cellium/cells/ipam"
	"github.com/cellium/cellium/pkg/ctmap"
)

// flushWalkLog is what flush-released-addresses logs after each walk.
const flushWalkLog = "Deleted the conntrack entries of released addresses"

// walkCounter is a log handler that counts flush-released-addresses' walks
// and drops every record.
type walkCounter struct{ walks atomic.Int64 }

func (c *walkCounter) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelInfo }
func (c *walkCounter) Handle(_ context.Context, r slog.Record) error {
	if r.Message == flushWalkLog {
		c.walks.Add(1)
	}
	return nil
}
func (c *walkCounter) WithAttrs([]slog.Attr) slog.Handler { return c }
func (c *walkCounter) WithGroup(string) slog.Handler      { return c }

const (
	flushBenchEntries = 100_000
	flushBenchPods    = 100
	// flushBenchPodConns are each pod's entries among flushBenchEntries.
	flushBenchPodConns = 10
)

// BenchmarkReleasedAddressFlush measures flush-released-addresses (the
// ct-gc job that deletes a released address's conntrack entries before the
// IPAM hands it out again) with the conntrack maps at their default sizes
// (TCP 524288, other 262144, per family) and 100,000 TCP entries present,
// 10 of them per each of 100 pods:
//
//   - walk: one walk of the four maps for one address (flushAddrs), wall
//     and CPU time of the walking thread;
//   - burst: 100 pods' addresses released back to back (as a DEL burst
//     does, one ReleaseOwner each), then paced 2 ms apart, each until every
//     address is free: how many walks the job made, wall time and the
//     process's CPU time.
//
// It prints one line per figure with the 1-minute load average:
//
//	go test ./cells/ctgc -run '^$' -bench ReleasedAddressFlush -benchtime 1x
func BenchmarkReleasedAddressFlush(b *testing.B) {
	root := bpfmapstest.Root(b)
	var (
		gc   *GC
		maps *ctmaps.Maps
		pool *ipam.IPAM
	)
	h := celltest.New(bpfmaps.Cell, ctmaps.Cell, Cell, daemon.Cell, ipam.Cell,
		cell.Provide(endpointmanager.NewTable, statedb.RWTable[*endpointmanager.Endpoint].ToTable),
		cell.Invoke(func(g *GC, m *ctmaps.Maps, i *ipam.IPAM) { gc, maps, pool = g, m, i }),
	)
	dir := b.TempDir()
	hive.AddConfigOverride(h, func(c *bpfmaps.Config) { c.BPFRoot = root })
	hive.AddConfigOverride(h, func(c *daemon.Config) { c.StateDir, c.RunDir = filepath.Join(dir, "state"), filepath.Join(dir, "run") })
	counter := &walkCounter{}
	log := slog.New(counter)
	if err := h.Start(log, context.Background()); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { h.Stop(log, context.Background()) })
	if _, err := gc.Run(context.Background()); err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	info, err := maps.TCP4.EBPF().Info()
	if err != nil {
		b.Fatal(err)
	}
	// walk prints the mean of a few walks for an address with no entries.
	walk := func(entries int) {
		const walks = 5
		var wall, cpu time.Duration
		for range walks {
			w, c := threadTimed(func() {
				if _, err := gc.flushAddrs("released addresses", []netip.Addr{netip.MustParseAddr("10.99.0.1")}); err != nil {
					b.Fatal(err)
				}
			})
			wall, cpu = wall+w, cpu+c
		}
		fmt.Printf("ctgc-flush walk entries=%d tcp4_max=%d wall_ms=%.1f cpu_ms=%.1f (mean of %d) load1=%s\n",
			entries, info.MaxEntries, ms(wall)/walks, ms(cpu)/walks, walks, load1())
	}
	for b.Loop() {
		walk(0)
		pods := allocPods(b, ctx, pool)
		fillFlushBench(b, maps.TCP4, pods)
		walk(flushBenchEntries)

		for _, pace := range []time.Duration{0, 2 * time.Millisecond} {
			if pace > 0 {
				pods = allocPods(b, ctx, pool)
				fillFlushBench(b, maps.TCP4, pods)
			}
			before := counter.walks.Load()
			cpu0 := processCPU()
			start := time.Now()
			for i := range flushBenchPods {
				if _, err := pool.ReleaseOwner(podOwner(i)); err != nil {
					b.Fatal(err)
				}
				if pace > 0 {
					time.Sleep(pace) // the DELs' arrival, not synchronization
				}
			}
			released := time.Since(start)
			waitFreed(b, ctx, pool)
			total := time.Since(start)
			fmt.Printf("ctgc-flush burst pods=%d pace=%s walks=%d releases_wall_ms=%.1f until_all_free_ms=%.1f process_cpu_ms=%.1f load1=%s\n",
				flushBenchPods, pace, counter.walks.Load()-before, ms(released), ms(total), ms(processCPU()-cpu0), load1())
			if n := countPodEntries(b, maps.TCP4, pods); n != 0 {
				b.Fatalf("%d entries of released pods left", n)
			}
		}
	}
}

func podOwner(i int) string { return fmt.Sprintf("bench-container-%03d", i) }

func allocPods(b *testing.B, ctx context.Context, pool *ipam.IPAM) []netip.Addr {
	b.Helper()
	out := make([]netip.Addr, flushBenchPods)
	for i := range out {
		a, err := pool.Allocate(ctx, ipam.Request{Owner: podOwner(i), Family: ipam.IPv4})
		if err != nil {
			b.Fatal(err)
		}
		out[i] = a.IP
	}
	return out
}

// fillFlushBench empties m and puts flushBenchEntries entries in it,
// flushBenchPodConns of them from each of pods.
func fillFlushBench(b *testing.B, m *ctmaps.Map4, pods []netip.Addr) {
	b.Helper()
	var keys []ctmap.Key4
	var cursor = m.EBPF().Iterate()
	var k ctmap.Key4
	var e ctmap.Entry
	for cursor.Next(&k, &e) {
		keys = append(keys, k)
	}
	for _, k := range keys {
		_ = m.EBPF().Delete(k)
	}
	now := ctmap.Now()
	keys = make([]ctmap.Key4, 0, flushBenchEntries)
	entries := make([]ctmap.Entry, 0, flushBenchEntries)
	for i := range flushBenchEntries {
		src := [4]byte{10, 245, byte(i >> 8), byte(i)}
		if i < len(pods)*flushBenchPodConns {
			src = pods[i/flushBenchPodConns].As4()
		}
		keys = append(keys, ctmap.Key4{SrcAddr: src, DstAddr: [4]byte{10, 96, byte(i >> 16), byte(i >> 8)},
			SrcPort: [2]byte{byte(i >> 8), byte(i)}, DstPort: [2]byte{0, 80}, Proto: 6})
		entries = append(entries, ctmap.Entry{Lifetime: now + 3600, EndpointID: uint16(i%100 + 1)})
	}
	for len(keys) > 0 {
		n := min(len(keys), 65536)
		if _, err := m.BatchPut(keys[:n], entries[:n]); err != nil {
			b.Fatal(err)
		}
		keys, entries = keys[n:], entries[n:]
	}
}

func countPodEntries(b *testing.B, m *ctmaps.Map4, pods []netip.Addr) int {
	b.Helper()
	set := map[[4]byte]bool{}
	for _, p := range pods {
		set[p.As4()] = true
	}
	it := m.EBPF().Iterate()
	var k ctmap.Key4
	var e ctmap.Entry
	n := 0
	for it.Next(&k, &e) {
		if set[k.SrcAddr] || set[k.DstAddr] {
			n++
		}
	}
	if err := it.Err(); err != nil {
		b.Fatal(err)
	}
	return n
}

// waitFreed waits until the IPAM holds no released address.
func waitFreed(b *testing.B, ctx context.Context, pool *ipam.IPAM) {
	b.Helper()
	for {
		held, watch := pool.Releasing()
		if len(held) == 0 {
			return
		}
		select {
		case <-watch:
		case <-ctx.Done():
			b.Fatalf("%d addresses still held: %v", len(held), ctx.Err())
		}
	}
}

// threadTimed runs f on one locked OS thread and returns its wall and that
// thread's CPU time (user and system).
func threadTimed(f func()) (wall, cpu time.Duration) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var r0, r1 syscall.Rusage
	_ = syscall.Getrusage(1 /* RUSAGE_THREAD */, &r0)
	start := time.Now()
	f()
	wall = time.Since(start)
	_ = syscall.Getrusage(1, &r1)
	return wall, rusageCPU(r1) - rusageCPU(r0)
}

func processCPU() time.Duration {
	var r syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &r)
	return rusageCPU(r)
}

func rusageCPU(r syscall.Rusage) time.Duration {
	return time.Duration(r.Utime.Nano() + r.Stime.Nano())
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func load1() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	return strings.Fields(string(b))[0]
}
