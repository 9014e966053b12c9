package hubble

import (
	"fmt"
	"testing"
	"time"

	"github.com/cellium/cellium/cells/ctmaps"
	"github.com/cellium/cellium/pkg/monitorapi"
)

// Figures of BenchmarkHubblePipeline.
const (
	benchFlows = 1 << 20
	// benchChunk records go into the ring buffer per BPF_PROG_TEST_RUN
	// call; benchInFlight chunks may wait in the pipeline at once, which
	// the ring buffer and the queue hold without losing any.
	benchChunk    = 1 << 14
	benchInFlight = 4
)

// BenchmarkHubblePipeline is `make bench-hubble`: records written into the
// real event ring buffer by a BPF program (monitortest), as the datapath
// writes them, read and decoded by the monitor, fanned out to the hubble
// cell, converted to flows with enrichment from the tables and added to
// the Hubble ring. The figure is flows per second from the first record
// written to the last flow in the ring. The writer keeps a few chunks in
// flight so the pipeline never waits for it, and never more than the ring
// buffer and the cell's queue hold: a lost event fails the benchmark. The
// records are the seven of the tests (trace, drop and socket events,
// IPv4 and IPv6, with pods and services to enrich), in equal shares. It
// also reports the userspace part alone (decode, convert, add to the ring,
// in one goroutine) as a ceiling.
func BenchmarkHubblePipeline(b *testing.B) {
	e := newCellEnv(b, envOptions{
		ctmaps: func(c *ctmaps.Config) { c.MonitorRingbufSize = 16 << 20 },
		config: func(c *Config) { c.HubbleEventQueueSize = benchChunk * benchInFlight * 2 },
	})
	base := testBase(e.boot)
	var records [][]byte
	for _, ev := range testEvents(base) {
		rec, err := monitorapi.Encode(ev, e.boot)
		if err != nil {
			b.Fatal(err)
		}
		records = append(records, rec)
	}
	o := e.hubble.observer
	seen := func() uint64 { _, next := o.flows.Bounds(); return next }

	var perSecond, ceiling float64
	for b.Loop() {
		lostBefore, err := e.events.LostEvents()
		if err != nil {
			b.Fatal(err)
		}
		start, written := seen(), uint64(0)
		began := time.Now()
		lastProgress, lastSeen := began, start
		for written < benchFlows || seen()-start < benchFlows {
			done := seen() - start
			if written < benchFlows && written-done < benchChunk*(benchInFlight-1) {
				for i, rec := range records {
					n := benchChunk / len(records)
					if i == 0 {
						n += benchChunk % len(records)
					}
					if err := e.writer.Write(rec, n); err != nil {
						b.Fatal(err)
					}
				}
				written += benchChunk
				continue
			}
			if s := seen(); s != lastSeen {
				lastProgress, lastSeen = time.Now(), s
			} else if time.Since(lastProgress) > 10*time.Second {
				lost, _ := e.events.LostEvents()
				b.Fatalf("stuck at %d of %d flows (%d written); the datapath lost %d", s-start, benchFlows, written, lost-lostBefore)
			}
			// Polling the ring's count costs the pipeline nothing; a
			// tenth of a millisecond is far below the run's length.
			time.Sleep(100 * time.Microsecond)
		}
		elapsed := time.Since(began)
		if lost, _ := e.events.LostEvents(); lost != lostBefore {
			b.Fatalf("the datapath lost %d events: the figure would not be of every flow", lost-lostBefore)
		}
		if got := seen() - start; got != benchFlows {
			b.Fatalf("%d entries entered the ring, want exactly %d flows (lost-event records?)", got, benchFlows)
		}
		perSecond = benchFlows / elapsed.Seconds()
		ceiling = userspaceCeiling(b, e, records)
	}
	b.ReportMetric(perSecond, "flows/s")
	b.ReportMetric(ceiling, "userspace-flows/s")
	fmt.Printf("hubble-stage userspace_decode_convert_ring_flows_per_s=%.0f\n", ceiling)
	fmt.Printf("hubble-bench flows_per_s=%.0f\n", perSecond)
}

// userspaceCeiling is flows per second of decoding, converting and adding
// to a ring in one goroutine, without the kernel and the fan-out.
func userspaceCeiling(b *testing.B, e *cellEnv, records [][]byte) float64 {
	const n = 1 << 19
	o := NewObserver(DefaultConfig.HubbleBufferSize, "node-1", time.Now)
	c := newConverter("node-1", e.hubble.convert.enrich.Tables)
	began := time.Now()
	txn := e.db.ReadTxn()
	for i := range n {
		if i%maxBatch == 0 {
			txn = e.db.ReadTxn()
		}
		ev, err := monitorapi.Decode(records[i%len(records)], e.boot)
		if err != nil {
			b.Fatal(err)
		}
		o.AddFlow(c.flowOf(txn, ev))
	}
	return n / time.Since(began).Seconds()
}
