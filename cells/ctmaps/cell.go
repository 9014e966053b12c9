package ctmaps

import (
	"fmt"
	"math"
	"os"
	"runtime"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/hive/cell"
	"github.com/spf13/pflag"

	"github.com/cellium/cellium/cells/bpfmaps"
	"github.com/cellium/cellium/pkg/ctmap"
)

// Cell declares the conntrack maps and the event ring buffer.
var Cell = cell.Module(
	"ct-maps",
	"BPF conntrack maps and the datapath event ring buffer",

	cell.Config(defaultConfig),
	cell.Provide(newMaps, newEvents),
)

// Config is the ct-maps cell's configuration.
type Config struct {
	ConntrackTCPMax         uint32
	ConntrackAnyMax         uint32
	ConntrackLifetimeSyn    time.Duration
	ConntrackLifetimeTCP    time.Duration
	ConntrackLifetimeClose  time.Duration
	ConntrackLifetimeNonTCP time.Duration
	MonitorRingbufSize      uint32
	MonitorAggregation      bool
}

var defaultConfig = Config{
	ConntrackTCPMax:         524288,
	ConntrackAnyMax:         262144,
	ConntrackLifetimeSyn:    60 * time.Second,
	ConntrackLifetimeTCP:    6 * time.Hour,
	ConntrackLifetimeClose:  10 * time.Second,
	ConntrackLifetimeNonTCP: 60 * time.Second,
	MonitorRingbufSize:      0, // ringbufPerCPU per CPU, see ringbufSize
	MonitorAggregation:      true,
}

func (def Config) Flags(flags *pflag.FlagSet) {
	flags.Uint32("conntrack-tcp-max", def.ConntrackTCPMax, "Entries of each TCP conntrack map (LRU, one per family)")
	flags.Uint32("conntrack-any-max", def.ConntrackAnyMax, "Entries of each non-TCP conntrack map (LRU, one per family): UDP, ICMP echo, other protocols")
	flags.Duration("conntrack-lifetime-syn", def.ConntrackLifetimeSyn, "Lifetime of a TCP connection's entry until its SYN is answered")
	flags.Duration("conntrack-lifetime-tcp", def.ConntrackLifetimeTCP, "Lifetime of an established TCP connection's entry after its last packet")
	flags.Duration("conntrack-lifetime-close", def.ConntrackLifetimeClose, "Lifetime of a TCP connection's entry once both sides sent a FIN, or one sent a RST")
	flags.Duration("conntrack-lifetime-nontcp", def.ConntrackLifetimeNonTCP, "Lifetime of a UDP, ICMP or other connection's entry after its last packet")
	flags.Uint32("monitor-ringbuf-size", def.MonitorRingbufSize, "Bytes of the datapath's event ring buffer: a power of two, at least a page; 0: 512 KiB per CPU, from 1 MiB to 64 MiB")
	flags.Bool("monitor-aggregation", def.MonitorAggregation,
		"Report a connection's packet only when it opens the connection, changes its state or is the first of its direction in a second; false: report every packet")
}

// maxRingbufSize bounds --monitor-ringbuf-size: the kernel takes up to
// 2 GiB, but so much locked memory for events is a typo.
const maxRingbufSize = 1 << 30

// The ring buffer's size when --monitor-ringbuf-size is 0: room per CPU
// (every CPU's programs write into the one ring), rounded up to a power of
// two and kept within bounds: 1 MiB on 2 CPUs (11,900 trace records),
// 4 MiB on 8. The ring is kernel memory the agent maps twice (its pages
// count twice in the agent's resident set), so a fixed 4 MiB was 8 MB of a
// small node's idle agent.
const (
	ringbufPerCPU  = 512 << 10
	minAutoRingbuf = 1 << 20
	maxAutoRingbuf = 64 << 20
)

// ringbufSize is the ring buffer's size in bytes, on a machine of cpus CPUs.
func (cfg Config) ringbufSize(cpus int) uint32 {
	if cfg.MonitorRingbufSize != 0 {
		return cfg.MonitorRingbufSize
	}
	want := uint64(max(cpus, 1)) * ringbufPerCPU
	size := uint64(minAutoRingbuf)
	for size < want && size < maxAutoRingbuf {
		size <<= 1
	}
	return uint32(size)
}

func (cfg Config) validate() error {
	for _, f := range []struct {
		flag string
		max  uint32
	}{
		{"conntrack-tcp-max", cfg.ConntrackTCPMax},
		{"conntrack-any-max", cfg.ConntrackAnyMax},
	} {
		if f.max == 0 {
			return fmt.Errorf("invalid --%s 0: want at least 1 entry", f.flag)
		}
	}
	for _, f := range []struct {
		flag string
		d    time.Duration
	}{
		{"conntrack-lifetime-syn", cfg.ConntrackLifetimeSyn},
		{"conntrack-lifetime-tcp", cfg.ConntrackLifetimeTCP},
		{"conntrack-lifetime-close", cfg.ConntrackLifetimeClose},
		{"conntrack-lifetime-nontcp", cfg.ConntrackLifetimeNonTCP},
	} {
		// The programs count in whole seconds of a 32-bit clock.
		if f.d < time.Second || f.d%time.Second != 0 || f.d > math.MaxInt32*time.Second {
			return fmt.Errorf("invalid --%s %s: want whole seconds, from 1s to %ds", f.flag, f.d, math.MaxInt32)
		}
	}
	page := uint32(os.Getpagesize())
	if n := cfg.MonitorRingbufSize; n != 0 && (n < page || n > maxRingbufSize || n&(n-1) != 0) {
		return fmt.Errorf("invalid --monitor-ringbuf-size %d: want a power of two from %d (a page) to %d, or 0 for a size by CPU count", n, page, maxRingbufSize)
	}
	return nil
}

// ProgramConstants are the read-only constants of the TC programs
// (bpf/lxc.c) that come from the flags: the lifetimes in seconds and
// whether to aggregate trace events. The loader sets them before loading.
func (cfg Config) ProgramConstants() map[string]uint32 {
	aggregate := uint32(0)
	if cfg.MonitorAggregation {
		aggregate = 1
	}
	c := cfg.LifetimeConstants()
	c["monitor_aggregation"] = aggregate
	return c
}

// LifetimeConstants are the lifetimes of ProgramConstants alone, which
// the NodePort programs (bpf/nodeport.c) give their NAT entries too.
func (cfg Config) LifetimeConstants() map[string]uint32 {
	return map[string]uint32{
		"ct_lifetime_syn":    uint32(cfg.ConntrackLifetimeSyn / time.Second),
		"ct_lifetime_tcp":    uint32(cfg.ConntrackLifetimeTCP / time.Second),
		"ct_lifetime_close":  uint32(cfg.ConntrackLifetimeClose / time.Second),
		"ct_lifetime_nontcp": uint32(cfg.ConntrackLifetimeNonTCP / time.Second),
	}
}

// Names of the maps: their pins, and the names the programs declare them
// under (bpf/include/ct.h, events.h).
const (
	MapTCP4       = "cellium_ct4_tcp"
	MapAny4       = "cellium_ct4_any"
	MapTCP6       = "cellium_ct6_tcp"
	MapAny6       = "cellium_ct6_any"
	MapEvents     = "cellium_events"
	MapEventsLost = "cellium_events_lost"
)

// Map4 and Map6 are conntrack maps of one family.
type (
	Map4 = bpfmaps.Map[ctmap.Key4, ctmap.Entry]
	Map6 = bpfmaps.Map[ctmap.Key6, ctmap.Entry]
)

// Maps are the conntrack maps.
type Maps struct {
	TCP4 *Map4
	Any4 *Map4
	TCP6 *Map6
	Any6 *Map6
}

func newMaps(cfg Config, lc cell.Lifecycle, reg *bpfmaps.Registry) (*Maps, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	// LRU: the programs insert, so the maps must make room themselves when
	// full rather than refuse new connections.
	lru := func(name string, max uint32) bpfmaps.Spec {
		return bpfmaps.Spec{Name: name, Type: ebpf.LRUHash, MaxEntries: max}
	}
	var (
		m   Maps
		err error
	)
	if m.TCP4, err = bpfmaps.NewMap[ctmap.Key4, ctmap.Entry](lc, reg, lru(MapTCP4, cfg.ConntrackTCPMax)); err != nil {
		return nil, err
	}
	if m.Any4, err = bpfmaps.NewMap[ctmap.Key4, ctmap.Entry](lc, reg, lru(MapAny4, cfg.ConntrackAnyMax)); err != nil {
		return nil, err
	}
	if m.TCP6, err = bpfmaps.NewMap[ctmap.Key6, ctmap.Entry](lc, reg, lru(MapTCP6, cfg.ConntrackTCPMax)); err != nil {
		return nil, err
	}
	if m.Any6, err = bpfmaps.NewMap[ctmap.Key6, ctmap.Entry](lc, reg, lru(MapAny6, cfg.ConntrackAnyMax)); err != nil {
		return nil, err
	}
	return &m, nil
}

// EBPF is every open conntrack map by its name in the programs, for
// ebpf.CollectionOptions.MapReplacements. Call it from a start hook of a
// cell that takes *Maps: the maps are open by then.
func (m *Maps) EBPF() map[string]*ebpf.Map {
	return map[string]*ebpf.Map{
		m.TCP4.Name(): m.TCP4.EBPF(),
		m.Any4.Name(): m.Any4.EBPF(),
		m.TCP6.Name(): m.TCP6.EBPF(),
		m.Any6.Name(): m.Any6.EBPF(),
	}
}

// EventRing is the event ring buffer: a ring buffer has no keys or values.
type EventRing = bpfmaps.Map[struct{}, struct{}]

// LostCounter is the per-CPU counter of events that did not fit, at key 0.
type LostCounter = bpfmaps.Map[uint32, uint64]

// Events are the event ring buffer and its lost counter.
type Events struct {
	Ring *EventRing
	Lost *LostCounter
}

func newEvents(cfg Config, lc cell.Lifecycle, reg *bpfmaps.Registry) (*Events, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	ring, err := bpfmaps.NewMap[struct{}, struct{}](lc, reg, bpfmaps.Spec{
		Name: MapEvents, Type: ebpf.RingBuf, MaxEntries: cfg.ringbufSize(runtime.NumCPU()),
	})
	if err != nil {
		return nil, err
	}
	lost, err := bpfmaps.NewMap[uint32, uint64](lc, reg, bpfmaps.Spec{
		Name: MapEventsLost, Type: ebpf.PerCPUArray, MaxEntries: 1,
	})
	if err != nil {
		return nil, err
	}
	return &Events{Ring: ring, Lost: lost}, nil
}

// EBPF is the ring buffer and the lost counter by their names in the
// programs, for ebpf.CollectionOptions.MapReplacements.
func (e *Events) EBPF() map[string]*ebpf.Map {
	return map[string]*ebpf.Map{
		e.Ring.Name(): e.Ring.EBPF(),
		e.Lost.Name(): e.Lost.EBPF(),
	}
}

// LostEvents is the number of events that did not fit in the ring buffer
// since the counter was created: the sum over the CPUs.
func (e *Events) LostEvents() (uint64, error) {
	perCPU, err := e.Lost.LookupPerCPU(0)
	if err != nil {
		return 0, err
	}
	var sum uint64
	for _, n := range perCPU {
		sum += n
	}
	return sum, nil
}
