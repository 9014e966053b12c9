package devcluster_test

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cellium/cellium/pkg/devcluster"
	"github.com/cellium/cellium/pkg/devcluster/devclustertest"
	"github.com/cellium/cellium/pkg/polltest"
)

func TestMain(m *testing.M) { devclustertest.Main(m) }

// One 3-node cluster: every agent ready and seen by Status; two pods on one
// node reach each other; a pod on node-2 is exec'd in node-2's cgroup and
// its socket load balancing is node-2's; Down removes everything.
func TestCluster(t *testing.T) {
	c := devclustertest.Start(t, devcluster.Options{Nodes: 3})
	ctx := t.Context()

	st := c.Status(ctx)
	if st.Phase != devcluster.PhaseUp || len(st.Nodes) != 3 || !st.Etcd.Running || !st.Etcd.Healthy {
		t.Fatalf("status = %+v, want 3 nodes, etcd running and healthy, phase up", st)
	}
	for i, n := range st.Nodes {
		if want := fmt.Sprintf("node-%d", i+1); n.Name != want || !n.Running || !n.Ready {
			t.Errorf("node %d = %s running=%v ready=%v (%v %s), want %s running and ready", i, n.Name, n.Running, n.Ready, n.Pending, n.Error, want)
		}
	}

	t.Run("pods on one node", func(t *testing.T) {
		a := c.AddPod("node-1", "a", map[string]string{"app": "a"})
		b := c.AddPod("node-1", "b", map[string]string{"app": "b"})
		if !c.Node("node-1").PodCIDRs[0].Contains(a.IPv4) || !c.Node("node-1").PodCIDRs[1].Contains(b.IPv6) {
			t.Fatalf("pods a %s and b %s are not in node-1's pod CIDRs %v", a.IPv4, b.IPv6, c.Node("node-1").PodCIDRs)
		}
		for _, dst := range []netip.Addr{b.IPv4, b.IPv6} {
			if err := c.Ping("a", dst); err != nil {
				t.Errorf("a -> b: %v", err)
			}
		}
		c.ServeTCP("b", 8080)
		for _, dst := range []netip.Addr{b.IPv4, b.IPv6} {
			r := c.DialTCP("a", netip.AddrPortFrom(dst, 8080))
			if r.Error != "" || r.Reply.Pod != "b" || r.Reply.Remote.Addr() != r.Local.Addr() || !(r.Local.Addr() == a.IPv4 || r.Local.Addr() == a.IPv6) {
				t.Errorf("TCP a -> b %s: %+v, want b's reply seeing a's address", dst, r)
			}
		}
		// The agent knows both pods with their labels.
		cl, err := c.Client("node-1")
		if err != nil {
			t.Fatal(err)
		}
		eps, err := cl.Endpoints(ctx)
		if err != nil {
			t.Fatal(err)
		}
		labels := map[string]string{}
		for _, ep := range eps {
			labels[ep.PodName] = ep.Labels["app"]
		}
		if labels["a"] != "a" || labels["b"] != "b" {
			t.Errorf("node-1's endpoints carry labels %v, want a: a, b: b", labels)
		}
	})

	t.Run("socket load balancing of node-2", func(t *testing.T) {
		c.AddPod("node-2", "client", nil)
		backend := c.AddPod("node-2", "backend", map[string]string{"app": "web"})
		c.ServeTCP("backend", 8080)
		c.WriteManifest("web.yaml", fmt.Sprintf(`apiVersion: v1
kind: Service
metadata: {name: web, namespace: default}
spec:
  clusterIP: 10.96.0.50
  ports: [{name: http, port: 80, targetPort: 8080, protocol: TCP}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-1
  namespace: default
  labels: {kubernetes.io/service-name: web}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints:
- addresses: [%s]
  conditions: {ready: true}
`, backend.IPv4))
		vip := netip.MustParseAddrPort("10.96.0.50:80")
		c.WaitService("node-2", "default", "web")
		r := c.DialTCP("client", vip)
		if r.Error != "" || r.Peer != vip || r.Reply.Pod != "backend" || r.Reply.Local != netip.AddrPortFrom(backend.IPv4, 8080) {
			t.Fatalf("client -> %s: %+v, want the backend's reply and getpeername %s", vip, r, vip)
		}
		// The client ran in node-2's cgroup, and nowhere else: the only
		// socket programs that could translate its connect are node-2's.
		if n2 := c.Node("node-2"); !strings.HasSuffix(n2.Cgroup, r.Cgroup) || r.Cgroup == "" {
			t.Errorf("the client ran in cgroup %q, want node-2's %s", r.Cgroup, n2.Cgroup)
		}
		out := c.Exec("client", "cat", "/proc/net/dev")
		if !strings.Contains(out, "eth0:") || strings.Contains(out, "lxc") {
			t.Errorf("Exec's process sees these devices, want only the pod's lo and eth0:\n%s", out)
		}
	})

	t.Run("kill, start, restart and remove", func(t *testing.T) {
		n3 := c.Node("node-3")
		c.KillAgent("node-3")
		if st := c.Status(ctx); st.Nodes[2].Running || st.Nodes[2].Ready {
			t.Fatalf("node-3 after KillAgent: running=%v ready=%v", st.Nodes[2].Running, st.Nodes[2].Ready)
		}
		c.StartAgent("node-3")
		if st := c.Status(ctx); !st.Nodes[2].Running || !st.Nodes[2].Ready || st.Nodes[2].Agent.PID == n3.Agent.PID {
			t.Fatalf("node-3 after StartAgent: running=%v ready=%v pid %d (was %d)", st.Nodes[2].Running, st.Nodes[2].Ready, st.Nodes[2].Agent.PID, n3.Agent.PID)
		}

		// node-1's pods keep their addresses and reach each other through
		// a restart of its agent.
		c.RestartAgent("node-1")
		if r := c.DialTCP("a", netip.AddrPortFrom(c.Pod("b").IPv4, 8080)); r.Error != "" || r.Reply.Pod != "b" {
			t.Errorf("TCP a -> b after node-1's agent restarted: %+v", r)
		}

		// A node whose agent died is removed with its pods all the same.
		c.AddPod("node-3", "gone", nil)
		agent3 := c.Node("node-3").Agent
		c.KillAgent("node-3")
		c.RemoveNode("node-3")
		for _, n := range c.Nodes() {
			if n.Name == "node-3" {
				t.Fatal("node-3 is still in the cluster")
			}
		}
		if _, err := c.Cluster.Pod("gone"); err == nil {
			t.Error("node-3's pod is still in the cluster")
		}
		for _, p := range []string{n3.NetNS, n3.Cgroup, n3.Dir, filepath.Join("/sys/fs/bpf", n3.BPFPrefix),
			filepath.Join(c.ManifestsDir(), "node.node-3.yaml"), filepath.Join(c.ManifestsDir(), "pod.gone.yaml")} {
			if _, err := os.Stat(p); !os.IsNotExist(err) {
				t.Errorf("%s is still there after RemoveNode (%v)", p, err)
			}
		}
		if agent3.Alive() {
			t.Error("node-3's agent still runs")
		}
	})

	t.Run("down", func(t *testing.T) {
		// A process the cluster knows nothing of, in a node's namespace:
		// Down ends it too, or the namespace would live on.
		stray := exec.Command("nsenter", "--net="+c.Node("node-1").NetNS, "sleep", "600")
		if err := stray.Start(); err != nil {
			t.Skipf("nsenter: %v", err)
		}
		strayExited := make(chan error, 1)
		go func() { strayExited <- stray.Wait() }()
		var node1 unix.Stat_t
		if err := unix.Stat(c.Node("node-1").NetNS, &node1); err != nil {
			t.Fatal(err)
		}
		polltest.Until(t, fmt.Sprintf("nsenter (pid %d) in node-1's namespace (inode %d)", stray.Process.Pid, node1.Ino), 10*time.Second, 10*time.Millisecond, func() (bool, string) {
			var s unix.Stat_t
			if err := unix.Stat(fmt.Sprintf("/proc/%d/ns/net", stray.Process.Pid), &s); err != nil {
				return false, err.Error()
			}
			return s.Ino == node1.Ino, fmt.Sprintf("its namespace's inode %d", s.Ino)
		})
		made := inventory(t, c.Cluster)
		if err := c.Down(ctx); err != nil {
			t.Fatal(err)
		}
		made.checkGone(t)
		select {
		case <-strayExited:
		default:
			t.Errorf("a process in node-1's namespace (pid %d) runs after Down", stray.Process.Pid)
			stray.Process.Kill()
		}
		if err := c.Down(ctx); err != nil {
			t.Errorf("second Down: %v", err)
		}
	})
}

// made is what a cluster made on the machine, to check that Down removed
// it all.
type made struct {
	paths     []string // namespaces' bind mounts, cgroups, pin dirs, the cluster dir
	netnsInos map[uint64]string
	pids      map[int]string
}

func inventory(t *testing.T, c *devcluster.Cluster) made {
	t.Helper()
	m := made{netnsInos: map[uint64]string{}, pids: map[int]string{}}
	st := c.Status(t.Context())
	netns := []string{}
	for _, n := range st.Nodes {
		netns = append(netns, n.NetNS)
		m.paths = append(m.paths, n.Cgroup, filepath.Join("/sys/fs/bpf", n.BPFPrefix))
		m.pids[n.Agent.PID] = "agent of " + n.Name
	}
	for _, p := range st.Pods {
		netns = append(netns, p.NetNS)
	}
	matches, _ := filepath.Glob("/var/run/netns/cellium-" + st.Name + ".*")
	if len(matches) != len(netns)+1 {
		t.Fatalf("namespaces of the cluster: %v, want %d of nodes and pods and the bridge's", matches, len(netns))
	}
	for _, path := range matches {
		var s unix.Stat_t
		if err := unix.Stat(path, &s); err != nil {
			t.Fatal(err)
		}
		m.netnsInos[s.Ino] = path
		m.paths = append(m.paths, path)
	}
	m.paths = append(m.paths, filepath.Dir(st.Nodes[0].Cgroup), st.Dir)
	m.pids[st.Etcd.PID] = "etcd"
	for _, p := range m.paths {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("before Down: %v", err)
		}
	}
	return m
}

func (m made) checkGone(t *testing.T) {
	t.Helper()
	for _, p := range m.paths {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s is still there after Down (%v)", p, err)
		}
	}
	for pid, what := range m.pids {
		if err := unix.Kill(pid, 0); err == nil {
			if b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); !strings.Contains(string(b), ") Z ") {
				t.Errorf("%s (pid %d) still runs after Down", what, pid)
			}
		}
	}
	// No process or thread is left in any of the namespaces: they are
	// gone, not merely unnamed.
	tasks, _ := filepath.Glob("/proc/[0-9]*/task/[0-9]*/ns/net")
	for _, task := range tasks {
		var s unix.Stat_t
		if unix.Stat(task, &s) != nil {
			continue
		}
		if ns, ok := m.netnsInos[s.Ino]; ok {
			t.Errorf("%s is in namespace %s after Down", filepath.Dir(filepath.Dir(task)), ns)
		}
	}
}

// A cluster whose agents cannot start: Up fails naming the node and what
// its log says, and leaves nothing behind.
func TestUpFails(t *testing.T) {
	if err := devcluster.CheckHost(); err != nil {
		t.Skip(err)
	}
	if _, err := devcluster.EtcdBinary(); err != nil {
		t.Skip(err)
	}
	agent, cni := devclustertest.Binaries(t)
	name := devclustertest.RandomName()
	dir := filepath.Join(t.TempDir(), "c")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, err := devcluster.Up(ctx, devcluster.Options{
		Name: name, Nodes: 2, Dir: dir, AgentBinary: agent, CNIBinary: cni, StopWithCaller: true,
		AgentArgs: []string{"--lb-algorithm", "bogus"},
	})
	if err == nil || !strings.Contains(err.Error(), "node node-1: the agent (pid") || !strings.Contains(err.Error(), `invalid --lb-algorithm "bogus"`) {
		t.Fatalf("Up with a bad agent flag = %v, want node-1's agent exited, with its log's error", err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("the cluster directory is left after a failed Up: %v", err)
	}
	if left, _ := filepath.Glob("/var/run/netns/cellium-" + name + ".*"); len(left) > 0 {
		t.Errorf("namespaces left after a failed Up: %v", left)
	}
	if left, _ := filepath.Glob("/sys/fs/bpf/cellium_" + name + "_*"); len(left) > 0 {
		t.Errorf("pin directories left after a failed Up: %v", left)
	}
	if left, _ := filepath.Glob("/sys/fs/cgroup/*/cellium-devcluster-" + name); len(left) > 0 {
		t.Errorf("cgroups left after a failed Up: %v", left)
	}
}
