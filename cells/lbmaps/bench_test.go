package lbmaps_test

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	goruntime "runtime"
	"runtime/debug"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"

	"github.com/cellium/cellium/cells/bpfmaps"
	"github.com/cellium/cellium/cells/bpfmaps/bpfmapstest"
	"github.com/cellium/cellium/cells/daemon"
	"github.com/cellium/cellium/cells/devices"
	"github.com/cellium/cellium/cells/internal/celltest"
	"github.com/cellium/cellium/cells/k8sclient"
	"github.com/cellium/cellium/cells/k8sclient/k8sclienttest"
	"github.com/cellium/cellium/cells/lbmaps"
	"github.com/cellium/cellium/cells/loadbalancer"
	"github.com/cellium/cellium/cells/loadbalancer/loadbalancertest"
	"github.com/cellium/cellium/pkg/lbmap"
)

var (
	benchSizes   = flag.String("lb.sizes", "1000,10000,50000", "Comma-separated numbers of Services for BenchmarkPipeline")
	benchRuns    = flag.Int("lb.runs", 5, "Runs of each size in BenchmarkPipeline, whose mean it reports")
	insertCPU    = flag.String("lb.insert-cpuprofile", "", "Write a CPU profile of the insert phase of the last size to this file")
	insertHeap   = flag.String("lb.insert-heapprofile", "", "Write a heap profile taken after the insert of the last size to this file")
	deleteCPU    = flag.String("lb.delete-cpuprofile", "", "Write a CPU profile of the delete phase of the last size to this file")
	profiledSize int
)

// BenchmarkPipeline pushes N ClusterIP Services, each with an EndpointSlice
// of one endpoint, from Kubernetes watch events through the reflectors, the
// tables and the lb-maps reconciler into real BPF maps, then deletes them
// all, and measures:
//
//   - insert: services/s from the first event to every frontend reconciled;
//   - delete: services/s from the first deletion to every entry gone;
//   - live heap per service once inserted (after GC), and allocated bytes;
//   - the raw floor: the same map updates issued directly with batch
//     updates, in the same run, as services/s.
//
// Each size runs -lb.runs times, each on a fresh agent, and the rates are
// from the mean durations, as Cilium's benchmark averages its iterations:
// on a shared machine one run's rate moves by a third. The largest size
// ends with the summary line `make bench-lb` prints.
//
//	go test ./cells/lbmaps -run '^$' -bench Pipeline -benchtime 1x
func BenchmarkPipeline(b *testing.B) {
	var sizes []int
	for _, s := range strings.Split(*benchSizes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 {
			b.Fatalf("invalid -lb.sizes %q: want numbers of services such as 1000,10000,50000", *benchSizes)
		}
		sizes = append(sizes, n)
	}
	profiledSize = sizes[len(sizes)-1]
	// The agent's garbage collector target (the daemon cell sets it), so
	// that the rates are the agent's.
	defer debug.SetGCPercent(debug.SetGCPercent(daemon.DefaultGCPercent))
	for _, n := range sizes {
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) {
			var r pipelineResult
			for range b.N {
				var runs []pipelineResult
				for range *benchRuns {
					runs = append(runs, runPipeline(b, n))
				}
				r = mean(runs)
			}
			b.ReportMetric(r.insertPerSec, "insert-services/s")
			b.ReportMetric(r.insertCPU, "insert-cpu-µs/service")
			b.ReportMetric(r.deletePerSec, "delete-services/s")
			b.ReportMetric(r.liveBytes, "live-B/service")
			b.ReportMetric(r.allocBytes, "alloc-B/service")
			b.ReportMetric(r.rawPerSec, "raw-floor-services/s")
			if n == sizes[len(sizes)-1] {
				// Straight to stdout: the last line `make bench-lb` shows.
				fmt.Fprintf(os.Stdout, "lb-bench services=%d insert_per_s=%.0f delete_per_s=%.0f live_bytes_per_service=%.0f raw_floor_per_s=%.0f gc_percent=%d\n",
					n, r.insertPerSec, r.deletePerSec, r.liveBytes, r.rawPerSec, daemon.DefaultGCPercent)
			}
		})
	}
}

// mean averages runs: rates from the mean durations, the rest as they are.
func mean(runs []pipelineResult) pipelineResult {
	var insert, del, m pipelineResult
	for _, r := range runs {
		insert.insertPerSec += 1 / r.insertPerSec
		del.deletePerSec += 1 / r.deletePerSec
		m.liveBytes += r.liveBytes
		m.allocBytes += r.allocBytes
		m.rawPerSec += r.rawPerSec
		m.insertCPU += r.insertCPU
	}
	n := float64(len(runs))
	m.insertPerSec, m.deletePerSec = n/insert.insertPerSec, n/del.deletePerSec
	m.liveBytes, m.allocBytes, m.rawPerSec, m.insertCPU = m.liveBytes/n, m.allocBytes/n, m.rawPerSec/n, m.insertCPU/n
	return m
}

type pipelineResult struct {
	insertPerSec, deletePerSec, liveBytes, allocBytes, rawPerSec float64
	// insertCPU is the process's CPU time (user and system) per service
	// during the insert: steadier than the rate on a shared machine.
	insertCPU float64
}

func runPipeline(b *testing.B, n int) pipelineResult {
	b.StopTimer()
	feed := loadbalancertest.NewFeed(n, loadbalancertest.Watch)
	var (
		db        *statedb.DB
		frontends statedb.RWTable[*loadbalancer.Frontend]
		rec       lbmaps.Reconciler
		maps      *lbmaps.Maps
	)
	h := celltest.New(
		bpfmaps.Cell, lbmaps.Cell, loadbalancer.Cell,
		k8sclienttest.Cell(),
		cell.Invoke(func(cs *k8sclient.Fake) { feed.Attach(cs) }),
		cell.Provide(func() daemon.NodeName { return "node-0" }),
		cell.Provide(func(db *statedb.DB) (statedb.Table[*devices.NodeAddress], error) {
			return statedb.NewTable(db, devices.NodeAddressesTableName, devices.NodeAddressAddr)
		}),
		cell.Invoke(func(db_ *statedb.DB, fe statedb.RWTable[*loadbalancer.Frontend], r lbmaps.Reconciler, m *lbmaps.Maps) {
			db, frontends, rec, maps = db_, fe, r, m
		}),
	)
	hive.AddConfigOverride(h, func(c *bpfmaps.Config) { c.BPFRoot = bpfmapstest.Root(b) })
	hive.AddConfigOverride(h, func(c *lbmaps.Config) {
		c.LBServiceMapMax, c.LBBackendMapMax, c.LBRevnatMapMax = uint32(2*n+16), uint32(n+16), uint32(min(n+16, 1<<16))
	})
	log := slog.New(slog.DiscardHandler)
	if err := h.Start(log, context.Background()); err != nil {
		b.Fatal(err)
	}
	defer h.Stop(log, context.Background())
	done := newDoneCounter(b, db, frontends)

	before := memStats()
	stopProfile := startCPUProfile(b, n, *insertCPU)
	cpuBefore := cpuTime()
	b.StartTimer()
	start := time.Now()
	close(feed.Start)
	done.wait(b, n)
	insert := time.Since(start)
	b.StopTimer()
	insertCPU := cpuTime() - cpuBefore
	stopProfile()
	after := memStats()
	writeHeapProfile(b, n)
	if got := countEntries(b, maps.Services4); got != 2*n {
		b.Fatalf("service map holds %d entries after the insert, want %d (a master and a slot per service)", got, 2*n)
	}

	stopProfile = startCPUProfile(b, n, *deleteCPU)
	b.StartTimer()
	start = time.Now()
	feed.Delete()
	waitGone(b, db, frontends, rec)
	deleted := time.Since(start)
	b.StopTimer()
	stopProfile()
	for name, got := range map[string]int{
		"services": countEntries(b, maps.Services4), "backends": countEntries(b, maps.Backends4), "revnat": countEntries(b, maps.RevNAT4),
	} {
		if got != 0 {
			b.Fatalf("%s map holds %d entries after every service was deleted", name, got)
		}
	}

	return pipelineResult{
		insertPerSec: float64(n) / insert.Seconds(),
		deletePerSec: float64(n) / deleted.Seconds(),
		liveBytes:    float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / float64(n),
		allocBytes:   float64(after.TotalAlloc-before.TotalAlloc) / float64(n),
		rawPerSec:    rawFloor(b, maps, n),
		insertCPU:    float64(insertCPU.Microseconds()) / float64(n),
	}
}

// doneCounter counts frontends that reached the maps with their backend,
// from the table's changes: each generated frontend does so once, so a
// count needs no memory per frontend (which would show in the live heap).
type doneCounter struct {
	db      *statedb.DB
	changes statedb.ChangeIterator[*loadbalancer.Frontend]
	n       int
}

func newDoneCounter(b *testing.B, db *statedb.DB, tbl statedb.RWTable[*loadbalancer.Frontend]) *doneCounter {
	txn := db.WriteTxn(tbl)
	changes, err := tbl.Changes(txn)
	if err != nil {
		b.Fatal(err)
	}
	txn.Commit()
	return &doneCounter{db: db, changes: changes}
}

func (c *doneCounter) wait(b *testing.B, want int) {
	deadline := time.After(5 * time.Minute)
	for c.n < want {
		changes, watch := c.changes.Next(c.db.ReadTxn())
		for ch := range changes {
			if !ch.Deleted && ch.Object.Status.Kind() == reconciler.StatusKindDone && len(ch.Object.Backends) == 1 {
				c.n++
			}
		}
		if c.n >= want {
			break
		}
		select {
		case <-watch:
		case <-deadline:
			b.Fatalf("%d of %d frontends in the maps after 5 minutes", c.n, want)
		}
	}
	c.changes.Close()
}

// waitGone waits until the frontends table is empty and the reconciler has
// processed the deletions.
func waitGone(b *testing.B, db *statedb.DB, tbl statedb.RWTable[*loadbalancer.Frontend], rec lbmaps.Reconciler) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	for {
		txn := db.ReadTxn()
		_, watch := tbl.AllWatch(txn)
		if tbl.NumObjects(txn) == 0 {
			if _, _, err := rec.WaitUntilReconciled(ctx, tbl.Revision(txn)); err != nil {
				b.Fatal(err)
			}
			return
		}
		select {
		case <-watch:
		case <-ctx.Done():
			b.Fatalf("%d frontends left after 5 minutes", tbl.NumObjects(txn))
		}
	}
}

// rawFloor writes what n services need (a backend, a slot, a master and a
// reverse NAT entry each) straight into the maps with batch updates, and
// returns the rate in services/s: what the pipeline would reach if the
// agent cost nothing.
func rawFloor(b *testing.B, maps *lbmaps.Maps, n int) float64 {
	backendIDs := make([]lbmap.BackendID, n)
	backends := make([]lbmap.Backend4, n)
	svcKeys := make([]lbmap.Service4Key, 0, 2*n)
	svcValues := make([]lbmap.ServiceValue, 0, 2*n)
	revIDs := make([]lbmap.RevNATIndex, 0, n)
	revs := make([]lbmap.RevNAT4, 0, n)
	for i := range n {
		fe := netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)})
		id, rev := lbmap.BackendID(i+1), lbmap.RevNATIndex(i%(1<<16-1)+1)
		backendIDs[i] = id
		backends[i] = lbmap.NewBackend4(netip.AddrFrom4([4]byte{10, 244, byte(i >> 8), byte(i)}), 8080, lbmap.TCP)
		svcKeys = append(svcKeys, lbmap.NewService4Key(fe, 80, lbmap.TCP, 1), lbmap.NewService4Key(fe, 80, lbmap.TCP, 0))
		svcValues = append(svcValues, lbmap.NewServiceSlot(id, rev), lbmap.NewServiceMaster(1, rev, 0, 0))
		if len(revIDs) < 1<<16-1 {
			revIDs = append(revIDs, rev)
			revs = append(revs, lbmap.NewRevNAT4(fe, 80))
		}
	}
	start := time.Now()
	if _, err := maps.Backends4.BatchPut(backendIDs, backends); err != nil {
		b.Fatal(err)
	}
	if _, err := maps.Services4.BatchPut(svcKeys, svcValues); err != nil {
		b.Fatal(err)
	}
	if _, err := maps.RevNAT4.BatchPut(revIDs, revs); err != nil {
		b.Fatal(err)
	}
	return float64(n) / time.Since(start).Seconds()
}

func countEntries[K, V any](b *testing.B, m *bpfmaps.Map[K, V]) int {
	n := 0
	if err := m.Iterate(func(K, V) bool { n++; return true }); err != nil {
		b.Fatal(err)
	}
	return n
}

func startCPUProfile(b *testing.B, n int, file string) (stop func()) {
	if file == "" || n != profiledSize {
		return func() {}
	}
	f, err := os.Create(file)
	if err != nil {
		b.Fatal(err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		b.Fatal(err)
	}
	return func() { pprof.StopCPUProfile(); f.Close() }
}

func writeHeapProfile(b *testing.B, n int) {
	if *insertHeap == "" || n != profiledSize {
		return
	}
	f, err := os.Create(*insertHeap)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
		b.Fatal(err)
	}
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func memStats() goruntime.MemStats {
	goruntime.GC()
	goruntime.GC()
	var ms goruntime.MemStats
	goruntime.ReadMemStats(&ms)
	return ms
}
