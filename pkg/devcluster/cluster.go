package devcluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"time"

	"github.com/cellium/cellium/pkg/cgroup2"
	"github.com/cellium/cellium/pkg/kubeapiserver"
	"github.com/cellium/cellium/pkg/netnsrun"
	"github.com/cellium/cellium/pkg/statefile"
)

// Options say what Up builds. The zero value of each field is its default.
type Options struct {
	// Name is the cluster's name, which every namespace, cgroup and pin
	// directory it makes carries: lower-case letters, digits and '-', at
	// most 24. Default "dev".
	Name string
	// Nodes is the number of nodes, 1 to MaxNodes. Default 2.
	Nodes int
	// Dir holds the cluster's state, logs and manifests; it must not exist
	// or be empty. Default DefaultDir(Name).
	Dir string
	// AgentBinary is the agent to run on every node. Default: the file
	// named agent next to this program (os.Executable), where make build
	// puts it beside cellium-dev.
	AgentBinary string
	// CNIBinary is the CNI plugin, a file named cellium-cni. Default: the
	// one next to AgentBinary.
	CNIBinary string
	// EtcdBinary is Debian's etcd-server. Default $ETCD_BIN, else etcd on
	// the PATH.
	EtcdBinary string
	// IdentityMode is where the agents keep cluster-wide identities:
	// IdentityKVStore (default: the agents share etcd and each serves the
	// manifests directory) or IdentityCRD (a real kube-apiserver on the
	// cluster's etcd, with deploy/rbac.yaml's RBAC; no kvstore).
	IdentityMode string
	// KubeAPIServerBinary is the kube-apiserver of crd mode. Default
	// $KUBE_APISERVER_BIN, else the one `make kube-apiserver` built.
	KubeAPIServerBinary string
	// BPFRoot is the agents' --bpf-root. Default /sys/fs/bpf.
	BPFRoot string
	// RoutingMode is the agents' --routing-mode: tunnel (default) or
	// native.
	RoutingMode string
	// AgentArgs are more flags for every agent, after the cluster's own
	// (a later flag wins): --log-level=debug, say.
	AgentArgs []string
	// ReadyTimeout bounds the wait for each agent to be ready. Default 2m.
	ReadyTimeout time.Duration
	// StopWithCaller kills the agents and etcd when the process that
	// started them exits: for tests, which must leave nothing running if
	// they die. Without it they outlive the caller, as `cellium-dev cluster
	// up` needs.
	StopWithCaller bool
	// Log receives progress. Default: discarded.
	Log *slog.Logger
}

func (o *Options) complete() error {
	if o.Name == "" {
		o.Name = DefaultName
	}
	if err := CheckName(o.Name); err != nil {
		return err
	}
	if o.Nodes == 0 {
		o.Nodes = 2
	}
	switch o.RoutingMode {
	case "":
		o.RoutingMode = "tunnel"
	case "tunnel", "native":
	default:
		return fmt.Errorf("invalid routing mode %q: want tunnel or native", o.RoutingMode)
	}
	if o.Nodes < 1 || o.Nodes > MaxNodes {
		return fmt.Errorf("invalid number of nodes %d: want 1 to %d", o.Nodes, MaxNodes)
	}
	if o.Dir == "" {
		o.Dir = DefaultDir(o.Name)
	}
	dir, err := filepath.Abs(o.Dir)
	if err != nil {
		return fmt.Errorf("cluster directory %q: %w", o.Dir, err)
	}
	o.Dir = dir
	if o.AgentBinary == "" {
		self, err := os.Executable()
		if err != nil {
			return fmt.Errorf("find the agent binary: %w", err)
		}
		o.AgentBinary = filepath.Join(filepath.Dir(self), "agent")
		if err := executable("agent binary", o.AgentBinary); err != nil {
			return fmt.Errorf("%w (it is looked for next to this program; make build puts both in bin/)", err)
		}
	} else if err := executable("agent binary", o.AgentBinary); err != nil {
		return err
	}
	if o.CNIBinary == "" {
		o.CNIBinary = filepath.Join(filepath.Dir(o.AgentBinary), "cellium-cni")
		if err := executable("CNI plugin", o.CNIBinary); err != nil {
			return fmt.Errorf("%w (it is looked for next to the agent; make build puts both in bin/)", err)
		}
	}
	if err := executable("CNI plugin", o.CNIBinary); err != nil {
		return err
	}
	if filepath.Base(o.CNIBinary) != "cellium-cni" {
		return fmt.Errorf("invalid CNI plugin %s: the file must be named cellium-cni, the type in the agents' CNI configuration", o.CNIBinary)
	}
	if o.EtcdBinary == "" {
		if o.EtcdBinary, err = EtcdBinary(); err != nil {
			return err
		}
	}
	if err := executable("etcd binary", o.EtcdBinary); err != nil {
		return err
	}
	switch o.IdentityMode {
	case "":
		o.IdentityMode = IdentityKVStore
	case IdentityKVStore:
	case IdentityCRD:
		if o.KubeAPIServerBinary == "" {
			if o.KubeAPIServerBinary, err = kubeapiserver.Binary(); err != nil {
				return fmt.Errorf("identity allocation mode crd runs a kube-apiserver: %w", err)
			}
		}
		if err := executable("kube-apiserver binary", o.KubeAPIServerBinary); err != nil {
			return err
		}
	default:
		return fmt.Errorf("invalid identity allocation mode %q: want kvstore or crd", o.IdentityMode)
	}
	if o.BPFRoot == "" {
		o.BPFRoot = "/sys/fs/bpf"
	}
	if o.ReadyTimeout == 0 {
		o.ReadyTimeout = 2 * time.Minute
	}
	if o.Log == nil {
		o.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return nil
}

// CheckName says what is wrong with a cluster name, if anything.
func CheckName(name string) error {
	if !clusterNameRE().MatchString(name) {
		return fmt.Errorf("invalid cluster name %q: want at most 24 lower-case letters, digits and '-', starting and ending with a letter or digit, e.g. dev", name)
	}
	return nil
}

// EtcdBinary is the etcd server the cluster runs: $ETCD_BIN, else etcd on
// the PATH, or an error saying how to get one.
func EtcdBinary() (string, error) {
	if bin := os.Getenv("ETCD_BIN"); bin != "" {
		return bin, nil
	}
	bin, err := exec.LookPath("etcd")
	if err != nil {
		return "", errors.New("no etcd binary on the PATH: install Debian's etcd-server, or set ETCD_BIN")
	}
	return bin, nil
}

func executable(what, path string) error {
	st, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("%s %s: %w", what, path, err)
	}
	if st.IsDir() || st.Mode()&0o111 == 0 {
		return fmt.Errorf("%s %s is not an executable file", what, path)
	}
	if !filepath.IsAbs(path) {
		return fmt.Errorf("%s %s: want an absolute path", what, path)
	}
	return nil
}

// CheckHost says why this machine cannot run a cluster, or nil: root, a
// cgroup2 mount and network namespaces are needed.
func CheckHost() error {
	if os.Geteuid() != 0 {
		return errors.New("needs root: it creates network namespaces, links, cgroups and BPF pins")
	}
	if _, err := cgroup2.Mount(); err != nil {
		return err
	}
	if _, err := os.Stat("/proc/self/ns/net"); err != nil {
		return fmt.Errorf("no network namespaces in this kernel: %w", err)
	}
	return nil
}

// Cluster is a cluster on this machine, as its cluster.json describes it.
// Its methods may be called from several goroutines, and from several
// processes at once: each change takes the cluster's lock and re-reads the
// file first.
type Cluster struct {
	dir            string
	log            *slog.Logger
	readyTimeout   time.Duration
	stopWithCaller bool

	mu sync.Mutex
	st *state // as last read or written
}

// Up builds a cluster and returns once every agent is ready. On failure it
// takes down what it made and says what failed: for an agent, its node and
// the end of its log.
func Up(ctx context.Context, o Options) (*Cluster, error) {
	if err := o.complete(); err != nil {
		return nil, err
	}
	if err := CheckHost(); err != nil {
		return nil, err
	}
	mount, err := cgroup2.Mount()
	if err != nil {
		return nil, err
	}
	s := plan(o, mount)
	c := &Cluster{dir: o.Dir, log: o.Log.With("cluster", o.Name), readyTimeout: o.ReadyTimeout, stopWithCaller: o.StopWithCaller, st: s}

	if err := emptyDir(o.Dir); err != nil {
		return nil, err
	}
	_, statErr := os.Stat(o.Dir)
	created := errors.Is(statErr, fs.ErrNotExist)
	if err := os.MkdirAll(o.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("create cluster directory: %w", err)
	}
	unlock, err := lockDir(o.Dir)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if err := checkFree(s); err != nil {
		os.Remove(filepath.Join(o.Dir, "lock"))
		if created {
			os.Remove(o.Dir)
		}
		return nil, err
	}
	// Recorded before anything is made: Down removes whatever exists of it.
	if err := s.save(); err != nil {
		return nil, err
	}
	start := time.Now()
	c.log.Info("Creating cluster", "nodes", o.Nodes, "dir", o.Dir)
	if err := c.build(ctx, s); err != nil {
		c.log.Error("Creating the cluster failed; taking down what was made", "error", err)
		if derr := c.down(context.WithoutCancel(ctx), s); derr != nil {
			return nil, fmt.Errorf("%w; taking down what was made failed too: %w (run cellium-dev cluster down --dir %s)", err, derr, o.Dir)
		}
		return nil, err
	}
	s.Phase = PhaseUp
	if err := s.save(); err != nil {
		return nil, err
	}
	c.log.Info("Cluster is up", "nodes", o.Nodes, "duration", time.Since(start).Round(time.Millisecond))
	return c, nil
}

// emptyDir checks that dir does not exist or is empty: Down removes it
// whole.
func emptyDir(dir string) error {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("cluster directory %s: %w", dir, err)
	}
	for _, e := range entries {
		if e.Name() == stateFile {
			return fmt.Errorf("a cluster exists in %s already: take it down first (cellium-dev cluster down --dir %s), or pick another name", dir, dir)
		}
	}
	if len(entries) > 0 {
		return fmt.Errorf("cluster directory %s is not empty: give a new or empty directory (down removes it whole)", dir)
	}
	return nil
}

// checkFree fails when something the cluster would make exists already:
// left by a cluster of the same name whose state is gone, most likely.
func checkFree(s *state) error {
	var taken []string
	if netnsrun.Exists(s.BridgeNetNS) {
		taken = append(taken, "network namespace "+s.BridgeNetNS)
	}
	if _, err := os.Stat(s.Cgroup); err == nil {
		taken = append(taken, "cgroup "+s.Cgroup)
	}
	for _, n := range s.Nodes {
		if netnsrun.Exists(n.NetNS) {
			taken = append(taken, "network namespace "+n.NetNS)
		}
		if _, err := os.Stat(filepath.Join(s.BPFRoot, n.BPFPrefix)); err == nil {
			taken = append(taken, "BPF pin directory "+filepath.Join(s.BPFRoot, n.BPFPrefix))
		}
	}
	if len(taken) > 0 {
		return fmt.Errorf("cluster %s cannot be created: these exist already, left by an earlier cluster of that name? %v (remove them: ip netns del NAME, rmdir CGROUP, agent cleanup --bpf-map-prefix PREFIX)", s.Name, taken)
	}
	return nil
}

func (c *Cluster) build(ctx context.Context, s *state) error {
	if err := netnsrun.Create(s.BridgeNetNS); err != nil {
		return err
	}
	if err := setupBridge(s); err != nil {
		return fmt.Errorf("bridge namespace %s: %w", s.BridgeNetNS, err)
	}
	if err := os.MkdirAll(s.Cgroup, 0o755); err != nil {
		return fmt.Errorf("create cgroup: %w", err)
	}
	if err := statefile.MkdirAll(s.manifestsDir()); err != nil {
		return err
	}
	if err := makeHubbleTLS(s); err != nil {
		return err
	}
	for i := range s.Nodes {
		if err := c.buildNode(s, &s.Nodes[i]); err != nil {
			return fmt.Errorf("node %s: %w", s.Nodes[i].Name, err)
		}
	}
	c.log.Info("Created the network", "bridge", s.BridgeNetNS, "nodes", len(s.Nodes))

	if err := c.startEtcd(ctx, s); err != nil {
		return err
	}
	if s.crd() {
		if err := c.startKubeAPI(ctx, s); err != nil {
			return err
		}
	}
	// Into the manifests directory, or the kube-apiserver: the Nodes as
	// kubelets would register them.
	for _, n := range s.Nodes {
		if err := s.writeManifest(nodeManifest(n.Name), nodeObject(n)); err != nil {
			return fmt.Errorf("node %s: %w", n.Name, err)
		}
	}
	for i := range s.Nodes {
		if err := c.startAgent(s, &s.Nodes[i]); err != nil {
			return err
		}
	}
	return c.waitReady(ctx, s.Nodes...)
}

func (c *Cluster) buildNode(s *state, n *Node) error {
	if err := netnsrun.Create(n.NetNS); err != nil {
		return err
	}
	if err := setupNode(s, n); err != nil {
		return err
	}
	if err := os.MkdirAll(n.Cgroup, 0o755); err != nil {
		return fmt.Errorf("create cgroup: %w", err)
	}
	for _, d := range []string{n.StateDir(), n.RunDir(), n.CNIConfDir()} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	return nil
}

// Load opens the cluster in dir. Without a cluster there, the error is
// ErrNoCluster. Processes it starts (Restart, StartAgent) outlive the
// caller; log receives progress (nil: discarded).
func Load(dir string, log *slog.Logger) (*Cluster, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	s, err := loadState(dir)
	if err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return &Cluster{dir: dir, log: log.With("cluster", s.Name), readyTimeout: 2 * time.Minute, st: s}, nil
}

// Name is the cluster's name.
func (c *Cluster) Name() string { return c.snapshot().Name }

// Dir is the cluster's directory.
func (c *Cluster) Dir() string { return c.dir }

// ManifestsDir is the directory every agent serves with its embedded API
// server: a Service or EndpointSlice written there reaches every node.
func (c *Cluster) ManifestsDir() string { return c.snapshot().manifestsDir() }

// EtcdURL is the client URL of the cluster's etcd, reachable from the
// nodes' namespaces.
func (c *Cluster) EtcdURL() string { return c.snapshot().etcdURL() }

// Nodes are the cluster's nodes.
func (c *Cluster) Nodes() []Node { return append([]Node(nil), c.snapshot().Nodes...) }

// Node is the node called name.
func (c *Cluster) Node(name string) (Node, error) {
	n, err := c.snapshot().node(name)
	if err != nil {
		return Node{}, err
	}
	return *n, nil
}

// Pods are the cluster's pods.
func (c *Cluster) Pods() []Pod { return append([]Pod(nil), c.snapshot().Pods...) }

// Pod is the pod called name.
func (c *Cluster) Pod(name string) (Pod, error) {
	p, err := c.snapshot().pod(name)
	if err != nil {
		return Pod{}, err
	}
	return *p, nil
}

// snapshot is the cluster's state as cluster.json has it now, or as it was
// last seen if it cannot be read (taken down meanwhile).
func (c *Cluster) snapshot() *state {
	c.mu.Lock()
	defer c.mu.Unlock()
	if s, err := loadState(c.dir); err == nil {
		c.st = s
	}
	return c.st
}

// update runs fn on the current state under the cluster's lock and saves
// what it leaves, also when it fails: fn keeps the state true to what
// exists.
func (c *Cluster) update(fn func(s *state) error) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	unlock, err := lockDir(c.dir)
	if err != nil {
		return err
	}
	defer unlock()
	s, err := loadState(c.dir)
	if err != nil {
		return err
	}
	c.st = s
	ferr := fn(s)
	if err := s.save(); err != nil {
		return errors.Join(ferr, err)
	}
	return ferr
}

// WriteManifest writes a manifest (Services, EndpointSlices, any built-in
// kind; YAML or JSON) into the shared manifests directory, atomically;
// every agent sees its objects within a second. name is a file name ending
// in .yaml, .yml or .json.
func (c *Cluster) WriteManifest(name string, data []byte) error {
	if err := checkManifestName(name); err != nil {
		return err
	}
	s := c.snapshot()
	if err := statefile.WriteMode(filepath.Join(s.manifestsDir(), name), data, 0o644); err != nil {
		return err
	}
	return s.kubeApply(name, data)
}

// RemoveManifest removes a manifest WriteManifest wrote; its objects are
// deleted from every agent's API server.
func (c *Cluster) RemoveManifest(name string) error {
	if err := checkManifestName(name); err != nil {
		return err
	}
	return c.snapshot().removeManifest(name)
}
