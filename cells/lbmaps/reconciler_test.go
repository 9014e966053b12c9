package lbmaps_test

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/cellium/cellium/cells/bpfmaps"
	"github.com/cellium/cellium/cells/bpfmaps/bpfmapstest"
	"github.com/cellium/cellium/cells/health"
	"github.com/cellium/cellium/cells/internal/celltest"
	"github.com/cellium/cellium/cells/internal/drift/drifttest"
	"github.com/cellium/cellium/cells/lbmaps"
	"github.com/cellium/cellium/cells/loadbalancer"
	"github.com/cellium/cellium/pkg/lbmap"
	"github.com/cellium/cellium/pkg/polltest"
)

// frontendsTable stands in for the loadbalancer cell: the tests write the
// frontends themselves.
var frontendsTable = frontendsTableHeldBy("")

// handFilled is the frontends table of tests that fill the maps by hand: it
// never counts as initialized, so the reconciler never prunes their entries.
var handFilled = frontendsTableHeldBy("maps-filled-by-hand")

// frontendsTableHeldBy provides the frontends table, holding an initializer
// named hold that nobody completes, if hold is not empty.
func frontendsTableHeldBy(hold string) cell.Cell {
	return cell.Provide(func(db *statedb.DB) (statedb.RWTable[*loadbalancer.Frontend], error) {
		tbl, err := loadbalancer.NewFrontendsTable(db)
		if err != nil || hold == "" {
			return tbl, err
		}
		txn := db.WriteTxn(tbl)
		tbl.RegisterInitializer(txn, hold)
		txn.Commit()
		return tbl, nil
	})
}

// lbEnv is one run of the lb-maps cell over a bpffs: a restart is a new
// lbEnv over the same root.
type lbEnv struct {
	t         *testing.T
	h         *hive.Hive
	db        *statedb.DB
	frontends statedb.RWTable[*loadbalancer.Frontend]
	maps      *lbmaps.Maps
	registry  *prometheus.Registry
	rec       lbmaps.Reconciler
	health    statedb.Table[*health.Status]
	held      loadbalancer.Programmed
	stop      func()
	// sync is an initializer of the frontends table that the test holds,
	// as the loadbalancer cell does until Kubernetes has synced.
	sync func(statedb.WriteTxn)
}

func newLBEnv(t *testing.T, root string, cfg func(*lbmaps.Config)) *lbEnv {
	e := &lbEnv{t: t, registry: prometheus.NewRegistry()}
	h := celltest.New(bpfmaps.Cell, lbmaps.Cell, frontendsTable,
		cell.Invoke(func(db *statedb.DB, fe statedb.RWTable[*loadbalancer.Frontend], m *lbmaps.Maps, r lbmaps.Reconciler, hs statedb.Table[*health.Status], held loadbalancer.Programmed) {
			e.db, e.frontends, e.maps, e.rec, e.health, e.held = db, fe, m, r, hs, held
			txn := db.WriteTxn(fe)
			e.sync = fe.RegisterInitializer(txn, "test-sync")
			txn.Commit()
		}),
		cell.Invoke(func(c struct {
			cell.In
			Collectors []prometheus.Collector `group:"metrics"`
		}) {
			e.registry.MustRegister(c.Collectors...)
		}),
	)
	hive.AddConfigOverride(h, func(c *bpfmaps.Config) { c.BPFRoot = root })
	hive.AddConfigOverride(h, func(c *lbmaps.Config) {
		small(c)
		if cfg != nil {
			cfg(c)
		}
	})
	e.h = h
	e.stop = start(t, h)
	return e
}

// set makes the frontends table hold exactly fes (pending), and marks the
// table synced if synced.
func (e *lbEnv) set(synced bool, fes ...*loadbalancer.Frontend) {
	txn := e.db.WriteTxn(e.frontends)
	want := map[loadbalancer.L3n4Addr]bool{}
	for _, fe := range fes {
		fe = fe.Clone()
		fe.SetStatus(reconciler.StatusPending())
		e.frontends.Insert(txn, fe)
		want[fe.Address] = true
	}
	for fe := range e.frontends.All(txn) {
		if !want[fe.Address] {
			e.frontends.Delete(txn, fe)
		}
	}
	if synced && e.sync != nil {
		e.sync(txn)
		e.sync = nil
	}
	txn.Commit()
}

// waitDone waits until the reconciler has processed every change to the
// table, deletions included, and every frontend is Done, and returns them.
func (e *lbEnv) waitDone() []*loadbalancer.Frontend {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rev := e.frontends.Revision(e.db.ReadTxn())
	if _, _, err := e.rec.WaitUntilReconciled(ctx, rev); err != nil {
		e.t.Fatalf("frontends not reconciled up to revision %d in 30s: %v", rev, err)
	}
	for {
		all, watch := e.frontends.AllWatch(e.db.ReadTxn())
		var fes []*loadbalancer.Frontend
		done := true
		for fe := range all {
			fes = append(fes, fe)
			if fe.Status.Kind() != reconciler.StatusKindDone {
				done = false
			}
		}
		if done {
			return fes
		}
		select {
		case <-watch:
		case <-ctx.Done():
			e.t.Fatalf("frontends not reconciled in 30s: %v", fes)
		}
	}
}

// writes is the number of entries written to all maps so far.
func (e *lbEnv) writes() float64 { return e.counter("cellium_lbmaps_writes_total") }

func (e *lbEnv) deletes() float64 { return e.counter("cellium_lbmaps_deletes_total") }

func (e *lbEnv) counter(name string) float64 {
	families, err := e.registry.Gather()
	if err != nil {
		e.t.Fatal(err)
	}
	var sum float64
	for _, f := range families {
		if f.GetName() == name {
			for _, m := range f.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}

// dump renders every load-balancing map, sorted, for comparisons.
func (e *lbEnv) dump() []string {
	e.t.Helper()
	var out []string
	add := func(name string, k, v fmt.Stringer) { out = append(out, name+" "+k.String()+" => "+v.String()) }
	must := func(err error) {
		if err != nil {
			e.t.Fatal(err)
		}
	}
	must(e.maps.Services4.Iterate(func(k lbmap.Service4Key, v lbmap.ServiceValue) bool { add("svc4", k, v); return true }))
	must(e.maps.Services6.Iterate(func(k lbmap.Service6Key, v lbmap.ServiceValue) bool { add("svc6", k, v); return true }))
	must(e.maps.Backends4.Iterate(func(k lbmap.BackendID, v lbmap.Backend4) bool { add("be4", stringer(k), v); return true }))
	must(e.maps.Backends6.Iterate(func(k lbmap.BackendID, v lbmap.Backend6) bool { add("be6", stringer(k), v); return true }))
	must(e.maps.RevNAT4.Iterate(func(k lbmap.RevNATIndex, v lbmap.RevNAT4) bool { add("rev4", stringer(k), v); return true }))
	must(e.maps.RevNAT6.Iterate(func(k lbmap.RevNATIndex, v lbmap.RevNAT6) bool { add("rev6", stringer(k), v); return true }))
	must(e.maps.Maglev4.Iterate(func(k lbmap.RevNATIndex) bool {
		table, err := e.maps.Maglev4.Lookup(k)
		must(err)
		out = append(out, fmt.Sprintf("maglev4 %d => %d slots, backends %v", k, len(table), distinct(table)))
		return true
	}))
	slices.Sort(out)
	return out
}

type stringer uint32

func (s stringer) String() string { return fmt.Sprint(uint32(s)) }

func distinct(table []lbmap.BackendID) []lbmap.BackendID {
	set := map[lbmap.BackendID]bool{}
	for _, id := range table {
		set[id] = true
	}
	return slices.Sorted(maps.Keys(set))
}

func addr(s string) loadbalancer.L3n4Addr {
	a, err := loadbalancer.ParseL3n4Addr(s)
	if err != nil {
		panic(err)
	}
	return a
}

func frontend(fe string, backends ...string) *loadbalancer.Frontend {
	f := &loadbalancer.Frontend{
		Address:     addr(fe),
		Type:        loadbalancer.FrontendClusterIP,
		ServiceName: loadbalancer.ServiceName{Namespace: "default", Name: "svc"},
	}
	for _, be := range backends {
		f.Backends = append(f.Backends, addr(be))
	}
	return f
}

// service is the entries of one service map for addr:port, by slot.
func (e *lbEnv) service4(a string) map[uint16]lbmap.ServiceValue {
	e.t.Helper()
	fe := addr(a)
	out := map[uint16]lbmap.ServiceValue{}
	err := e.maps.Services4.Iterate(func(k lbmap.Service4Key, v lbmap.ServiceValue) bool {
		if k.AddrPort() == netip.AddrPortFrom(fe.Addr, fe.Port) {
			out[k.BackendSlot] = v
		}
		return true
	})
	if err != nil {
		e.t.Fatal(err)
	}
	return out
}

func (e *lbEnv) backend4(id lbmap.BackendID) string {
	e.t.Helper()
	b, err := e.maps.Backends4.Lookup(id)
	if err != nil {
		e.t.Fatalf("backend %d: %v", id, err)
	}
	return b.AddrPort().String()
}

func TestFrontendReachesTheMaps(t *testing.T) {
	e := newLBEnv(t, bpfmapstest.Root(t), nil)
	e.set(true, frontend("10.96.0.10:80/TCP", "10.244.0.1:8080/TCP", "10.244.0.2:8080/TCP"))
	e.waitDone()

	svc := e.service4("10.96.0.10:80/TCP")
	master := svc[0]
	if len(svc) != 3 || master.Count != 2 || master.RevNATIndex == 0 {
		t.Fatalf("service entries = %v, want a master counting 2 slots and 2 slots", svc)
	}
	var got []string
	for _, n := range []uint16{1, 2} {
		if svc[n].RevNATIndex != master.RevNATIndex {
			t.Errorf("slot %d has reverse NAT %d, want the master's %d", n, svc[n].RevNATIndex, master.RevNATIndex)
		}
		got = append(got, e.backend4(svc[n].BackendID))
	}
	if want := []string{"10.244.0.1:8080", "10.244.0.2:8080"}; !slices.Equal(got, want) {
		t.Errorf("slots point at %v, want %v in order", got, want)
	}
	rev, err := e.maps.RevNAT4.Lookup(master.RevNATIndex)
	if err != nil || rev.AddrPort().String() != "10.96.0.10:80" {
		t.Errorf("reverse NAT %d = %v %v, want 10.96.0.10:80", master.RevNATIndex, rev, err)
	}
}

func TestShrinkGrowShareDelete(t *testing.T) {
	e := newLBEnv(t, bpfmapstest.Root(t), nil)
	a, b := "10.96.0.10:80/TCP", "10.96.0.11:53/UDP"
	shared := "10.244.0.1:53/UDP"

	e.set(true, frontend(a, "10.244.0.1:8080/TCP", "10.244.0.2:8080/TCP", "10.244.0.3:8080/TCP"))
	e.waitDone()
	// Shrink: the master counts 1 and slots 2 and 3 are gone, with the
	// backends only they used.
	e.set(true, frontend(a, "10.244.0.2:8080/TCP"))
	e.waitDone()
	if svc := e.service4(a); len(svc) != 2 || svc[0].Count != 1 || e.backend4(svc[1].BackendID) != "10.244.0.2:8080" {
		t.Fatalf("after shrinking: %v", e.dump())
	}
	if n := len(e.dumpPrefix("be4")); n != 1 {
		t.Fatalf("backends after shrinking = %d, want 1:\n%v", n, e.dump())
	}

	// Two frontends share a backend; deleting one keeps it for the other.
	e.set(true, frontend(a, "10.244.0.2:8080/TCP"), frontend(b, shared), frontend("10.96.0.12:53/UDP", shared))
	e.waitDone()
	e.set(true, frontend(a, "10.244.0.2:8080/TCP"), frontend(b, shared))
	e.waitDone()
	if svc := e.service4(b); svc[0].Count != 1 || e.backend4(svc[1].BackendID) != "10.244.0.1:53" {
		t.Fatalf("shared backend lost with the other frontend: %v", e.dump())
	}
	if svc := e.service4("10.96.0.12:53/UDP"); len(svc) != 0 {
		t.Fatalf("deleted frontend left %v", svc)
	}

	// A frontend with no backends keeps a master that counts none: the
	// datapath refuses connections.
	e.set(true, frontend(a), frontend(b, shared))
	e.waitDone()
	if svc := e.service4(a); len(svc) != 1 || svc[0].Count != 0 {
		t.Fatalf("frontend without backends: %v, want only a master counting 0", svc)
	}

	// Everything deleted: nothing is left in any map.
	e.set(true)
	e.waitDone()
	if d := e.dump(); len(d) != 0 {
		t.Fatalf("maps after deleting every frontend:\n%v", d)
	}
}

func (e *lbEnv) dumpPrefix(prefix string) []string {
	var out []string
	for _, l := range e.dump() {
		if len(l) > len(prefix) && l[:len(prefix)+1] == prefix+" " {
			out = append(out, l)
		}
	}
	return out
}

// TestRestartRewritesNothing is the restart contract: the same frontends
// after a restart reuse every ID and write no entry.
func TestRestartRewritesNothing(t *testing.T) {
	root := bpfmapstest.Root(t)
	fes := []*loadbalancer.Frontend{
		frontend("10.96.0.10:80/TCP", "10.244.0.1:8080/TCP", "10.244.0.2:8080/TCP"),
		frontend("10.96.0.11:53/UDP", "10.244.0.1:53/UDP"),
		frontend("[fd00::10]:80/TCP", "[fd00:244::1]:8080/TCP"),
		frontend("10.96.0.12:443/TCP"),
	}
	affinity := frontend("10.96.0.13:80/TCP", "10.244.0.3:80/TCP")
	affinity.SessionAffinity, affinity.AffinityTimeout = true, 3*time.Hour
	fes = append(fes, affinity)

	first := newLBEnv(t, root, nil)
	first.set(true, fes...)
	first.waitDone()
	before := first.dump()
	first.stop()

	second := newLBEnv(t, root, nil)
	second.set(true, fes...)
	second.waitDone()
	if w, d := second.writes(), second.deletes(); w != 0 || d != 0 {
		t.Fatalf("restart with the same frontends wrote %v and deleted %v entries, want none", w, d)
	}
	if after := second.dump(); !slices.Equal(before, after) {
		t.Fatalf("maps changed across the restart:\nbefore %v\nafter  %v", before, after)
	}
}

// TestRestartConverges: frontends changed while the agent was down converge,
// and stale ones go only once the table is synced.
func TestRestartConverges(t *testing.T) {
	root := bpfmapstest.Root(t)
	keep := frontend("10.96.0.10:80/TCP", "10.244.0.1:8080/TCP")
	changed := frontend("10.96.0.11:80/TCP", "10.244.0.2:8080/TCP")
	gone := frontend("10.96.0.12:80/TCP", "10.244.0.3:8080/TCP")

	first := newLBEnv(t, root, nil)
	first.set(true, keep, changed, gone)
	first.waitDone()
	keepID := first.service4("10.96.0.10:80/TCP")[0].RevNATIndex
	first.stop()

	second := newLBEnv(t, root, nil)
	changed2 := frontend("10.96.0.11:80/TCP", "10.244.0.2:8080/TCP", "10.244.0.4:8080/TCP")
	second.set(false, keep, changed2)
	second.waitDone()
	if svc := second.service4("10.96.0.12:80/TCP"); len(svc) != 2 {
		t.Fatalf("stale frontend pruned before the table synced: %v", svc)
	}
	if svc := second.service4("10.96.0.11:80/TCP"); svc[0].Count != 2 {
		t.Fatalf("changed frontend not updated: %v", svc)
	}
	if id := second.service4("10.96.0.10:80/TCP")[0].RevNATIndex; id != keepID {
		t.Fatalf("unchanged frontend's ID %d became %d", keepID, id)
	}
	// Backend entry, slot 2 and the master: 3 writes for the change.
	if w := second.writes(); w != 3 {
		t.Fatalf("writes = %v, want 3 (new backend, new slot, master)", w)
	}

	second.set(true, keep, changed2)
	second.waitPruned(t, "10.96.0.12:80/TCP")
	if n := len(second.dumpPrefix("be4")); n != 3 {
		t.Fatalf("backends after prune = %d, want 3:\n%v", n, second.dump())
	}
}

// TestPruneNamesEveryFailure: when the kernel refuses to remove stale
// frontends, the health scope lb-maps.prune stays Degraded with an error
// that names each of them, not only some.
func TestPruneNamesEveryFailure(t *testing.T) {
	root := bpfmapstest.Root(t)
	stale := []string{"10.96.0.20:80/TCP", "10.96.0.21:80/TCP", "10.96.0.22:80/TCP", "10.96.0.23:80/UDP", "10.96.0.24:80/TCP"}
	var fes []*loadbalancer.Frontend
	for i, a := range stale {
		fes = append(fes, frontend(a, fmt.Sprintf("10.244.0.%d:8080/TCP", i+1)))
	}
	first := newLBEnv(t, root, nil)
	first.set(true, fes...)
	first.waitDone()
	first.stop()

	second := newLBEnv(t, root, nil)
	// A frozen map takes no writes or deletes from user space.
	if err := second.maps.Services4.EBPF().Freeze(); err != nil {
		t.Skipf("cannot freeze the service map: %v", err)
	}
	second.set(true)
	var report string
	celltest.Eventually(t, "lb-maps.prune Degraded", func() (bool, string) {
		s, _, found := second.health.Get(second.db.ReadTxn(), health.StatusID.Query("lb-maps.prune"))
		if found && s.Level == cell.StatusDegraded {
			report = s.Error
			return true, ""
		}
		return false, fmt.Sprintf("found %v: %+v", found, s)
	})
	for _, a := range stale {
		if !strings.Contains(report, "remove stale frontend "+a+": ") {
			t.Errorf("the prune's error does not name %s:\n%s", a, report)
		}
	}
	if svc := second.service4(stale[0]); len(svc) != 2 {
		t.Errorf("stale frontend %s: %v, want its entries kept (the kernel refused)", stale[0], svc)
	}
}

// waitPruned waits until the frontend's entries are gone.
func (e *lbEnv) waitPruned(t *testing.T, fe string) {
	t.Helper()
	// Prune runs once the table is initialized; the test has no event to
	// wait on, so it polls the map.
	polltest.Until(t, "stale frontend "+fe+" gone from the maps after sync", 30*time.Second, 10*time.Millisecond, func() (bool, string) {
		n := len(e.service4(fe))
		return n == 0, fmt.Sprintf("%d entries", n)
	})
}

func TestMaglevTables(t *testing.T) {
	root := bpfmapstest.Root(t)
	maglev := func(c *lbmaps.Config) { c.LBAlgorithm = lbmaps.AlgorithmMaglev }
	e := newLBEnv(t, root, maglev)
	e.set(true, frontend("10.96.0.10:80/TCP", "10.244.0.1:8080/TCP", "10.244.0.2:8080/TCP"))
	e.waitDone()
	master := e.service4("10.96.0.10:80/TCP")[0]
	if master.Flags&lbmap.ServiceMaglev == 0 {
		t.Fatalf("master flags %v lack maglev", master.Flags)
	}
	table, err := e.maps.Maglev4.Lookup(master.RevNATIndex)
	if err != nil {
		t.Fatal(err)
	}
	if got := distinct(table); len(got) != 2 || len(table) != 251 {
		t.Fatalf("maglev table has %d slots over %v, want 251 over both backends", len(table), got)
	}
	e.stop()

	again := newLBEnv(t, root, maglev)
	again.set(true, frontend("10.96.0.10:80/TCP", "10.244.0.1:8080/TCP", "10.244.0.2:8080/TCP"))
	again.waitDone()
	if w := again.writes(); w != 0 {
		t.Fatalf("restart rewrote %v entries, the Maglev table included", w)
	}
	again.set(true, frontend("10.96.0.10:80/TCP", "10.244.0.2:8080/TCP"))
	again.waitDone()
	table, err = again.maps.Maglev4.Lookup(master.RevNATIndex)
	if err != nil || len(distinct(table)) != 1 {
		t.Fatalf("maglev table after removing a backend: %v %v", distinct(table), err)
	}
}

func TestFlags(t *testing.T) {
	e := newLBEnv(t, bpfmapstest.Root(t), nil)
	np := frontend("0.0.0.0:30080/TCP", "10.244.0.1:8080/TCP")
	np.Type = loadbalancer.FrontendNodePort
	aff := frontend("10.96.0.10:80/TCP", "10.244.0.1:8080/TCP")
	aff.SessionAffinity, aff.AffinityTimeout = true, 10*time.Second
	sctp := frontend("10.96.0.11:9/SCTP", "10.244.0.1:9/SCTP")
	e.set(true, np, aff, sctp)
	fes := e.waitDone()
	if len(fes) != 3 {
		t.Fatalf("frontends = %d, want 3 (SCTP is Done without entries)", len(fes))
	}
	if m := e.service4("0.0.0.0:30080/TCP")[0]; m.Flags != lbmap.ServiceNodePortWildcard {
		t.Errorf("wildcard NodePort flags = %v", m.Flags)
	}
	if m := e.service4("10.96.0.10:80/TCP")[0]; m.Flags != lbmap.ServiceAffinity || m.AffinityTimeout() != 10*time.Second {
		t.Errorf("affinity master = %v", m)
	}
	if svc := e.service4("10.96.0.11:9/SCTP"); len(svc) != 0 {
		t.Errorf("SCTP frontend written: %v", svc)
	}
}

// TestRestoreDropsLeftovers: entries that belong to no frontend (a crash
// between writes, another version's leftovers) are removed by the first
// prune after sync, and IDs they hold are not handed out twice.
func TestRestoreDropsLeftovers(t *testing.T) {
	root := bpfmapstest.Root(t)
	first := newLBEnv(t, root, nil)
	first.set(true)
	first.waitDone()
	// With no frontend, waitDone does not wait for the restore: the
	// leftovers are written once the first agent has read the maps and
	// pruned, or it would restore and prune them itself.
	first.waitPruneOK(t)
	m := first.maps
	orphanSlot := lbmap.NewService4Key(netip.MustParseAddr("10.96.0.99"), 80, lbmap.TCP, 1)
	if err := m.Services4.Put(orphanSlot, lbmap.NewServiceSlot(7, 7)); err != nil {
		t.Fatal(err)
	}
	if err := m.RevNAT4.Put(9, lbmap.NewRevNAT4(netip.MustParseAddr("10.96.0.98"), 80)); err != nil {
		t.Fatal(err)
	}
	if err := m.Backends4.Put(5, lbmap.NewBackend4(netip.MustParseAddr("10.244.9.9"), 80, lbmap.TCP)); err != nil {
		t.Fatal(err)
	}
	first.stop()

	second := newLBEnv(t, root, nil)
	second.set(true, frontend("10.96.0.10:80/TCP", "10.244.0.1:8080/TCP"))
	second.waitDone()
	second.waitPruned(t, "10.96.0.99:80/TCP")
	polltest.Until(t, "leftovers pruned", 30*time.Second, 10*time.Millisecond, func() (bool, string) {
		d := second.dump()
		return len(d) == 4, fmt.Sprintf("%v", d) // the frontend's master, slot, backend and reverse NAT
	})
	if id := second.service4("10.96.0.10:80/TCP")[1].BackendID; id == 5 {
		t.Fatalf("new backend got ID 5, which a leftover entry held at restore")
	}
	// The prune counts what it removed before it reports OK.
	second.waitPruneOK(t)
	if n := drifttest.Repairs(t, second.registry, "lb-maps", "lb-revnat"); n != 1 {
		t.Errorf("leftover reverse NAT entries counted as repairs: %v, want 1", n)
	}
}

// TestHoldsWhatTheMapsHold: after a restart, Holds says true of exactly
// the frontends whose reconciliation would write nothing, and the
// loadbalancer writer's use of it (each frontend in Done when held,
// Pending when not) leaves the maps as the agent wrote them, entries
// changed behind its back while it was down repaired.
func TestHoldsWhatTheMapsHold(t *testing.T) {
	root := bpfmapstest.Root(t)
	two := frontend("10.96.0.10:80/TCP", "10.244.0.1:8080/TCP", "10.244.0.2:8080/TCP")
	none := frontend("10.96.0.11:443/TCP")
	six := frontend("[fd00::10]:80/TCP", "[fd00:244::1]:8080/TCP")
	affinity := frontend("10.96.0.12:80/TCP", "10.244.0.3:80/TCP")
	affinity.SessionAffinity, affinity.AffinityTimeout = true, 3*time.Hour
	wildcard := frontend("0.0.0.0:30080/TCP", "10.244.0.1:8080/TCP")
	wildcard.Type = loadbalancer.FrontendNodePort
	sctp := frontend("10.96.0.13:9/SCTP", "10.244.0.1:9/SCTP")
	// Changed in the maps while the agent is down: a slot points at
	// another backend, and a backend entry holds another address.
	slotChanged := frontend("10.96.0.20:80/TCP", "10.244.0.5:8080/TCP")
	backendChanged := frontend("10.96.0.21:80/TCP", "10.244.0.6:8080/TCP")
	fes := []*loadbalancer.Frontend{two, none, six, affinity, wildcard, sctp, slotChanged, backendChanged}

	first := newLBEnv(t, root, nil)
	if first.held.Holds(two) {
		t.Fatal("Holds says true of a frontend never written")
	}
	first.set(true, fes...)
	first.waitDone()
	before := first.dump()
	slot := first.service4("10.96.0.20:80/TCP")[1]
	other := first.service4("10.96.0.10:80/TCP")[1].BackendID
	if err := first.maps.Services4.Put(lbmap.NewService4Key(netip.MustParseAddr("10.96.0.20"), 80, lbmap.TCP, 1),
		lbmap.NewServiceSlot(other, slot.RevNATIndex)); err != nil {
		t.Fatal(err)
	}
	beID := first.service4("10.96.0.21:80/TCP")[1].BackendID
	if err := first.maps.Backends4.Put(beID, lbmap.NewBackend4(netip.MustParseAddr("10.244.9.9"), 8080, lbmap.TCP)); err != nil {
		t.Fatal(err)
	}
	first.stop()

	second := newLBEnv(t, root, nil)
	// Holds never waits: it says false until the maps are restored.
	polltest.Until(t, "restore", 30*time.Second, time.Millisecond, func() (bool, string) {
		return second.held.Holds(two), "Holds says false of an unchanged frontend"
	})
	for _, fe := range []*loadbalancer.Frontend{two, none, six, affinity, wildcard, sctp} {
		if !second.held.Holds(fe) {
			t.Errorf("Holds(%s) = false for a frontend the maps hold as it is", fe.Address)
		}
	}
	// Nor while a reconciliation round has the state: it says false at
	// once, and the frontend goes the reconciler's way.
	lbmaps.WhileReconciling(second.held, func() {
		if second.held.Holds(two) {
			t.Error("Holds says true while a reconciliation round holds the state")
		}
	})
	variant := func(fe *loadbalancer.Frontend, change func(*loadbalancer.Frontend)) *loadbalancer.Frontend {
		fe = fe.Clone()
		fe.Backends = slices.Clone(fe.Backends)
		change(fe)
		return fe
	}
	for what, fe := range map[string]*loadbalancer.Frontend{
		"a slot changed in the maps":         slotChanged,
		"a backend changed in the maps":      backendChanged,
		"never written":                      frontend("10.96.0.30:80/TCP"),
		"one more backend":                   variant(two, func(fe *loadbalancer.Frontend) { fe.Backends = append(fe.Backends, addr("10.244.0.3:80/TCP")) }),
		"one backend fewer":                  variant(two, func(fe *loadbalancer.Frontend) { fe.Backends = fe.Backends[:1] }),
		"backends in another order":          variant(two, func(fe *loadbalancer.Frontend) { slices.Reverse(fe.Backends) }),
		"a backend not in the maps":          variant(two, func(fe *loadbalancer.Frontend) { fe.Backends[1] = addr("10.244.0.99:8080/TCP") }),
		"a backend of the other family":      variant(two, func(fe *loadbalancer.Frontend) { fe.Backends[1] = addr("[fd00:244::1]:8080/TCP") }),
		"a backend where there was none":     variant(none, func(fe *loadbalancer.Frontend) { fe.Backends = []loadbalancer.L3n4Addr{addr("10.244.0.1:8080/TCP")} }),
		"another affinity timeout":           variant(affinity, func(fe *loadbalancer.Frontend) { fe.AffinityTimeout = time.Hour }),
		"no affinity":                        variant(affinity, func(fe *loadbalancer.Frontend) { fe.SessionAffinity = false }),
		"local traffic policy":               variant(two, func(fe *loadbalancer.Frontend) { fe.TrafficPolicyLocal = true }),
		"a NodePort at a node address now":   variant(wildcard, func(fe *loadbalancer.Frontend) { fe.Address = addr("192.0.2.1:30080/TCP") }),
		"a ClusterIP where the wildcard was": variant(wildcard, func(fe *loadbalancer.Frontend) { fe.Type = loadbalancer.FrontendClusterIP }),
	} {
		if second.held.Holds(fe) {
			t.Errorf("Holds(%s) = true for %s", fe.Address, what)
		}
	}

	// As the loadbalancer writer inserts them on a start.
	txn := second.db.WriteTxn(second.frontends)
	for _, fe := range fes {
		fe = fe.Clone()
		if second.held.Holds(fe) {
			fe.SetStatus(reconciler.StatusDone())
		} else {
			fe.SetStatus(reconciler.StatusPending())
		}
		second.frontends.Insert(txn, fe)
	}
	second.sync(txn)
	second.sync = nil
	txn.Commit()
	second.waitDone()
	// The changed slot written back; the backend entry that now holds
	// another address is not 10.244.0.6's any more, which gets a new one,
	// and the slot pointing at it.
	if w := second.writes(); w != 3 {
		t.Errorf("restart wrote %v entries, want 3 (a slot; a backend and its slot):\n%v", w, second.dump())
	}
	for fe, be := range map[string]string{"10.96.0.20:80/TCP": "10.244.0.5:8080", "10.96.0.21:80/TCP": "10.244.0.6:8080"} {
		if svc := second.service4(fe); len(svc) != 2 || svc[0].Count != 1 || second.backend4(svc[1].BackendID) != be {
			t.Errorf("%s after the restart: %v, want its one slot at %s", fe, svc, be)
		}
	}
	after := second.dump()
	for _, line := range before {
		if !strings.Contains(line, "10.96.0.21:80") && !strings.Contains(line, "10.244.0.6:8080") && !slices.Contains(after, line) {
			t.Errorf("entry %q changed across the restart:\n%v", line, after)
		}
	}
}

// TestRestoreLeavesTheOtherFamilyAlone: a reverse NAT entry of one family
// under the ID of a frontend of the other (IDs are one space for both) is
// a leftover: it goes at the first prune, and the frontend whose ID it
// has keeps its own entry, unwritten.
func TestRestoreLeavesTheOtherFamilyAlone(t *testing.T) {
	root := bpfmapstest.Root(t)
	fe := frontend("10.96.0.10:80/TCP", "10.244.0.1:8080/TCP")
	first := newLBEnv(t, root, nil)
	first.set(true, fe)
	first.waitDone()
	id := first.service4("10.96.0.10:80/TCP")[0].RevNATIndex
	if err := first.maps.RevNAT6.Put(id, lbmap.NewRevNAT6(netip.MustParseAddr("fd00::99"), 80)); err != nil {
		t.Fatal(err)
	}
	first.stop()

	second := newLBEnv(t, root, nil)
	second.set(true, fe)
	second.waitDone()
	polltest.Until(t, "the IPv6 leftover pruned", 30*time.Second, 10*time.Millisecond, func() (bool, string) {
		d := second.dumpPrefix("rev6")
		return len(d) == 0, fmt.Sprint(d)
	})
	if w := second.writes(); w != 0 {
		t.Errorf("restart wrote %v entries, want none: %v", w, second.dump())
	}
	if rev, err := second.maps.RevNAT4.Lookup(id); err != nil || rev.AddrPort().String() != "10.96.0.10:80" {
		t.Errorf("reverse NAT %d = %v %v, want 10.96.0.10:80", id, rev, err)
	}
}

// TestLeftoverIDsNotHandedOut: a reverse NAT and a Maglev entry left at an
// ID below the highest restored one (a crash between a delete's master
// write and its reverse NAT write) keep that ID from a frontend created
// before the first prune, so the prune deletes only the leftovers and the
// new frontend's own entries stay.
func TestLeftoverIDsNotHandedOut(t *testing.T) {
	root := bpfmapstest.Root(t)
	maglev := func(c *lbmaps.Config) { c.LBAlgorithm = lbmaps.AlgorithmMaglev }
	a := frontend("10.96.0.10:80/TCP", "10.244.0.1:8080/TCP")
	gone := frontend("10.96.0.11:80/TCP", "10.244.0.2:8080/TCP")
	c := frontend("10.96.0.12:80/TCP", "10.244.0.3:8080/TCP")
	first := newLBEnv(t, root, maglev)
	first.set(true, a, gone, c)
	first.waitDone()
	goneID := first.service4("10.96.0.11:80/TCP")[0].RevNATIndex
	if cID := first.service4("10.96.0.12:80/TCP")[0].RevNATIndex; cID <= goneID {
		t.Fatalf("frontend IDs %d, %d: the test needs the leftover's below a restored one", goneID, cID)
	}
	// The crash: the service entries deleted, the reverse NAT and Maglev
	// entries not yet.
	for slot := range first.service4("10.96.0.11:80/TCP") {
		if err := first.maps.Services4.Delete(lbmap.NewService4Key(netip.MustParseAddr("10.96.0.11"), 80, lbmap.TCP, slot)); err != nil {
			t.Fatal(err)
		}
	}
	first.stop()

	second := newLBEnv(t, root, maglev)
	created := frontend("10.96.0.20:80/TCP", "10.244.0.4:8080/TCP")
	second.set(false, a, c, created) // created while the agent was down; not synced: no prune yet
	second.waitDone()
	id := second.service4("10.96.0.20:80/TCP")[0].RevNATIndex
	if id == goneID {
		t.Errorf("new frontend got ID %d, which a leftover entry holds until the first prune", id)
	}
	second.set(true, a, c, created)
	second.waitPruneOK(t)
	if rev, err := second.maps.RevNAT4.Lookup(id); err != nil || rev.AddrPort().String() != "10.96.0.20:80" {
		t.Errorf("after the prune, reverse NAT %d = %v %v, want the new frontend's 10.96.0.20:80", id, rev, err)
	}
	if _, err := second.maps.Maglev4.Lookup(id); err != nil {
		t.Errorf("after the prune, the new frontend's Maglev table %d: %v", id, err)
	}
	for _, d := range second.dump() {
		if strings.HasPrefix(d, fmt.Sprintf("rev4 %d ", goneID)) || strings.HasPrefix(d, fmt.Sprintf("maglev4 %d ", goneID)) {
			t.Errorf("leftover not pruned: %s", d)
		}
	}
	for _, object := range []string{"lb-revnat", "lb-maglev"} {
		if n := drifttest.Repairs(t, second.registry, "lb-maps", object); n != 1 {
			t.Errorf("leftover %s entries counted as repairs: %v, want 1", object, n)
		}
	}
}

// waitPruneOK waits until a prune succeeded (health lb-maps.prune OK).
func (e *lbEnv) waitPruneOK(t *testing.T) {
	t.Helper()
	celltest.Eventually(t, "lb-maps.prune OK", func() (bool, string) {
		s, _, found := e.health.Get(e.db.ReadTxn(), health.StatusID.Query("lb-maps.prune"))
		return found && s.Level == cell.StatusOK, fmt.Sprintf("found %v: %+v", found, s)
	})
}
