package kvstore

import (
	"fmt"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"sigs.k8s.io/yaml"
)

// Config is the kvstore cell's configuration.
type Config struct {
	// KVStore is the kind of store: "" (none) or "etcd".
	KVStore string
	// KVStoreOpt are the store's options, key=value.
	KVStoreOpt []string
	// KVStoreLeaseTTL is the TTL of the leases that leased keys live on.
	KVStoreLeaseTTL time.Duration
	// KVStorePrefix is the prefix of every key the agent reads or writes.
	KVStorePrefix string
}

var defaultConfig = Config{
	KVStore:         "",
	KVStoreLeaseTTL: 15 * time.Minute,
	KVStorePrefix:   "cellium",
}

func (def Config) Flags(flags *pflag.FlagSet) {
	flags.String("kvstore", def.KVStore, `Shared store for identities, the ipcache and nodes: "" (none: node-local identities) or etcd`)
	flags.StringSlice("kvstore-opt", def.KVStoreOpt,
		"Options of --kvstore, key=value: etcd.address=URL[;URL...] (or several etcd.address), etcd.config=FILE (endpoints, trusted-ca-file, cert-file, key-file), etcd.qps=N")
	flags.Duration("kvstore-lease-ttl", def.KVStoreLeaseTTL, "TTL of the leases the agent's keys live on: how long they outlive a dead agent")
	flags.String("kvstore-prefix", def.KVStorePrefix, "Prefix of every kvstore key the agent reads or writes")
}

// Option keys of --kvstore-opt.
const (
	optAddress = "etcd.address"
	optConfig  = "etcd.config"
	optQPS     = "etcd.qps"
)

// etcdOptions are the parsed --kvstore-opt values.
type etcdOptions struct {
	endpoints  []string
	configFile string
	qps        float64
}

// parse checks the flags without I/O; an etcd.config file is read at start.
func (cfg Config) parse() (etcdOptions, error) {
	var o etcdOptions
	switch cfg.KVStore {
	case "":
		if len(cfg.KVStoreOpt) > 0 {
			return o, fmt.Errorf("--kvstore-opt %s given without --kvstore: set --kvstore=etcd", strings.Join(cfg.KVStoreOpt, ","))
		}
		return o, nil
	case "etcd":
	default:
		return o, fmt.Errorf("invalid --kvstore %q: want \"\" (none) or etcd", cfg.KVStore)
	}
	if cfg.KVStoreLeaseTTL < 5*time.Second {
		return o, fmt.Errorf("invalid --kvstore-lease-ttl %s: must be at least 5s", cfg.KVStoreLeaseTTL)
	}
	if p := cfg.KVStorePrefix; p == "" || strings.HasPrefix(p, "/") || strings.HasSuffix(p, "/") {
		return o, fmt.Errorf("invalid --kvstore-prefix %q: want a non-empty key prefix without leading or trailing /, such as cellium", p)
	}
	for _, kv := range cfg.KVStoreOpt {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || v == "" {
			return o, fmt.Errorf("invalid --kvstore-opt %q: want key=value, such as etcd.address=http://127.0.0.1:2379", kv)
		}
		switch k {
		case optAddress:
			for _, addr := range strings.FieldsFunc(v, func(r rune) bool { return r == ';' || r == ' ' }) {
				u, err := url.Parse(addr)
				if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
					return o, fmt.Errorf("invalid --kvstore-opt %s=%s: %q is not an http:// or https:// URL", k, v, addr)
				}
				o.endpoints = append(o.endpoints, addr)
			}
		case optConfig:
			o.configFile = v
		case optQPS:
			qps, err := strconv.ParseFloat(v, 64)
			if err != nil || qps <= 0 {
				return o, fmt.Errorf("invalid --kvstore-opt %s=%s: want a positive number of requests per second", k, v)
			}
			o.qps = qps
		default:
			return o, fmt.Errorf("unknown --kvstore-opt %q: want one of %s, %s, %s", k, optAddress, optConfig, optQPS)
		}
	}
	if len(o.endpoints) == 0 && o.configFile == "" {
		return o, fmt.Errorf("--kvstore=etcd needs --kvstore-opt %s=URL or %s=FILE", optAddress, optConfig)
	}
	return o, nil
}

// configFile is the etcd.config file: the clientv3 YAML fields we use.
type configFile struct {
	Endpoints     []string `json:"endpoints"`
	TrustedCAFile string   `json:"trusted-ca-file"`
	CertFile      string   `json:"cert-file"`
	KeyFile       string   `json:"key-file"`
}

// readConfigFile reads and checks an etcd.config file.
func readConfigFile(path string) (configFile, error) {
	var f configFile
	b, err := os.ReadFile(path)
	if err != nil {
		return f, fmt.Errorf("--kvstore-opt %s=%s: %w", optConfig, path, err)
	}
	if err := yaml.UnmarshalStrict(b, &f); err != nil {
		return f, fmt.Errorf("--kvstore-opt %s=%s: %w (want YAML with endpoints, trusted-ca-file, cert-file, key-file)", optConfig, path, err)
	}
	if len(f.Endpoints) == 0 {
		return f, fmt.Errorf("--kvstore-opt %s=%s: no endpoints", optConfig, path)
	}
	if (f.CertFile == "") != (f.KeyFile == "") {
		return f, fmt.Errorf("--kvstore-opt %s=%s: cert-file and key-file go together", optConfig, path)
	}
	return f, nil
}
