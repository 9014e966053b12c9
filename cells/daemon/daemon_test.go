package daemon_test

import (
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/hivetest"

	"github.com/cellium/cellium/cells/daemon"
	"github.com/cellium/cellium/cells/internal/celltest"
)

func TestDirectoriesExistAtStart(t *testing.T) {
	dir := t.TempDir()
	var paths daemon.Paths
	var node daemon.NodeName
	h := celltest.New(daemon.Cell, cell.Invoke(func(p daemon.Paths, n daemon.NodeName) { paths, node = p, n }))
	hive.AddConfigOverride(h, func(c *daemon.Config) {
		c.StateDir = filepath.Join(dir, "state")
		c.RunDir = filepath.Join(dir, "run")
		c.NodeName = "node-1"
	})
	celltest.Start(t, h)

	for path, mode := range map[string]os.FileMode{paths.StateDir: 0o700, paths.RunDir: 0o755} {
		fi, err := os.Stat(path)
		if err != nil || !fi.IsDir() || fi.Mode().Perm() != mode {
			t.Errorf("%s: %v %v, want a directory with mode %v", path, fi.Mode(), err, mode)
		}
	}
	if node != "node-1" {
		t.Errorf("node name = %q, want the configured node-1", node)
	}
}

func TestNodeNameDefaultsToHostName(t *testing.T) {
	var node daemon.NodeName
	h := celltest.New(daemon.Cell, cell.Invoke(func(n daemon.NodeName) { node = n }))
	hive.AddConfigOverride(h, func(c *daemon.Config) { c.StateDir, c.RunDir = t.TempDir(), t.TempDir() })
	if err := h.Populate(hivetest.Logger(t)); err != nil {
		t.Fatal(err)
	}
	host, err := os.Hostname()
	if err != nil {
		t.Skip("no host name:", err)
	}
	if string(node) != host {
		t.Fatalf("node name = %q, want the host name %q", node, host)
	}
}

func TestInvalidConfig(t *testing.T) {
	tests := []struct {
		name string
		cfg  daemon.Config
		want string
	}{
		{"relative state dir", daemon.Config{StateDir: "state", RunDir: "/run"}, `invalid --state-dir "state": must be an absolute path`},
		{"relative run dir", daemon.Config{StateDir: "/state", RunDir: "run"}, `invalid --run-dir "run": must be an absolute path`},
		{"node name with a slash", daemon.Config{StateDir: "/state", RunDir: "/run", NodeName: "a/b"}, `invalid --node-name "a/b"`},
		{"negative GC target", daemon.Config{StateDir: "/state", RunDir: "/run", NodeName: "n", GCPercent: -1}, `invalid --gc-percent -1: want a percentage of at least 1, or 0 to leave Go's setting (GOGC)`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := celltest.New(daemon.Cell)
			hive.AddConfigOverride(h, func(c *daemon.Config) { *c = tc.cfg })
			err := h.Populate(hivetest.Logger(t))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("populate = %v, want %q", err, tc.want)
			}
		})
	}
}

// TestGCPercent: the garbage collector's target is the flag's once the cell
// has started (not before: building the graph sets nothing), and 0 leaves
// the runtime's.
func TestGCPercent(t *testing.T) {
	orig := debug.SetGCPercent(100)
	t.Cleanup(func() { debug.SetGCPercent(orig) })
	current := func() int {
		v := debug.SetGCPercent(100)
		debug.SetGCPercent(v)
		return v
	}
	for _, c := range []struct{ flag, want int }{{37, 37}, {0, 100}} {
		debug.SetGCPercent(100)
		h := celltest.New(daemon.Cell)
		hive.AddConfigOverride(h, func(cfg *daemon.Config) {
			cfg.StateDir, cfg.RunDir, cfg.GCPercent = t.TempDir(), t.TempDir(), c.flag
		})
		if err := h.Populate(hivetest.Logger(t)); err != nil {
			t.Fatal(err)
		}
		if got := current(); got != 100 {
			t.Errorf("--gc-percent %d: target %d before start, want it unchanged (100)", c.flag, got)
		}
		celltest.Start(t, h)
		if got := current(); got != c.want {
			t.Errorf("--gc-percent %d: target %d after start, want %d", c.flag, got, c.want)
		}
	}
}
