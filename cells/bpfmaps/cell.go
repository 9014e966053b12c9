package bpfmaps

import (
	"fmt"
	"path/filepath"
	"regexp"
	"sync"

	"github.com/cilium/hive/cell"
	"github.com/spf13/pflag"
)

// Cell provides the Registry, through which cells declare their BPF maps,
// the GET /v1/maps routes that list them, and the Cleaner that removes
// everything the agent pinned (`agent cleanup`).
var Cell = cell.Module(
	"bpf-maps",
	"Pinned BPF maps on bpffs and the registry of the maps the agent owns",

	cell.Config(defaultConfig),
	cell.Provide(newRegistry, newCleaner, apiRoutes),
	cell.Invoke(requireRegistry),
)

// requireRegistry validates the flags and makes sure bpffs is mounted even
// while no cell declares a map.
func requireRegistry(*Registry) {}

// Config is the bpf-maps cell's configuration.
type Config struct {
	// BPFRoot is where a BPF filesystem is (or will be) mounted.
	BPFRoot string
	// BPFMapPrefix is the directory under BPFRoot that holds the agent's
	// pins, so that several agents (or tests) can share one bpffs.
	BPFMapPrefix string
}

var defaultConfig = Config{
	BPFRoot:      "/sys/fs/bpf",
	BPFMapPrefix: "cellium",
}

func (def Config) Flags(flags *pflag.FlagSet) {
	flags.String("bpf-root", def.BPFRoot,
		"Mount point of the BPF filesystem; the agent mounts one there if there is none")
	flags.String("bpf-map-prefix", def.BPFMapPrefix,
		"Directory under --bpf-root in which the agent pins its maps")
}

// prefixRE is a single directory name: no slashes, no "." or "..".
// Compiled on first use, not in the package's initializer (the bounded
// repeat makes a large program).
var prefixRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,63}$`) })

// validate checks the flags and returns the bpffs root and the pin directory.
func (cfg Config) validate() (root, dir string, err error) {
	if !filepath.IsAbs(cfg.BPFRoot) {
		return "", "", fmt.Errorf("invalid --bpf-root %q: must be an absolute path, e.g. /sys/fs/bpf", cfg.BPFRoot)
	}
	if !prefixRE().MatchString(cfg.BPFMapPrefix) {
		return "", "", fmt.Errorf("invalid --bpf-map-prefix %q: want one directory name of at most 64 lower-case letters, digits, '_' and '-', e.g. cellium", cfg.BPFMapPrefix)
	}
	root = filepath.Clean(cfg.BPFRoot)
	return root, filepath.Join(root, cfg.BPFMapPrefix), nil
}
