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
	cell.Provide(programsLive, programsAttacher),
	cell.Invoke(registerEndpointReconciler, registerProgramsHealth),

	cell.ProvidePrivate(newNodePortMaps, newDSRFallbacks, newNodePortPasses),
	cell.Provide(newNodePortMetrics, nodePortNATMap),
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
	// LBMode is how the NodePort programs reach a backend on another
	// node: LBModeSNAT or LBModeDSR.
	LBMode string
	// LBDSRMapMax is the size of the endpoint programs' DSR map: one
	// entry per DSR connection to a pod of this node.
	LBDSRMapMax uint32
}

// The values of --lb-mode.
const (
	// LBModeSNAT sends a remote backend the client's packets from the
	// node's address; the replies come back through the node.
	LBModeSNAT = "snat"
	// LBModeDSR sends them with the client's address and the frontend in
	// an IPv4 option; the backend's node answers the client directly.
	LBModeDSR = "dsr"
)

var defaultConfig = Config{EnableNodePort: true, LBNodePortNATMapMax: 1 << 18, LBMode: LBModeSNAT, LBDSRMapMax: 1 << 16}

func (def Config) Flags(flags *pflag.FlagSet) {
	flags.String("cgroup-root", def.CgroupRoot,
		"cgroup2 directory whose sockets, and those of the cgroups below it, are load-balanced; empty: the cgroup2 mount point from /proc/self/mountinfo")
	flags.Bool("enable-nodeport", def.EnableNodePort,
		"Attach the NodePort programs to the selected devices (--devices), which send outside clients of NodePort, ExternalIP and LoadBalancer frontends to local backends; false detaches them")
	flags.Uint32("lb-nodeport-nat-map-max", def.LBNodePortNATMapMax,
		"Entries of the NAT map of the NodePort programs on the node's devices; each connection from outside to a service takes two")
	flags.String("lb-mode", def.LBMode,
		"How a NodePort, ExternalIP or LoadBalancer connection from outside reaches a backend on another node: snat (from this node's address; replies come back through this node) or dsr (Direct Server Return: with the client's address and the frontend in an IPv4 option; the backend's node answers the client directly, and honours the option only with dsr). Local backends and externalTrafficPolicy: Local are the same in both")
	flags.Uint32("lb-dsr-map-max", def.LBDSRMapMax,
		"Entries of the DSR map of the endpoint programs (--lb-mode=dsr): one per connection from outside that another node's NodePort sent to a pod of this node")
}

func (cfg Config) validate() error {
	if cfg.CgroupRoot != "" && !filepath.IsAbs(cfg.CgroupRoot) {
		return fmt.Errorf("invalid --cgroup-root %q: want an absolute path to a cgroup2 directory, e.g. /sys/fs/cgroup, or empty to use the cgroup2 mount point", cfg.CgroupRoot)
	}
	if cfg.LBNodePortNATMapMax < 2 {
		return fmt.Errorf("invalid --lb-nodeport-nat-map-max %d: want at least 2 (each connection takes two entries)", cfg.LBNodePortNATMapMax)
	}
	if cfg.LBMode != LBModeSNAT && cfg.LBMode != LBModeDSR {
		return fmt.Errorf("invalid --lb-mode %q: want %s or %s", cfg.LBMode, LBModeSNAT, LBModeDSR)
	}
	if cfg.LBDSRMapMax < 1 {
		return fmt.Errorf("invalid --lb-dsr-map-max %d: want at least 1", cfg.LBDSRMapMax)
	}
	return nil
}

// lbModeConstant is --lb-mode as the NodePort programs' lb_mode
// (LB_MODE_*), and 1 for dsr as the endpoint programs' lb_dsr.
func (cfg Config) lbModeConstant() uint32 {
	if cfg.LBMode == LBModeDSR {
		return 1
	}
	return 0
}
