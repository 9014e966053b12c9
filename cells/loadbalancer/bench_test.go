package loadbalancer_test

import (
	"context"
	"flag"
	"iter"
	"log/slog"
	goruntime "runtime"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"

	"github.com/cellium/cellium/cells/daemon"
	"github.com/cellium/cellium/cells/devices"
	"github.com/cellium/cellium/cells/internal/celltest"
	"github.com/cellium/cellium/cells/k8sclient/k8sclienttest"
	"github.com/cellium/cellium/cells/loadbalancer"
	"github.com/cellium/cellium/cells/loadbalancer/loadbalancertest"
)

var benchServices = flag.Int("lb.services", 50000, "Services (each with one endpoint) per benchmark run")

// BenchmarkK8sToFrontends pushes Services, each with an EndpointSlice of one
// endpoint, through the reflectors into the tables, until a stand-in for the
// lb-maps reconciler (which writes nothing) has reconciled every frontend
// with its backend. "watch" streams them as watch events after start, "list"
// hands them over as the initial LIST. The objects are made before the
// clock starts and the first heap figure is taken, so the rate and the live
// heap are the agent's own.
//
//	go test ./cells/loadbalancer -run '^$' -bench K8sToFrontends -benchtime 1x -cpu 2
func BenchmarkK8sToFrontends(b *testing.B) {
	for _, mode := range []string{loadbalancertest.Watch, loadbalancertest.List} {
		b.Run(mode, func(b *testing.B) {
			n := *benchServices
			var r runResult
			for range b.N {
				r = runK8sToFrontends(b, mode, n)
			}
			b.ReportMetric(r.servicesPerSec, "services/s")
			b.ReportMetric(r.cpuPerService, "cpu-µs/service")
			b.ReportMetric(r.liveBytes, "live-B/service")
			b.ReportMetric(r.allocBytes, "alloc-B/service")
		})
	}
}

// runResult are the figures of one run, per service.
type runResult struct {
	servicesPerSec float64
	// cpuPerService is the process's CPU time (user and system): unlike
	// the rate, it does not depend on what else the machine runs.
	cpuPerService float64
	liveBytes     float64
	allocBytes    float64
}

func runK8sToFrontends(b *testing.B, mode string, n int) runResult {
	b.StopTimer()
	feed := loadbalancertest.NewFeed(n, mode)
	counter := &reconciledCounter{want: int64(n), done: make(chan struct{})}
	h := celltest.New(
		loadbalancer.Cell,
		k8sclienttest.Cell(),
		cell.Invoke(feed.Attach),
		cell.Provide(func() daemon.NodeName { return nodeName }),
		cell.Provide(func(db *statedb.DB) (statedb.Table[*devices.NodeAddress], error) {
			return statedb.NewTable(db, devices.NodeAddressesTableName, devices.NodeAddressAddr)
		}),
		cell.Module("bench-lb-maps", "Stand-in for the lb-maps reconciler",
			cell.ProvidePrivate(job.Registry.NewGroup),
			cell.Invoke(counter.register),
		),
	)
	log := slog.New(slog.DiscardHandler)
	if err := h.Start(log, context.Background()); err != nil {
		b.Fatal(err)
	}
	defer h.Stop(log, context.Background())

	before := memStats()
	cpuBefore := cpuTime()
	b.StartTimer()
	start := time.Now()
	close(feed.Start)
	select {
	case <-counter.done:
	case <-time.After(5 * time.Minute):
		b.Fatalf("%d of %d frontends reconciled after 5 minutes", counter.n.Load(), n)
	}
	elapsed := time.Since(start)
	cpu := cpuTime() - cpuBefore
	b.StopTimer()
	after := memStats()
	return runResult{
		servicesPerSec: float64(n) / elapsed.Seconds(),
		cpuPerService:  float64(cpu.Microseconds()) / float64(n),
		liveBytes:      float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / float64(n),
		allocBytes:     float64(after.TotalAlloc-before.TotalAlloc) / float64(n),
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

// reconciledCounter is a reconciler that writes nothing and closes done
// once want frontends were reconciled with a backend. Each generated
// frontend gets its one backend once and never changes after, so counting
// needs no memory per frontend.
type reconciledCounter struct {
	n    atomic.Int64
	want int64
	done chan struct{}
}

func (c *reconciledCounter) register(p reconciler.Params, tbl statedb.RWTable[*loadbalancer.Frontend]) error {
	_, err := reconciler.Register(p, tbl,
		(*loadbalancer.Frontend).Clone, (*loadbalancer.Frontend).SetStatus, (*loadbalancer.Frontend).GetStatus,
		c, nil)
	return err
}

func (c *reconciledCounter) Update(_ context.Context, _ statedb.ReadTxn, _ statedb.Revision, fe *loadbalancer.Frontend) error {
	if len(fe.Backends) > 0 && c.n.Add(1) == c.want {
		close(c.done)
	}
	return nil
}

func (c *reconciledCounter) Delete(context.Context, statedb.ReadTxn, statedb.Revision, *loadbalancer.Frontend) error {
	return nil
}

func (c *reconciledCounter) Prune(context.Context, statedb.ReadTxn, iter.Seq2[*loadbalancer.Frontend, statedb.Revision]) error {
	return nil
}
