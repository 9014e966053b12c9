package endpointmanager

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"
	"github.com/spf13/pflag"
	"github.com/vishvananda/netlink"

	"github.com/cellium/cellium/cells/daemon"
	"github.com/cellium/cellium/cells/devices"
	"github.com/cellium/cellium/cells/health"
	idalloc "github.com/cellium/cellium/cells/identity"
	"github.com/cellium/cellium/cells/internal/drift"
	"github.com/cellium/cellium/cells/internal/faultpoint"
	"github.com/cellium/cellium/cells/internal/tables"
	"github.com/cellium/cellium/cells/ipam"
	"github.com/cellium/cellium/cells/k8sclient"
	"github.com/cellium/cellium/pkg/kinderr"
)

// Cell provides the endpoints table, the Manager that creates, deletes and
// restores endpoints, the /v1/endpoints routes, and writes the CNI
// configuration.
var Cell = cell.Module(
	"endpoint-manager",
	"Pod endpoints with state files restore and the CNI API",

	cell.Config(defaultConfig),
	cell.ProvidePrivate(job.Registry.NewGroup, newRepairs),
	cell.Provide(NewTable, statedb.RWTable[*Endpoint].ToTable, newManager, apiRoutes, repairMetrics, newLiveMetrics),
	cell.Invoke(writeCNIConfig, registerHostRouteRepair),
)

// Config is the endpoint-manager cell's configuration.
type Config struct {
	// CNIConfDir is where the agent writes its CNI configuration.
	CNIConfDir string
	// EndpointMTU is the MTU of both ends of every endpoint's veth pair.
	EndpointMTU int
	// EndpointRestoreLiveReport is how long a restored endpoint on a
	// remade veth pair may wait to be live in the datapath before the
	// health row endpoint-manager.restore-live names it (see
	// routeRestored); it keeps waiting.
	EndpointRestoreLiveReport time.Duration
	// EndpointTestCrashAt makes the agent kill itself at a step of
	// endpoint creation. For crash tests only.
	EndpointTestCrashAt string
}

var defaultConfig = Config{
	CNIConfDir:                "/etc/cni/net.d",
	EndpointMTU:               0,
	EndpointRestoreLiveReport: 30 * time.Second,
}

// Steps of endpoint creation where --endpoint-test-crash-at can kill the
// agent.
const (
	// CrashIPAMAllocated: the addresses are allocated and on disk; nothing
	// else is.
	CrashIPAMAllocated = "ipam-allocated"
	// CrashVethCreated: the state file says "creating" and the veth pair
	// exists, without addresses or routes.
	CrashVethCreated = "veth-created"
	// CrashEndpointPersisted: the endpoint is complete and its state file
	// says "ready", but the CNI ADD has not been answered.
	CrashEndpointPersisted = "endpoint-persisted"
)

var crashSteps = []string{CrashIPAMAllocated, CrashVethCreated, CrashEndpointPersisted}

func (def Config) Flags(flags *pflag.FlagSet) {
	flags.String("cni-conf-dir", def.CNIConfDir, "Directory the agent writes its CNI configuration (05-cellium.conflist) to once it is ready; empty: do not write it")
	flags.Int("endpoint-mtu", def.EndpointMTU,
		"MTU of the endpoints' veth pairs, set on restored ones too; 0: the lowest MTU of the devices holding node addresses (1500 without any), less the tunnel's overhead with --routing-mode=tunnel, given to new veth pairs only (a restart leaves running pods' MTU as it is)")
	flags.Duration("endpoint-restore-live-report", def.EndpointRestoreLiveReport,
		"How long a restored endpoint whose veth pair was made again may wait to be live in the datapath (programs attached, policy in the maps) before the health row endpoint-manager.restore-live names it; it stays unrouted and keeps waiting")
	flags.String("endpoint-test-crash-at", def.EndpointTestCrashAt,
		"TEST ONLY: kill the agent with SIGKILL at this step of every endpoint creation ("+strings.Join(crashSteps, ", ")+")")
	flags.MarkHidden("endpoint-test-crash-at")
}

func (cfg Config) validate() error {
	if cfg.EndpointMTU != 0 && (cfg.EndpointMTU < 1280 || cfg.EndpointMTU > 65535) {
		return fmt.Errorf("invalid --endpoint-mtu %d: want 1280 (the IPv6 minimum) to 65535, or 0 for automatic", cfg.EndpointMTU)
	}
	if cfg.EndpointRestoreLiveReport <= 0 {
		return fmt.Errorf("invalid --endpoint-restore-live-report %v: want a positive duration, e.g. 30s", cfg.EndpointRestoreLiveReport)
	}
	if cfg.EndpointTestCrashAt != "" && !slices.Contains(crashSteps, cfg.EndpointTestCrashAt) {
		return fmt.Errorf("invalid --endpoint-test-crash-at %q: want one of %s", cfg.EndpointTestCrashAt, strings.Join(crashSteps, ", "))
	}
	if cfg.CNIConfDir != "" && !strings.HasPrefix(cfg.CNIConfDir, "/") {
		return fmt.Errorf("invalid --cni-conf-dir %q: must be an absolute path, e.g. /etc/cni/net.d", cfg.CNIConfDir)
	}
	return nil
}

// Errors of the Manager, for callers that answer with a status. Test them
// with errors.Is; the message of the returned error says what was wrong.
var (
	ErrInvalid   = errors.New("invalid endpoint request")
	ErrExists    = errors.New("endpoint exists")
	ErrNotFound  = errors.New("endpoint not found")
	ErrNotReady  = errors.New("endpoint manager not ready (restoring endpoints, or the node's pods not listed yet)")
	ErrExhausted = errors.New("no free endpoint ID")
	ErrBusy      = errors.New("endpoint manager busy")
)

// errorf is an error of one of the kinds above with its own message.
var errorf = kinderr.Errorf

// restoreName names the restore wherever something waits for it: the
// readiness barrier, the IPAM restorer and the endpoints table initializer.
const restoreName = "endpoint-restore"

// RestoreBarrier is the readiness barrier of the restore.
const RestoreBarrier = restoreName

type params struct {
	cell.In

	// Programs attaches a new endpoint's programs within its creation;
	// the loader provides it, and none in tests of this cell alone. First
	// of the fields: its programs' start hook loads them before the jobs
	// (the restore, after which ADDs are served) start.
	Programs ProgramsAttacher `optional:"true"`

	Config Config
	Log    *slog.Logger
	DB     *statedb.DB
	Table  statedb.RWTable[*Endpoint]
	IPAM   *ipam.IPAM
	// Identities gives endpoints their security identities.
	Identities *idalloc.Allocator
	Paths      daemon.Paths
	Readiness  *health.Readiness
	Lifecycle  cell.Lifecycle
	Jobs       job.Group
	Health     cell.Health
	NodeName   daemon.NodeName
	// Routing, Devices and NodeAddresses make the automatic MTU; without
	// them (tests of this cell alone) it is 1500.
	Overhead      TunnelOverhead                      `optional:"true"`
	Devices       statedb.Table[*devices.Device]      `optional:"true"`
	NodeAddresses statedb.Table[*devices.NodeAddress] `optional:"true"`
	// Clientset gives endpoints their pods' labels, service accounts and
	// namespaces' labels; without it they have none.
	Clientset k8sclient.Clientset `optional:"true"`
	// Live are what a new endpoint waits for before it is routed and
	// ready (see LiveCondition); Policy shows endpoints' policy. Both come
	// from other cells, and from none in tests of this cell alone.
	Live        []LiveCondition `group:"endpoint-live"`
	Policy      PolicyView      `optional:"true"`
	LiveMetrics *liveMetrics
}

// ProgramsAttacher attaches the datapath's programs to the host side of a
// new endpoint, which is not up yet, as a step of its creation: the loader
// owns the programs and their attachment (its reconciler of the endpoints
// table attaches them to restored endpoints, retries failures and detaches
// them), and gives the endpoint manager this step so that an ADD does not
// wait for the reconciler's rounds, one goroutine for the whole node. An
// endpoint whose programs it attached enters the table with its Programs
// status done, which the reconciler leaves alone; when it fails, the
// status is pending and the reconciler does it.
//
// h is the socket to make the filters through: the creations' shared one
// (hostNetlink), or for callers without one a zero Handle, a socket per
// request.
type ProgramsAttacher interface {
	AttachPrograms(h *netlink.Handle, ep *Endpoint) error
}

// Manager creates, deletes and restores endpoints. See the package
// documentation.
type Manager struct {
	log    *slog.Logger
	db     *statedb.DB
	tbl    statedb.RWTable[*Endpoint]
	ipam   *ipam.IPAM
	ids    *idalloc.Allocator
	states *stateStore
	plumb  *plumbing
	health cell.Health
	// pods is nil without a Kubernetes clientset.
	pods *podWatcher
	// crash is --endpoint-test-crash-at.
	crash faultpoint.Step

	ipamRestored  func()
	tableRestored func(statedb.WriteTxn)
	ready         func()

	// locks serialize the creation, deletion and identity changes of each
	// container, and give the restore the whole manager: see opLocks.
	// Nothing done with them held touches a path a caller gave (a
	// CNI_NETNS is opened before), and waiting for them ends with the
	// waiter's context.
	locks *opLocks
	// idMu guards reservedIDs: the endpoint IDs of creations not yet in
	// the table, which no other creation may take.
	idMu        sync.Mutex
	reservedIDs map[uint16]bool
	// problemsMu guards moved, orphans, outside and problems.
	problemsMu sync.Mutex
	// moved are the state files the restore moved aside, and orphans the
	// containers it keeps without state, by container ID: problems is the
	// health scope that shows them (nil without any).
	moved   []movedFile
	orphans map[string]orphan
	// orphanSkips counts the orphans-gone rounds in a row that found the
	// manager busy (that job's only).
	orphanSkips int
	// outside says, by container ID, which restored endpoints have
	// addresses in no pod pool.
	outside  map[string]string
	problems cell.Health
	// stalledMu guards stalled, the restored endpoints waiting too long to
	// be live by container ID, and stalledHealth, the scope showing them
	// (see reportStalled).
	stalledMu     sync.Mutex
	stalled       map[string]string
	stalledHealth cell.Health
	// liveReport is --endpoint-restore-live-report.
	liveReport time.Duration
	// repairs counts the host routes put back (see hostroutes.go).
	repairs *drift.Repairs
	// live are the conditions a creation waits for (see waitLive); policy
	// is nil without a policy cell.
	live        []LiveCondition
	policy      PolicyView
	liveMetrics *liveMetrics
	// programs is nil without the loader.
	programs ProgramsAttacher
	// devices and nodeAddrs are what the automatic MTU reads; nil
	// without them, or with --endpoint-mtu (see waitDevices).
	devices   statedb.Table[*devices.Device]
	nodeAddrs statedb.Table[*devices.NodeAddress]
}

func newManager(p params) (*Manager, error) {
	if err := p.Config.validate(); err != nil {
		return nil, err
	}
	m := &Manager{
		log:    p.Log,
		db:     p.DB,
		tbl:    p.Table,
		ipam:   p.IPAM,
		ids:    p.Identities,
		states: newStateStore(p.Log, p.Paths.StateDir),
		health: p.Health,
		crash:  faultpoint.AtStep(p.Log, p.Config.EndpointTestCrashAt),
		locks:  newOpLocks(),

		liveReport: p.Config.EndpointRestoreLiveReport,

		live: p.Live, policy: p.Policy, liveMetrics: p.LiveMetrics, programs: p.Programs,

		reservedIDs: map[uint16]bool{},
	}
	if p.Config.EndpointMTU == 0 {
		m.devices, m.nodeAddrs = p.Devices, p.NodeAddresses
	}
	m.plumb = &plumbing{mtu: func() int { return m.mtu(p.Config.EndpointMTU, p.Overhead, p.Devices, p.NodeAddresses) },
		fixedMTU: p.Config.EndpointMTU != 0, vethCreated: func() { m.crash.At(CrashVethCreated) }}
	// The creations' host-side netlink sockets, opened by the first.
	p.Lifecycle.Append(cell.Hook{OnStop: func(cell.HookContext) error { m.plumb.host.close(); return nil }})

	// The restore gates three things: allocation of addresses for new
	// endpoints, readers of the endpoints table (the endpoint map prunes
	// only after it), and the agent's readiness.
	m.ipamRestored = p.IPAM.RegisterRestorer(restoreName)
	txn := p.DB.WriteTxn(p.Table)
	m.tableRestored = p.Table.RegisterInitializer(txn, restoreName)
	txn.Commit()
	m.ready = p.Readiness.Add(restoreName)

	// The job is added here, after the IPAM's start hook was appended (this
	// constructor takes the IPAM): it starts once the IPAM has loaded its
	// allocations, which it claims.
	p.Jobs.Add(job.OneShot("restore", m.restore,
		job.WithRetry(-1, &job.ExponentialBackoff{Min: 100 * time.Millisecond, Max: 30 * time.Second})))
	p.Jobs.Add(job.Timer("resolve-identities", m.resolveIdentities, resolveInterval))
	p.Jobs.Add(job.Timer("orphans-gone", m.releaseGoneOrphans, orphanInterval))
	if p.Clientset != nil {
		pods, err := newPodWatcher(p.Clientset, string(p.NodeName), m)
		if err != nil {
			return nil, err
		}
		m.pods = pods
		p.Jobs.Add(job.OneShot("pod-labels", pods.run))
	}
	return m, nil
}

// waitRestored waits until the restore is done, as long as ctx allows.
func (m *Manager) waitRestored(ctx context.Context) error {
	if err := tables.WaitInitialized(ctx, m.db, m.tbl); err != nil {
		return errorf(ErrNotReady, "the agent is restoring its endpoints; try again: %v", err)
	}
	return nil
}

// waitDevices waits, as long as ctx allows, until the node's devices and
// addresses are listed, when the MTU is automatic and the agent has those
// tables: the MTU is read from them, and before their first listing it
// would be the 1500 fallback, which the restore would set on every
// running pod's veth pair and a creation give a new one.
func (m *Manager) waitDevices(ctx context.Context) error {
	if m.devices == nil || m.nodeAddrs == nil {
		return nil
	}
	err := tables.WaitInitialized(ctx, m.db, m.devices)
	if err == nil {
		err = tables.WaitInitialized(ctx, m.db, m.nodeAddrs)
	}
	if err != nil {
		return errorf(ErrNotReady, "the node's devices are not listed yet, so the endpoints' MTU is not known; try again: %v", err)
	}
	return nil
}

// devicesListed says whether waitDevices would return at once.
func (m *Manager) devicesListed() bool {
	if m.devices == nil || m.nodeAddrs == nil {
		return true
	}
	txn := m.db.ReadTxn()
	devs, _ := m.devices.Initialized(txn)
	addrs, _ := m.nodeAddrs.Initialized(txn)
	return devs && addrs
}

// TunnelOverhead is what the routing mode's encapsulation adds to a
// packet over an IPv4 and an IPv6 underlay; the routing cell provides it.
type TunnelOverhead struct {
	IPv4, IPv6 int
}

func (o TunnelOverhead) of(v6 bool) int {
	if v6 {
		return o.IPv6
	}
	return o.IPv4
}

// mtu is the MTU of new endpoints: --endpoint-mtu, or the lowest MTU of the
// devices holding node addresses (1500 without any) less what the routing
// mode's encapsulation adds, so that a pod's full-size packet still fits
// once encapsulated.
func (m *Manager) mtu(configured int, overhead TunnelOverhead, devs statedb.Table[*devices.Device], addrs statedb.Table[*devices.NodeAddress]) int {
	if configured != 0 {
		return configured
	}
	if devs == nil || addrs == nil {
		return 1500 - overhead.of(false)
	}
	txn := m.db.ReadTxn()
	base, v6only := 0, true
	for a := range addrs.All(txn) {
		v6only = v6only && a.Addr.Is6()
		if d, _, found := devs.Get(txn, devices.DeviceName.Query(a.Device)); found && (base == 0 || d.MTU < base) {
			base = d.MTU
		}
	}
	if base == 0 {
		base, v6only = 1500, false
	}
	return base - overhead.of(v6only)
}
