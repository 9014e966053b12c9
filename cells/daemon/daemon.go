// Package daemon holds what every cell of the agent shares: the directories
// it keeps state and runtime files in, the name of the node it runs on, and
// the process's memory setting: the Go garbage collector's target.
//
// The cell creates the directories in its start hook, so a cell that takes
// [Paths] may use them from its own start hook on.
package daemon

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"

	"github.com/cellium/cellium/pkg/flagcheck"

	"github.com/cilium/hive/cell"
	"github.com/spf13/pflag"
	"golang.org/x/sys/unix"
)

// Cell provides Paths and NodeName.
var Cell = cell.Module(
	"daemon",
	"State and run directories and the node name",

	cell.Config(defaultConfig),
	cell.Provide(newDaemon),
	cell.Invoke(requireDirectories),
)

// requireDirectories validates the flags and creates the directories even
// while no cell uses them.
func requireDirectories(Paths) {}

// Config is the daemon cell's configuration.
type Config struct {
	// StateDir holds state that must survive agent restarts (endpoint state
	// files). Losing it loses state: put it on a host path.
	StateDir string
	// RunDir holds runtime files: sockets, the CNI config copy.
	RunDir string
	// NodeName is the Kubernetes node this agent runs on; empty means the
	// host name.
	NodeName string
	// GCPercent is how far the heap grows past what was live at the last
	// collection before the next one (Go's GOGC); 0 leaves the runtime's
	// setting (the GOGC variable, else 100).
	GCPercent int
}

// DefaultGCPercent is the agent's garbage collector target. Go's default,
// 100, lets the heap reach twice the live heap between collections: the
// agent's live heap is mostly long-lived tables (the load balancer's rows
// at 50,000 Services), its garbage comes in bursts (listings, restarts),
// and 50 keeps its resident size a quarter lower for a few percent of CPU
// in those bursts (docs/performance.md).
const DefaultGCPercent = 50

var defaultConfig = Config{
	StateDir:  "/var/run/cellium/state",
	RunDir:    "/var/run/cellium",
	NodeName:  "",
	GCPercent: DefaultGCPercent,
}

func (def Config) Flags(flags *pflag.FlagSet) {
	flags.String("state-dir", def.StateDir, "Directory for state that survives agent restarts")
	flags.String("run-dir", def.RunDir, "Directory for runtime files (sockets)")
	flags.String("node-name", def.NodeName, "Name of this node (default: the host name)")
	flags.Int("gc-percent", def.GCPercent, "Go garbage collector target: heap growth, in percent of the live heap, between collections (Go's GOGC); 0 leaves the GOGC variable or Go's default of 100")
}

// Paths are the agent's directories. They exist once the daemon cell has
// started.
type Paths struct {
	StateDir string
	RunDir   string
}

// NodeName is the name of the node the agent runs on.
type NodeName string

type out struct {
	cell.Out

	Paths    Paths
	NodeName NodeName
}

func newDaemon(cfg Config, lc cell.Lifecycle, log *slog.Logger) (out, error) {
	for _, dir := range []struct{ flag, path string }{{"state-dir", cfg.StateDir}, {"run-dir", cfg.RunDir}} {
		if !filepath.IsAbs(dir.path) {
			return out{}, fmt.Errorf("invalid --%s %q: must be an absolute path", dir.flag, dir.path)
		}
		if err := flagcheck.Creatable(dir.path); err != nil {
			return out{}, fmt.Errorf("invalid --%s %q: %w", dir.flag, dir.path, err)
		}
	}
	name, err := nodeName(cfg.NodeName)
	if err != nil {
		return out{}, err
	}
	if cfg.GCPercent < 0 {
		return out{}, fmt.Errorf("invalid --gc-percent %d: want a percentage of at least 1, or 0 to leave Go's setting (GOGC)", cfg.GCPercent)
	}
	paths := Paths{StateDir: filepath.Clean(cfg.StateDir), RunDir: filepath.Clean(cfg.RunDir)}
	// Set at start, not when the graph is built (as `agent hive` does).
	lc.Append(cell.Hook{OnStart: func(cell.HookContext) error {
		if cfg.GCPercent > 0 {
			old := debug.SetGCPercent(cfg.GCPercent)
			log.Debug("Garbage collector target set", "gc-percent", cfg.GCPercent, "was", old)
		}
		return nil
	}})
	lc.Append(cell.Hook{OnStart: (&directories{paths, log, name}).create})
	return out{Paths: paths, NodeName: NodeName(name)}, nil
}

// directories creates the agent's directories at start.
type directories struct {
	Paths
	log  *slog.Logger
	node string
}

func (d *directories) create(cell.HookContext) error {
	// State is private to the agent; run files (sockets) are guarded by
	// their own modes.
	if err := os.MkdirAll(d.StateDir, 0o700); err != nil {
		return fmt.Errorf("--state-dir: %w", err)
	}
	if err := os.MkdirAll(d.RunDir, 0o755); err != nil {
		return fmt.Errorf("--run-dir: %w", err)
	}
	d.log.Info("Agent directories ready", "state-dir", d.StateDir, "run-dir", d.RunDir, "node", d.node)
	return nil
}

// nodeName validates the configured node name, defaulting to the host name
// (from uname, which does no file I/O).
func nodeName(configured string) (string, error) {
	name := configured
	if name == "" {
		var uts unix.Utsname
		if err := unix.Uname(&uts); err != nil {
			return "", fmt.Errorf("--node-name is empty and the host name is unknown: %w", err)
		}
		name = unix.ByteSliceToString(uts.Nodename[:])
	}
	if name == "" || len(name) > 253 || strings.ContainsAny(name, " /\t\n") {
		return "", fmt.Errorf("invalid --node-name %q: want a DNS subdomain such as node-1", name)
	}
	return name, nil
}
