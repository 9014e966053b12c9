package loader

import (
	"fmt"
	"path/filepath"

	"github.com/cilium/hive/cell"
	"github.com/spf13/pflag"
)

// Cell loads and attaches the socket load-balancing programs.
var Cell = cell.Module(
	"loader",
	"Loads the BPF programs and attaches them to cgroups",

	cell.Config(defaultConfig),
	cell.Provide(linksCleanup),
	cell.Invoke(registerLoader),
)

// Config is the loader cell's configuration.
type Config struct {
	// CgroupRoot is the cgroup2 directory the socket programs attach to;
	// empty means the cgroup2 mount point.
	CgroupRoot string
}

var defaultConfig = Config{}

func (def Config) Flags(flags *pflag.FlagSet) {
	flags.String("cgroup-root", def.CgroupRoot,
		"cgroup2 directory whose sockets, and those of the cgroups below it, are load-balanced; empty: the cgroup2 mount point from /proc/self/mountinfo")
}

func (cfg Config) validate() error {
	if cfg.CgroupRoot != "" && !filepath.IsAbs(cfg.CgroupRoot) {
		return fmt.Errorf("invalid --cgroup-root %q: want an absolute path to a cgroup2 directory, e.g. /sys/fs/cgroup, or empty to use the cgroup2 mount point", cfg.CgroupRoot)
	}
	return nil
}
