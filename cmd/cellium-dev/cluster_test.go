package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/cellium/cellium/pkg/devcluster"
	"github.com/cellium/cellium/pkg/devcluster/devclustertest"
)

// The binaries as make build puts them: cellium-dev with the agent and the
// CNI plugin beside it, where `cluster up` looks for them.
var devBin, agentBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "cellium-dev-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	devBin, agentBin = filepath.Join(dir, "cellium-dev"), filepath.Join(dir, "agent")
	for out, pkg := range map[string]string{devBin: ".", agentBin: "../agent", filepath.Join(dir, "cellium-cni"): "../cellium-cni"} {
		build := exec.Command("go", "build", "-o", out, pkg)
		build.Stdout, build.Stderr = os.Stderr, os.Stderr
		if err := build.Run(); err != nil {
			fmt.Fprintln(os.Stderr, "build", pkg+":", err)
			os.RemoveAll(dir)
			os.Exit(1)
		}
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// run runs bin with args and returns what it printed and its exit code.
func run(t *testing.T, bin string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	var out, errb bytes.Buffer
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if ee, ok := errors.AsType[*exec.ExitError](err); ok {
		return out.String(), errb.String(), ee.ExitCode()
	}
	if err != nil {
		t.Fatalf("%s %v: %v", bin, args, err)
	}
	return out.String(), errb.String(), 0
}

// devCmd runs cellium-dev; agentCmd runs a client command of the agent.
func devCmd(t *testing.T, args ...string) (string, string, int) {
	t.Helper()
	return run(t, devBin, args...)
}

func agentCmd(t *testing.T, args ...string) (string, string, int) {
	t.Helper()
	return run(t, agentBin, args...)
}

// newClusterDir skips t on a machine that cannot run a cluster, else gives
// it a fresh cluster name and an empty directory for it (which down
// empties and the cleanup removes).
func newClusterDir(t *testing.T) (name, dir string) {
	if err := devcluster.CheckHost(); err != nil {
		t.Skip(err)
	}
	if _, err := devcluster.EtcdBinary(); err != nil {
		t.Skip(err)
	}
	dir, err := os.MkdirTemp("", "cdc-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(dir) })
	return devclustertest.RandomName(), dir
}

// The cluster commands as a user runs them: up, status, pods, exec,
// down, and what each says to bad input.
func TestDevCluster(t *testing.T) {
	name, dir := newClusterDir(t)
	sel := []string{"--name", name, "--dir", dir}
	dc := func(args ...string) (string, string, int) {
		t.Helper()
		return devCmd(t, append(append([]string{"cluster"}, sel...), args...)...)
	}
	// The agents outlive `up`: whatever happens, take them down.
	t.Cleanup(func() {
		if _, errOut, code := dc("down"); code != 0 {
			t.Errorf("dev-cluster down at cleanup = %d: %s", code, errOut)
		}
	})

	out, errOut, code := dc("up", "--nodes", "2", "-o", "json")
	if code != 0 {
		t.Fatalf("dev-cluster up = %d: %s", code, errOut)
	}
	var st devcluster.Status
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("up -o json is not a status: %v\n%s", err, out)
	}
	if st.Name != name || len(st.Nodes) != 2 || !st.Nodes[0].Ready || !st.Nodes[1].Ready || st.Phase != devcluster.PhaseUp {
		t.Fatalf("status after up = %+v, want 2 ready nodes", st)
	}
	if !strings.Contains(errOut, `"msg":"Agent ready"`) {
		t.Errorf("up logged no progress:\n%s", errOut)
	}
	// The nodes run the agent beside cellium-dev.
	for _, n := range st.Nodes {
		if exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", n.Agent.PID)); err != nil || exe != agentBin {
			t.Errorf("%s runs %q (%v), want the agent beside cellium-dev, %s", n.Name, exe, err, agentBin)
		}
	}

	out, _, code = dc("status")
	if code != 0 || !strings.Contains(out, "node-1   10.90.0.11") || strings.Count(out, "   ready\n") != 2 {
		t.Errorf("status = %d, want both nodes ready in a table:\n%s", code, out)
	}

	out, errOut, code = dc("pod", "add", "node-2", "web", "--label", "app=web", "-o", "json")
	if code != 0 {
		t.Fatalf("pod add = %d: %s", code, errOut)
	}
	var pod devcluster.Pod
	if err := json.Unmarshal([]byte(out), &pod); err != nil || pod.Node != "node-2" || pod.Labels["app"] != "web" || !st.Nodes[1].PodCIDRs[0].Contains(pod.IPv4) {
		t.Fatalf("pod add -o json = %s (%v), want web on node-2 with an address of node-2's", out, err)
	}

	for _, bad := range []struct {
		args []string
		want string
	}{
		{[]string{"pod", "add", "node-9", "x"}, `cluster ` + name + ` has no node "node-9": its nodes are [node-1 node-2]`},
		{[]string{"pod", "add", "node-1", "X"}, `invalid pod name "X"`},
		{[]string{"pod", "add", "node-1", "x", "--label", "app"}, `invalid --label "app": want key=value`},
		{[]string{"pod", "add", "node-1", "x", "--label", "a b=c"}, `invalid label key "a b"`},
		{[]string{"pod", "add", "node-1", "web"}, `has a pod "web" already`},
		{[]string{"pod", "add", "node-1", "x", "--namespace", "Prod"}, `invalid namespace "Prod"`},
		{[]string{"pod", "add", "node-1", "x", "--port", "http=99999"}, `invalid --port "http=99999": want [NAME=]PORT[/PROTOCOL]`},
		{[]string{"pod", "add", "node-1", "x", "--port", "80/ICMP"}, `invalid protocol "ICMP" of port 80`},
		{[]string{"pod", "label", "web", "tier-"}, `invalid label change "tier-": the pod has no label tier`},
		{[]string{"pod", "label", "web", "=x"}, `invalid label change "=x"`},
		{[]string{"pod", "label", "prod/web", "a=b"}, `has no pod "prod/web"`},
		{[]string{"pod", "del", "nope"}, `has no pod "nope"`},
		{[]string{"exec", "web", "cat"}, "want a pod, --, and a command"},
		{[]string{"exec", "nope", "--", "true"}, `has no pod "nope"`},
		{[]string{"up"}, "a cluster exists in " + dir + " already"},
		{[]string{"status", "-o", "yaml"}, `invalid --output "yaml"`},
	} {
		_, errOut, code := dc(bad.args...)
		if code != 1 || !strings.Contains(errOut, bad.want) {
			t.Errorf("dev-cluster %v = %d, %q; want 1 and %q", bad.args, code, errOut, bad.want)
		}
	}
	if _, errOut, code := devCmd(t, "cluster", "status", "--name", "Bad_Name"); code != 1 || !strings.Contains(errOut, `--name: invalid cluster name "Bad_Name"`) {
		t.Errorf("status --name Bad_Name = %d, %q", code, errOut)
	}

	// exec runs in the pod's namespace (its eth0, no node's links) and in
	// node-2's cgroup, and exits with the command's code.
	out, errOut, code = dc("exec", "web", "--", "sh", "-c", "cat /proc/net/dev /proc/self/cgroup")
	if code != 0 || !strings.Contains(out, "eth0:") || strings.Contains(out, "lxc") || !strings.Contains(out, "0::/cellium-devcluster-"+name+"/node-2\n") {
		t.Errorf("exec = %d (%s), want the pod's devices and node-2's cgroup:\n%s", code, errOut, out)
	}
	if _, _, code := dc("exec", "web", "--", "sh", "-c", "exit 7"); code != 7 {
		t.Errorf("exec of a command that exits 7 = %d", code)
	}

	// A pod of the same name in another namespace, with named ports; a
	// label change reaches its node's agent before `pod label` returns.
	out, errOut, code = dc("pod", "add", "node-1", "web", "--namespace", "prod", "--label", "app=web", "--port", "http=8080", "--port", "53/udp", "-o", "json")
	var prodWeb devcluster.Pod
	if err := json.Unmarshal([]byte(out), &prodWeb); code != 0 || err != nil || prodWeb.Namespace != "prod" || prodWeb.Ref() != "prod/web" ||
		!slices.Equal(prodWeb.Ports, []devcluster.ContainerPort{{Name: "http", Port: 8080, Protocol: "TCP"}, {Port: 53, Protocol: "UDP"}}) {
		t.Fatalf("pod add --namespace prod = %d %s (%v): %s", code, out, err, errOut)
	}
	if out, errOut, code := dc("pod", "label", "prod/web", "app-", "tier=front"); code != 0 || !strings.Contains(out, "prod        web   node-1") || !strings.Contains(out, "tier=front   ready") {
		t.Errorf("pod label = %d: %s%s", code, out, errOut)
	}
	if out, errOut, code := agentCmd(t, "endpoint", "get", "container-id:"+prodWeb.ContainerID, "-o", "json", "--api-socket", st.Nodes[0].APISocket); code != 0 ||
		!strings.Contains(out, `"tier": "front"`) || strings.Contains(out, `"app"`) || !strings.Contains(out, `"podNamespace": "prod"`) {
		t.Errorf("endpoint get of prod/web after pod label = %d: %s%s", code, out, errOut)
	}
	if b, err := os.ReadFile(filepath.Join(st.ManifestsDir, "pod.prod.web.yaml")); err != nil || !strings.Contains(string(b), "name: http") {
		t.Errorf("manifest of prod/web: %v\n%s", err, b)
	}
	out, _, _ = dc("pod", "list")
	if !strings.Contains(out, "default     web   node-2   "+pod.IPv4.String()) || !strings.Contains(out, "prod        web   node-1   "+prodWeb.IPv4.String()) {
		t.Errorf("pod list does not show both webs:\n%s", out)
	}
	if out, errOut, code := dc("exec", "prod/web", "--", "cat", "/proc/self/cgroup"); code != 0 || !strings.Contains(out, "/node-1\n") {
		t.Errorf("exec in prod/web = %d: %s%s", code, out, errOut)
	}
	if out, errOut, code := dc("pod", "del", "prod/web"); code != 0 || out != "Deleted pod prod/web\n" {
		t.Errorf("pod del prod/web = %d: %s%s", code, out, errOut)
	}
	if out, errOut, code := dc("pod", "del", "web"); code != 0 || out != "Deleted pod web\n" {
		t.Errorf("pod del = %d: %s%s", code, out, errOut)
	}
	if out, _, _ := dc("pod", "list", "-o", "json"); strings.TrimSpace(out) != "[]" {
		t.Errorf("pod list -o json after del = %s, want []", out)
	}
	if _, err := os.Stat(pod.NetNS); !os.IsNotExist(err) {
		t.Errorf("the pod's namespace is left after del: %v", err)
	}

	// The outside namespace: made once, then shown; down removes it.
	out, errOut, code = dc("outside", "-o", "json")
	var outside devcluster.Outside
	if err := json.Unmarshal([]byte(out), &outside); code != 0 || err != nil || outside.IPv4.String() != "10.90.0.200" {
		t.Fatalf("outside -o json = %d %s (%v): %s", code, out, err, errOut)
	}
	if out, _, code := dc("outside"); code != 0 || out != "Outside namespace "+outside.NetNS+": 10.90.0.200, fd00:10:90::200\n" {
		t.Errorf("outside again = %d: %q", code, out)
	}
	// node-1's masquerade rows: its pod CIDR masqueraded, in the kernel.
	if out, errOut, code := agentCmd(t, "db", "show", "masquerade", "--api-socket", st.Nodes[0].APISocket); code != 0 ||
		!regexp.MustCompile(`source\s+10\.244\.1\.0/24\s+pod CIDR of this node \(node-1\)\s+Done`).MatchString(out) {
		t.Errorf("db show masquerade on node-1 = %d: %s%s", code, out, errOut)
	}

	if out, errOut, code := dc("down"); code != 0 || out != "Cluster "+name+" is down\n" {
		t.Fatalf("down = %d: %s%s", code, out, errOut)
	}
	for _, n := range st.Nodes {
		if n.Agent.Alive() {
			t.Errorf("%s's agent runs after down", n.Name)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "cluster.json")); !os.IsNotExist(err) {
		t.Errorf("cluster.json after down: %v", err)
	}
	if _, err := os.Stat(outside.NetNS); !os.IsNotExist(err) {
		t.Errorf("the outside namespace is left after down: %v", err)
	}
	if out, _, code := dc("down"); code != 0 || !strings.HasPrefix(out, "No cluster in "+dir) {
		t.Errorf("second down = %d: %s", code, out)
	}
}

// An up killed half way leaves a cluster that down takes down whole:
// processes it did not get to record included.
func TestDevClusterDownAfterKilledUp(t *testing.T) {
	name, dir := newClusterDir(t)
	sel := []string{"cluster", "--name", name, "--dir", dir}

	up := exec.Command(devBin, append(sel, "up", "--nodes", "3")...)
	stderr, err := up.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := up.Start(); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(stderr)
	for sc.Scan() && !strings.Contains(sc.Text(), `"msg":"Started etcd"`) {
	}
	up.Process.Kill()
	up.Wait()
	t.Cleanup(func() { devCmd(t, append(sel, "down")...) })

	var st devcluster.Status
	out, _, _ := devCmd(t, append(sel, "status", "-o", "json")...)
	if err := json.Unmarshal([]byte(out), &st); err != nil || st.Phase != devcluster.PhaseCreating {
		t.Fatalf("status after a killed up = %s (%v), want phase creating", out, err)
	}
	namespaces, _ := filepath.Glob("/var/run/netns/cellium-" + name + ".*")
	if len(namespaces) != 4 {
		t.Fatalf("namespaces after a killed up: %v, want the bridge's and 3 nodes'", namespaces)
	}
	var inos []uint64
	for _, ns := range namespaces {
		var s unix.Stat_t
		if err := unix.Stat(ns, &s); err != nil {
			t.Fatal(err)
		}
		inos = append(inos, s.Ino)
	}
	if !st.Etcd.Running {
		t.Fatalf("etcd does not run after up was killed past starting it: %+v", st.Etcd)
	}

	if out, errOut, code := devCmd(t, append(sel, "down")...); code != 0 {
		t.Fatalf("down = %d: %s%s", code, out, errOut)
	}
	for _, glob := range []string{"/var/run/netns/cellium-" + name + ".*", "/sys/fs/bpf/cellium_" + name + "_*",
		"/sys/fs/cgroup/*/cellium-devcluster-" + name, filepath.Join(dir, "*")} {
		if left, _ := filepath.Glob(glob); len(left) > 0 {
			t.Errorf("left after down: %v", left)
		}
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/ns/net")
	for _, p := range procs {
		var s unix.Stat_t
		if unix.Stat(p, &s) == nil && slices.Contains(inos, s.Ino) {
			t.Errorf("%s is still in one of the cluster's namespaces after down", filepath.Dir(filepath.Dir(p)))
		}
	}
}

// Which agent up runs: the one beside cellium-dev, or --agent-bin; without
// one it says where it looked, and makes nothing.
func TestClusterUpAgentBinary(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: cluster up checks it first")
	}
	// cellium-dev alone in a directory, as a hard link: the path it is run
	// by is its os.Executable.
	alone := t.TempDir()
	lone := filepath.Join(alone, "cellium-dev")
	if err := os.Link(devBin, lone); err != nil {
		t.Skipf("hard link cellium-dev into %s: %v", alone, err)
	}
	dir := filepath.Join(t.TempDir(), "cluster")
	for _, c := range []struct {
		bin  string
		args []string
		want string
	}{
		{lone, nil, "agent binary " + filepath.Join(alone, "agent") + ": stat " + filepath.Join(alone, "agent") + ": no such file or directory (it is looked for next to this program; make build puts both in bin/)"},
		{devBin, []string{"--agent-bin", filepath.Join(alone, "nope")}, "agent binary " + filepath.Join(alone, "nope") + ": stat"},
		{devBin, []string{"--agent-bin", alone}, "agent binary " + alone + " is not an executable file"},
	} {
		_, errOut, code := run(t, c.bin, append([]string{"cluster", "--name", devclustertest.RandomName(), "--dir", dir, "up"}, c.args...)...)
		if code != 1 || !strings.Contains(errOut, c.want) {
			t.Errorf("%s cluster up %v = %d, %q; want 1 and %q", c.bin, c.args, code, errOut, c.want)
		}
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("up without an agent made %s: %v", dir, err)
	}
}
