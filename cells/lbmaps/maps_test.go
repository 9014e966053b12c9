package lbmaps_test

import (
	"context"
	"errors"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/hivetest"
	"golang.org/x/sys/unix"

	"github.com/cellium/cellium/bpf"
	"github.com/cellium/cellium/cells/bpfmaps"
	"github.com/cellium/cellium/cells/bpfmaps/bpfmapstest"
	"github.com/cellium/cellium/cells/ctmaps"
	"github.com/cellium/cellium/cells/internal/celltest"
	"github.com/cellium/cellium/cells/lbmaps"
	"github.com/cellium/cellium/pkg/lbmap"
)

// newHive is the bpf-maps and lb-maps cells on the bpffs at root, with cfg
// applied to the lb-maps flags; maps receives the Maps.
func newHive(root string, cfg func(*lbmaps.Config), maps **lbmaps.Maps, extra ...cell.Cell) *hive.Hive {
	h := celltest.New(append([]cell.Cell{bpfmaps.Cell, lbmaps.Cell, handFilled, cell.Invoke(func(m *lbmaps.Maps) { *maps = m })}, extra...)...)
	hive.AddConfigOverride(h, func(c *bpfmaps.Config) { c.BPFRoot = root })
	if cfg != nil {
		hive.AddConfigOverride(h, cfg)
	}
	return h
}

func start(t *testing.T, h *hive.Hive) (stop func()) {
	t.Helper()
	log := hivetest.Logger(t)
	if err := h.Start(log, context.Background()); err != nil {
		t.Fatalf("start hive: %v", err)
	}
	stopped := false
	stop = func() {
		if !stopped {
			stopped = true
			if err := h.Stop(log, context.Background()); err != nil {
				t.Errorf("stop hive: %v", err)
			}
		}
	}
	t.Cleanup(stop)
	return stop
}

// small keeps the test's maps small; the defaults preallocate tens of MB.
func small(c *lbmaps.Config) {
	c.LBServiceMapMax, c.LBBackendMapMax, c.LBRevnatMapMax = 64, 32, 16
	c.LBAffinityMapMax, c.LBSockRevnatMapMax, c.LBMaglevTableSize = 16, 128, 251
}

// TestMapsMatchProgram compares each declared map with the program's C
// declaration of the same name: the loader hands these maps to the
// programs, and the kernel's layout of each must be what the C code uses.
// Sizes come from the flags, so max entries are compared with the flags.
func TestMapsMatchProgram(t *testing.T) {
	var (
		maps   *lbmaps.Maps
		events *ctmaps.Events
	)
	// The programs also report to the event ring buffer, which ct-maps
	// declares.
	h := newHive(bpfmapstest.Root(t), small, &maps, ctmaps.Cell, cell.Invoke(func(e *ctmaps.Events) { events = e }))
	start(t, h)
	spec, err := bpf.LoadSockLB()
	if err != nil {
		t.Fatal(err)
	}
	declared := maps.EBPF()
	for name, m := range events.EBPF() {
		declared[name] = m
	}
	if len(declared) != len(spec.Maps)-1 { // less .rodata
		t.Errorf("lb-maps and ct-maps declare %d maps, the program %d (with .rodata)", len(declared), len(spec.Maps))
	}
	for name, want := range spec.Maps {
		if name == ".rodata" {
			continue
		}
		m := declared[name]
		if m == nil {
			t.Errorf("the program's map %s is not declared", name)
			continue
		}
		want = want.Copy()
		want.MaxEntries = m.MaxEntries()
		if err := want.Compatible(m); err != nil {
			t.Errorf("map %s: %v", name, err)
		}
	}

	wantMax := map[string]uint32{
		bpf.SockLBMapCelliumLb4Services:   64,
		bpf.SockLBMapCelliumLb6Services:   64,
		bpf.SockLBMapCelliumLb4Backends:   32,
		bpf.SockLBMapCelliumLb6Backends:   32,
		bpf.SockLBMapCelliumLb4Revnat:     16,
		bpf.SockLBMapCelliumLb6Revnat:     16,
		bpf.SockLBMapCelliumLb4Maglev:     16,
		bpf.SockLBMapCelliumLb6Maglev:     16,
		bpf.SockLBMapCelliumLbAffinity:    16,
		bpf.SockLBMapCelliumLb4SockRevnat: 128,
		bpf.SockLBMapCelliumLb6SockRevnat: 128,
	}
	for name, want := range wantMax {
		if got := declared[name].MaxEntries(); got != want {
			t.Errorf("map %s has %d entries, want %d from its flag", name, got, want)
		}
	}

	// The inner arrays are what the C template says, with tables of
	// --lb-maglev-table-size slots.
	for _, name := range []string{bpf.SockLBMapCelliumLb4Maglev, bpf.SockLBMapCelliumLb6Maglev} {
		tmpl := spec.Maps[name].InnerMap
		inner := maps.Maglev4
		if name == bpf.SockLBMapCelliumLb6Maglev {
			inner = maps.Maglev6
		}
		if inner.TableSize() != 251 {
			t.Errorf("%s: table size %d, want 251", name, inner.TableSize())
		}
		if err := inner.Put(1, make([]lbmap.BackendID, 251)); err != nil {
			t.Fatal(err)
		}
		id := innerID(t, declared[name], 1)
		m, err := ebpf.NewMapFromID(id)
		if err != nil {
			t.Fatal(err)
		}
		if m.Type() != tmpl.Type || m.KeySize() != tmpl.KeySize || m.MaxEntries() != tmpl.MaxEntries || m.ValueSize() != 4*251 {
			t.Errorf("%s: inner map %s key %d value %d entries %d; want the template's %s key %d, entries %d, value 4*251",
				name, m.Type(), m.KeySize(), m.ValueSize(), m.MaxEntries(), tmpl.Type, tmpl.KeySize, tmpl.MaxEntries)
		}
		m.Close()
	}
}

func innerID(t *testing.T, outer *ebpf.Map, key lbmap.RevNATIndex) ebpf.MapID {
	t.Helper()
	var id uint32
	if err := outer.Lookup(key, &id); err != nil {
		t.Fatal(err)
	}
	return ebpf.MapID(id)
}

func TestMaglevMap(t *testing.T) {
	root := bpfmapstest.Root(t)
	var maps *lbmaps.Maps
	stop := start(t, newHive(root, small, &maps))

	table := make([]lbmap.BackendID, 251)
	for i := range table {
		table[i] = lbmap.BackendID(i%3 + 1)
	}
	if err := maps.Maglev4.Put(7, table); err != nil {
		t.Fatal(err)
	}
	if err := maps.Maglev6.Put(8, table); err != nil {
		t.Fatal(err)
	}
	got, err := maps.Maglev4.Lookup(7)
	if err != nil || !slices.Equal(got, table) {
		t.Fatalf("table 7 = %v, %v; want what was put", got, err)
	}
	if err := maps.Maglev4.Put(9, table[:250]); err == nil || !strings.Contains(err.Error(), "table of 250 slots for frontend 9, want 251 (--lb-maglev-table-size)") {
		t.Fatalf("put of a short table: %v", err)
	}
	var frontends []lbmap.RevNATIndex
	if err := maps.Maglev4.Iterate(func(r lbmap.RevNATIndex) bool { frontends = append(frontends, r); return true }); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(frontends, []lbmap.RevNATIndex{7}) {
		t.Fatalf("frontends with a table %v, want [7]", frontends)
	}
	if err := maps.Maglev4.Delete(7); err != nil {
		t.Fatal(err)
	}
	if _, err := maps.Maglev4.Lookup(7); !errors.Is(err, ebpf.ErrKeyNotExist) {
		t.Fatalf("lookup after delete: %v, want ErrKeyNotExist", err)
	}
	stop()

	// Another table size makes the old tables unusable: the map is
	// replaced, so whoever fills it sees an empty map and starts over.
	start(t, newHive(root, func(c *lbmaps.Config) { small(c); c.LBMaglevTableSize = 509 }, &maps))
	if maps.Maglev6.Origin() != bpfmaps.OriginRecreated {
		t.Fatalf("origin after a table size change %q, want %q", maps.Maglev6.Origin(), bpfmaps.OriginRecreated)
	}
	if _, err := maps.Maglev6.Lookup(8); !errors.Is(err, ebpf.ErrKeyNotExist) {
		t.Fatalf("old table after a table size change: %v, want none", err)
	}
	if err := maps.Maglev6.Put(8, make([]lbmap.BackendID, 509)); err != nil {
		t.Fatalf("put a table of the new size: %v", err)
	}
	// The other maps are reused.
	if maps.Services4.Origin() != bpfmaps.OriginReused {
		t.Fatalf("services map origin %q, want %q", maps.Services4.Origin(), bpfmaps.OriginReused)
	}
}

func TestMapsKeepEntriesAcrossRestart(t *testing.T) {
	root := bpfmapstest.Root(t)
	var maps *lbmaps.Maps
	stop := start(t, newHive(root, small, &maps))
	key := lbmap.NewService4Key(netip.MustParseAddr("10.96.0.10"), 80, lbmap.TCP, 0)
	master := lbmap.NewServiceMaster(1, 1, lbmap.ServiceMaglev, 0)
	if err := maps.Services4.Put(key, master); err != nil {
		t.Fatal(err)
	}
	stop()
	start(t, newHive(root, small, &maps))
	if got, err := maps.Services4.Lookup(key); err != nil || got != master {
		t.Fatalf("service after restart = %v, %v; want %v", got, err, master)
	}
}

func TestConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  func(*lbmaps.Config)
		want string
	}{
		{"no services", func(c *lbmaps.Config) { c.LBServiceMapMax = 0 }, "invalid --lb-service-map-max 0: want at least 1 entry"},
		{"no sockets", func(c *lbmaps.Config) { c.LBSockRevnatMapMax = 0 }, "invalid --lb-sock-revnat-map-max 0"},
		{"too many frontends", func(c *lbmaps.Config) { c.LBRevnatMapMax = 70000 }, "invalid --lb-revnat-map-max 70000: want at most 65536"},
		{"table size not prime", func(c *lbmaps.Config) { c.LBMaglevTableSize = 1000 }, "invalid --lb-maglev-table-size 1000: want one of 251, 509, "},
		{"algorithm", func(c *lbmaps.Config) { c.LBAlgorithm = "roundrobin" }, `invalid --lb-algorithm "roundrobin": want random or maglev`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var maps *lbmaps.Maps
			root := filepath.Join(t.TempDir(), "never-mounted")
			// Should the flag wrongly pass, the hive mounts a bpffs there.
			t.Cleanup(func() { unix.Unmount(root, unix.MNT_DETACH) })
			h := newHive(root, tc.cfg, &maps)
			log := hivetest.Logger(t)
			err := h.Start(log, context.Background())
			if err == nil {
				h.Stop(log, context.Background())
				t.Fatal("started; want a config error")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q does not contain %q", err, tc.want)
			}
		})
	}
}
