package ctgc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"

	"github.com/cellium/cellium/cells/bpfmaps"
	"github.com/cellium/cellium/cells/ctmaps"
	"github.com/cellium/cellium/cells/endpointmanager"
	"github.com/cellium/cellium/cells/ipam"
	"github.com/cellium/cellium/pkg/ctmap"
	"github.com/cellium/cellium/pkg/nodeportmap"
)

// Pass is what one garbage collection pass did.
type Pass struct {
	// Number counts passes from 1, the first after start: the one that
	// also removes the entries of endpoints that are gone.
	Number   uint64
	Start    time.Time
	Duration time.Duration
	Maps     []MapPass
	// Share is the largest share of a map's capacity that the pass found
	// expired, which the adaptive interval follows. Entries of endpoints
	// that are gone do not count: they say nothing of how fast entries
	// expire.
	Share float64
	// Interval is the wait until the next pass, as this pass decided it.
	Interval time.Duration
	// Err is why the pass failed. A failed pass may have deleted entries,
	// and leaves the interval as it was.
	Err error

	// long: the pass took long enough to log its progress.
	long bool
}

// MapPass is what a pass did in one map.
type MapPass struct {
	Map      string
	Capacity int
	Scanned  int
	// Expired entries had outlived their lifetime.
	Expired int
	// EndpointGone entries belonged to an endpoint that the endpoints
	// table no longer has (first pass only).
	EndpointGone int
}

// Scanned is the number of entries the pass read.
func (p *Pass) Scanned() int {
	n := 0
	for _, m := range p.Maps {
		n += m.Scanned
	}
	return n
}

// Deleted is the number of entries the pass removed.
func (p *Pass) Deleted() int {
	n := 0
	for _, m := range p.Maps {
		n += m.Expired + m.EndpointGone
	}
	return n
}

func (p *Pass) endpointGone() int {
	n := 0
	for _, m := range p.Maps {
		n += m.EndpointGone
	}
	return n
}

// Status is what the GC is doing and has done.
type Status struct {
	// Waiting, while not empty, says what the first pass waits for.
	Waiting string
	// Passes counts the passes since start, failed ones included.
	Passes uint64
	// Interval is the current wait between passes; Fixed when
	// --conntrack-gc-interval sets it.
	Interval time.Duration
	Fixed    bool
	// Last is the latest pass; nil before the first.
	Last *Pass
	// EndpointsFlushed counts the endpoints deleted since start whose
	// conntrack entries are deleted (in hives without the IPAM).
	EndpointsFlushed uint64
	// AddressesReleased counts the addresses the IPAM held as released
	// whose conntrack entries are deleted, then freed.
	AddressesReleased uint64
}

// Flushed is what a flush removed from one map.
type Flushed struct {
	Map     string
	Deleted int
}

// ErrStopped is returned by Run when the GC is not running.
var ErrStopped = errors.New("conntrack garbage collector is not running")

// GC collects garbage from the conntrack maps. See the package
// documentation.
type GC struct {
	log       *slog.Logger
	db        *statedb.DB
	endpoints statedb.Table[*endpointmanager.Endpoint]
	maps      *ctmaps.Maps
	nat       *NodePortNAT
	ipam      *ipam.IPAM
	metrics   *gcMetrics
	interval  *interval

	// requests are Run's: each gets the first pass that starts after it.
	requests chan chan Pass
	// stopped is closed when the job ends.
	stopped chan struct{}

	// mu serializes walks that delete: passes and flushes.
	mu sync.Mutex
	// chunk is how many entries a walk reads per system call. Each walk
	// makes its two chunks' buffers and lets them go when it ends: kept
	// between passes, the buffers of the five maps were 2 MB of an idle
	// agent's heap.
	chunk int
	// progressEvery is how often a long walk logs its progress.
	progressEvery time.Duration

	statusMu sync.Mutex
	status   Status
	changed  chan struct{}
}

type params struct {
	cell.In

	Config    Config
	Log       *slog.Logger
	DB        *statedb.DB
	Endpoints statedb.Table[*endpointmanager.Endpoint]
	Maps      *ctmaps.Maps
	// NAT is the NodePort programs' NAT map (the loader's), whose expired
	// entries the passes delete too; absent in hives without the loader.
	// Before Jobs, as Maps: its start hook opens it before the job starts.
	NAT *NodePortNAT `optional:"true"`
	// IPAM, when the hive has it, holds released addresses until their
	// entries are deleted.
	IPAM *ipam.IPAM `optional:"true"`
	Jobs job.Group
}

// NodePortNAT is the NAT map of the NodePort programs (bpf/nodeport.c),
// which the loader cell declares and provides.
type NodePortNAT = bpfmaps.Map[nodeportmap.Key4, nodeportmap.NAT4]

func newGC(p params) (*GC, error) {
	iv, err := newInterval(p.Config)
	if err != nil {
		return nil, err
	}
	gc := &GC{
		log:       p.Log,
		db:        p.DB,
		endpoints: p.Endpoints,
		maps:      p.Maps,
		nat:       p.NAT,
		ipam:      p.IPAM,
		metrics:   newGCMetrics(),
		interval:  iv,
		requests:  make(chan chan Pass),
		stopped:   make(chan struct{}),
		chunk:     chunkSize,
		status:    Status{Waiting: "start", Interval: iv.current, Fixed: iv.fixed > 0},
		changed:   make(chan struct{}),

		progressEvery: progressEvery,
	}
	gc.metrics.interval.Set(iv.current.Seconds())
	// The job group's start hook was appended when the group was built for
	// this constructor, after the maps' (this constructor takes them): the
	// job starts once the maps are open.
	p.Jobs.Add(job.OneShot("gc", gc.run))
	if p.IPAM != nil {
		// Every address an endpoint had is released through the IPAM
		// before the endpoint leaves the table: held there until its
		// entries are gone, it goes to no new pod before.
		p.IPAM.HoldReleases("conntrack garbage collection")
		p.Jobs.Add(job.OneShot("flush-released-addresses", gc.flushReleasedAddresses))
	} else {
		p.Jobs.Add(job.OneShot("flush-deleted-endpoints", gc.flushDeletedEndpoints))
	}
	return gc, nil
}

// flushReleasedAddresses is the job that deletes the conntrack entries of
// the addresses the IPAM holds as released (HoldReleases), then frees them:
// the IPAM hands such an address to a new pod only after its old owner's
// entries are gone, which would otherwise let the old pod's peers into the
// new one past its ingress policy. A walk deletes the entries of every
// address released by then; one that fails is tried again after the
// shortest interval, the addresses held meanwhile.
func (gc *GC) flushReleasedAddresses(ctx context.Context, health cell.Health) error {
	health.OK("Following released addresses")
	var retry <-chan time.Time
	for {
		addrs, watch := gc.ipam.Releasing()
		if len(addrs) > 0 && retry == nil {
			deleted, err := gc.flushAddrs("released addresses", addrs)
			if err != nil {
				gc.log.Warn("Deleting the conntrack entries of released addresses failed; they stay held, retrying", "addresses", addrs, "error", err)
				health.Degraded("Deleting the conntrack entries of released addresses", err)
				retry = time.After(gc.interval.min)
			} else {
				gc.ipam.FinishReleases(addrs)
				gc.log.Info("Deleted the conntrack entries of released addresses", "addresses", addrs, "deleted", deleted)
				health.OK("Following released addresses")
				gc.updateStatus(func(s *Status) { s.AddressesReleased += uint64(len(addrs)) })
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-watch:
		case <-retry:
			retry = nil
		}
	}
}

// flushDeletedEndpoints is the job that, for every endpoint deleted from
// the endpoints table, deletes the conntrack entries with one of its
// addresses as source or destination, in every map and both families:
// the address goes to another pod later (the IPAM hands released
// addresses out again), and an established entry left from the old pod's
// connections would let its peers' packets into the new pod without its
// ingress policy. The deletes of one batch of changes are one walk of the
// maps; a walk that fails is tried again, with the addresses of the
// endpoints deleted meanwhile, after the shortest interval.
func (gc *GC) flushDeletedEndpoints(ctx context.Context, health cell.Health) error {
	wtxn := gc.db.WriteTxn(gc.endpoints)
	changes, err := gc.endpoints.Changes(wtxn)
	wtxn.Commit()
	if err != nil {
		return fmt.Errorf("follow table %s: %w", endpointmanager.TableName, err)
	}
	defer changes.Close()
	health.OK("Following deleted endpoints")
	var (
		pending []netip.Addr
		ids     []uint16
		retry   <-chan time.Time
	)
	for {
		seq, watch := changes.Next(gc.db.ReadTxn())
		for c := range seq {
			if c.Deleted {
				pending = append(pending, c.Object.IPs()...)
				ids = append(ids, c.Object.ID)
			}
		}
		if len(pending) > 0 && retry == nil {
			deleted, err := gc.flushAddrs("deleted endpoints' addresses", pending)
			if err != nil {
				gc.log.Warn("Deleting the conntrack entries of deleted endpoints failed; retrying", "endpoints", ids, "addresses", pending, "error", err)
				health.Degraded("Deleting the conntrack entries of deleted endpoints", err)
				retry = time.After(gc.interval.min)
			} else {
				gc.log.Info("Deleted the conntrack entries of deleted endpoints", "endpoints", ids, "addresses", pending, "deleted", deleted)
				health.OK("Following deleted endpoints")
				gc.updateStatus(func(s *Status) { s.EndpointsFlushed += uint64(len(ids)) })
				pending, ids = pending[:0], ids[:0]
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-watch:
		case <-retry:
			retry = nil
		}
	}
}

// flushAddrs deletes the conntrack entries (not the NAT map's) with one of
// addrs as source or destination, and returns how many. what names the
// addresses in its progress log.
func (gc *GC) flushAddrs(what string, addrs []netip.Addr) (int, error) {
	gc.mu.Lock()
	defer gc.mu.Unlock()
	j := &judge{deleted: newAddrSet(addrs)}
	prog := newProgress(gc.log, "flush of "+what, gc.progressEvery)
	var (
		n    int
		errs []error
	)
	for _, sweep := range gc.sweeps(j, prog, false) {
		s, err := sweep()
		errs = append(errs, err)
		n += s.Deleted[endpointDeleted]
		gc.metrics.deleted.WithLabelValues(s.Map, endpointDeleted.String()).Add(float64(s.Deleted[endpointDeleted]))
	}
	return n, errors.Join(errs...)
}

// Status returns the GC's status and a channel that is closed when it
// changes.
func (gc *GC) Status() (Status, <-chan struct{}) {
	gc.statusMu.Lock()
	defer gc.statusMu.Unlock()
	return gc.status, gc.changed
}

func (gc *GC) updateStatus(update func(*Status)) {
	gc.statusMu.Lock()
	defer gc.statusMu.Unlock()
	update(&gc.status)
	close(gc.changed)
	gc.changed = make(chan struct{})
}

// Run asks for a pass now and returns it when it is done; the error is the
// pass's, or ctx's. The first pass waits for the endpoints table to be
// initialized: before it, Run waits for it, then for a pass of its own.
func (gc *GC) Run(ctx context.Context) (Pass, error) {
	reply := make(chan Pass, 1)
	select {
	case gc.requests <- reply:
	case <-gc.stopped:
		return Pass{}, ErrStopped
	case <-ctx.Done():
		return Pass{}, ctx.Err()
	}
	select {
	case p := <-reply:
		return p, p.Err
	case <-ctx.Done():
		return Pass{}, ctx.Err()
	}
}

// run is the GC's job: the first pass once the endpoints are restored, then
// a pass per interval, or sooner when Run asks.
func (gc *GC) run(ctx context.Context, health cell.Health) error {
	defer close(gc.stopped)
	if !gc.waitForEndpoints(ctx, health) {
		return nil
	}
	var waiting []chan Pass
	for number, checkEndpoints := uint64(1), true; ; number++ {
		p := gc.pass(number, checkEndpoints)
		if p.Err == nil {
			// The endpoint check is done once, but done: a failed first
			// pass leaves it to the next.
			checkEndpoints = false
		}
		gc.report(&p, health)
		for _, reply := range waiting {
			reply <- p
		}
		waiting = waiting[:0]

		timer := time.NewTimer(p.Interval)
		select {
		case <-ctx.Done():
			timer.Stop()
			return nil
		case <-timer.C:
		case reply := <-gc.requests:
			timer.Stop()
			waiting = append(waiting, reply)
		}
		// Requests that came meanwhile are served by the same pass.
		for more := true; more; {
			select {
			case reply := <-gc.requests:
				waiting = append(waiting, reply)
			default:
				more = false
			}
		}
	}
}

// waitForEndpoints waits until the endpoints table is initialized, that is
// until the endpoint manager has restored the endpoints of the previous
// run: before that, an entry of an endpoint not yet restored would look
// like one of an endpoint that is gone. It returns false if ctx ended first.
func (gc *GC) waitForEndpoints(ctx context.Context, health cell.Health) bool {
	for {
		txn := gc.db.ReadTxn()
		initialized, watch := gc.endpoints.Initialized(txn)
		if initialized {
			gc.updateStatus(func(s *Status) { s.Waiting = "" })
			return true
		}
		waiting := fmt.Sprintf("the %s table to be initialized (pending: %s)",
			endpointmanager.TableName, strings.Join(gc.endpoints.PendingInitializers(txn), ", "))
		gc.updateStatus(func(s *Status) { s.Waiting = waiting })
		health.OK("Waiting for " + waiting)
		select {
		case <-ctx.Done():
			return false
		case <-watch:
		}
	}
}

// pass walks every map once and deletes what has expired and, when
// checkEndpoints, the entries of endpoints that are gone.
func (gc *GC) pass(number uint64, checkEndpoints bool) Pass {
	gc.mu.Lock()
	defer gc.mu.Unlock()
	p := Pass{Number: number, Start: time.Now()}
	j := &judge{now: ctmap.Now()}
	if checkEndpoints {
		j.endpoints = newEndpointCheck(gc.db, gc.endpoints)
	}
	prog := newProgress(gc.log, fmt.Sprintf("pass %d", number), gc.progressEvery)
	var errs []error
	for _, sweep := range gc.sweeps(j, prog, true) {
		s, err := sweep()
		errs = append(errs, err)
		mp := MapPass{
			Map: s.Map, Capacity: s.Capacity, Scanned: s.Scanned,
			Expired: s.Deleted[expired], EndpointGone: s.Deleted[endpointGone],
		}
		p.Maps = append(p.Maps, mp)
		if mp.Capacity > 0 {
			p.Share = max(p.Share, float64(mp.Expired)/float64(mp.Capacity))
		}
	}
	p.Duration = time.Since(p.Start)
	p.long = prog.long()
	p.Err = errors.Join(errs...)
	if p.Err == nil {
		p.Interval = gc.interval.next(p.Share)
	} else {
		// Retry soon, without reading anything into a pass that saw only
		// part of the maps.
		p.Interval = min(gc.interval.current, gc.interval.min)
	}
	return p
}

// sweeps are the walks of the four conntrack maps with j and, with nat,
// of the NodePort NAT map.
func (gc *GC) sweeps(j *judge, prog *progress, nat bool) []func() (swept, error) {
	ct4 := func(m *ctmaps.Map4) func() (swept, error) {
		return func() (swept, error) {
			return sweep(walk[ctmap.Key4, ctmap.Entry]{m: m, bufs: newBuffers[ctmap.Key4, ctmap.Entry](gc.chunk), verdict: j.verdict4}, j, prog)
		}
	}
	ct6 := func(m *ctmaps.Map6) func() (swept, error) {
		return func() (swept, error) {
			return sweep(walk[ctmap.Key6, ctmap.Entry]{m: m, bufs: newBuffers[ctmap.Key6, ctmap.Entry](gc.chunk), verdict: j.verdict6}, j, prog)
		}
	}
	sweeps := []func() (swept, error){ct4(gc.maps.TCP4), ct4(gc.maps.Any4), ct6(gc.maps.TCP6), ct6(gc.maps.Any6)}
	if nat && gc.nat != nil {
		sweeps = append(sweeps, func() (swept, error) {
			return sweep(walk[nodeportmap.Key4, nodeportmap.NAT4]{
				m: gc.nat, bufs: newBuffers[nodeportmap.Key4, nodeportmap.NAT4](gc.chunk), verdict: j.natVerdict, confirm: gc.natStillExpired(j.now),
			}, j, prog)
		})
	}
	return sweeps
}

// natStillExpired reads a NAT entry again just before it is deleted: the
// datapath takes an expired entry's key over for a new connection (a SNAT
// port is free again once its connection expired), which the pass must
// not delete. What is left is the microseconds between this lookup and
// the delete.
func (gc *GC) natStillExpired(now uint32) func(nodeportmap.Key4) bool {
	return func(k nodeportmap.Key4) bool {
		v, err := gc.nat.Lookup(k)
		return err == nil && v.Expired(now)
	}
}

// report logs, counts and publishes a pass.
func (gc *GC) report(p *Pass, health cell.Health) {
	gc.metrics.observe(p)
	gc.updateStatus(func(s *Status) {
		s.Passes = p.Number
		s.Interval = p.Interval
		s.Last = p
	})
	attrs := []any{
		"pass", p.Number, "scanned", p.Scanned(), "deleted", p.Deleted(), "endpointGone", p.endpointGone(),
		"share", fmt.Sprintf("%.3f", p.Share), "duration", p.Duration, "next", p.Interval,
	}
	if p.Err != nil {
		gc.log.Warn("Conntrack garbage collection pass failed", append(attrs, "error", p.Err)...)
		health.Degraded("Conntrack garbage collection pass failed", p.Err)
		return
	}
	level := slog.LevelDebug
	if p.Share > shrinkAbove || p.endpointGone() > 0 || p.long {
		level = slog.LevelInfo
	}
	gc.log.Log(context.Background(), level, "Conntrack garbage collection pass", attrs...)
	health.OK(fmt.Sprintf("Pass %d deleted %d of %d entries in %s; next in %s",
		p.Number, p.Deleted(), p.Scanned(), p.Duration.Round(time.Millisecond), p.Interval))
}

// Flush deletes every entry of every conntrack map. Connections in flight
// get new entries with their next packets.
func (gc *GC) Flush() ([]Flushed, error) {
	gc.mu.Lock()
	defer gc.mu.Unlock()
	j := &judge{flush: true}
	var (
		out  []Flushed
		errs []error
	)
	prog := newProgress(gc.log, "flush", gc.progressEvery)
	// Not the NAT map: a connection whose entries go is broken, not
	// tracked anew.
	for _, sweep := range gc.sweeps(j, prog, false) {
		s, err := sweep()
		out = append(out, Flushed{Map: s.Map, Deleted: s.Deleted[flushed]})
		errs = append(errs, err)
		gc.metrics.deleted.WithLabelValues(s.Map, flushed.String()).Add(float64(s.Deleted[flushed]))
	}
	return out, errors.Join(errs...)
}
