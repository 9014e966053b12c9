package bpfmaps_test

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/hivetest"

	"github.com/cellium/cellium/cells/bpfmaps"
	"github.com/cellium/cellium/cells/bpfmaps/bpfmapstest"
)

// pinCell stands for a cell that pins something besides its maps (as the
// loader pins links) under the pin directory, and contributes the Cleanup
// that removes it.
func pinCell(removedBy *[]string) cell.Cell {
	return cell.Module("pinner", "Test pins besides maps",
		cell.Provide(func(reg *bpfmaps.Registry) bpfmaps.CleanupOut {
			pin := filepath.Join(reg.PinDir(), "extra", "thing")
			return bpfmaps.CleanupOut{Cleanup: bpfmaps.Cleanup{
				Name: "pinner",
				Remove: func() ([]string, error) {
					if _, err := os.Stat(pin); errors.Is(err, os.ErrNotExist) {
						return nil, nil
					}
					// The maps must still be there: cells clean up first.
					if _, err := os.Stat(filepath.Join(reg.PinDir(), "cellium_flows")); err != nil {
						return nil, errors.New("the maps were removed before the cells' cleanups ran")
					}
					if err := os.Remove(pin); err != nil {
						return nil, err
					}
					*removedBy = append(*removedBy, pin)
					return []string{"removed " + pin}, os.Remove(filepath.Dir(pin))
				},
			}}
		}),
	)
}

// cleaner builds (without starting) a hive like the agent's for `agent
// cleanup` and returns its Cleaner.
func cleaner(t *testing.T, root string, cells ...cell.Cell) *bpfmaps.Cleaner {
	t.Helper()
	var c *bpfmaps.Cleaner
	h := newHive(root, append(cells, cell.Invoke(func(cl *bpfmaps.Cleaner) { c = cl }))...)
	if err := h.Populate(hivetest.Logger(t)); err != nil {
		t.Fatal(err)
	}
	return c
}

func TestCleaner(t *testing.T) {
	root := bpfmapstest.Root(t)
	spec := bpfmaps.Spec{Name: "cellium_flows", Type: ebpf.Hash, MaxEntries: 16}
	var removedBy []string
	var flows *bpfmaps.Map[flowKey, flowStats]
	stop := start(t, newHive(root, declare("flows", spec, &flows), pinCell(&removedBy)))
	dir := filepath.Dir(flows.PinPath())

	// What the other cell pins, and a map an older agent left behind.
	if err := os.Mkdir(filepath.Join(dir, "extra"), 0o700); err != nil {
		t.Fatal(err)
	}
	for _, pin := range []string{filepath.Join(dir, "extra", "thing"), filepath.Join(dir, "cellium_old")} {
		m, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 4, MaxEntries: 1})
		if err != nil {
			t.Fatal(err)
		}
		err = m.Pin(pin)
		m.Close()
		if err != nil {
			t.Fatal(err)
		}
	}
	stop()

	c := cleaner(t, root, declare[flowKey, flowStats]("flows", spec, nil), pinCell(&removedBy))
	if c.PinDir() != dir {
		t.Fatalf("PinDir() = %s, want %s", c.PinDir(), dir)
	}
	removed, err := c.Remove()
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"removed " + filepath.Join(dir, "extra", "thing"),
		"removed map " + filepath.Join(dir, "cellium_flows"),
		"removed " + filepath.Join(dir, "cellium_old") + ", which no cell of this agent declares",
		"removed pin directory " + dir,
	}
	if !slices.Equal(removed, want) {
		t.Fatalf("removed:\n%q\nwant:\n%q", removed, want)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("pin directory after cleanup: %v", err)
	}

	// Idempotent: a second run finds nothing.
	removed, err = cleaner(t, root, declare[flowKey, flowStats]("flows", spec, nil), pinCell(&removedBy)).Remove()
	if err != nil || len(removed) != 0 {
		t.Fatalf("second cleanup: removed %q, err %v; want nothing", removed, err)
	}
	if len(removedBy) != 1 {
		t.Fatalf("the cell's cleanup removed %v, want its pin once", removedBy)
	}
}

// A --bpf-root that is no BPF filesystem holds nobody's pins: cleanup must
// not touch its files.
func TestCleanerLeavesOtherFilesystems(t *testing.T) {
	root := t.TempDir()
	file := filepath.Join(root, "cellium", "cellium_flows")
	if err := os.MkdirAll(filepath.Dir(file), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, []byte("not a pin"), 0o600); err != nil {
		t.Fatal(err)
	}
	spec := bpfmaps.Spec{Name: "cellium_flows", Type: ebpf.Hash, MaxEntries: 16}
	removed, err := cleaner(t, root, declare[flowKey, flowStats]("flows", spec, nil)).Remove()
	if err != nil || len(removed) != 0 {
		t.Fatalf("cleanup of a plain directory: removed %q, err %v; want nothing", removed, err)
	}
	if _, err := os.Stat(file); err != nil {
		t.Fatalf("cleanup touched a file outside bpffs: %v", err)
	}
}
