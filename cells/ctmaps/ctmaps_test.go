package ctmaps_test

import (
	"context"
	"errors"
	"maps"
	"net/netip"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/ringbuf"
	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/hivetest"
	"golang.org/x/sys/unix"

	"github.com/cellium/cellium/cells/bpfmaps"
	"github.com/cellium/cellium/cells/bpfmaps/bpfmapstest"
	"github.com/cellium/cellium/cells/ctmaps"
	"github.com/cellium/cellium/cells/internal/celltest"
	"github.com/cellium/cellium/pkg/ctmap"
)

// newHive is the ct-maps cell on a bpffs directory of the test's own, with
// the flags set as given.
func newHive(root string, flags map[string]any, maps **ctmaps.Maps, events **ctmaps.Events) *hive.Hive {
	h := celltest.New(bpfmaps.Cell, ctmaps.Cell,
		cell.Invoke(func(m *ctmaps.Maps, e *ctmaps.Events) { *maps, *events = m, e }))
	h.Viper().Set("bpf-root", root)
	for k, v := range flags {
		h.Viper().Set(k, v)
	}
	return h
}

// With the default flags the ring buffer is sized by the machine's CPU
// count: 512 KiB each, rounded up to a power of two, 1 MiB to 64 MiB.
func TestRingbufDefaultSize(t *testing.T) {
	var (
		maps   *ctmaps.Maps
		events *ctmaps.Events
	)
	h := newHive(bpfmapstest.Root(t), nil, &maps, &events)
	log := hivetest.Logger(t)
	if err := h.Start(log, context.Background()); err != nil {
		t.Fatal(err)
	}
	defer h.Stop(log, context.Background())
	want := uint32(1 << 20)
	for want < uint32(runtime.NumCPU())*512<<10 && want < 64<<20 {
		want *= 2
	}
	if got := events.Ring.EBPF().MaxEntries(); got != want {
		t.Errorf("ring buffer of %d bytes on %d CPUs, want %d", got, runtime.NumCPU(), want)
	}
}

// The maps are LRU hashes of the flags' sizes, with the layout of pkg/ctmap;
// their entries, and the ring buffer, survive a restart.
func TestMapsAcrossRestart(t *testing.T) {
	root := bpfmapstest.Root(t)
	var (
		maps   *ctmaps.Maps
		events *ctmaps.Events
	)
	flags := map[string]any{"conntrack-tcp-max": 1024, "conntrack-any-max": 512, "monitor-ringbuf-size": 8192}
	h := newHive(root, flags, &maps, &events)
	log := hivetest.Logger(t)
	if err := h.Start(log, context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, m := range []struct {
		em   *ebpf.Map
		max  uint32
		typ  ebpf.MapType
		key  uint32
		name string
	}{
		{maps.TCP4.EBPF(), 1024, ebpf.LRUHash, 16, ctmaps.MapTCP4},
		{maps.Any4.EBPF(), 512, ebpf.LRUHash, 16, ctmaps.MapAny4},
		{maps.TCP6.EBPF(), 1024, ebpf.LRUHash, 40, ctmaps.MapTCP6},
		{maps.Any6.EBPF(), 512, ebpf.LRUHash, 40, ctmaps.MapAny6},
		{events.Ring.EBPF(), 8192, ebpf.RingBuf, 0, ctmaps.MapEvents},
		{events.Lost.EBPF(), 1, ebpf.PerCPUArray, 4, ctmaps.MapEventsLost},
	} {
		if m.em.Type() != m.typ || m.em.MaxEntries() != m.max || m.em.KeySize() != m.key {
			t.Errorf("%s: %s of %d entries, key %d bytes; want %s of %d, key %d", m.name, m.em.Type(), m.em.MaxEntries(), m.em.KeySize(), m.typ, m.max, m.key)
		}
	}
	if got := maps.TCP4.EBPF().ValueSize(); got != 48 {
		t.Errorf("entry of %d bytes, want 48", got)
	}
	if names := maps.EBPF(); len(names) != 4 || names[ctmaps.MapAny6] == nil {
		t.Errorf("Maps.EBPF() = %v, want the four maps by name", names)
	}

	key := ctmap.NewKey4(unix.IPPROTO_TCP, netip.MustParseAddrPort("10.244.0.2:40000"), netip.MustParseAddrPort("10.244.0.3:80"), 0)
	entry := ctmap.Entry{Lifetime: ctmap.Now() + 60, Flags: ctmap.CTFSynSeen, EndpointID: 3}
	if err := maps.TCP4.Put(key, entry); err != nil {
		t.Fatal(err)
	}
	if err := h.Stop(log, context.Background()); err != nil {
		t.Fatal(err)
	}

	h = newHive(root, flags, &maps, &events)
	celltest.Start(t, h)
	if got, err := maps.TCP4.Lookup(key); err != nil || got != entry {
		t.Fatalf("after restart: %v, %v; want %v", got, err, entry)
	}
	if o := events.Ring.Origin(); o != bpfmaps.OriginReused {
		t.Fatalf("ring buffer %s after restart, want reused", o)
	}
	if n, err := events.LostEvents(); err != nil || n != 0 {
		t.Fatalf("LostEvents = %d, %v; want 0", n, err)
	}
	// The pinned ring buffer is one a reader can open.
	rd, err := ringbuf.NewReader(events.Ring.EBPF())
	if err != nil {
		t.Fatal(err)
	}
	rd.SetDeadline(time.Now())
	if _, err := rd.Read(); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read of an empty ring buffer: %v, want a deadline error", err)
	}
	rd.Close()
}

func TestProgramConstants(t *testing.T) {
	var cfg ctmaps.Config
	h := celltest.New(bpfmaps.Cell, ctmaps.Cell, cell.Invoke(func(c ctmaps.Config) { cfg = c }))
	for k, v := range map[string]any{
		"conntrack-lifetime-syn": "7s", "conntrack-lifetime-tcp": "2h", "conntrack-lifetime-close": "3s",
		"conntrack-lifetime-nontcp": "45s", "monitor-aggregation": false,
	} {
		h.Viper().Set(k, v)
	}
	if err := h.Populate(hivetest.Logger(t)); err != nil {
		t.Fatal(err)
	}
	got := cfg.ProgramConstants()
	want := map[string]uint32{"ct_lifetime_syn": 7, "ct_lifetime_tcp": 7200, "ct_lifetime_close": 3, "ct_lifetime_nontcp": 45, "monitor_aggregation": 0}
	if !maps.Equal(got, want) {
		t.Fatalf("ProgramConstants = %v, want %v", got, want)
	}
}

func TestFlagErrors(t *testing.T) {
	for _, tc := range []struct {
		flag  string
		value any
		want  string
	}{
		{"conntrack-tcp-max", 0, "invalid --conntrack-tcp-max 0: want at least 1 entry"},
		{"conntrack-any-max", 0, "invalid --conntrack-any-max 0: want at least 1 entry"},
		{"conntrack-lifetime-syn", "500ms", "invalid --conntrack-lifetime-syn 500ms: want whole seconds, from 1s to"},
		{"conntrack-lifetime-tcp", "1.5s", "invalid --conntrack-lifetime-tcp 1.5s: want whole seconds"},
		{"conntrack-lifetime-close", "0s", "invalid --conntrack-lifetime-close 0s"},
		{"conntrack-lifetime-nontcp", "1000000h", "invalid --conntrack-lifetime-nontcp 1000000h0m0s"},
		{"monitor-ringbuf-size", 5000, "invalid --monitor-ringbuf-size 5000: want a power of two from 4096 (a page)"},
		{"monitor-ringbuf-size", 1024, "invalid --monitor-ringbuf-size 1024"},
		{"monitor-ringbuf-size", 1 << 31, "invalid --monitor-ringbuf-size 2147483648"},
	} {
		t.Run(tc.flag, func(t *testing.T) {
			root := bpfmapstest.Root(t)
			var (
				maps   *ctmaps.Maps
				events *ctmaps.Events
			)
			h := newHive(root, map[string]any{tc.flag: tc.value}, &maps, &events)
			err := h.Populate(hivetest.Logger(t))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want %q", err, tc.want)
			}
		})
	}
}
