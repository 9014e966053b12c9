package devcluster

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cellium/cellium/pkg/statefile"
)

// DefaultName is the name of a cluster when none is given.
const DefaultName = "dev"

// DefaultDir is where a cluster named name keeps its state when no
// directory is given. It is under /var/run: like the namespaces, cgroups
// and pins it describes, it does not survive a reboot.
func DefaultDir(name string) string { return filepath.Join("/var/run/cellium-dev", name) }

// MaxNodes bounds a cluster: node i's addresses and pod CIDRs are numbered
// after it.
const MaxNodes = 200

// stateFile is the cluster's state in its directory.
const stateFile = "cluster.json"

// stateVersion is the layout of cluster.json.
const stateVersion = 1

// netnsDir is where named network namespaces are bind-mounted, as
// `ip netns` does, so `ip netns list` and `nsenter --net=` find them.
const netnsDir = "/var/run/netns"

var (
	// clusterNameRE: the name goes into namespace, cgroup and pin names.
	// Both are compiled on first use, not at the start of every agent
	// (the bounded repeats make large programs).
	clusterNameRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,22}[a-z0-9])?$`) })
	// podNameRE is a DNS-1123 label, as Kubernetes wants of most names.
	podNameRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`) })
)

// ErrNoCluster is returned by Load when the directory holds no cluster.
var ErrNoCluster = errors.New("no dev cluster")

// Phase is how far a cluster got.
type Phase string

const (
	// PhaseCreating: Up is making it, or died doing so.
	PhaseCreating Phase = "creating"
	// PhaseUp: every agent was ready when Up returned.
	PhaseUp Phase = "up"
	// PhaseDeleting: Down started; a Down that failed leaves it so.
	PhaseDeleting Phase = "deleting"
)

// Process is a process the cluster started: its PID and its start time in
// clock ticks after boot (field 22 of /proc/PID/stat), which tells it from
// a later process that reuses the PID.
type Process struct {
	PID       int    `json:"pid"`
	StartTime uint64 `json:"startTime"`
}

// Node is one node of the cluster.
type Node struct {
	Name string `json:"name"`
	// NetNS is the path of the node's network namespace.
	NetNS string `json:"netns"`
	// IPv4 and IPv6 are the node's addresses, on its eth0.
	IPv4 netip.Addr `json:"ipv4"`
	IPv6 netip.Addr `json:"ipv6"`
	// PodCIDRs are the Node's spec.podCIDRs: an IPv4 and an IPv6 one.
	PodCIDRs []netip.Prefix `json:"podCIDRs"`
	// Dir holds the agent's state and run directories, its CNI
	// configuration and its log.
	Dir string `json:"dir"`
	// Cgroup is the agent's --cgroup-root.
	Cgroup string `json:"cgroup"`
	// BPFPrefix is the agent's --bpf-map-prefix.
	BPFPrefix string `json:"bpfPrefix"`
	// APISocket is the agent's --api-socket.
	APISocket string  `json:"apiSocket"`
	Agent     Process `json:"agent"`
}

// Log is the path of the agent's log.
func (n Node) Log() string { return filepath.Join(n.Dir, "agent.log") }

// StateDir is the agent's --state-dir.
func (n Node) StateDir() string { return filepath.Join(n.Dir, "state") }

// RunDir is the agent's --run-dir.
func (n Node) RunDir() string { return filepath.Join(n.Dir, "run") }

// CNIConfDir is the agent's --cni-conf-dir.
func (n Node) CNIConfDir() string { return filepath.Join(n.Dir, "net.d") }

// HubbleSocket is where the agent's Hubble server listens.
func (n Node) HubbleSocket() string { return filepath.Join(n.RunDir(), "hubble.sock") }

// Pod is a pod of the cluster.
type Pod struct {
	Name string `json:"name"`
	// Namespace is the pod's Kubernetes namespace (default unless given).
	Namespace string            `json:"namespace"`
	Node      string            `json:"node"`
	Labels    map[string]string `json:"labels,omitempty"`
	// Ports are the container ports of its Pod manifest, which named
	// ports of NetworkPolicies resolve on.
	Ports []ContainerPort `json:"ports,omitempty"`
	// NetNS is the path of the pod's network namespace.
	NetNS       string     `json:"netns"`
	ContainerID string     `json:"containerID"`
	IPv4        netip.Addr `json:"ipv4"`
	IPv6        netip.Addr `json:"ipv6"`
	// Ready is false while AddPod has not finished, or when it died half
	// way; DeletePod and Down remove such a pod too.
	Ready bool `json:"ready"`
	// Added is when its CNI ADD returned: from then on a runtime would
	// start its containers.
	Added time.Time `json:"added,omitzero"`
}

// Ref is how commands name the pod: NAME in the default namespace,
// NAMESPACE/NAME in any other.
func (p Pod) Ref() string {
	if p.Namespace == DefaultNamespace {
		return p.Name
	}
	return p.Namespace + "/" + p.Name
}

// ContainerPort is a port of a pod's container, as in a Pod's
// spec.containers[].ports.
type ContainerPort struct {
	// Name is empty or an IANA service name (at most 15 characters).
	Name string `json:"name,omitempty"`
	Port uint16 `json:"port"`
	// Protocol is TCP, UDP or SCTP.
	Protocol string `json:"protocol"`
}

// state is cluster.json: everything Down needs to remove, recorded before
// it is made.
type state struct {
	Version int       `json:"version"`
	Name    string    `json:"name"`
	Dir     string    `json:"dir"`
	Phase   Phase     `json:"phase"`
	Created time.Time `json:"created"`

	AgentBinary string `json:"agentBinary"`
	CNIBinary   string `json:"cniBinary"`
	EtcdBinary  string `json:"etcdBinary"`
	// IdentityMode is Options.IdentityMode; empty (a file of before it)
	// is kvstore.
	IdentityMode        string   `json:"identityMode,omitempty"`
	KubeAPIServerBinary string   `json:"kubeAPIServerBinary,omitempty"`
	RoutingMode         string   `json:"routingMode"`
	AgentArgs           []string `json:"agentArgs,omitempty"`
	BPFRoot             string   `json:"bpfRoot"`
	// Cgroup is the parent of the nodes' cgroups.
	Cgroup string `json:"cgroup"`

	BridgeNetNS string     `json:"bridgeNetns"`
	Gateway4    netip.Addr `json:"gateway4"`
	Gateway6    netip.Addr `json:"gateway6"`
	Etcd        Process    `json:"etcd"`
	// KubeAPI is kube-apiserver, in crd mode.
	KubeAPI Process `json:"kubeAPI,omitzero"`
	// Relay is hubble-relay, when StartRelay started it.
	Relay Process `json:"relay,omitzero"`

	Nodes []Node `json:"nodes"`
	Pods  []Pod  `json:"pods"`
	// Outside is the namespace AddOutside made, if any.
	Outside *Outside `json:"outside,omitempty"`
}

func (s *state) manifestsDir() string { return filepath.Join(s.Dir, "manifests") }
func (s *state) etcdURL() string      { return "http://" + netip.AddrPortFrom(s.Gateway4, 2379).String() }
func (s *state) etcdLog() string      { return filepath.Join(s.Dir, "etcd.log") }

func (s *state) node(name string) (*Node, error) {
	for i := range s.Nodes {
		if s.Nodes[i].Name == name {
			return &s.Nodes[i], nil
		}
	}
	names := make([]string, len(s.Nodes))
	for i, n := range s.Nodes {
		names[i] = n.Name
	}
	return nil, fmt.Errorf("cluster %s has no node %q: its nodes are %v", s.Name, name, names)
}

// pod is the pod ref names (see Pod.Ref).
func (s *state) pod(ref string) (*Pod, error) {
	ns, name := splitPodRef(ref)
	for i := range s.Pods {
		if s.Pods[i].Namespace == ns && s.Pods[i].Name == name {
			return &s.Pods[i], nil
		}
	}
	return nil, fmt.Errorf("cluster %s has no pod %q (cellium-dev cluster status lists them)", s.Name, ref)
}

// splitPodRef is the namespace and name of a pod's Ref.
func splitPodRef(ref string) (namespace, name string) {
	if ns, name, ok := strings.Cut(ref, "/"); ok {
		return ns, name
	}
	return DefaultNamespace, ref
}

// plan is the state of a cluster before anything exists: every name and
// address, so that Down can remove whatever Up got to.
func plan(o Options, cgroupMount string) *state {
	s := &state{
		Version: stateVersion, Name: o.Name, Dir: o.Dir, Phase: PhaseCreating, Created: time.Now().UTC(),
		AgentBinary: o.AgentBinary, CNIBinary: o.CNIBinary, EtcdBinary: o.EtcdBinary,
		IdentityMode: o.IdentityMode, KubeAPIServerBinary: o.KubeAPIServerBinary,
		AgentArgs: o.AgentArgs, RoutingMode: o.RoutingMode, BPFRoot: o.BPFRoot,
		Cgroup:      filepath.Join(cgroupMount, "cellium-devcluster-"+o.Name),
		BridgeNetNS: filepath.Join(netnsDir, "cellium-"+o.Name+".bridge"),
		Gateway4:    netip.MustParseAddr("10.90.0.1"),
		Gateway6:    netip.MustParseAddr("fd00:10:90::1"),
		Pods:        []Pod{},
	}
	for i := 1; i <= o.Nodes; i++ {
		name := fmt.Sprintf("node-%d", i)
		dir := filepath.Join(o.Dir, name)
		s.Nodes = append(s.Nodes, Node{
			Name:  name,
			NetNS: filepath.Join(netnsDir, "cellium-"+o.Name+"."+name),
			IPv4:  netip.AddrFrom4([4]byte{10, 90, 0, byte(10 + i)}),
			IPv6:  netip.MustParseAddr(fmt.Sprintf("fd00:10:90::%d", 10+i)),
			PodCIDRs: []netip.Prefix{
				netip.MustParsePrefix(fmt.Sprintf("10.244.%d.0/24", i)),
				// The node's number written in hex digits reads as it does
				// in the IPv4 CIDR: node-12 has fd00:10:244:12::/64.
				netip.MustParsePrefix(fmt.Sprintf("fd00:10:244:%d::/64", i)),
			},
			Dir:       dir,
			Cgroup:    filepath.Join(s.Cgroup, name),
			BPFPrefix: "cellium_" + o.Name + "_" + name,
			APISocket: filepath.Join(dir, "run", "agent.sock"),
		})
	}
	return s
}

// Ranges blackholed in every node, and their purpose, for the docs and the
// routes alike.
var (
	podRanges     = []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("fd00:10:244::/48")}
	serviceRanges = []netip.Prefix{netip.MustParsePrefix("10.96.0.0/12"), netip.MustParsePrefix("fd00:10:96::/108")}
)

func (s *state) save() error {
	data, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	return statefile.WriteMode(filepath.Join(s.Dir, stateFile), append(data, '\n'), 0o644)
}

// loadState reads dir's cluster.json; a file that is not one is an error
// naming it and what is wrong.
func loadState(dir string) (*state, error) {
	path := filepath.Join(dir, stateFile)
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w in %s (no %s)", ErrNoCluster, dir, stateFile)
	}
	if err != nil {
		return nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var s state
	if err := dec.Decode(&s); err != nil {
		return nil, fmt.Errorf("state file %s: %w (it is written by cellium-dev cluster only; remove the cluster's namespaces by hand with ip netns del, or restore the file)", path, err)
	}
	if err := s.validate(dir); err != nil {
		return nil, fmt.Errorf("state file %s: %w", path, err)
	}
	return &s, nil
}

// validate checks what Down would act on: names that make paths, and
// paths where the cluster puts things, so a damaged file cannot make it
// remove something else.
func (s *state) validate(dir string) error {
	if s.Version != stateVersion {
		return fmt.Errorf("version %d, want %d (written by another version of the agent: take the cluster down with that one)", s.Version, stateVersion)
	}
	if !clusterNameRE().MatchString(s.Name) {
		return fmt.Errorf("invalid cluster name %q", s.Name)
	}
	if filepath.Clean(s.Dir) != filepath.Clean(dir) {
		return fmt.Errorf("it describes a cluster in %s, not in %s where it is", s.Dir, dir)
	}
	want := plan(Options{Name: s.Name, Dir: s.Dir, Nodes: MaxNodes}, filepath.Dir(s.Cgroup))
	if s.Cgroup != want.Cgroup || s.BridgeNetNS != want.BridgeNetNS {
		return fmt.Errorf("cgroup %q or bridge namespace %q is not the cluster's", s.Cgroup, s.BridgeNetNS)
	}
	for _, n := range s.Nodes {
		i := -1
		fmt.Sscanf(n.Name, "node-%d", &i)
		if i < 1 || i > MaxNodes || n.Name != fmt.Sprintf("node-%d", i) {
			return fmt.Errorf("invalid node name %q", n.Name)
		}
		w := want.Nodes[i-1]
		if n.NetNS != w.NetNS || n.Dir != w.Dir || n.Cgroup != w.Cgroup || n.BPFPrefix != w.BPFPrefix {
			return fmt.Errorf("node %s: its namespace, directory, cgroup or BPF prefix is not the cluster's", n.Name)
		}
	}
	for _, p := range s.Pods {
		if !podNameRE().MatchString(p.Name) || !podNameRE().MatchString(p.Namespace) || p.NetNS != podNetNS(s.Name, p) {
			return fmt.Errorf("invalid pod %q (network namespace %q)", p.Ref(), p.NetNS)
		}
	}
	return nil
}

// podNetNS is the path of p's network namespace: cellium-CLUSTER.pod.NAME,
// with NAMESPACE. before NAME outside the default namespace (names have no
// dots, so no two pods share one).
func podNetNS(cluster string, p Pod) string {
	return filepath.Join(netnsDir, "cellium-"+cluster+".pod."+podFileName(p))
}

// podFileName is NAME, or NAMESPACE.NAME outside the default namespace:
// p's part of the names of its network namespace and manifest.
func podFileName(p Pod) string {
	if p.Namespace == DefaultNamespace {
		return p.Name
	}
	return p.Namespace + "." + p.Name
}

// lockDir takes the cluster's lock: commands of several processes (two
// shells adding pods) change cluster.json one at a time.
func lockDir(dir string) (unlock func(), err error) {
	f, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lock cluster %s: %w", dir, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("lock cluster %s: %w", dir, err)
	}
	return func() { f.Close() }, nil
}
