package bpfmaps_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/hivetest"
	"golang.org/x/sys/unix"

	"github.com/cellium/cellium/cells/bpfmaps"
)

// startErr starts h, which must fail, and returns the error.
func startErr(t *testing.T, h *hive.Hive) error {
	t.Helper()
	log := hivetest.Logger(t)
	err := h.Start(log, context.Background())
	if err == nil {
		h.Stop(log, context.Background())
		t.Fatal("hive started; want an error")
	}
	return err
}

type padded struct {
	Proto uint8
	ID    uint32
}

type trailingPad struct {
	Bytes uint64
	ID    uint32
}

// These fail in constructors, before any I/O: no bpffs needed.
func TestDeclareErrors(t *testing.T) {
	hash := func(name string) bpfmaps.Spec {
		return bpfmaps.Spec{Name: name, Type: ebpf.Hash, MaxEntries: 8}
	}
	for _, tc := range []struct {
		name string
		cell cell.Cell
		want string
	}{
		{"upper case", declare[uint32, uint64]("demo", hash("Flows"), nil), `invalid bpf map name "Flows"`},
		{"slash", declare[uint32, uint64]("demo", hash("a/b"), nil), `invalid bpf map name "a/b"`},
		{"dot dot", declare[uint32, uint64]("demo", hash(".."), nil), `invalid bpf map name ".."`},
		{"empty", declare[uint32, uint64]("demo", hash(""), nil), `invalid bpf map name ""`},
		{"leading digit", declare[uint32, uint64]("demo", hash("4flows"), nil), `invalid bpf map name "4flows"`},
		{"too long", declare[uint32, uint64]("demo", hash(strings.Repeat("a", bpfmaps.MaxNameLen+1)), nil), "at most 64 characters"},
		{"no type", declare[uint32, uint64]("demo", bpfmaps.Spec{Name: "flows", MaxEntries: 8}, nil), "bpf map flows: Spec.Type is not set"},
		{"no max entries", declare[uint32, uint64]("demo", bpfmaps.Spec{Name: "flows", Type: ebpf.Hash}, nil), "bpf map flows: Spec.MaxEntries is 0"},
		{"string key", declare[string, uint64]("demo", hash("flows"), nil), "bpf map flows: key: type string has no fixed size"},
		{"int value", declare[uint32, int]("demo", hash("flows"), nil), "bpf map flows: value: type int has no fixed size"},
		{"pointer value", declare[uint32, *uint64]("demo", hash("flows"), nil), "bpf map flows: value: type *uint64 has no fixed size"},
		{"padded key", declare[padded, uint64]("demo", hash("flows"), nil), "bpf map flows: key: type bpfmaps_test.padded has 3 bytes of implicit padding"},
		{"trailing padding", declare[uint32, trailingPad]("demo", hash("flows"), nil), "bpf map flows: value: type bpfmaps_test.trailingPad has 4 bytes of implicit padding"},
		{"hash of maps through NewMap", declare[uint32, uint32]("demo", bpfmaps.Spec{Name: "tables", Type: ebpf.HashOfMaps, MaxEntries: 8, InnerMap: &tableSpec}, nil),
			"bpf map tables: declare a HashOfMaps with NewMapOfMaps"},
		{"hash through NewMapOfMaps", declareTables("demo", bpfmaps.Spec{Name: "tables", Type: ebpf.Hash, MaxEntries: 8}, nil),
			"bpf map tables: NewMapOfMaps declares a HashOfMaps; Spec.Type is Hash"},
		{"no inner map", declareTables("demo", bpfmaps.Spec{Name: "tables", Type: ebpf.HashOfMaps, MaxEntries: 8}, nil),
			"bpf map tables: Spec.InnerMap is for a HashOfMaps, and a HashOfMaps needs one"},
		{"inner map of a hash", declare[uint32, uint64]("demo", bpfmaps.Spec{Name: "flows", Type: ebpf.Hash, MaxEntries: 8, InnerMap: &tableSpec}, nil),
			"bpf map flows: Spec.InnerMap is for a HashOfMaps"},
		{"array of maps", declare[uint32, uint32]("demo", bpfmaps.Spec{Name: "tables", Type: ebpf.ArrayOfMaps, MaxEntries: 8, InnerMap: &tableSpec}, nil),
			"bpf map tables: ArrayOfMaps is not supported, declare a HashOfMaps"},
		{"inner map of maps", declareTables("demo", bpfmaps.Spec{Name: "tables", Type: ebpf.HashOfMaps, MaxEntries: 8,
			InnerMap: &bpfmaps.InnerSpec{Type: ebpf.HashOfMaps, KeySize: 4, ValueSize: 4, MaxEntries: 1}}, nil),
			"bpf map tables: InnerMap.Type HashOfMaps: want the type of a map that holds data"},
		{"inner map without a size", declareTables("demo", bpfmaps.Spec{Name: "tables", Type: ebpf.HashOfMaps, MaxEntries: 8,
			InnerMap: &bpfmaps.InnerSpec{Type: ebpf.Array, KeySize: 4, MaxEntries: 1}}, nil),
			"bpf map tables: InnerMap needs a KeySize, ValueSize and MaxEntries"},
		{
			"duplicate",
			cell.Group(
				declare[uint32, uint64]("first", hash("flows"), nil),
				declare[uint32, uint32]("second", hash("flows"), nil),
			),
			"bpf map flows declared twice",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := filepath.Join(t.TempDir(), "never-mounted")
			// Should the declaration wrongly pass, the hive mounts a bpffs
			// here: do not leave it behind.
			t.Cleanup(func() { unix.Unmount(root, unix.MNT_DETACH) })
			err := startErr(t, newHive(root, tc.cell))
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q does not contain %q", err, tc.want)
			}
			if _, err := os.Stat(root); !os.IsNotExist(err) {
				t.Fatalf("a failed declaration touched --bpf-root: stat %s: %v", root, err)
			}
		})
	}
}

func TestConfigErrors(t *testing.T) {
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		config bpfmaps.Config
		want   []string
	}{
		{"relative root", bpfmaps.Config{BPFRoot: "sys/fs/bpf", BPFMapPrefix: "cellium"},
			[]string{`invalid --bpf-root "sys/fs/bpf": must be an absolute path`}},
		{"empty root", bpfmaps.Config{BPFRoot: "", BPFMapPrefix: "cellium"},
			[]string{`invalid --bpf-root ""`}},
		{"prefix with slash", bpfmaps.Config{BPFRoot: "/sys/fs/bpf", BPFMapPrefix: "a/b"},
			[]string{`invalid --bpf-map-prefix "a/b"`, "e.g. cellium"}},
		{"prefix dot dot", bpfmaps.Config{BPFRoot: "/sys/fs/bpf", BPFMapPrefix: ".."},
			[]string{`invalid --bpf-map-prefix ".."`}},
		{"empty prefix", bpfmaps.Config{BPFRoot: "/sys/fs/bpf", BPFMapPrefix: ""},
			[]string{`invalid --bpf-map-prefix ""`}},
		// Passes validation but cannot become a bpffs: the start hook
		// must say which flag is wrong and how to fix it.
		{"root is a file", bpfmaps.Config{BPFRoot: file, BPFMapPrefix: "cellium"},
			[]string{"--bpf-root " + file + " is not a BPF filesystem", "mount -t bpf bpffs " + file, "set --bpf-root"}},
		{"root under a file", bpfmaps.Config{BPFRoot: filepath.Join(file, "bpf"), BPFMapPrefix: "cellium"},
			[]string{"--bpf-root " + filepath.Join(file, "bpf"), "mount -t bpf bpffs"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := hive.New(bpfmaps.Cell)
			hive.AddConfigOverride(h, func(c *bpfmaps.Config) { *c = tc.config })
			err := startErr(t, h)
			for _, want := range tc.want {
				if !strings.Contains(err.Error(), want) {
					t.Fatalf("error %q does not contain %q", err, want)
				}
			}
		})
	}
}
