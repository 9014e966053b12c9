package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/cellium/cellium/cells/bpfmaps/bpfmapstest"
	"github.com/cellium/cellium/cells/loader/socklbtest"
	"github.com/cellium/cellium/pkg/apiv1"
	"github.com/cellium/cellium/pkg/cgroup2"
	"github.com/cellium/cellium/pkg/client"
	"github.com/cellium/cellium/pkg/nettest"
)

// binDir holds the agent and the plugin, built once: it is the runtime's
// CNI_PATH.
var binDir string

func TestMain(m *testing.M) {
	// The socket clients of the datapath tests are this binary, started
	// in a pod's namespace and the node's cgroup.
	socklbtest.ServeIfClient()
	dir, err := os.MkdirTemp("", "cellium-cni-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binDir = dir
	// The floor of the CNI benchmarks: a Go plugin that does nothing.
	noop := filepath.Join(dir, "noop.go")
	if err := os.WriteFile(noop, []byte(noopPlugin), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	// The plugin as the image builds it (make image): static, without
	// cgo, so without the dynamic loader and libc's start in every exec.
	for _, b := range []struct {
		out, pkg string
		shipped  bool
	}{{"agent", "../agent", false}, {"cellium-cni", ".", true}, {"noop-plugin", noop, false}} {
		build := exec.Command("go", "build", "-o", filepath.Join(dir, b.out), b.pkg)
		if b.shipped {
			build = exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w", "-o", filepath.Join(dir, b.out), b.pkg)
			build.Env = append(os.Environ(), "CGO_ENABLED=0")
		}
		build.Stdout, build.Stderr = os.Stderr, os.Stderr
		if err := build.Run(); err != nil {
			fmt.Fprintf(os.Stderr, "build %s: %v\n", b.pkg, err)
			os.Exit(1)
		}
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// noopPlugin is a CNI plugin that does nothing: it reads its
// configuration and prints an empty result.
const noopPlugin = `package main

import (
	"io"
	"os"
)

func main() {
	io.Copy(io.Discard, os.Stdin)
	os.Stdout.WriteString("{\"cniVersion\":\"1.0.0\"}\n")
}
`

// node is a machine for the end-to-end tests: a network namespace that
// plays the host, in which the built agent runs, with private paths. Pods
// are namespaces joined to it by the agent's veth pairs; nothing the test
// sends leaves these namespaces, and the host has blackhole routes over
// the test's ranges besides.
type node struct {
	t      testing.TB
	ns     ns.NetNS
	dir    string
	v4, v6 netip.Prefix
	// podCIDR is --pod-cidr: v4 and v6 unless a test narrows it.
	podCIDR string
	socket  string
	bpfRoot string
	// cgroup is the agent's --cgroup-root: its socket programs must not see
	// every socket of the machine.
	cgroup string
	agent  *agentProcess
	// agentBin is the agent binary start runs; "" is the one built for
	// the tests.
	agentBin string
	cni      *libcni.CNIConfig
	// healthAddr is the agent's --health-addr, in the node's namespace.
	healthAddr string
}

func newNode(t testing.TB) *node {
	t.Helper()
	nettest.RequireRoot(t)
	v4, v6 := nettest.Ranges(t)
	dir := t.TempDir()
	n := &node{
		t: t, ns: nettest.NewNS(t), dir: dir, v4: v4, v6: netip.PrefixFrom(v6.Addr(), 120),
		socket: filepath.Join(dir, "run", "agent.sock"), bpfRoot: bpfmapstest.Root(t),
		cni: libcni.NewCNIConfigWithCacheDir([]string{binDir}, filepath.Join(dir, "cni-cache"), nil),
	}
	n.podCIDR = n.v4.String() + "," + n.v6.String()
	n.healthAddr = freePort(t)
	mount, err := cgroup2.Mount()
	if err != nil {
		t.Skipf("no cgroup2 mount for the agent's socket programs: %v", err)
	}
	if n.cgroup, err = os.MkdirTemp(mount, "cellium-cni-test-"); err != nil {
		t.Skipf("cannot create a cgroup for the agent's socket programs: %v", err)
	}
	t.Cleanup(func() { os.Remove(n.cgroup) })
	// The node routes between its pods; the agent's --proc-fs is a
	// directory, so it does not change the host's forwarding.
	err = nettest.Do(n.ns.Path(), func() error {
		for _, p := range []string{"/proc/sys/net/ipv4/ip_forward", "/proc/sys/net/ipv6/conf/all/forwarding"} {
			if err := os.WriteFile(p, []byte("1"), 0); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("enable forwarding in the node's netns: %v", err)
	}
	for _, p := range []string{"net/ipv4/ip_forward", "net/ipv6/conf/all/forwarding"} {
		path := filepath.Join(dir, "proc", "sys", p)
		os.MkdirAll(filepath.Dir(path), 0o755)
		if err := os.WriteFile(path, []byte("0\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { n.kill() })
	return n
}

func (n *node) flags(extra ...string) []string {
	return append([]string{
		"--state-dir", filepath.Join(n.dir, "state"),
		"--run-dir", filepath.Join(n.dir, "run"),
		"--api-socket", n.socket,
		"--cni-conf-dir", filepath.Join(n.dir, "net.d"),
		"--bpf-root", n.bpfRoot,
		"--proc-fs", filepath.Join(n.dir, "proc"),
		"--health-addr", n.healthAddr,
		"--metrics-addr", "",
		"--pod-cidr", n.podCIDR,
		"--cgroup-root", n.cgroup,
		"--log-format", "json",
		// No health endpoint: its namespace, bind-mounted in the state
		// dir, would outlive the test's directory.
		"--cluster-health-port", "0",
	}, extra...)
}

func freePort(t testing.TB) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// agentProcess is one run of the agent binary.
type agentProcess struct {
	cmd      *exec.Cmd
	exitOnce sync.Once
	exited   chan struct{}
	exitErr  error
	// restored is the log line of the endpoint restore.
	restored map[string]any

	mu sync.Mutex
	// log keeps every line, for the test's output when it fails.
	log []string
	// seen holds the first line of each message; changed is closed and
	// replaced when a line is added.
	seen    map[string]map[string]any
	changed chan struct{}
	done    bool
}

// start runs the agent in the node's namespace and waits until it has
// started and restored its endpoints.
func (n *node) start(extra ...string) *agentProcess {
	n.t.Helper()
	a := n.startAsync(extra...)
	// Ready: the CNI configuration is written only then.
	a.restored = a.waitLog(n.t, "Started hive", "Restored endpoints", "Wrote CNI configuration")["Restored endpoints"]
	return a
}

// startAsync runs the agent in the node's namespace.
func (n *node) startAsync(extra ...string) *agentProcess {
	n.t.Helper()
	bin := n.agentBin
	if bin == "" {
		bin = filepath.Join(binDir, "agent")
	}
	cmd := exec.Command(bin, append([]string{"run"}, n.flags(extra...)...)...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		n.t.Fatal(err)
	}
	// Started from a thread in the node's namespace, the agent lives there.
	if err := nettest.Do(n.ns.Path(), cmd.Start); err != nil {
		n.t.Fatalf("start agent: %v", err)
	}
	a := &agentProcess{cmd: cmd, exited: make(chan struct{}), seen: map[string]map[string]any{}, changed: make(chan struct{})}
	n.agent = a
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			var line map[string]any
			json.Unmarshal(sc.Bytes(), &line)
			a.mu.Lock()
			a.log = append(a.log, sc.Text())
			if msg, ok := line["msg"].(string); ok && a.seen[msg] == nil {
				a.seen[msg] = line
			}
			close(a.changed)
			a.changed = make(chan struct{})
			a.mu.Unlock()
		}
		a.mu.Lock()
		a.done = true
		close(a.changed)
		a.mu.Unlock()
	}()
	go func() {
		err := cmd.Wait()
		a.exitOnce.Do(func() { a.exitErr = err; close(a.exited) })
	}()
	n.t.Cleanup(func() {
		if n.t.Failed() {
			a.mu.Lock()
			n.t.Logf("agent log:\n%s", strings.Join(a.log, "\n"))
			a.mu.Unlock()
		}
	})
	return a
}

// waitLog waits until the agent has logged every message, in any order,
// since it started, and returns the lines.
func (a *agentProcess) waitLog(t testing.TB, msgs ...string) map[string]map[string]any {
	t.Helper()
	timeout := time.After(60 * time.Second)
	for {
		a.mu.Lock()
		found := map[string]map[string]any{}
		for _, msg := range msgs {
			if line := a.seen[msg]; line != nil {
				found[msg] = line
			}
		}
		changed, done := a.changed, a.done
		a.mu.Unlock()
		if len(found) == len(msgs) {
			return found
		}
		if done {
			t.Fatalf("agent exited before logging %q", msgs)
		}
		select {
		case <-changed:
		case <-timeout:
			t.Fatalf("agent did not log %q within 60s", msgs)
		}
	}
}

// lines are every line the agent logged with message msg, parsed.
func (a *agentProcess) lines(msg string) []map[string]any {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []map[string]any
	for _, l := range a.log {
		var line map[string]any
		if json.Unmarshal([]byte(l), &line) == nil && line["msg"] == msg {
			out = append(out, line)
		}
	}
	return out
}

// wait waits for the agent to exit and returns how it did.
func (a *agentProcess) wait() error {
	<-a.exited
	return a.exitErr
}

// kill stops the agent with SIGKILL, as a crash would, and waits for it.
func (n *node) kill() {
	if n.agent == nil {
		return
	}
	n.agent.cmd.Process.Kill()
	n.agent.wait()
	n.agent = nil
}

// conflist is the agent's CNI configuration.
func (n *node) conflist() *libcni.NetworkConfigList {
	n.t.Helper()
	list, err := libcni.ConfListFromFile(filepath.Join(n.dir, "net.d", "05-cellium.conflist"))
	if err != nil {
		n.t.Fatalf("the agent's CNI configuration: %v", err)
	}
	return list
}

// pod is a container with its network namespace.
type pod struct {
	name string
	id   string
	ns   ns.NetNS
}

func (n *node) newPod(name string) *pod {
	// A container ID allows letters, digits, '_', '.' and '-'.
	test := strings.Map(func(r rune) rune {
		if r == '_' || r == '.' || r == '-' || ('a' <= r && r <= 'z') || ('A' <= r && r <= 'Z') || ('0' <= r && r <= '9') {
			return r
		}
		return '-'
	}, n.t.Name())
	return &pod{name: name, id: fmt.Sprintf("%s-%s-%d", test, name, time.Now().UnixNano()), ns: nettest.NewNS(n.t)}
}

func (p *pod) runtimeConf() *libcni.RuntimeConf {
	return &libcni.RuntimeConf{
		ContainerID: p.id, NetNS: p.ns.Path(), IfName: "eth0",
		Args: [][2]string{{"K8S_POD_NAMESPACE", "default"}, {"K8S_POD_NAME", p.name}},
	}
}

// add is a runtime's CNI ADD of the pod with the agent's configuration.
func (n *node) add(p *pod) (netip.Addr, netip.Addr) {
	n.t.Helper()
	res, err := n.cni.AddNetworkList(context.Background(), n.conflist(), p.runtimeConf())
	if err != nil {
		n.t.Fatalf("CNI ADD of %s: %v", p.name, err)
	}
	return resultAddrs(n.t, res)
}

func resultAddrs(t testing.TB, res types.Result) (v4, v6 netip.Addr) {
	t.Helper()
	var r struct {
		IPs []struct {
			Address string `json:"address"`
		} `json:"ips"`
	}
	var buf bytes.Buffer
	if err := res.PrintTo(&buf); err != nil || json.Unmarshal(buf.Bytes(), &r) != nil {
		t.Fatalf("CNI result %s: %v", buf.String(), err)
	}
	for _, ip := range r.IPs {
		p := netip.MustParsePrefix(ip.Address)
		if p.Addr().Is4() {
			v4 = p.Addr()
		} else {
			v6 = p.Addr()
		}
	}
	return v4, v6
}

// cniExec runs the plugin binary as a runtime does, with the CNI_*
// variables and the configuration on stdin, and returns its stdout and,
// when it fails, its CNI error.
func cniExec(t testing.TB, env map[string]string, stdin []byte) ([]byte, *types.Error) {
	t.Helper()
	cmd := pluginCmd(filepath.Join(binDir, "cellium-cni"), env, stdin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if ee, ok := errors.AsType[*exec.ExitError](err); ok {
		var cniErr types.Error
		if jerr := json.Unmarshal(stdout.Bytes(), &cniErr); jerr != nil {
			t.Fatalf("plugin exited %d without a CNI error on stdout: %q (stderr %q)", ee.ExitCode(), stdout.String(), stderr.String())
		}
		return stdout.Bytes(), &cniErr
	}
	if err != nil {
		t.Fatalf("run plugin: %v", err)
	}
	return stdout.Bytes(), nil
}

// pluginConf is the configuration a runtime hands the plugin for the
// agent's network list.
func (n *node) pluginConf(version string) []byte {
	return fmt.Appendf(nil, `{"cniVersion":%q,"name":"cellium","type":"cellium-cni","socket":%q}`, version, n.socket)
}

// agentCLI runs a client command of the built agent against the node's agent.
func (n *node) agentCLI(args ...string) string {
	n.t.Helper()
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(filepath.Join(binDir, "agent"), append(args, "--api-socket", n.socket)...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		n.t.Fatalf("agent %v: %v\n%s", args, err, stderr.String())
	}
	return stdout.String()
}

// endpoints is `agent endpoint list -o json`.
func (n *node) endpoints() []apiv1.Endpoint {
	n.t.Helper()
	var eps []apiv1.Endpoint
	if out := n.agentCLI("endpoint", "list", "-o", "json"); json.Unmarshal([]byte(out), &eps) != nil {
		n.t.Fatalf("agent endpoint list -o json is not a JSON array of endpoints:\n%s", out)
	}
	return eps
}

// allocations is `agent ipam list -o json`, as "ip owner state", routers
// left out.
func (n *node) allocations() []string {
	n.t.Helper()
	var allocs []apiv1.IPAMAllocation
	if out := n.agentCLI("ipam", "list", "-o", "json"); json.Unmarshal([]byte(out), &allocs) != nil {
		n.t.Fatalf("agent ipam list -o json is not a JSON array of allocations:\n%s", out)
	}
	var out []string
	for _, a := range allocs {
		if a.State != apiv1.AllocationRouter {
			out = append(out, a.IP+" "+a.Owner+" "+a.State)
		}
	}
	return out
}

// hostLink says whether the node has a link of that name.
func (n *node) hostLink(name string) bool {
	n.t.Helper()
	found := false
	err := n.ns.Do(func(ns.NetNS) error {
		_, err := netlink.LinkByName(name)
		found = err == nil
		return nil
	})
	if err != nil {
		n.t.Fatal(err)
	}
	return found
}

// stateDirs are the endpoint state directories on disk.
func (n *node) stateDirs() []string {
	entries, _ := os.ReadDir(filepath.Join(n.dir, "state", "endpoints"))
	var out []string
	for _, e := range entries {
		out = append(out, e.Name())
	}
	return out
}

func (n *node) client() *client.Client { return client.New(n.socket) }

// router is a pool's router address.
func router(p netip.Prefix) netip.Addr { return p.Addr().Next() }

// exitedBySIGKILL says whether the agent process died of SIGKILL.
func exitedBySIGKILL(err error) bool {
	ee, ok := errors.AsType[*exec.ExitError](err)
	if !ok {
		return false
	}
	ws, ok := ee.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && ws.Signal() == unix.SIGKILL
}
