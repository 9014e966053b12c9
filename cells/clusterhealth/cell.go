package clusterhealth

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"
	"github.com/spf13/pflag"

	"github.com/cellium/cellium/cells/bpfmaps"
	"github.com/cellium/cellium/cells/daemon"
	"github.com/cellium/cellium/cells/endpointmanager"
	"github.com/cellium/cellium/cells/nodes"
	"github.com/cellium/cellium/pkg/netnsrun"
)

// Cell probes every node of the cluster, through the node's address and
// through its health endpoint, and serves /hello for the other nodes'
// probes; results in the table "node-health".
var Cell = cell.Module(
	"cluster-health",
	"Probes of every node and its health endpoint",

	cell.Config(defaultConfig),
	cell.ProvidePrivate(newTable, job.Registry.NewGroup, newProber),
	cell.Provide(statedb.RWTable[*NodeHealth].ToTable, apiRoutes, newMetrics, cleanup),
	cell.Invoke(newClusterHealth),
)

// Config is the cluster-health cell's configuration.
type Config struct {
	// ClusterHealthPort is where /hello is served, on the node and on its
	// health endpoint; 0 turns node health off.
	ClusterHealthPort uint16
	// ClusterHealthInterval is the probe interval of a small cluster.
	ClusterHealthInterval time.Duration
}

var defaultConfig = Config{ClusterHealthPort: 4240, ClusterHealthInterval: 10 * time.Second}

func (def Config) Flags(flags *pflag.FlagSet) {
	flags.Uint16("cluster-health-port", def.ClusterHealthPort,
		"TCP port of /hello on the node and on its health endpoint, which the other nodes probe; 0: no node health")
	flags.Duration("cluster-health-interval", def.ClusterHealthInterval,
		"Interval of the probe rounds of a small cluster; it grows with the cluster: max(this, nodes x 40ms)")
}

func (cfg Config) validate() error {
	if cfg.ClusterHealthInterval < 100*time.Millisecond {
		return fmt.Errorf("invalid --cluster-health-interval %s: want 100ms or more", cfg.ClusterHealthInterval)
	}
	return nil
}

// perNode is how much each node adds to the probe interval: a round's
// probes are spread over the interval, 25 nodes a second at most.
const perNode = 40 * time.Millisecond

// interval is the probe interval for a cluster of n nodes.
func interval(base time.Duration, n int) time.Duration {
	return max(base, time.Duration(n)*perNode)
}

// healthNetns is the file, in the state dir, that holds the health
// endpoint's network namespace.
const healthNetns = "health.netns"

// HealthContainerID names the health endpoint in the endpoints table.
const HealthContainerID = "cellium-node-health"

type params struct {
	cell.In

	Config    Config
	Log       *slog.Logger
	DB        *statedb.DB
	Table     statedb.RWTable[*NodeHealth]
	Nodes     statedb.Table[*nodes.Node]
	Endpoints statedb.Table[*endpointmanager.Endpoint]
	Manager   *endpointmanager.Manager
	Paths     daemon.Paths
	NodeName  daemon.NodeName
	Prober    *prober
	Jobs      job.Group
	Health    cell.Health
}

func newProber(cfg Config, log *slog.Logger, db *statedb.DB, tbl statedb.RWTable[*NodeHealth], nodeTbl statedb.Table[*nodes.Node]) *prober {
	return &prober{log: log, db: db, tbl: tbl, nodes: nodeTbl, port: cfg.ClusterHealthPort, base: cfg.ClusterHealthInterval}
}

func newClusterHealth(p params) error {
	if err := p.Config.validate(); err != nil {
		return err
	}
	if p.Config.ClusterHealthPort == 0 {
		p.Health.OK("Disabled (--cluster-health-port=0)")
		return nil
	}
	ep := &healthEndpoint{log: p.Log, db: p.DB, endpoints: p.Endpoints, mgr: p.Manager, port: p.Config.ClusterHealthPort,
		netnsPath: p.Paths.StateDir + "/" + healthNetns, node: string(p.NodeName)}
	pr := p.Prober
	p.Jobs.Add(
		job.OneShot("serve-node", func(ctx context.Context, h cell.Health) error {
			return serveNode(ctx, h, p.Log, p.Config.ClusterHealthPort, string(p.NodeName))
		}, job.WithRetry(-1, &job.ExponentialBackoff{Min: time.Second, Max: time.Minute})),
		job.OneShot("health-endpoint", ep.run),
		job.OneShot("probe", pr.run),
	)
	return nil
}

// cleanup removes the health endpoint's namespace for `agent cleanup`
// (its endpoint goes with it: the next start finds its namespace gone).
func cleanup(paths daemon.Paths) bpfmaps.CleanupOut {
	path := paths.StateDir + "/" + healthNetns
	return bpfmaps.CleanupOut{Cleanup: bpfmaps.Cleanup{Name: "cluster-health", Remove: func() ([]string, error) {
		if !netnsrun.Exists(path) {
			return nil, nil
		}
		if err := netnsrun.Remove(path); err != nil {
			return nil, err
		}
		return []string{"removed the health endpoint's network namespace " + path}, nil
	}}}
}
