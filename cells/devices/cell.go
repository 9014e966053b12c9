package devices

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"
	"github.com/spf13/pflag"

	"github.com/cellium/cellium/cells/health"
)

// Cell provides the devices and node-addresses tables, kept current from
// netlink.
var Cell = cell.Module(
	"devices",
	"Network devices and node addresses from netlink",

	cell.Config(defaultConfig),
	cell.ProvidePrivate(newDeviceTable, newNodeAddressTable, job.Registry.NewGroup),
	cell.Provide(
		statedb.RWTable[*Device].ToTable,
		statedb.RWTable[*NodeAddress].ToTable,
		devicesKnown,
	),
	cell.Invoke(registerWatcher),
)

// Config is the devices cell's configuration.
type Config struct {
	// Devices are names or globs of the devices whose addresses are node
	// addresses; empty selects automatically.
	Devices []string
	// DevicesNetns is the network namespace to watch; empty is the agent's
	// own. Tests point it at a namespace they create.
	DevicesNetns string
}

var defaultConfig = Config{}

func (def Config) Flags(flags *pflag.FlagSet) {
	flags.StringSlice("devices", def.Devices,
		"Devices whose addresses are node addresses, as comma-separated names or globs (eth*); empty selects every device that is up, except loopback and the agent's own")
	flags.String("devices-netns", def.DevicesNetns,
		"Path of the network namespace whose devices to watch, such as /var/run/netns/test; empty is the agent's own (for tests)")
}

// checkNetnsPath refuses a --devices-netns that does not exist, at
// populate, instead of a watcher that retries it forever. (One stat: a
// namespace that goes away later is the watcher's retry's business.)
func checkNetnsPath(path string) error {
	if path == "" {
		return nil
	}
	if !filepath.IsAbs(path) {
		return fmt.Errorf("invalid --devices-netns %q: want an absolute path such as /var/run/netns/test", path)
	}
	if _, err := os.Stat(path); err != nil {
		return fmt.Errorf("invalid --devices-netns %q: %w; want the path of a network namespace such as /var/run/netns/test", path, err)
	}
	return nil
}

// EndpointHostPrefix begins the name of the host side of every
// endpoint's veth (endpointmanager.HostIfName).
const EndpointHostPrefix = "lxc"

// ownDevicePrefixes name the links the agent creates: its endpoints'
// veths and its own (cellium_*). Their addresses belong to pods or to the
// agent's datapath, never to the node.
var ownDevicePrefixes = []string{EndpointHostPrefix, "cellium"}

// selector decides which devices are selected.
type selector struct {
	patterns []string
}

func newSelector(cfg Config) (selector, error) {
	var patterns []string
	for _, p := range cfg.Devices {
		p = strings.TrimSpace(p)
		if p == "" {
			return selector{}, fmt.Errorf("invalid --devices %q: empty device name; want comma-separated names or globs such as eth0,ens*", strings.Join(cfg.Devices, ","))
		}
		if _, err := filepath.Match(p, ""); err != nil {
			return selector{}, fmt.Errorf("invalid --devices pattern %q: %w; want a name or a glob such as eth*", p, err)
		}
		patterns = append(patterns, p)
	}
	return selector{patterns: patterns}, nil
}

// selected reports whether the node's addresses may be taken from d: it is
// up, it is not loopback nor one of the agent's own veths, and it matches
// --devices if that is set. Loopback and the agent's veths stay out even when
// --devices names them: their addresses are not the node's.
func (s selector) selected(d *Device) bool {
	if !d.Up() || d.Flags&net.FlagLoopback != 0 || isOwnDevice(d.Name) {
		return false
	}
	if len(s.patterns) == 0 {
		return true
	}
	return s.matches(d.Name)
}

func (s selector) matches(name string) bool {
	return slices.ContainsFunc(s.patterns, func(p string) bool { return globMatch(p, name) })
}

// globMatch matches a --devices pattern, validated by newSelector.
func globMatch(pattern, name string) bool {
	ok, _ := filepath.Match(pattern, name)
	return ok
}

func isOwnDevice(name string) bool {
	return slices.ContainsFunc(ownDevicePrefixes, func(p string) bool { return strings.HasPrefix(name, p) })
}

// KnownBarrier is the readiness barrier that waits for the first netlink
// dump of devices and addresses.
const KnownBarrier = "devices-known"

func devicesKnown(db *statedb.DB, devices statedb.RWTable[*Device], addrs statedb.RWTable[*NodeAddress]) health.WaitOut {
	return health.TablesInitialized(KnownBarrier, db, devices, addrs)
}
