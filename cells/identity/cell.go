package identity

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"
	"github.com/spf13/pflag"

	"github.com/cellium/cellium/cells/daemon"
	"github.com/cellium/cellium/cells/internal/kvsync"
	"github.com/cellium/cellium/cells/k8sclient"
	"github.com/cellium/cellium/cells/kvstore"
	"github.com/cellium/cellium/pkg/identity"
)

// Cell provides the Allocator of security identities and the table
// "identities".
var Cell = cell.Module(
	"identity",
	"Security identities of label sets node-local kvstore or Kubernetes CRDs",

	cell.Config(defaultConfig),
	cell.ProvidePrivate(NewTable, job.Registry.NewGroup, newRepairs),
	cell.Provide(newAllocator, statedb.RWTable[*Identity].ToTable, apiRoutes, newMetrics),
)

// Config is the identity cell's configuration.
type Config struct {
	// Labels filters the pod labels that make an identity.
	Labels []string
	// IdentityGCInterval is how often an agent collects the cluster
	// identities nobody uses (kvstore and crd modes).
	IdentityGCInterval time.Duration
	// IdentityAllocationMode is where cluster identities live: auto,
	// kvstore, crd or local (see resolveMode).
	IdentityAllocationMode string
}

var defaultConfig = Config{Labels: defaultLabelFilter, IdentityGCInterval: 15 * time.Minute, IdentityAllocationMode: modeAuto}

func (def Config) Flags(flags *pflag.FlagSet) {
	flags.StringSlice("labels", def.Labels,
		"Which pod labels make a pod's identity: label keys or key prefixes ending in *; a leading ! drops what matches; when any pattern has no !, only labels matching one are kept. Replaces the default list")
	flags.Duration("identity-gc-interval", def.IdentityGCInterval,
		"kvstore and crd modes: how often one agent (elected through a kvstore lock or a Lease) deletes cluster identities that no node has used for two rounds")
	flags.String("identity-allocation-mode", def.IdentityAllocationMode,
		"Where identities live: kvstore (cluster-wide through --kvstore), crd (cluster-wide as CelliumIdentity objects in the Kubernetes API), local (this node only), or auto: kvstore with --kvstore, crd with a real API server, local otherwise")
}

// checkpointFile holds the node-local identities in the state dir.
const checkpointFile = "identities.json"

type params struct {
	cell.In

	Config  Config
	Log     *slog.Logger
	DB      *statedb.DB
	Table   statedb.RWTable[*Identity]
	KVStore kvstore.Client
	// Clientset is the Kubernetes API; absent in hives without it.
	Clientset k8sclient.Clientset `optional:"true"`
	Paths     daemon.Paths
	NodeName  daemon.NodeName
	Repairs   *kvsync.Repairs
	Lifecycle cell.Lifecycle
	Jobs      job.Group
	Health    cell.Health
}

func newAllocator(p params) (*Allocator, error) {
	filter, err := parseLabelFilter(p.Config.Labels)
	if err != nil {
		return nil, err
	}
	if p.Config.IdentityGCInterval < time.Second {
		return nil, fmt.Errorf("invalid --identity-gc-interval %s: want 1s or more", p.Config.IdentityGCInterval)
	}
	mode, err := resolveMode(p.Config.IdentityAllocationMode, p.KVStore, p.Clientset)
	if err != nil {
		return nil, err
	}
	a := &Allocator{
		log: p.Log, db: p.DB, tbl: p.Table, filter: filter, kv: p.KVStore, mode: mode, gcInterval: p.Config.IdentityGCInterval,
		node: string(p.NodeName), path: filepath.Join(p.Paths.StateDir, checkpointFile), health: p.Health, repairs: p.Repairs,
		used: map[string]*usedIdentity{}, refsChanged: make(chan struct{}, 1),
		writeBacks: writeBacks{pending: map[identity.NumericIdentity]*usedIdentity{}, wake: make(chan struct{}, 1)},
	}
	p.Lifecycle.Append(cell.Hook{OnStart: a.start})
	p.Jobs.Add(job.OneShot("identity-refs", a.publishRefs))
	a.setBackendState(stateCheckpointed)
	switch mode {
	case ModeCRD:
		if err := a.newCRDBackend(p); err != nil {
			return nil, err
		}
	case ModeKVStore:
		a.setBackendState(stateListing)
		txn := p.DB.WriteTxn(p.Table)
		listed := p.Table.RegisterInitializer(txn, "kvstore-identities")
		txn.Commit()
		p.Jobs.Add(
			job.OneShot("watch-identities", func(ctx context.Context, h cell.Health) error {
				return a.watch(ctx, h, listed)
			}),
			job.OneShot("identity-write-back", a.runWriteBacks),
			job.Timer("identity-gc", a.gcRound, p.Config.IdentityGCInterval),
		)
	}
	return a, nil
}

// start writes the reserved identities and, without the kvstore, loads the
// checkpoint of the local ones.
func (a *Allocator) start(cell.HookContext) error {
	txn := a.db.WriteTxn(a.tbl)
	defer txn.Abort()
	for _, row := range reservedRows() {
		if _, _, err := a.tbl.Insert(txn, row); err != nil {
			return err
		}
	}
	if a.mode == ModeLocal {
		restored, err := a.loadCheckpoint()
		if err != nil {
			return err
		}
		for _, id := range restored {
			a.used[id.Labels.String()] = newUsedIdentity(id.ID, id.Labels, SourceLocal, 0)
		}
		if len(restored) > 0 {
			a.log.Info("Restored node-local identities", "identities", len(restored), "file", a.path)
		}
		a.health.OK(fmt.Sprintf("Node-local identities (no kvstore), %d restored", len(restored)))
	}
	if a.mode == ModeCRD {
		a.health.OK("Cluster-wide identities as CelliumIdentity objects (--identity-allocation-mode=crd)")
	}
	txn.Commit()
	return nil
}
