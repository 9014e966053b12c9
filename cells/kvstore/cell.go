package kvstore

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	grpcbackoff "google.golang.org/grpc/backoff"

	"github.com/cellium/cellium/cells/api"
	"github.com/cellium/cellium/pkg/apiv1"
)

// Cell provides the Client: etcd with --kvstore=etcd, a disabled client
// otherwise.
var Cell = cell.Module(
	"kvstore",
	"Shared etcd store for identities the ipcache and nodes",

	cell.Config(defaultConfig),
	cell.ProvidePrivate(job.Registry.NewGroup),
	cell.Provide(newClient, apiRoutes, newKVMetrics),
	cell.Invoke(useMetrics),
)

// useMetrics gives the etcd client its metrics (they take the Client, to
// report its leased keys, so the client cannot take them).
func useMetrics(c Client, m *kvMetrics) {
	if ec, ok := c.(*etcdClient); ok {
		ec.metrics = m
	}
}

type params struct {
	cell.In

	Config    Config
	Log       *slog.Logger
	Lifecycle cell.Lifecycle
	Jobs      job.Group
	Health    cell.Health
}

func newClient(p params) (Client, error) {
	opts, err := p.Config.parse()
	if err != nil {
		return nil, err
	}
	if p.Config.KVStore == "" {
		p.Health.OK("Disabled (--kvstore is not set): identities come from --identity-allocation-mode, crd or local")
		return disabled{}, nil
	}
	c := newEtcdClient(p.Log, p.Config, opts)
	c.configFile = opts.configFile
	// The connection is made before the jobs below start (they are
	// appended to the lifecycle after this hook), and is never waited for.
	p.Lifecycle.Append(cell.Hook{OnStart: c.connect, OnStop: c.close})
	p.Jobs.Add(
		job.OneShot("kvstore-status", c.watchStatus),
		job.OneShot("kvstore-lease-rewrite", c.leases.run),
		job.Timer("kvstore-locks-gc", c.locks.gc, c.locks.gcInterval()),
	)
	return c, nil
}

// connect makes the etcd client. It does not wait for etcd: clientv3
// dials in the background, and kvstore-status reports when it gets
// through.
func (c *etcdClient) connect(cell.HookContext) error {
	cfg := clientv3.Config{
		Endpoints:            c.status.Endpoints,
		DialTimeout:          5 * time.Second,
		DialKeepAliveTime:    10 * time.Second,
		DialKeepAliveTimeout: 5 * time.Second,
		AutoSyncInterval:     0,
		Logger:               zap.NewNop(),
		// gRPC's default backoff grows by 1.6 per failed dial up to two
		// minutes: an etcd that returns is seen at the next dial, seconds
		// later, more the longer it was away. Dialling every second at
		// most costs little, and the agent is back within about a second.
		DialOptions: []grpc.DialOption{grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           grpcbackoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
			MinConnectTimeout: 5 * time.Second,
		})},
	}
	if c.configFile != "" {
		f, err := readConfigFile(c.configFile)
		if err != nil {
			return err
		}
		creds, err := newTLSCreds(f)
		if err != nil {
			return fmt.Errorf("--kvstore-opt %s=%s: %w", optConfig, c.configFile, err)
		}
		cfg.Endpoints = f.Endpoints
		if creds != nil {
			// cfg.TLS makes https endpoints take credentials; the dial
			// option, given last, makes them these.
			cfg.TLS = creds.base
			cfg.DialOptions = append(cfg.DialOptions, grpc.WithTransportCredentials(creds))
			c.handshakes = creds.hs
		}
		c.mu.Lock()
		c.status.Endpoints = f.Endpoints
		c.mu.Unlock()
	}
	cli, err := clientv3.New(cfg)
	if err != nil {
		return fmt.Errorf("etcd client for %v: %w", cfg.Endpoints, err)
	}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	c.cli = cli
	c.log.Info("Connecting to etcd", "endpoints", cfg.Endpoints, "tls", cfg.TLS != nil)
	return nil
}

func (c *etcdClient) close(cell.HookContext) error {
	if c.cli == nil {
		return nil
	}
	c.locks.close()
	c.cancel()
	return c.cli.Close()
}

// Status check intervals: statusInterval grows with the cluster, one
// step of statusIntervalBase per statusNodesPerStep nodes, so that the
// checks of all agents together stay near a constant load on etcd.
const (
	statusIntervalBase = 5 * time.Second
	statusNodesPerStep = 256
	statusTimeout      = 5 * time.Second
	nodesPrefix        = "state/nodes/v1/"
)

func statusInterval(base time.Duration, nodes int64) time.Duration {
	return base * time.Duration(1+nodes/statusNodesPerStep)
}

// watchStatus checks etcd until the agent stops and reports the result in
// health and Status: a linearizable read (the node count) says whether
// the cluster has quorum; when it fails, a status call to each endpoint
// tells "unreachable" from "reachable, no quorum".
func (c *etcdClient) watchStatus(ctx context.Context, health cell.Health) error {
	health.Degraded("Connecting to etcd", fmt.Errorf("connecting to %v", c.status.Endpoints))
	interval := c.statusBase
	for {
		nodes, err := c.check(ctx)
		switch {
		case ctx.Err() != nil:
			return nil
		case err == nil:
			if c.setState(StateConnected, nil) {
				c.log.Info("Connected to etcd", "endpoints", c.Status().Endpoints)
			}
			c.handshakes.reset()
			health.OK(fmt.Sprintf("Connected to etcd %v", c.Status().Endpoints))
			interval = statusInterval(c.statusBase, nodes)
		default:
			// A refused handshake shows only as a read that timed out:
			// the status names it, and the endpoint.
			if hsErr := c.handshakes.err(); hsErr != nil {
				err = fmt.Errorf("%w; %w", err, hsErr)
			}
			state := StateConnecting
			if c.reachable(ctx) {
				state = StateQuorumLost
				if c.metrics != nil {
					c.metrics.quorumErrors.Inc()
				}
			}
			if c.setState(state, err) {
				c.log.Warn("etcd not available; the datapath keeps working and the agent retries", "state", state, "error", err)
			}
			health.Degraded(fmt.Sprintf("etcd %s", state), err)
			interval = min(time.Second, c.statusBase)
		}
		t := time.NewTimer(interval)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

func (c *etcdClient) check(ctx context.Context) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, c.statusTimeout)
	defer cancel()
	before, _ := c.seenNow()
	resp, err := c.cli.Get(ctx, c.prefix+nodesPrefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return 0, err
	}
	c.observe(before, resp.Header)
	return resp.Count, nil
}

func (c *etcdClient) reachable(ctx context.Context) bool {
	for _, ep := range c.cli.Endpoints() {
		sctx, cancel := context.WithTimeout(ctx, time.Second)
		_, err := c.cli.Status(sctx, ep)
		cancel()
		if err == nil {
			return true
		}
	}
	return false
}

// disabled is the Client when no kvstore is configured.
type disabled struct{}

func (disabled) Enabled() bool { return false }
func (disabled) Get(context.Context, string) ([]byte, bool, error) {
	return nil, false, ErrDisabled
}
func (disabled) List(context.Context, string) ([]KeyValue, error) { return nil, ErrDisabled }
func (disabled) Watch(ctx context.Context, _ string) <-chan Event {
	ch := make(chan Event)
	close(ch)
	return ch
}
func (disabled) CreateOnly(context.Context, string, []byte, ...WriteOption) (bool, error) {
	return false, ErrDisabled
}
func (disabled) UpdateIfDifferent(context.Context, string, []byte, ...WriteOption) (bool, error) {
	return false, ErrDisabled
}
func (disabled) Delete(context.Context, string) error              { return ErrDisabled }
func (disabled) Txn(context.Context, ...Branch) (int, error)       { return -1, ErrDisabled }
func (disabled) Lock(context.Context, string) (Unlocker, error)    { return nil, ErrDisabled }
func (disabled) TryLock(context.Context, string) (Unlocker, error) { return nil, ErrDisabled }
func (disabled) Status() Status                                    { return Status{State: StateDisabled} }

// apiRoutes serve the kvstore's status and its keys, read-only.
func apiRoutes(c Client) api.Routes {
	return api.NewRoutes(
		api.Route{Method: http.MethodGet, Path: apiv1.PathKVStore, Handler: func(*http.Request) (any, error) {
			return apiStatus(c.Status()), nil
		}},
		api.Route{Method: http.MethodGet, Path: apiv1.PathKVStoreKeys, Handler: func(r *http.Request) (any, error) {
			return getKeys(r, c)
		}},
	)
}

func apiStatus(s Status) apiv1.KVStore {
	return apiv1.KVStore{
		State: string(s.State), Endpoints: s.Endpoints, LastError: s.LastError, Since: s.Since,
		Leases: s.Leases, LeasedKeys: s.LeasedKeys,
	}
}

func getKeys(r *http.Request, c Client) ([]apiv1.KVStoreKey, error) {
	if !c.Enabled() {
		return nil, api.Errorf(http.StatusServiceUnavailable, "%v", ErrDisabled)
	}
	key := r.URL.Query().Get("key")
	recursive := r.URL.Query().Get("recursive") == "true"
	if key == "" && !recursive {
		return nil, api.BadRequest("missing key: give ?key=KEY (relative to --kvstore-prefix), or recursive=true for every key")
	}
	ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	defer cancel()
	var kvs []KeyValue
	if recursive {
		var err error
		if kvs, err = c.List(ctx, key); err != nil {
			return nil, api.Errorf(http.StatusServiceUnavailable, "%v", err)
		}
	} else {
		v, found, err := c.Get(ctx, key)
		if err != nil {
			return nil, api.Errorf(http.StatusServiceUnavailable, "%v", err)
		}
		if !found {
			return nil, api.NotFound("no key %q under the kvstore prefix", key)
		}
		kvs = []KeyValue{{Key: key, Value: v}}
	}
	out := make([]apiv1.KVStoreKey, len(kvs))
	for i, kv := range kvs {
		out[i] = apiv1.KVStoreKey{Key: kv.Key, Value: string(kv.Value), ModRevision: kv.ModRevision, Lease: kv.Lease}
	}
	return out, nil
}
