package bpf_test

import (
	"context"
	"encoding/binary"
	"errors"
	"slices"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/hivetest"

	"github.com/cellium/cellium/bpf"
	"github.com/cellium/cellium/cells/bpfmaps"
	"github.com/cellium/cellium/cells/bpfmaps/bpfmapstest"
)

// l3CountsSpec is the registry's view of the C map l3_counts: the same
// type and max entries, with key and value sizes from the Go types.
var l3CountsSpec = bpfmaps.Spec{
	Name:       bpf.CounterMapL3Counts,
	Type:       ebpf.PerCPUArray,
	MaxEntries: uint32(bpf.CounterL3ClassL3CLASS_MAX),
}

type l3Counts = bpfmaps.Map[bpf.CounterL3Class, uint64]

// startCounterMap runs the bpf-maps cell and a cell that declares the
// counter map with spec, as the loader will, and returns the open map.
func startCounterMap(t *testing.T, spec bpfmaps.Spec) *l3Counts {
	t.Helper()
	var counts *l3Counts
	h := hive.New(
		bpfmaps.Cell,
		cell.Module("counter", "Test L3 counter map",
			cell.Invoke(func(lc cell.Lifecycle, reg *bpfmaps.Registry) (err error) {
				counts, err = bpfmaps.NewMap[bpf.CounterL3Class, uint64](lc, reg, spec)
				return err
			}),
		),
	)
	hive.AddConfigOverride(h, func(c *bpfmaps.Config) { c.BPFRoot = bpfmapstest.Root(t) })
	log := hivetest.Logger(t)
	if err := h.Start(log, context.Background()); err != nil {
		t.Fatalf("start hive: %v", err)
	}
	t.Cleanup(func() {
		if err := h.Stop(log, context.Background()); err != nil {
			t.Errorf("stop hive: %v", err)
		}
	})
	return counts
}

// loadCounter loads count_l3 with the registry's map in place of its own.
func loadCounter(t *testing.T, counts *l3Counts) (bpf.CounterPrograms, error) {
	t.Helper()
	spec, err := bpf.LoadCounter()
	if err != nil {
		t.Fatal(err)
	}
	var prog bpf.CounterPrograms
	err = spec.LoadAndAssign(&prog, &ebpf.CollectionOptions{
		MapReplacements: map[string]*ebpf.Map{bpf.CounterMapL3Counts: counts.EBPF()},
	})
	return prog, err
}

// frame is a minimal Ethernet frame with the given EtherType, padded to
// the Ethernet minimum.
func frame(etherType uint16, payload ...byte) []byte {
	f := make([]byte, 14, 64)
	copy(f[0:6], []byte{0x02, 0, 0, 0, 0, 0x01})
	copy(f[6:12], []byte{0x02, 0, 0, 0, 0, 0x02})
	binary.BigEndian.PutUint16(f[12:14], etherType)
	f = append(f, payload...)
	return f[:64]
}

func TestCountL3(t *testing.T) {
	counts := startCounterMap(t, l3CountsSpec)
	prog, err := loadCounter(t, counts)
	if err != nil {
		t.Fatalf("load count_l3 with the registry's map: %v", err)
	}
	defer prog.Close()

	// The program uses the registry's pinned map, not a map of its own.
	info, err := prog.CountL3.Info()
	if err != nil {
		t.Fatal(err)
	}
	mapIDs, _ := info.MapIDs()
	mapInfo, err := counts.EBPF().Info()
	if err != nil {
		t.Fatal(err)
	}
	if id, _ := mapInfo.ID(); !slices.Contains(mapIDs, id) {
		t.Fatalf("count_l3 uses maps %v, not the registry's map %d", mapIDs, id)
	}

	const (
		etherTypeIPv4 = 0x0800
		etherTypeIPv6 = 0x86dd
		etherTypeARP  = 0x0806
		etherTypeVLAN = 0x8100
	)
	for _, tc := range []struct {
		name   string
		frame  []byte
		repeat uint32
	}{
		{"ipv4", frame(etherTypeIPv4, 0x45), 3},
		{"ipv6", frame(etherTypeIPv6, 0x60), 2},
		{"arp", frame(etherTypeARP), 1},
		// Tagged frames are not parsed past the tag: other.
		{"vlan", frame(etherTypeVLAN, 0x00, 0x01, 0x08, 0x00), 4},
	} {
		ret, err := prog.CountL3.Run(&ebpf.RunOptions{Data: tc.frame, Repeat: tc.repeat})
		if err != nil {
			t.Fatalf("run on %s frame: %v", tc.name, err)
		}
		if ret != 0 { // TC_ACT_OK
			t.Fatalf("run on %s frame returned %d, want TC_ACT_OK (0): the program must pass every packet", tc.name, ret)
		}
	}

	for class, want := range map[bpf.CounterL3Class]uint64{
		bpf.CounterL3ClassL3CLASS_IPV4:  3,
		bpf.CounterL3ClassL3CLASS_IPV6:  2,
		bpf.CounterL3ClassL3CLASS_OTHER: 5,
	} {
		perCPU, err := counts.LookupPerCPU(class)
		if err != nil {
			t.Fatal(err)
		}
		var sum uint64
		for _, n := range perCPU {
			sum += n
		}
		if sum != want {
			t.Errorf("class %d: %d packets counted (per CPU %v), want %d", class, sum, perCPU, want)
		}
	}
}

// A registry Spec that does not match the C map is caught at load time.
func TestCounterSpecMismatch(t *testing.T) {
	wrong := l3CountsSpec
	wrong.MaxEntries = 8
	counts := startCounterMap(t, wrong)
	prog, err := loadCounter(t, counts)
	if err == nil {
		prog.Close()
		t.Fatal("loaded count_l3 with a map of 8 entries; want ErrMapIncompatible")
	}
	if !errors.Is(err, ebpf.ErrMapIncompatible) {
		t.Fatalf("load with a mismatched map: %v, want ErrMapIncompatible", err)
	}
}
