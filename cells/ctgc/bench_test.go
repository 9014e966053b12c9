package ctgc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/hivetest"
	"github.com/cilium/statedb"

	"github.com/cellium/cellium/cells/bpfmaps"
	"github.com/cellium/cellium/cells/bpfmaps/bpfmapstest"
	"github.com/cellium/cellium/cells/ctmaps"
	"github.com/cellium/cellium/cells/endpointmanager"
	"github.com/cellium/cellium/cells/internal/celltest"
	"github.com/cellium/cellium/pkg/ctmap"
)

const (
	benchEntries = 1_000_000
	// benchCapacity leaves room for the free entries an LRU map sets
	// aside per CPU, so filling it evicts nothing.
	benchCapacity = 1 << 20
)

// BenchmarkGCPass is `make bench-ctgc`: a real TCP conntrack map, pinned on
// a bpffs of the benchmark's own, holds a million entries, half of them
// expired. Each iteration dumps the map raw with batch lookups of the GC's
// chunk size (the floor: reading every entry once, nothing else), then runs
// a GC pass, which reads every entry and deletes the expired half, then puts
// that half back. It ends with the one line
//
//	ctgc-bench entries=1000000 gc_entries_per_s=N raw_dump_entries_per_s=N deleted=N
//
// of the last iteration. The target is a pass within 1.5x of the raw dump.
func BenchmarkGCPass(b *testing.B) {
	gc, m := startBench(b)
	filled := fill(b, m, false)
	// An untimed dump first, so that the timed one and the pass both meet
	// a map the kernel has touched since it was filled.
	rawDump(b, m.EBPF(), chunkSize)

	var summary string
	for b.Loop() {
		raw, pass, deleted := dumpAndCollect(b, gc, m, chunkSize)
		summary = fmt.Sprintf("ctgc-bench entries=%d gc_entries_per_s=%.0f raw_dump_entries_per_s=%.0f deleted=%d",
			benchEntries, pass, raw, deleted)
		b.ReportMetric(pass, "gc_entries/s")
		b.ReportMetric(raw, "raw_dump_entries/s")
		fill(b, m, true)
	}
	// After the loop: its start drops the metrics reported before.
	b.ReportMetric(filled, "fill_entries/s")
	fmt.Println(summary)
}

// BenchmarkGCChunkSizes is BenchmarkGCPass at several chunk sizes, one line
// each, to choose chunkSize:
//
//	go test ./cells/ctgc -run '^$' -bench GCChunkSizes -benchtime 1x
func BenchmarkGCChunkSizes(b *testing.B) {
	gc, m := startBench(b)
	fill(b, m, false)
	rawDump(b, m.EBPF(), chunkSize)
	for b.Loop() {
		for _, size := range []int{256, 1024, 4096, 16384, 65536} {
			gc.mu.Lock()
			gc.chunk = size
			gc.mu.Unlock()
			raw, pass, _ := dumpAndCollect(b, gc, m, size)
			fmt.Printf("ctgc-chunk size=%d raw_dump_entries_per_s=%.0f gc_entries_per_s=%.0f raw_over_gc=%.2f\n",
				size, raw, pass, raw/pass)
			fill(b, m, true)
		}
	}
}

// startBench starts the GC with a TCP map of benchCapacity: the passes after
// the first, over empty maps, are the benchmark's.
func startBench(b *testing.B) (*GC, *ctmaps.Map4) {
	return startGC(b, benchCapacity)
}

// startGC starts the ct-maps and ct-gc cells over a bpffs of the test's
// own, with TCP maps of tcpMax entries, and returns once the GC's first pass
// is done.
func startGC(b testing.TB, tcpMax uint32) (*GC, *ctmaps.Map4) {
	root := bpfmapstest.Root(b)
	var (
		gc   *GC
		maps *ctmaps.Maps
	)
	h := celltest.New(bpfmaps.Cell, ctmaps.Cell, Cell,
		cell.Provide(endpointmanager.NewTable, statedb.RWTable[*endpointmanager.Endpoint].ToTable),
		cell.Invoke(func(g *GC, m *ctmaps.Maps) { gc, maps = g, m }),
	)
	hive.AddConfigOverride(h, func(c *bpfmaps.Config) { c.BPFRoot = root })
	hive.AddConfigOverride(h, func(c *ctmaps.Config) { c.ConntrackTCPMax = tcpMax })
	// Errors only: the benchmark's output is its figures.
	log := hivetest.Logger(b, hivetest.LogLevel(slog.LevelError))
	if err := h.Start(log, context.Background()); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { h.Stop(log, context.Background()) })
	if _, err := gc.Run(context.Background()); err != nil {
		b.Fatal(err)
	}
	return gc, maps.TCP4
}

// dumpAndCollect dumps m raw with chunks of size, then runs a pass, and
// returns their rates in entries per second and what the pass deleted.
func dumpAndCollect(b *testing.B, gc *GC, m *ctmaps.Map4, size int) (raw, pass float64, deleted int) {
	b.Helper()
	dumped, dumpTime := rawDump(b, m.EBPF(), size)
	if dumped != benchEntries {
		b.Fatalf("raw dump with chunks of %d read %d entries, want %d", size, dumped, benchEntries)
	}
	p, err := gc.Run(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	if p.Scanned() != benchEntries || p.Deleted() != benchEntries/2 {
		b.Fatalf("pass with chunks of %d: scanned %d, deleted %d; want %d, %d", size, p.Scanned(), p.Deleted(), benchEntries, benchEntries/2)
	}
	return perSecond(dumped, dumpTime), perSecond(p.Scanned(), p.Duration), p.Deleted()
}

// fill puts the benchmark's entries in m with batch updates: entry i lives
// for an hour if i is even and expired 10 seconds ago if odd. With
// expiredOnly it puts back only the odd ones, which a pass deletes. It
// returns the entries it put per second.
func fill(b *testing.B, m *ctmaps.Map4, expiredOnly bool) float64 {
	b.Helper()
	start := time.Now()
	now := ctmap.Now()
	const batch = 65536
	keys, entries := make([]ctmap.Key4, 0, batch), make([]ctmap.Entry, 0, batch)
	put := func() {
		if _, err := m.BatchPut(keys, entries); err != nil {
			b.Fatal(err)
		}
		keys, entries = keys[:0], entries[:0]
	}
	first, step := 0, 1
	if expiredOnly {
		first, step = 1, 2
	}
	n := 0
	for i := first; i < benchEntries; i += step {
		k := ctmap.Key4{
			SrcAddr: [4]byte{10, 244, byte(i >> 16), byte(i >> 8)},
			DstAddr: [4]byte{10, 96, 0, byte(i)},
			SrcPort: [2]byte{byte(i >> 8), byte(i)},
			DstPort: [2]byte{0, 80},
			Proto:   6,
		}
		// Endpoints the table lacks: only the first pass, done before the
		// map was filled, looks at endpoints.
		e := ctmap.Entry{Lifetime: now + 3600, EndpointID: uint16(i%100 + 1)}
		if i%2 == 1 {
			e.Lifetime = now - 10
		}
		keys, entries = append(keys, k), append(entries, e)
		if len(keys) == batch {
			put()
		}
		n++
	}
	if len(keys) > 0 {
		put()
	}
	return perSecond(n, time.Since(start))
}

// rawDump reads every entry of m with batch lookups of size entries and
// does nothing else with them.
func rawDump(b *testing.B, m *ebpf.Map, size int) (int, time.Duration) {
	b.Helper()
	keys, entries := make([]ctmap.Key4, size), make([]ctmap.Entry, size)
	var cursor ebpf.MapBatchCursor
	total := 0
	start := time.Now()
	for {
		n, err := m.BatchLookup(&cursor, keys, entries, nil)
		total += n
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			break
		}
		if err != nil {
			b.Fatal(err)
		}
	}
	return total, time.Since(start)
}

func perSecond(n int, d time.Duration) float64 { return float64(n) / d.Seconds() }
