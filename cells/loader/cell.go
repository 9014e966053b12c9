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
// side of every endpoint's veth pair, the NodePort programs to the node's
// selected devices.
var Cell = cell.Module(
	"loader",
	"Loads the BPF programs and attaches them to cgroups and endpoints",

	cell.Config(defaultConfig),
	cell.ProvidePrivate(job.Registry.NewGroup),
	cell.Provide(linksCleanup, programsAttached),
	cell.Invoke(registerLoader),

	cell.ProvidePrivate(newLXCPrograms),
	cell.Invoke(registerEndpointReconciler, registerProgramsHealth),

	cell.ProvidePrivate(newNodePortMaps),
	cell.Provide(nodePortNATMap),
	cell.Invoke(registerNodePort),
)

// Config is the loader cell's configuration.
type Config struct {
	// CgroupRoot is the cgroup2 directory the socket programs attach to;
	// empty means the cgroup2 mount point.
	CgroupRoot string
	// EnableNodePort attaches the NodePort programs to the node's selected
	// devices, for clients outside the cluster.
	EnableNodePort bool
	// LBNodePortNATMapMax is the size of the NodePort programs' NAT map:
	// two entries per connection from outside.
	LBNodePortNATMapMax uint32
}

var defaultConfig = Config{EnableNodePort: true, LBNodePortNATMapMax: 1 << 18}

func (def Config) Flags(flags *pflag.FlagSet) {
	flags.String("cgroup-root", def.CgroupRoot,
		"cgroup2 directory whose sockets, and those of the cgroups below it, are load-balanced; empty: the cgroup2 mount point from /proc/self/mountinfo")
	flags.Bool("enable-nodeport", def.EnableNodePort,
		"Attach the NodePort programs to the selected devices (--devices), which send outside clients of NodePort, ExternalIP and LoadBalancer frontends to local backends; false detaches them")
	flags.Uint32("lb-nodeport-nat-map-max", def.LBNodePortNATMapMax,
		"Entries of the NAT map of the NodePort programs on the node's devices; each connection from outside to a service takes two")
}

func (cfg Config) validate() error {
	if cfg.CgroupRoot != "" && !filepath.IsAbs(cfg.CgroupRoot) {
		return fmt.Errorf("invalid --cgroup-root %q: want an absolute path to a cgroup2 directory, e.g. /sys/fs/cgroup, or empty to use the cgroup2 mount point", cfg.CgroupRoot)
	}
	if cfg.LBNodePortNATMapMax < 2 {
		return fmt.Errorf("invalid --lb-nodeport-nat-map-max %d: want at least 2 (each connection takes two entries)", cfg.LBNodePortNATMapMax)
	}
	return nil
}
