package ctgc_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/hivetest"
	"github.com/cilium/statedb"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/cellium/cellium/cells/api"
	"github.com/cellium/cellium/cells/bpfmaps"
	"github.com/cellium/cellium/cells/bpfmaps/bpfmapstest"
	"github.com/cellium/cellium/cells/ctgc"
	"github.com/cellium/cellium/cells/ctmaps"
	"github.com/cellium/cellium/cells/daemon"
	"github.com/cellium/cellium/cells/endpointmanager"
	"github.com/cellium/cellium/cells/health"
	"github.com/cellium/cellium/cells/internal/celltest"
	"github.com/cellium/cellium/cells/ipam"
	"github.com/cellium/cellium/pkg/ctmap"
	"github.com/cellium/cellium/pkg/nodeportmap"
)

// Map sizes of the tests: small enough that a test fills a good share of a
// map, large enough that the LRU maps never evict: an LRU map sets up to
// 128 free entries per CPU aside, and evicts when the rest is used.
const (
	tcpMax = 8192
	anyMax = 4096
)

// gcEnv is one run of the ct-gc cell over a bpffs, with the real conntrack
// maps and an endpoints table the test fills: a restart is a new gcEnv over
// the same root.
type gcEnv struct {
	t         *testing.T
	db        *statedb.DB
	endpoints statedb.RWTable[*endpointmanager.Endpoint]
	health    statedb.Table[*health.Status]
	maps      *ctmaps.Maps
	nat       *ctgc.NodePortNAT
	ipam      *ipam.IPAM
	gc        *ctgc.GC
	registry  *prometheus.Registry
	stop      func()
	// restore is the test's initializer of the endpoints table, as the
	// endpoint manager holds one until it has restored the endpoints; nil
	// when the test holds none.
	restore func(statedb.WriteTxn)
}

type envOptions struct {
	// endpoints are in the table from the start.
	endpoints []uint16
	// holdRestore keeps the endpoints table uninitialized until
	// finishRestore. Without it, newGCEnv returns after the first pass,
	// so that the test's entries meet passes it runs itself.
	holdRestore bool
	config      func(*ctgc.Config)
	// apiSocket, if set, serves the API there.
	apiSocket string
	// logs, if set, records what the hive logs.
	logs *logRecorder
	// nat declares the NodePort NAT map, as the loader does.
	nat bool
	// ipam adds the IPAM (pool 10.244.0.0/29 and fd00::/125, state in a
	// temporary directory), which the GC holds released addresses of.
	ipam bool
}

func newGCEnv(t *testing.T, root string, opts envOptions) *gcEnv {
	t.Helper()
	e := &gcEnv{t: t, registry: prometheus.NewRegistry()}
	cells := []cell.Cell{bpfmaps.Cell, ctmaps.Cell, ctgc.Cell,
		cell.Provide(endpointmanager.NewTable, statedb.RWTable[*endpointmanager.Endpoint].ToTable),
		cell.Invoke(func(db *statedb.DB, eps statedb.RWTable[*endpointmanager.Endpoint], hs statedb.Table[*health.Status], maps *ctmaps.Maps, gc *ctgc.GC) {
			e.db, e.endpoints, e.health, e.maps, e.gc = db, eps, hs, maps, gc
			txn := db.WriteTxn(eps)
			for _, id := range opts.endpoints {
				eps.Insert(txn, testEndpoint(id))
			}
			if opts.holdRestore {
				e.restore = eps.RegisterInitializer(txn, "test-restore")
			}
			txn.Commit()
		}),
		cell.Invoke(func(c struct {
			cell.In
			Collectors []prometheus.Collector `group:"metrics"`
		}) {
			e.registry.MustRegister(c.Collectors...)
		}),
	}
	if opts.apiSocket != "" {
		cells = append(cells, api.Cell)
	}
	if opts.nat {
		cells = append(cells, cell.Provide(func(lc cell.Lifecycle, reg *bpfmaps.Registry) (*ctgc.NodePortNAT, error) {
			return bpfmaps.NewMap[nodeportmap.Key4, nodeportmap.NAT4](lc, reg, bpfmaps.Spec{
				Name: nodeportmap.MapName, Type: ebpf.LRUHash, MaxEntries: natMax,
			})
		}), cell.Invoke(func(nat *ctgc.NodePortNAT) { e.nat = nat }))
	}
	if opts.ipam {
		cells = append(cells, daemon.Cell, ipam.Cell, cell.Invoke(func(i *ipam.IPAM) { e.ipam = i }))
	}
	h := celltest.New(cells...)
	if opts.ipam {
		dir := t.TempDir()
		hive.AddConfigOverride(h, func(c *daemon.Config) { c.StateDir, c.RunDir = filepath.Join(dir, "state"), filepath.Join(dir, "run") })
		hive.AddConfigOverride(h, func(c *ipam.Config) { c.PodCIDR = []string{"10.244.0.0/29", "fd00::/125"} })
	}
	if opts.apiSocket != "" {
		hive.AddConfigOverride(h, func(c *api.Config) { c.APISocket = opts.apiSocket })
	}
	hive.AddConfigOverride(h, func(c *bpfmaps.Config) { c.BPFRoot = root })
	hive.AddConfigOverride(h, func(c *ctmaps.Config) {
		c.ConntrackTCPMax = tcpMax
		c.ConntrackAnyMax = anyMax
	})
	if opts.config != nil {
		hive.AddConfigOverride(h, opts.config)
	}
	log := hivetest.Logger(t)
	if opts.logs != nil {
		log = slog.New(opts.logs.wrap(log.Handler()))
	}
	if err := h.Start(log, context.Background()); err != nil {
		t.Fatalf("start hive: %v", err)
	}
	var once sync.Once
	e.stop = func() {
		once.Do(func() {
			if err := h.Stop(log, context.Background()); err != nil {
				t.Errorf("stop hive: %v", err)
			}
		})
	}
	t.Cleanup(e.stop)
	if !opts.holdRestore {
		e.waitStatus("a first pass", func(s ctgc.Status) bool { return s.Passes >= 1 })
	}
	return e
}

func testEndpoint(id uint16) *endpointmanager.Endpoint {
	return &endpointmanager.Endpoint{ID: id, ContainerID: fmt.Sprintf("container-%d", id), State: endpointmanager.Ready}
}

// finishRestore puts endpoints in the table and completes the test's
// initializer in the same transaction, as the endpoint manager's restore
// does.
func (e *gcEnv) finishRestore(endpoints ...uint16) {
	txn := e.db.WriteTxn(e.endpoints)
	for _, id := range endpoints {
		e.endpoints.Insert(txn, testEndpoint(id))
	}
	e.restore(txn)
	txn.Commit()
}

// run runs a pass and fails the test if it fails.
func (e *gcEnv) run() ctgc.Pass {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, err := e.gc.Run(ctx)
	if err != nil {
		e.t.Fatalf("GC pass: %v", err)
	}
	return p
}

// waitStatus waits until the GC's status satisfies ok, and returns it.
func (e *gcEnv) waitStatus(what string, ok func(ctgc.Status) bool) ctgc.Status {
	e.t.Helper()
	timeout := time.After(30 * time.Second)
	for {
		st, changed := e.gc.Status()
		if ok(st) {
			return st
		}
		select {
		case <-changed:
		case <-timeout:
			e.t.Fatalf("GC status never showed %s; last: %+v", what, st)
		}
	}
}

// conn is a conntrack entry the tests put in a map: which map, its tuple
// by number, its endpoint and whether it has expired.
type conn struct {
	tcp      bool
	ipv6     bool
	n        int
	endpoint uint16
	expired  bool
}

func (c conn) String() string {
	return fmt.Sprintf("conn{tcp %v, ipv6 %v, #%d, endpoint %d, expired %v}", c.tcp, c.ipv6, c.n, c.endpoint, c.expired)
}

func (c conn) proto() uint8 {
	switch {
	case c.tcp:
		return 6
	case c.n%2 == 0:
		return 17
	case c.ipv6:
		return 58
	}
	return 1
}

func (c conn) key4() ctmap.Key4 {
	k := ctmap.Key4{
		SrcAddr: [4]byte{10, 244, byte(c.n >> 8), byte(c.n)},
		DstAddr: [4]byte{10, 96, 0, 10},
		SrcPort: [2]byte{byte(c.n >> 8), byte(c.n)},
		DstPort: [2]byte{0, 80},
		Proto:   c.proto(),
	}
	return k
}

func (c conn) key6() ctmap.Key6 {
	k := ctmap.Key6{
		SrcAddr: [16]byte{0xfd, 0, 14: byte(c.n >> 8), 15: byte(c.n)},
		DstAddr: [16]byte{0xfd, 0, 15: 1},
		SrcPort: [2]byte{byte(c.n >> 8), byte(c.n)},
		DstPort: [2]byte{0, 80},
		Proto:   c.proto(),
	}
	return k
}

func (c conn) entry(now uint32) ctmap.Entry {
	lifetime := now + 3600
	if c.expired {
		lifetime = now - 30
	}
	return ctmap.Entry{
		Lifetime: lifetime, Flags: ctmap.CTFSynSeen | ctmap.CTFEstablished, EndpointID: c.endpoint,
		PacketsTx: 3, BytesTx: 180, PacketsRx: 2, BytesRx: 120, LastTx: now - 1, LastRx: now - 2,
	}
}

func (e *gcEnv) ctMap4(c conn) *bpfmaps.Map[ctmap.Key4, ctmap.Entry] {
	if c.tcp {
		return e.maps.TCP4
	}
	return e.maps.Any4
}

func (e *gcEnv) ctMap6(c conn) *bpfmaps.Map[ctmap.Key6, ctmap.Entry] {
	if c.tcp {
		return e.maps.TCP6
	}
	return e.maps.Any6
}

func (e *gcEnv) put(conns ...conn) {
	e.t.Helper()
	now := ctmap.Now()
	for _, c := range conns {
		var err error
		if c.ipv6 {
			err = e.ctMap6(c).Put(c.key6(), c.entry(now))
		} else {
			err = e.ctMap4(c).Put(c.key4(), c.entry(now))
		}
		if err != nil {
			e.t.Fatalf("put %v: %v", c, err)
		}
	}
}

func (e *gcEnv) has(c conn) bool {
	e.t.Helper()
	var err error
	if c.ipv6 {
		_, err = e.ctMap6(c).Lookup(c.key6())
	} else {
		_, err = e.ctMap4(c).Lookup(c.key4())
	}
	if err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		e.t.Fatalf("lookup %v: %v", c, err)
	}
	return err == nil
}

// check fails the test unless exactly the conns marked kept are in the
// maps.
func (e *gcEnv) check(when string, kept, gone []conn) {
	e.t.Helper()
	for _, c := range kept {
		if !e.has(c) {
			e.t.Errorf("%s: %v was deleted, want it kept", when, c)
		}
	}
	for _, c := range gone {
		if e.has(c) {
			e.t.Errorf("%s: %v is still there, want it deleted", when, c)
		}
	}
}

// conns are n conns of every map, each with the given endpoint and expiry.
func conns(from, n int, endpoint uint16, expired bool) []conn {
	var out []conn
	for _, tcp := range []bool{true, false} {
		for _, ipv6 := range []bool{false, true} {
			for i := from; i < from+n; i++ {
				out = append(out, conn{tcp: tcp, ipv6: ipv6, n: i, endpoint: endpoint, expired: expired})
			}
		}
	}
	return out
}

func mapPass(t *testing.T, p ctgc.Pass, name string) ctgc.MapPass {
	t.Helper()
	for _, m := range p.Maps {
		if m.Map == name {
			return m
		}
	}
	t.Fatalf("pass %d has no figures for map %s: %+v", p.Number, name, p.Maps)
	return ctgc.MapPass{}
}

func TestExpiredEntriesGoLiveOnesStay(t *testing.T) {
	e := newGCEnv(t, bpfmapstest.Root(t), envOptions{endpoints: []uint16{7}})
	live := append(conns(0, 10, 0, false), conns(10, 10, 7, false)...)
	dead := append(conns(100, 10, 0, true), conns(110, 5, 7, true)...)
	e.put(live...)
	e.put(dead...)

	p := e.run()
	e.check("after a pass", live, dead)
	if p.Err != nil || p.Scanned() != len(live)+len(dead) || p.Deleted() != len(dead) {
		t.Errorf("pass: scanned %d, deleted %d, error %v; want %d, %d, none", p.Scanned(), p.Deleted(), p.Err, len(live)+len(dead), len(dead))
	}
	for _, name := range []string{"cellium_ct4_tcp", "cellium_ct4_any", "cellium_ct6_tcp", "cellium_ct6_any"} {
		m := mapPass(t, p, name)
		if m.Scanned != 35 || m.Expired != 15 || m.EndpointGone != 0 {
			t.Errorf("%s: %+v, want 35 scanned, 15 expired, none of an endpoint gone", name, m)
		}
	}
	if got := metric(t, e.registry, "cellium_ct_gc_entries_deleted_total", "map", "cellium_ct6_any", "reason", "expired"); got != 15 {
		t.Errorf("cellium_ct_gc_entries_deleted_total{map=cellium_ct6_any,reason=expired} = %v, want 15", got)
	}

	// Entries that expire later go with the pass after.
	later := conns(200, 3, 7, true)
	e.put(later...)
	p2 := e.run()
	e.check("after the next pass", live, later)
	if p2.Deleted() != len(later) || p2.Number != p.Number+1 {
		t.Errorf("next pass: number %d, deleted %d; want %d, %d", p2.Number, p2.Deleted(), p.Number+1, len(later))
	}
	if got := metric(t, e.registry, "cellium_ct_gc_entries_scanned_total", "map", "cellium_ct4_tcp"); got != 35+23 {
		t.Errorf("cellium_ct_gc_entries_scanned_total{map=cellium_ct4_tcp} = %v, want %d", got, 35+23)
	}
}

// TestEndpointGoneAfterRestart: the first pass after a restart removes the
// entries of endpoints the restored table lacks, and waits for the table to
// be initialized before it does anything.
func TestEndpointGoneAfterRestart(t *testing.T) {
	root := bpfmapstest.Root(t)
	first := newGCEnv(t, root, envOptions{endpoints: []uint16{7, 8}})
	ep7, ep8, none := conns(0, 5, 7, false), conns(10, 5, 8, false), conns(20, 5, 0, false)
	all := append(append(append([]conn{}, ep7...), ep8...), none...)
	first.put(all...)
	if p := first.run(); p.Deleted() != 0 {
		t.Fatalf("first run: a pass with every endpoint in the table deleted %d entries", p.Deleted())
	}
	first.stop()

	// Endpoint 8 went while the agent was down.
	second := newGCEnv(t, root, envOptions{holdRestore: true})
	st := second.waitStatus("waiting for the endpoints table", func(s ctgc.Status) bool {
		return strings.Contains(s.Waiting, "test-restore")
	})
	if st.Passes != 0 || st.Interval != 5*time.Minute {
		t.Fatalf("status while the endpoints table is not initialized: %d passes, interval %s; want none, 5m", st.Passes, st.Interval)
	}
	second.check("before the restore", all, nil)

	second.finishRestore(7)
	st = second.waitStatus("a first pass", func(s ctgc.Status) bool { return s.Passes >= 1 })
	p := st.Last
	if p.Number != 1 || p.Err != nil || p.Deleted() != len(ep8) {
		t.Errorf("first pass after restart: number %d, deleted %d, error %v; want 1, %d, none", p.Number, p.Deleted(), p.Err, len(ep8))
	}
	if m := mapPass(t, *p, "cellium_ct6_any"); m.EndpointGone != 5 || m.Expired != 0 {
		t.Errorf("cellium_ct6_any: %+v, want 5 entries of an endpoint gone", m)
	}
	// Entries of endpoints that are gone say nothing of how fast entries
	// expire: they leave the interval to the expired ones.
	if p.Share != 0 {
		t.Errorf("first pass after restart: share %v, want 0: it deleted no expired entry", p.Share)
	}
	second.check("after the first pass", append(ep7, none...), ep8)

	// Only the first pass looks at endpoints.
	ep9 := conns(30, 2, 9, false)
	second.put(ep9...)
	if p := second.run(); p.Deleted() != 0 {
		t.Errorf("second pass deleted %d entries, want none: it keeps entries of unknown endpoints", p.Deleted())
	}
	second.check("after the second pass", ep9, nil)
}

func TestIntervalAdaptsToPasses(t *testing.T) {
	e := newGCEnv(t, bpfmapstest.Root(t), envOptions{config: func(c *ctgc.Config) {
		c.ConntrackGCIntervalMin = 10 * time.Second
		c.ConntrackGCIntervalMax = time.Hour
	}})
	// The first pass, on empty maps, doubled the starting 5m.
	if st, _ := e.gc.Status(); st.Interval != 10*time.Minute || st.Fixed {
		t.Errorf("status after the first pass: interval %s, fixed %v; want 10m, adaptive", st.Interval, st.Fixed)
	}
	tcp4 := func(from, n int) []conn {
		var out []conn
		for i := from; i < from+n; i++ {
			out = append(out, conn{tcp: true, n: i, expired: true})
		}
		return out
	}
	for _, step := range []struct {
		what string
		put  []conn
		want time.Duration
	}{
		{"an empty pass doubles it", nil, 20 * time.Minute},
		{"half a map halves it", tcp4(0, tcpMax/2), 10 * time.Minute},
		{"a tenth holds it", tcp4(10000, tcpMax/10), 10 * time.Minute},
		{"30% shortens it in proportion", tcp4(20000, tcpMax*3/10), 500 * time.Second},
		{"nothing doubles it again", nil, 1000 * time.Second},
	} {
		e.put(step.put...)
		p := e.run()
		st, _ := e.gc.Status()
		if p.Interval != step.want || st.Interval != step.want {
			t.Fatalf("%s: pass interval %s, status %s, want %s (share %.3f)", step.what, p.Interval, st.Interval, step.want, p.Share)
		}
		if got := metric(t, e.registry, "cellium_ct_gc_interval_seconds"); got != step.want.Seconds() {
			t.Fatalf("%s: cellium_ct_gc_interval_seconds = %v, want %v", step.what, got, step.want.Seconds())
		}
	}
}

func TestFixedInterval(t *testing.T) {
	e := newGCEnv(t, bpfmapstest.Root(t), envOptions{config: func(c *ctgc.Config) { c.ConntrackGCInterval = 42 * time.Second }})
	for i := range tcpMax / 2 {
		e.put(conn{tcp: true, n: i, expired: true})
	}
	if p := e.run(); p.Interval != 42*time.Second || p.Deleted() != tcpMax/2 {
		t.Errorf("pass deleting half a map with --conntrack-gc-interval=42s: interval %s, deleted %d; want 42s, %d", p.Interval, p.Deleted(), tcpMax/2)
	}
	if st, _ := e.gc.Status(); !st.Fixed || st.Interval != 42*time.Second {
		t.Errorf("status: fixed %v, interval %s; want fixed 42s", st.Fixed, st.Interval)
	}
}

// TestFailedPassDegradesHealth breaks a map under the GC: closing its file
// descriptor makes every system call on it fail.
func TestFailedPassDegradesHealth(t *testing.T) {
	e := newGCEnv(t, bpfmapstest.Root(t), envOptions{})
	e.put(conns(0, 3, 0, true)...)
	if err := e.maps.Any6.EBPF().Close(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, err := e.gc.Run(ctx)
	if err == nil || !strings.Contains(err.Error(), "cellium_ct6_any") {
		t.Fatalf("pass over a closed map: error %v, want one naming cellium_ct6_any", err)
	}
	// The other maps were collected all the same.
	if m := mapPass(t, p, "cellium_ct4_tcp"); m.Expired != 3 {
		t.Errorf("cellium_ct4_tcp in the failed pass: %+v, want its 3 expired entries deleted", m)
	}
	if p.Interval != 10*time.Second {
		t.Errorf("interval after a failed pass: %s, want the minimum, 10s", p.Interval)
	}
	s, _, found := e.health.Get(e.db.ReadTxn(), health.StatusID.Query("ct-gc.job-gc"))
	if !found || s.Level != cell.StatusDegraded || !strings.Contains(s.Error, "cellium_ct6_any") {
		t.Errorf("health of ct-gc.job-gc: %+v, want Degraded with the error", s)
	}
	if got := metric(t, e.registry, "cellium_ct_gc_passes_total", "result", "error"); got != 1 {
		t.Errorf("cellium_ct_gc_passes_total{result=error} = %v, want 1", got)
	}
}

// metric is the value of the series of a counter or gauge with the label
// pairs.
func metric(t *testing.T, reg *prometheus.Registry, name string, labels ...string) float64 {
	t.Helper()
	v, ok := celltest.Value(t, reg, name, labels...)
	if !ok {
		t.Fatalf("no metric %s%v", name, labels)
	}
	return v
}

// TestPassOverManyChunks walks maps of thousands of entries in chunks of 64,
// so that the walk reads each of its two buffers again while the entries
// the other condemned are being deleted: every expired entry goes and every
// live one stays all the same.
func TestPassOverManyChunks(t *testing.T) {
	e := newGCEnv(t, bpfmapstest.Root(t), envOptions{})
	ctgc.SetChunkSize(e.gc, 64)
	var live, dead []conn
	for i := range 4000 {
		for _, ipv6 := range []bool{false, true} {
			c := conn{tcp: true, ipv6: ipv6, n: i, expired: i%2 == 1}
			if c.expired {
				dead = append(dead, c)
			} else {
				live = append(live, c)
			}
		}
	}
	e.put(live...)
	e.put(dead...)

	p := e.run()
	e.check("after a pass in chunks of 64", live, dead)
	for _, name := range []string{"cellium_ct4_tcp", "cellium_ct6_tcp"} {
		if m := mapPass(t, p, name); m.Scanned != 4000 || m.Expired != 2000 {
			t.Errorf("%s: %+v, want 4000 scanned, 2000 expired", name, m)
		}
	}
	if p := e.run(); p.Scanned() != len(live) || p.Deleted() != 0 {
		t.Errorf("next pass: scanned %d, deleted %d; want %d, none", p.Scanned(), p.Deleted(), len(live))
	}
}

// TestLongPassLogsProgress: a pass that takes long logs how far it got
// after each stretch of progressEvery, and its end at info. The test makes
// every pass long by setting the stretch to 0.
func TestLongPassLogsProgress(t *testing.T) {
	logs := &logRecorder{}
	e := newGCEnv(t, bpfmapstest.Root(t), envOptions{logs: logs})
	ctgc.SetChunkSize(e.gc, 64)
	var cs []conn
	for i := range 300 {
		cs = append(cs, conn{tcp: true, n: i, expired: i < 100})
	}
	e.put(cs...)

	// A pass of a few milliseconds is not long.
	p := e.run()
	if got := logs.find("Conntrack garbage collection in progress", nil); len(got) != 0 {
		t.Fatalf("a short pass logged progress: %v", got)
	}
	if got := logs.find("Conntrack garbage collection pass", map[string]string{"pass": fmt.Sprint(p.Number)}); len(got) != 1 || got[0].level != slog.LevelDebug {
		t.Fatalf("a short pass that deleted little: logs %v, want one at debug", got)
	}

	ctgc.SetProgressEvery(e.gc, 0)
	p = e.run()
	walk := fmt.Sprintf("pass %d", p.Number)
	progress := logs.find("Conntrack garbage collection in progress", map[string]string{"walk": walk, "map": "cellium_ct4_tcp"})
	// 200 entries in chunks of at most 64 (a chunk ends early rather than
	// split a hash bucket): 4 chunks or more, a line after each, counting
	// up to 200.
	var scanned []int
	for _, r := range progress {
		n, err := strconv.Atoi(r.attrs["scanned"])
		if err != nil || r.level != slog.LevelInfo {
			t.Fatalf("progress line %v: want an info line with the entries scanned", r)
		}
		scanned = append(scanned, n)
	}
	ok := len(scanned) >= 4 && scanned[len(scanned)-1] == 200
	for i, n := range scanned {
		prev := 0
		if i > 0 {
			prev = scanned[i-1]
		}
		ok = ok && n > prev && n-prev <= 64
	}
	if !ok {
		t.Errorf("progress of %s in cellium_ct4_tcp: scanned %v, want a line per chunk of at most 64, up to 200; records %v", walk, scanned, progress)
	}
	if got := logs.find("Conntrack garbage collection pass", map[string]string{"pass": fmt.Sprint(p.Number)}); len(got) != 1 || got[0].level != slog.LevelInfo {
		t.Errorf("end of a long pass: logs %v, want one at info", got)
	}
}

// logRecorder keeps what a logger logs, with the logger's attributes, and
// passes it on.
type logRecorder struct {
	mu      sync.Mutex
	records []logRecord
}

type logRecord struct {
	level slog.Level
	msg   string
	attrs map[string]string
}

func (l *logRecorder) wrap(h slog.Handler) slog.Handler { return &recordingHandler{Handler: h, rec: l} }

// find returns the records of msg that have the attributes of want.
func (l *logRecorder) find(msg string, want map[string]string) []logRecord {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []logRecord
next:
	for _, r := range l.records {
		if r.msg != msg {
			continue
		}
		for k, v := range want {
			if r.attrs[k] != v {
				continue next
			}
		}
		out = append(out, r)
	}
	return out
}

type recordingHandler struct {
	slog.Handler
	rec   *logRecorder
	attrs []slog.Attr
}

func (h *recordingHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h *recordingHandler) Handle(ctx context.Context, r slog.Record) error {
	lr := logRecord{level: r.Level, msg: r.Message, attrs: map[string]string{}}
	for _, a := range h.attrs {
		lr.attrs[a.Key] = a.Value.String()
	}
	r.Attrs(func(a slog.Attr) bool {
		lr.attrs[a.Key] = a.Value.String()
		return true
	})
	h.rec.mu.Lock()
	h.rec.records = append(h.rec.records, lr)
	h.rec.mu.Unlock()
	if !h.Handler.Enabled(ctx, r.Level) {
		return nil
	}
	return h.Handler.Handle(ctx, r)
}

func (h *recordingHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return &recordingHandler{Handler: h.Handler.WithAttrs(as), rec: h.rec, attrs: append(slices.Clip(h.attrs), as...)}
}

func (h *recordingHandler) WithGroup(name string) slog.Handler {
	return &recordingHandler{Handler: h.Handler.WithGroup(name), rec: h.rec, attrs: h.attrs}
}
