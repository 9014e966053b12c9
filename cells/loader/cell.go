package loader

import (
	"fmt"
	"path/filepath"

	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/spf13/pflag"
)

// Cell loads the datapath programs and attaches them: the socket
// load-balancing programs to a cgroup, the endpoint programs to the host
// side of every endpoint's veth pair.
var Cell = cell.Module(
	"loader",
	"Loads the BPF programs and attaches them to cgroups and endpoints",

	cell.Config(defaultConfig),
	cell.ProvidePrivate(job.Registry.NewGroup),
	cell.Provide(linksCleanup, programsAttached),
	cell.Invoke(registerLoader),

	cell.ProvidePrivate(newLXCPrograms),
	cell.Invoke(registerEndpointReconciler, registerProgramsHealth),
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
