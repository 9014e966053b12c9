package k8sclient

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"path/filepath"

	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"
	"github.com/spf13/pflag"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/cellium/cellium/cells/daemon"
)

// Cell provides the Clientset: a real cluster's, or the embedded one fed
// from --k8s-manifests-dir.
var Cell = cell.Module(
	"k8s-client",
	"Kubernetes clientset for a cluster or embedded from a manifests directory",

	cell.Config(defaultConfig),
	cell.Provide(newClientset, statedb.RWTable[*ManifestFile].ToTable),
	cell.ProvidePrivate(newManifestFileTable, job.Registry.NewGroup),
	cell.Invoke(requireClientset),
)

// requireClientset validates the flags and serves the manifests even while
// no cell uses the Clientset.
func requireClientset(Clientset) {}

// Config is the k8s-client cell's configuration.
type Config struct {
	// K8sMode chooses the API server: auto, in-cluster, kubeconfig or
	// embedded. See the package documentation for what auto picks.
	K8sMode string
	// Kubeconfig is the kubeconfig file of kubeconfig mode. $KUBECONFIG is
	// deliberately not read: an agent on a laptop must not start talking to
	// whatever cluster the shell happens to point at.
	Kubeconfig string
	// K8sManifestsDir holds the objects of embedded mode.
	K8sManifestsDir string
	// K8sAPIQPS and K8sAPIBurst rate-limit requests to a real API server.
	K8sAPIQPS   float32
	K8sAPIBurst int
}

// DefaultManifestsDir is the default --k8s-manifests-dir. Unlike a
// directory given explicitly, it may be missing: that means no objects.
const DefaultManifestsDir = "/etc/cellium/manifests"

var defaultConfig = Config{
	K8sMode:         modeAuto,
	Kubeconfig:      "",
	K8sManifestsDir: DefaultManifestsDir,
	K8sAPIQPS:       20,
	K8sAPIBurst:     40,
}

func (def Config) Flags(flags *pflag.FlagSet) {
	flags.String("k8s-mode", def.K8sMode,
		"Kubernetes API to use: auto, in-cluster, kubeconfig, or embedded (a fake API server fed from --k8s-manifests-dir)")
	flags.String("kubeconfig", def.Kubeconfig,
		"Kubeconfig file of the cluster to use (kubeconfig mode)")
	flags.String("k8s-manifests-dir", def.K8sManifestsDir,
		"Directory of YAML/JSON manifests that embedded mode serves; watched for changes")
	flags.Float32("k8s-api-qps", def.K8sAPIQPS, "Queries per second to a real API server")
	flags.Int("k8s-api-burst", def.K8sAPIBurst, "Burst of queries to a real API server")
}

const (
	modeAuto       = "auto"
	modeInCluster  = "in-cluster"
	modeKubeconfig = "kubeconfig"
	modeEmbedded   = "embedded"
)

// Clientset is the Kubernetes API the agent talks to: a real cluster, or the
// embedded fake.
type Clientset interface {
	// The typed clients of the API groups the agent uses (groups.go).
	CoreV1() CoreV1
	DiscoveryV1() DiscoveryV1
	NetworkingV1() NetworkingV1
	// Embedded is true when there is no cluster and objects come from
	// --k8s-manifests-dir.
	Embedded() bool
}

// clusterClientset talks to a real API server.
type clusterClientset struct {
	*groups
	config *rest.Config
}

func (clusterClientset) Embedded() bool { return false }

// RESTConfig is the client configuration of cs's API server, for clients
// of kinds the Clientset does not know (custom resources); nil in
// embedded mode.
func RESTConfig(cs Clientset) *rest.Config {
	if c, ok := cs.(clusterClientset); ok {
		return rest.CopyConfig(c.config)
	}
	return nil
}

// embeddedClientset is the embedded API server's clients: typed clients
// answered by the reactors of a Fake.
type embeddedClientset struct {
	*groups
	fake *Fake
}

func newEmbeddedClientset(cs *Fake) embeddedClientset {
	return embeddedClientset{groups: cs.groups, fake: cs}
}

func (embeddedClientset) Embedded() bool { return true }

type clientsetParams struct {
	cell.In

	Config    Config
	Lifecycle cell.Lifecycle
	Log       *slog.Logger
	Health    cell.Health
	Jobs      job.Group
	DB        *statedb.DB
	Files     statedb.RWTable[*ManifestFile]
	NodeName  daemon.NodeName
	Paths     daemon.Paths
}

func newClientset(p clientsetParams) (Clientset, error) {
	cfg := p.Config
	mode, rc, err := cfg.resolve()
	if err != nil {
		return nil, err
	}
	if mode != modeEmbedded {
		rc.QPS, rc.Burst = cfg.K8sAPIQPS, cfg.K8sAPIBurst
		rc.UserAgent = "cellium-agent"
		g, err := newGroups(rc)
		if err != nil {
			return nil, fmt.Errorf("kubernetes client for %s: %w", rc.Host, err)
		}
		p.Log.Info("Kubernetes API", "mode", mode, "server", rc.Host)
		// Nothing of this module runs in this mode: say so in health,
		// or the scope stays Unknown and so does the agent's level.
		p.Lifecycle.Append(cell.Hook{OnStart: func(cell.HookContext) error {
			p.Health.OK(fmt.Sprintf("Kubernetes API at %s (%s); each watcher reports its own state", rc.Host, mode))
			return nil
		}})
		return clusterClientset{g, rc}, nil
	}

	cs, store, err := newFakeClientset()
	if err != nil {
		return nil, err
	}
	dir := filepath.Clean(cfg.K8sManifestsDir)
	s := &manifestSync{
		log:       p.Log,
		health:    p.Health.NewScope("manifests"),
		dir:       dir,
		required:  dir != DefaultManifestsDir,
		localNode: string(p.NodeName),
		clientset: cs,
		store:     store,
		decoder:   newDecoder(),
		cache:     &parseCache{dir: filepath.Join(p.Paths.StateDir, "k8s-manifests")},
		db:        p.DB,
		files:     p.Files,
		loaded:    map[string][]*manifest{},
		applied:   newObjectSet(),
		logged:    map[string]string{},
		decoded:   map[string]*decodedFile{},
	}
	// The start hook loads the directory before the start hooks of the
	// cells that take a Clientset, so their first LIST sees every object.
	// The job watching for changes is added after it and so starts after it.
	p.Lifecycle.Append(cell.Hook{OnStart: s.start, OnStop: s.stop})
	p.Jobs.Add(job.OneShot("watch-manifests", s.watch))
	p.Log.Info("Kubernetes API", "mode", mode, "manifests", dir)
	return newEmbeddedClientset(cs), nil
}

// resolve validates the flags and picks the mode. Outside embedded mode it
// returns the REST config, whose constructors read the kubeconfig or the
// service account files: the only I/O done before start.
func (cfg Config) resolve() (string, *rest.Config, error) {
	if cfg.K8sAPIQPS <= 0 {
		return "", nil, fmt.Errorf("invalid --k8s-api-qps %v: must be greater than 0", cfg.K8sAPIQPS)
	}
	if cfg.K8sAPIBurst < 1 {
		return "", nil, fmt.Errorf("invalid --k8s-api-burst %d: must be at least 1", cfg.K8sAPIBurst)
	}
	if !filepath.IsAbs(cfg.K8sManifestsDir) {
		return "", nil, fmt.Errorf("invalid --k8s-manifests-dir %q: must be an absolute path, e.g. %s", cfg.K8sManifestsDir, DefaultManifestsDir)
	}
	customDir := filepath.Clean(cfg.K8sManifestsDir) != DefaultManifestsDir

	mode := cfg.K8sMode
	switch mode {
	case modeAuto:
		switch {
		case cfg.Kubeconfig != "":
			mode = modeKubeconfig
		case customDir:
			mode = modeEmbedded
		}
	case modeInCluster, modeKubeconfig, modeEmbedded:
	default:
		return "", nil, fmt.Errorf("invalid --k8s-mode %q: want auto, in-cluster, kubeconfig or embedded", cfg.K8sMode)
	}
	if cfg.Kubeconfig != "" && mode != modeKubeconfig {
		return "", nil, fmt.Errorf("--kubeconfig %q conflicts with --k8s-mode=%s: drop one of them", cfg.Kubeconfig, mode)
	}
	if customDir && (mode == modeInCluster || mode == modeKubeconfig) {
		return "", nil, fmt.Errorf("--k8s-manifests-dir %q is only read in embedded mode, not in %s mode: drop it or use --k8s-mode=embedded", cfg.K8sManifestsDir, mode)
	}

	switch mode {
	case modeKubeconfig:
		if cfg.Kubeconfig == "" {
			return "", nil, errors.New("--k8s-mode=kubeconfig needs --kubeconfig: the path of a kubeconfig file")
		}
		rc, err := clientcmd.BuildConfigFromFlags("", cfg.Kubeconfig)
		if err != nil {
			return "", nil, fmt.Errorf("invalid --kubeconfig %q: %w", cfg.Kubeconfig, err)
		}
		return mode, rc, nil
	case modeInCluster:
		rc, err := rest.InClusterConfig()
		if err != nil {
			return "", nil, fmt.Errorf("--k8s-mode=in-cluster: %w", err)
		}
		return mode, rc, nil
	case modeAuto:
		rc, err := rest.InClusterConfig()
		switch {
		case err == nil:
			return modeInCluster, rc, nil
		case errors.Is(err, rest.ErrNotInCluster), errors.Is(err, fs.ErrNotExist):
			// Not in a pod, or in one without a service account token.
			return modeEmbedded, nil, nil
		default:
			return "", nil, fmt.Errorf("in-cluster Kubernetes config (--k8s-mode=auto; use --k8s-mode=embedded to run without the cluster): %w", err)
		}
	}
	return modeEmbedded, nil, nil
}
