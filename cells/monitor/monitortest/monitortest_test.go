package monitortest_test

import (
	"bytes"
	"os"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/ringbuf"

	"github.com/cellium/cellium/cells/monitor/monitortest"
)

func newMaps(t *testing.T, ringSize uint32) (events, lost *ebpf.Map) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to load BPF programs")
	}
	events, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.RingBuf, MaxEntries: ringSize})
	if err != nil {
		t.Fatalf("create ring buffer: %v", err)
	}
	t.Cleanup(func() { events.Close() })
	lost, err = ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.PerCPUArray, KeySize: 4, ValueSize: 8, MaxEntries: 1})
	if err != nil {
		t.Fatalf("create lost counter: %v", err)
	}
	t.Cleanup(func() { lost.Close() })
	return events, lost
}

func lostCount(t *testing.T, lost *ebpf.Map) uint64 {
	t.Helper()
	var perCPU []uint64
	if err := lost.Lookup(uint32(0), &perCPU); err != nil {
		t.Fatal(err)
	}
	var sum uint64
	for _, n := range perCPU {
		sum += n
	}
	return sum
}

func TestRecordsReachTheRingBuffer(t *testing.T) {
	events, lost := newMaps(t, 4096)
	w, err := monitortest.NewRecordWriter(events, lost)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	r, err := ringbuf.NewReader(events)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()

	small := bytes.Repeat([]byte{0xab}, monitortest.MinRecord)
	large := make([]byte, monitortest.MaxRecord)
	for i := range large {
		large[i] = byte(i)
	}
	if err := w.Write(small, 2); err != nil {
		t.Fatal(err)
	}
	if err := w.Write(large, 1); err != nil {
		t.Fatal(err)
	}
	for i, want := range [][]byte{small, small, large} {
		rec, err := r.Read()
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(rec.RawSample, want) {
			t.Fatalf("record %d: got % x, want % x", i, rec.RawSample, want)
		}
	}
	if n := lostCount(t, lost); n != 0 {
		t.Fatalf("lost %d records with room to spare", n)
	}
}

func TestRecordsThatDoNotFitAreCounted(t *testing.T) {
	events, lost := newMaps(t, 4096)
	w, err := monitortest.NewRecordWriter(events, lost)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	// Each 64-byte record takes 72 bytes with its header: 56 fit in 4 KiB.
	if err := w.Write(make([]byte, 64), 100); err != nil {
		t.Fatal(err)
	}
	if n := lostCount(t, lost); n != 100-4096/72 {
		t.Fatalf("lost counter = %d, want %d", n, 100-4096/72)
	}
}

func TestRecordLengthIsChecked(t *testing.T) {
	events, lost := newMaps(t, 4096)
	w, err := monitortest.NewRecordWriter(events, lost)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if err := w.Write(make([]byte, monitortest.MaxRecord+1), 1); err == nil {
		t.Fatal("a record over MaxRecord was accepted")
	}
	if err := w.Write(make([]byte, 16), 0); err == nil {
		t.Fatal("repeat 0 was accepted")
	}
}
