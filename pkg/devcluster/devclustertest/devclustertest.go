// Package devclustertest runs a dev cluster (pkg/devcluster) for an
// end-to-end test: built from this module's agent and CNI plugin, named
// and placed so it runs beside a user's cluster and other tests' own,
// taken down when the test ends, with helpers that fail the test instead of
// returning errors, and TCP servers and clients that run inside pods.
//
//	func TestMain(m *testing.M) { devclustertest.Main(m) }
//
//	func TestPods(t *testing.T) {
//		c := devclustertest.Start(t, devcluster.Options{Nodes: 3})
//		a := c.AddPod("node-1", "a", map[string]string{"app": "a"})
//		b := c.AddPod("node-1", "b", nil)
//		c.ServeTCP("b", 8080)
//		r := c.DialTCP("a", netip.AddrPortFrom(b.IPv4, 8080))
//		// r.Reply.Pod == "b", r.Reply.Remote.Addr() == a.IPv4
//	}
//
// Start skips the test, saying why, when the machine cannot run a cluster:
// not root, no cgroup2, no network namespaces, no etcd. The agents and etcd
// die with the test process should it die before its cleanup.
//
// Servers and clients are this test binary again, started by the cluster
// in the pod's network namespace and its node's cgroup (Cluster.Start), so
// socket load balancing applies to them as to a container: that is why
// the package's TestMain must call Main (or ServeIfHelper).
package devclustertest

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cellium/cellium/pkg/apiv1"
	"github.com/cellium/cellium/pkg/devcluster"
	"github.com/cellium/cellium/pkg/nettest"
	"github.com/cellium/cellium/pkg/polltest"
)

// Main serves as a helper when the cluster started this test binary as
// one, and runs the tests otherwise. Call it from TestMain.
func Main(m *testing.M) {
	ServeIfHelper()
	code := m.Run()
	if bins.dir != "" {
		os.RemoveAll(bins.dir)
	}
	os.Exit(code)
}

var bins struct {
	once            sync.Once
	dir, agent, cni string
	err             error
}

// Binaries builds the agent and the CNI plugin of this module, once per
// test binary, into a directory Main removes at the end.
func Binaries(t testing.TB) (agent, cni string) {
	t.Helper()
	bins.once.Do(func() {
		bins.dir, bins.err = os.MkdirTemp("", "cellium-devcluster-bin-")
		if bins.err != nil {
			return
		}
		bins.agent, bins.cni = filepath.Join(bins.dir, "agent"), filepath.Join(bins.dir, "cellium-cni")
		for out, pkg := range map[string]string{bins.agent: "github.com/cellium/cellium/cmd/agent", bins.cni: "github.com/cellium/cellium/cmd/cellium-cni"} {
			b, err := exec.Command("go", "build", "-o", out, pkg).CombinedOutput()
			if err != nil {
				bins.err = fmt.Errorf("go build %s: %w\n%s", pkg, err, b)
				return
			}
		}
	})
	if bins.err != nil {
		t.Fatal(bins.err)
	}
	return bins.agent, bins.cni
}

// Cluster is a dev cluster for one test. Its methods with the names of
// devcluster.Cluster's fail the test instead of returning an error.
type Cluster struct {
	*devcluster.Cluster
	t testing.TB
}

// Start builds a cluster for t and takes it down when t ends. Unset
// options get values of the test's own: a random name, a fresh directory,
// this module's binaries (built once), StopWithCaller, logs to t.
func Start(t testing.TB, o devcluster.Options) *Cluster {
	t.Helper()
	if err := devcluster.CheckHost(); err != nil {
		t.Skip(err)
	}
	if _, err := devcluster.EtcdBinary(); err != nil {
		t.Skip(err)
	}
	if o.Name == "" {
		o.Name = RandomName()
	}
	if o.Dir == "" {
		// Short: the agents' unix socket paths must fit 108 bytes.
		dir, err := os.MkdirTemp("", "cdc-")
		if err != nil {
			t.Fatal(err)
		}
		o.Dir = dir
		t.Cleanup(func() { os.Remove(dir) })
	}
	if o.AgentBinary == "" {
		o.AgentBinary, o.CNIBinary = Binaries(t)
	}
	o.StopWithCaller = true
	if o.Log == nil {
		o.Log = slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	dc, err := devcluster.Up(ctx, o)
	if err != nil {
		t.Fatalf("dev cluster: %v", err)
	}
	c := &Cluster{Cluster: dc, t: t}
	t.Cleanup(func() {
		if t.Failed() {
			c.LogState()
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if err := dc.Down(ctx); err != nil {
			t.Errorf("dev cluster down: %v", err)
		}
	})
	return c
}

// RandomName is a cluster name no other test uses.
func RandomName() string {
	b := make([]byte, 4)
	rand.Read(b)
	return "t" + hex.EncodeToString(b)
}

// tWriter logs each write to t.
type tWriter struct{ t testing.TB }

func (w tWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(b), "\n"))
	return len(b), nil
}

// LogState logs the cluster's status and the end of every agent's log:
// what a failed test needs to be understood.
func (c *Cluster) LogState() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, _ := json.MarshalIndent(c.Status(ctx), "", "  ")
	c.t.Logf("dev cluster status:\n%s", st)
	for _, n := range c.Cluster.Nodes() {
		b, _ := os.ReadFile(n.Log())
		lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
		if len(lines) > 60 {
			lines = lines[len(lines)-60:]
		}
		c.t.Logf("the end of %s's agent log %s:\n%s", n.Name, n.Log(), strings.Join(lines, "\n"))
	}
}

func (c *Cluster) ctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 3*time.Minute)
}

// Node is the node called name.
func (c *Cluster) Node(name string) devcluster.Node {
	c.t.Helper()
	n, err := c.Cluster.Node(name)
	if err != nil {
		c.t.Fatal(err)
	}
	return n
}

// Pod is the pod called name (NAME, or NAMESPACE/NAME outside the
// default namespace).
func (c *Cluster) Pod(name string) devcluster.Pod {
	c.t.Helper()
	p, err := c.Cluster.Pod(name)
	if err != nil {
		c.t.Fatal(err)
	}
	return p
}

// AddPod adds a pod (see devcluster.Cluster.AddPod).
func (c *Cluster) AddPod(node, name string, labels map[string]string) devcluster.Pod {
	c.t.Helper()
	ctx, cancel := c.ctx()
	defer cancel()
	p, err := c.Cluster.AddPod(ctx, node, name, labels)
	if err != nil {
		c.t.Fatal(err)
	}
	return p
}

// AddPodSpec adds a pod (see devcluster.Cluster.AddPodSpec).
func (c *Cluster) AddPodSpec(spec devcluster.PodSpec) devcluster.Pod {
	c.t.Helper()
	ctx, cancel := c.ctx()
	defer cancel()
	p, err := c.Cluster.AddPodSpec(ctx, spec)
	if err != nil {
		c.t.Fatal(err)
	}
	return p
}

// SetPodLabels replaces a pod's labels and waits until its node's agent
// has them (see devcluster.Cluster.SetPodLabels).
func (c *Cluster) SetPodLabels(pod string, labels map[string]string) devcluster.Pod {
	c.t.Helper()
	ctx, cancel := c.ctx()
	defer cancel()
	p, err := c.Cluster.SetPodLabels(ctx, pod, labels)
	if err != nil {
		c.t.Fatal(err)
	}
	return p
}

// DeletePod deletes a pod.
func (c *Cluster) DeletePod(name string) {
	c.t.Helper()
	ctx, cancel := c.ctx()
	defer cancel()
	if err := c.Cluster.DeletePod(ctx, name); err != nil {
		c.t.Fatal(err)
	}
}

// Exec runs argv in pod and returns its standard output.
func (c *Cluster) Exec(pod string, argv ...string) string {
	c.t.Helper()
	ctx, cancel := c.ctx()
	defer cancel()
	out, err := c.Cluster.Exec(ctx, pod, argv...)
	if err != nil {
		c.t.Fatal(err)
	}
	return string(out)
}

// KillAgent kills node's agent with SIGKILL.
func (c *Cluster) KillAgent(node string) {
	c.t.Helper()
	ctx, cancel := c.ctx()
	defer cancel()
	if err := c.Cluster.KillAgent(ctx, node); err != nil {
		c.t.Fatal(err)
	}
}

// StopAgent stops node's agent with SIGTERM (SIGKILL after 10s).
func (c *Cluster) StopAgent(node string) {
	c.t.Helper()
	ctx, cancel := c.ctx()
	defer cancel()
	if err := c.Cluster.StopAgent(ctx, node); err != nil {
		c.t.Fatal(err)
	}
}

// StartAgent starts node's agent again, with extraArgs for this start
// only, and waits until it is ready.
func (c *Cluster) StartAgent(node string, extraArgs ...string) {
	c.t.Helper()
	ctx, cancel := c.ctx()
	defer cancel()
	if err := c.Cluster.StartAgent(ctx, node, extraArgs...); err != nil {
		c.t.Fatal(err)
	}
}

// WaitAgentExit waits until node's agent exits by itself (at a test fault
// point, say), 30s at most.
func (c *Cluster) WaitAgentExit(node string) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.Cluster.WaitAgentExit(ctx, node); err != nil {
		c.t.Fatal(err)
	}
}

// RestartAgent stops node's agent (SIGTERM), starts it again and waits
// until it is ready.
func (c *Cluster) RestartAgent(node string) {
	c.t.Helper()
	ctx, cancel := c.ctx()
	defer cancel()
	if err := c.Cluster.RestartAgent(ctx, node); err != nil {
		c.t.Fatal(err)
	}
}

// RemoveNode takes node out of the cluster.
func (c *Cluster) RemoveNode(node string) {
	c.t.Helper()
	ctx, cancel := c.ctx()
	defer cancel()
	if err := c.Cluster.RemoveNode(ctx, node); err != nil {
		c.t.Fatal(err)
	}
}

// WriteManifest writes a manifest every agent serves (a Service, say).
func (c *Cluster) WriteManifest(name, yaml string) {
	c.t.Helper()
	if err := c.Cluster.WriteManifest(name, []byte(yaml)); err != nil {
		c.t.Fatal(err)
	}
}

// WaitService waits until node's agent has the Service namespace/name in
// its datapath: every frontend in the maps, with a backend.
func (c *Cluster) WaitService(node, namespace, name string) {
	c.t.Helper()
	cl, err := c.Client(node)
	if err != nil {
		c.t.Fatal(err)
	}
	polltest.Until(c.t, fmt.Sprintf("service %s/%s in %s's datapath", namespace, name, node), 30*time.Second, 50*time.Millisecond, func() (bool, string) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		svc, err := cl.Service(ctx, namespace, name)
		if err != nil {
			return false, err.Error()
		}
		return len(svc.Frontends) > 0 && !slices.ContainsFunc(svc.Frontends, func(f apiv1.Frontend) bool {
			return f.Status != "Done" || len(f.Backends) == 0
		}), fmt.Sprintf("frontends %+v", svc.Frontends)
	})
}

// Ping sends an ICMP echo request from pod to dst and waits up to 5s for
// the reply.
func (c *Cluster) Ping(pod string, dst netip.Addr) error {
	c.t.Helper()
	return nettest.Ping(c.Pod(pod).NetNS, dst, 5*time.Second)
}

// Helper modes of the test binary, chosen by environment variables.
const (
	helperEnv   = "CELLIUM_DEVCLUSTERTEST_HELPER"
	addrEnv     = "CELLIUM_DEVCLUSTERTEST_ADDR"
	podEnv      = "CELLIUM_DEVCLUSTERTEST_POD"
	durationEnv = "CELLIUM_DEVCLUSTERTEST_DURATION"
)

// ServerReply is what a server of ServeTCP answers each connection with.
type ServerReply struct {
	// Pod is the server's pod.
	Pod string
	// Local is the server's side of the connection, Remote the client's as
	// the server sees it (after any translation).
	Local, Remote netip.AddrPort
}

// DialResult is what a client of DialTCP saw.
type DialResult struct {
	// Peer is getpeername of the connected socket: the address dialled,
	// even when socket load balancing connected it to a backend.
	Peer  netip.AddrPort
	Local netip.AddrPort
	Reply ServerReply
	// Cgroup is the client's cgroup2 path, relative to the mount.
	Cgroup string
	// Error says why the dial or the read failed; empty if neither did.
	Error string `json:",omitempty"`
}

// ServeTCP starts a TCP server in pod listening on port on every address,
// answering each connection with a ServerReply in JSON. It stops when the
// test ends.
func (c *Cluster) ServeTCP(pod string, port uint16) {
	c.t.Helper()
	h := c.startHelper(Where{Pod: pod}, "serve-tcp", false, addrEnv+"="+fmt.Sprintf(":%d", port), podEnv+"="+pod)
	line, err := h.out.ReadString('\n')
	if err != nil || strings.TrimSpace(line) != "listening" {
		c.t.Fatalf("TCP server in pod %s did not start (does the package's TestMain call devclustertest.Main?): %q %v %s", pod, line, err, h.stderr.String())
	}
}

// helperProcess is a helper that runs until the test ends.
type helperProcess struct {
	// in is its standard input, when asked for.
	in     io.WriteCloser
	out    *bufio.Reader
	stderr *strings.Builder
}

// startHelper starts the helper kind at w with env; it is stopped when the
// test ends.
func (c *Cluster) startHelper(w Where, kind string, stdin bool, env ...string) helperProcess {
	c.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cmd := helper(c.t, ctx, kind, env...)
	h := helperProcess{stderr: &strings.Builder{}}
	var err error
	if stdin {
		if h.in, err = cmd.StdinPipe(); err != nil {
			c.t.Fatal(err)
		}
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		c.t.Fatal(err)
	}
	h.out, cmd.Stderr = bufio.NewReader(stdout), h.stderr
	if err := c.start(w, cmd); err != nil {
		cancel()
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() {
		if h.in != nil {
			h.in.Close()
		}
		cancel()
		cmd.Wait()
	})
	return h
}

// DialTCP connects from pod to `to`, as a process of the pod (network
// namespace and node cgroup), reads what the server says and returns what
// it saw. A client that cannot run fails the test; a connection that fails
// is in DialResult.Error.
func (c *Cluster) DialTCP(pod string, to netip.AddrPort) DialResult {
	c.t.Helper()
	self, err := os.Executable()
	if err != nil {
		c.t.Fatal(err)
	}
	ctx, cancel := c.ctx()
	defer cancel()
	cmd := exec.CommandContext(ctx, self, "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"=dial-tcp", addrEnv+"="+to.String())
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := c.Start(pod, cmd); err != nil {
		c.t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		c.t.Fatalf("TCP client in pod %s: %v: %s", pod, err, stderr.String())
	}
	var r DialResult
	if err := json.Unmarshal([]byte(stdout.String()), &r); err != nil {
		c.t.Fatalf("TCP client in pod %s printed no result (does the package's TestMain call devclustertest.Main?): %v: %q %s", pod, err, stdout.String(), stderr.String())
	}
	return r
}

// helper is this test binary run as the helper kind, with env.
func helper(t testing.TB, ctx context.Context, kind string, env ...string) *exec.Cmd {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, self, "-test.run=^$")
	cmd.Env = append(append(os.Environ(), helperEnv+"="+kind), env...)
	return cmd
}

// Where a throughput helper runs: in a pod (its namespace and its node's
// cgroup), in a node's own namespace (the host side), or in another
// namespace by path, such as the outside namespace (no cgroup of the
// cluster's).
type Where struct {
	Pod   string
	Node  string
	NetNS string
}

func (c *Cluster) start(w Where, cmd *exec.Cmd) error {
	if w.Pod != "" {
		return c.Start(w.Pod, cmd)
	}
	// nsenter enters the namespace and execs the helper.
	nsPath := w.NetNS
	if nsPath == "" {
		nsPath = c.Node(w.Node).NetNS
	}
	cmd.Args = append([]string{"nsenter", "--net=" + nsPath, "--"}, cmd.Args...)
	path, err := exec.LookPath("nsenter")
	if err != nil {
		return err
	}
	cmd.Path = path
	return cmd.Start()
}

// Sink starts a server at w on port that reads and discards what it is
// sent, until the test ends.
func (c *Cluster) Sink(w Where, port uint16) {
	c.t.Helper()
	h := c.startHelper(w, "sink-tcp", false, addrEnv+"="+fmt.Sprintf(":%d", port))
	if line, err := h.out.ReadString('\n'); err != nil || strings.TrimSpace(line) != "listening" {
		c.t.Fatalf("sink at %+v did not start: %q %v", w, line, err)
	}
}

// Send sends from w to `to` (a Sink) as fast as TCP goes for d, and returns
// what it measured.
func (c *Cluster) Send(w Where, to netip.AddrPort, d time.Duration) Throughput {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d+30*time.Second)
	defer cancel()
	cmd := helper(c.t, ctx, "send-tcp", addrEnv+"="+to.String(), durationEnv+"="+d.String())
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := c.start(w, cmd); err != nil {
		c.t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		c.t.Fatalf("send from %+v to %s: %v: %s", w, to, err, stderr.String())
	}
	var r Throughput
	if err := json.Unmarshal([]byte(stdout.String()), &r); err != nil {
		c.t.Fatalf("send from %+v printed no result: %v: %q", w, err, stdout.String())
	}
	return r
}

// AddOutside makes the cluster's outside namespace (see
// devcluster.Cluster.AddOutside): a namespace on the bridge that is no
// node, for servers that play the world outside the cluster.
func (c *Cluster) AddOutside() devcluster.Outside {
	c.t.Helper()
	o, err := c.Cluster.AddOutside()
	if err != nil {
		c.t.Fatal(err)
	}
	return o
}
