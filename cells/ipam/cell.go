package ipam

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"
	"github.com/spf13/pflag"

	"github.com/cellium/cellium/cells/daemon"
	"github.com/cellium/cellium/cells/health"
	"github.com/cellium/cellium/cells/internal/tables"
	"github.com/cellium/cellium/cells/k8sclient"
	"github.com/cellium/cellium/pkg/kinderr"
)

// Cell provides the IPAM: the pod address pools, the table "ipam" of
// allocations, and the /v1/ipam routes.
var Cell = cell.Module(
	"ipam",
	"Pod address pools with allocation release and restore",

	cell.Config(defaultConfig),
	cell.ProvidePrivate(newTable, job.Registry.NewGroup),
	cell.Provide(newIPAM, statedb.RWTable[*Allocation].ToTable, apiRoutes, poolsKnown),
	cell.Invoke(requireIPAM),
)

// requireIPAM validates the flags and loads the allocations even when no
// cell allocates.
func requireIPAM(*IPAM) {}

// Modes of --ipam.
const (
	ModeStatic     = "static"
	ModeKubernetes = "kubernetes"
)

// Config is the ipam cell's configuration.
type Config struct {
	// IPAM is where the pod CIDRs come from: static (--pod-cidr) or
	// kubernetes (the Node object's spec.podCIDRs).
	IPAM string
	// PodCIDR are the static pod CIDRs, at most one per family.
	PodCIDR []string
	// IPAMLeakGrace is how long an address allocated before a restart
	// stays reserved for an owner that did not become an endpoint.
	IPAMLeakGrace time.Duration
}

var defaultConfig = Config{
	IPAM:          ModeStatic,
	PodCIDR:       []string{"10.244.0.0/24"},
	IPAMLeakGrace: 5 * time.Minute,
}

func (def Config) Flags(flags *pflag.FlagSet) {
	flags.String("ipam", def.IPAM, "Where pod CIDRs come from: static (--pod-cidr) or kubernetes (the Node's spec.podCIDRs)")
	flags.StringSlice("pod-cidr", def.PodCIDR, "Pod CIDRs for --ipam=static, at most one IPv4 and one IPv6, e.g. 10.244.0.0/24,fd00:10:244::/112 (ignored with --ipam=kubernetes)")
	flags.Duration("ipam-leak-grace", def.IPAMLeakGrace,
		"After a restart, how long to keep an address allocated for a container that did not become an endpoint (a CNI ADD that died half way) before releasing it")
}

// Errors of allocations, for callers that answer with a status. Test them
// with errors.Is; the message of the returned error says what was wrong.
var (
	ErrInvalid   = errors.New("invalid IPAM request")
	ErrNotReady  = errors.New("IPAM not ready")
	ErrExhausted = errors.New("pool exhausted")
	ErrInUse     = errors.New("address in use")
	ErrNotFound  = errors.New("address not allocated")
)

// errorf is an error of one of the kinds above with its own message.
var errorf = kinderr.Errorf

// Table initializers that gate allocation.
const (
	// initState is done once the allocations on disk are in the table.
	initState = "ipam-state"
)

type params struct {
	cell.In

	Config    Config
	Log       *slog.Logger
	DB        *statedb.DB
	Table     statedb.RWTable[*Allocation]
	Paths     daemon.Paths
	NodeName  daemon.NodeName
	Lifecycle cell.Lifecycle
	Jobs      job.Group
	Health    cell.Health
	// Clientset is needed by --ipam=kubernetes only.
	Clientset k8sclient.Clientset `optional:"true"`
}

// IPAM allocates pod addresses. See the package documentation.
type IPAM struct {
	log    *slog.Logger
	db     *statedb.DB
	tbl    statedb.RWTable[*Allocation]
	store  *store
	mode   string
	grace  time.Duration
	health cell.Health

	stateLoaded   func(statedb.WriteTxn)
	podCIDRsKnown func(statedb.WriteTxn)
	clientset     k8sclient.Clientset
	nodeName      string

	mu      sync.Mutex
	started bool
	loaded  bool
	pools   []Pool
	// cursor is where the search for a free address of a family starts:
	// after the last one handed out, so released addresses are not reused
	// at once.
	cursor map[Family]netip.Addr
	// holder, when set, holds released addresses (HoldReleases).
	holder string
}

func newIPAM(p params) (*IPAM, error) {
	if p.Config.IPAMLeakGrace < 0 {
		return nil, fmt.Errorf("invalid --ipam-leak-grace %s: must not be negative", p.Config.IPAMLeakGrace)
	}
	i := &IPAM{
		log:       p.Log,
		db:        p.DB,
		tbl:       p.Table,
		store:     newStore(p.Log, p.Paths.StateDir),
		mode:      p.Config.IPAM,
		grace:     p.Config.IPAMLeakGrace,
		health:    p.Health,
		cursor:    map[Family]netip.Addr{},
		clientset: p.Clientset,
		nodeName:  string(p.NodeName),
	}
	txn := p.DB.WriteTxn(p.Table)
	defer txn.Abort()
	switch p.Config.IPAM {
	case ModeStatic:
		pools, err := parsePools("--pod-cidr", p.Config.PodCIDR)
		if err != nil {
			return nil, err
		}
		i.pools = pools
	case ModeKubernetes:
		if p.Clientset == nil {
			return nil, fmt.Errorf("--ipam=%s needs a Kubernetes clientset, and the k8s-client cell is not in the agent", ModeKubernetes)
		}
		i.podCIDRsKnown = p.Table.RegisterInitializer(txn, initPodCIDRs)
	default:
		return nil, fmt.Errorf("invalid --ipam %q: want %s or %s", p.Config.IPAM, ModeStatic, ModeKubernetes)
	}
	i.stateLoaded = p.Table.RegisterInitializer(txn, initState)
	txn.Commit()

	// The start hook before the jobs: they need what it loads.
	p.Lifecycle.Append(cell.Hook{OnStart: i.start})
	if p.Config.IPAM == ModeKubernetes {
		p.Jobs.Add(job.OneShot("node-pod-cidrs", i.nodePodCIDRs,
			job.WithRetry(-1, &job.ExponentialBackoff{Min: time.Second, Max: time.Minute})))
	}
	p.Jobs.Add(job.OneShot("release-unclaimed", i.releaseUnclaimed))
	return i, nil
}

// parsePools parses pod CIDRs, at most one per family; what names where
// they come from in errors.
func parsePools(what string, cidrs []string) ([]Pool, error) {
	if len(cidrs) == 0 {
		return nil, fmt.Errorf("invalid %s: no pod CIDR; want one or two, e.g. 10.244.0.0/24", what)
	}
	var pools []Pool
	for _, cidr := range cidrs {
		pool, err := ParsePool(what, strings.TrimSpace(cidr))
		if err != nil {
			return nil, err
		}
		if slices.ContainsFunc(pools, func(p Pool) bool { return p.Family == pool.Family }) {
			return nil, fmt.Errorf("invalid %s %q: more than one %s CIDR; give at most one per family", what, strings.Join(cidrs, ","), pool.Family)
		}
		pools = append(pools, pool)
	}
	return pools, nil
}

// RegisterRestorer makes allocation wait for a restorer: a cell that
// reserves addresses which were in use before the agent restarted (with
// [IPAM.Claim]) calls it from its constructor and calls done once it has
// claimed every one of them. Until then [IPAM.Allocate] waits, so a new
// owner never gets an address that a restored one still holds.
func (i *IPAM) RegisterRestorer(name string) (done func()) {
	i.mu.Lock()
	started := i.started
	i.mu.Unlock()
	if started {
		panic(fmt.Sprintf("ipam: restorer %q registered after start: call RegisterRestorer from a constructor", name))
	}
	txn := i.db.WriteTxn(i.tbl)
	markDone := i.tbl.RegisterInitializer(txn, name)
	txn.Commit()
	return func() {
		txn := i.db.WriteTxn(i.tbl)
		markDone(txn)
		txn.Commit()
	}
}

// start loads the allocations on disk and reserves the router addresses.
func (i *IPAM) start(cell.HookContext) error {
	i.mu.Lock()
	i.started = true
	i.mu.Unlock()

	restored, err := i.store.load()
	if err != nil {
		return fmt.Errorf("--state-dir: %w", err)
	}
	txn := i.db.WriteTxn(i.tbl)
	defer txn.Abort()
	for _, a := range restored {
		if _, _, err := i.tbl.Insert(txn, a); err != nil {
			return err
		}
	}
	i.mu.Lock()
	pools := slices.Clone(i.pools)
	i.mu.Unlock()
	if err := i.reserveRouters(txn, pools); err != nil {
		return err
	}
	i.stateLoaded(txn)
	txn.Commit()

	i.mu.Lock()
	i.loaded = true
	i.mu.Unlock()
	unclaimed := 0
	for _, a := range restored {
		if a.State == Unclaimed {
			unclaimed++
		}
	}
	i.log.Info("IPAM ready to restore", "mode", i.mode, "pools", poolsString(pools),
		"restored-allocations", len(restored), "unclaimed", unclaimed)
	if len(pools) > 0 {
		i.health.OK("Pools " + poolsString(pools))
	}
	if len(i.store.moved) > 0 {
		// Shown until the agent restarts: the addresses of these files are
		// not reserved, and someone should look at them.
		i.health.NewScope("state").Degraded(
			fmt.Sprintf("%d IPAM state file(s) moved aside; their addresses are not reserved", len(i.store.moved)),
			errors.New(strings.Join(i.store.moved, "; ")))
	}
	return nil
}

// reserveRouters inserts the router address of each pool. An allocation on
// disk that holds a router address cannot be right: it is dropped.
func (i *IPAM) reserveRouters(txn statedb.WriteTxn, pools []Pool) error {
	for _, p := range pools {
		if old, _, found := i.tbl.Get(txn, AllocationIP.Query(p.Router)); found && old.State != Router {
			i.log.Error("An allocation on disk holds the router address of a pool; dropping it",
				"ip", p.Router, "owner", old.Owner, "pool", p.CIDR)
			if err := i.store.remove(p.Router); err != nil {
				return err
			}
		}
		if _, _, err := i.tbl.Insert(txn, &Allocation{IP: p.Router, Owner: RouterOwner, State: Router, Since: time.Now()}); err != nil {
			return err
		}
	}
	return nil
}

func poolsString(pools []Pool) string {
	var parts []string
	for _, p := range pools {
		parts = append(parts, fmt.Sprintf("%s (router %s)", p.CIDR, p.Router))
	}
	return strings.Join(parts, ", ")
}

// WaitReady waits until allocation is served: the pools are known and every
// restorer is done. The error, when ctx ends first, names what is pending.
func (i *IPAM) WaitReady(ctx context.Context) error {
	if err := tables.WaitInitialized(ctx, i.db, i.tbl); err != nil {
		return errorf(ErrNotReady, "IPAM is not ready yet, %v", err)
	}
	return nil
}

// Pools are the pod address pools, one per family. They are known once
// WaitReady returns.
func (i *IPAM) Pools() []Pool {
	i.mu.Lock()
	defer i.mu.Unlock()
	return slices.Clone(i.pools)
}

// releaseUnclaimed releases, once the grace period after the restore has
// passed, the addresses allocated before the restart whose owners no
// restorer claimed: what a CNI ADD that died half way left behind.
func (i *IPAM) releaseUnclaimed(ctx context.Context, health cell.Health) error {
	if err := i.WaitReady(ctx); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	if _, _, found := i.tbl.Get(i.db.ReadTxn(), AllocationState.Query(Unclaimed)); !found {
		return nil
	}
	health.OK(fmt.Sprintf("Releasing unclaimed addresses in %s", i.grace))
	select {
	case <-ctx.Done():
		return nil
	case <-time.After(i.grace):
	}

	wtxn := i.db.WriteTxn(i.tbl)
	defer wtxn.Abort()
	for a := range i.tbl.List(wtxn, AllocationState.Query(Unclaimed)) {
		if err := i.store.remove(a.IP); err != nil {
			return err
		}
		if _, _, err := i.tbl.Delete(wtxn, a); err != nil {
			return err
		}
		i.log.Warn("Released an address allocated before the restart for an owner that never became an endpoint",
			"ip", a.IP, "owner", a.Owner, "allocated", a.Since, "grace", i.grace)
	}
	wtxn.Commit()
	return nil
}

// PoolsBarrier is the readiness barrier that waits for the pod CIDRs and
// the allocations restored from the state dir.
const PoolsBarrier = "ipam-pools"

func poolsKnown(db *statedb.DB, tbl statedb.RWTable[*Allocation]) health.WaitOut {
	return health.TablesInitialized(PoolsBarrier, db, tbl)
}
