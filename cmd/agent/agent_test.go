package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cellium/cellium/cells/loader/socklbtest"
	"github.com/cellium/cellium/pkg/apiv1"
	"github.com/cellium/cellium/pkg/cgroup2"
)

// agentBin is the agent built once for the process tests.
var agentBin string

func TestMain(m *testing.M) {
	// The socket load-balancing tests run their clients as this binary.
	socklbtest.ServeIfClient()
	dir, err := os.MkdirTemp("", "cellium-agent-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	// Readable by everyone: TestHiveNeedsNoRoot runs it as nobody.
	os.Chmod(dir, 0o755)
	agentBin = filepath.Join(dir, "agent")
	if bin := os.Getenv("CELLIUM_AGENT_BIN"); bin != "" {
		// Another build of the agent (another commit's), run by these
		// tests and benchmarks: a side-by-side comparison with one
		// harness.
		agentBin = bin
	} else {
		build := exec.Command("go", "build", "-o", agentBin, ".")
		build.Stdout, build.Stderr = os.Stderr, os.Stderr
		if err := build.Run(); err != nil {
			fmt.Fprintln(os.Stderr, "build agent:", err)
			os.Exit(1)
		}
	}
	// On disk before the first agent runs, as an installed binary is: the
	// kernel skips pages under writeback when the agent releases its
	// executable's pages, and a binary just linked can still be written
	// back in the agent's first seconds (the idle benchmark measures what
	// it holds after; docs/performance-history.md, "Eighth pass").
	if err := syncFile(agentBin); err != nil {
		fmt.Fprintln(os.Stderr, "sync agent binary:", err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// agentEnv is a set of private paths for one agent process.
type agentEnv struct {
	dir, socket, healthAddr, metricsAddr, bpfRoot, cgroup string
}

func newAgentEnv(t testing.TB) *agentEnv {
	dir := t.TempDir()
	env := &agentEnv{
		dir:         dir,
		socket:      filepath.Join(dir, "run", "agent.sock"),
		healthAddr:  freePort(t),
		metricsAddr: freePort(t),
		bpfRoot:     filepath.Join(dir, "bpffs"),
	}
	// A fake procfs: the test must not change the host's forwarding.
	ipv4 := filepath.Join(dir, "proc", "sys", "net", "ipv4")
	if err := os.MkdirAll(ipv4, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(ipv4, "ip_forward"), []byte("0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// The agent mounts its own bpffs at bpfRoot; take it down afterwards.
	t.Cleanup(func() { unix.Unmount(env.bpfRoot, unix.MNT_DETACH) })
	env.cgroup = testCgroup(t)
	return env
}

// testCgroup makes an empty cgroup for the agent's socket programs: attached
// to the real root they would see every socket of the machine.
func testCgroup(t testing.TB) string {
	mount, err := cgroup2.Mount()
	if err != nil {
		t.Skipf("no cgroup2 mount for the socket programs: %v", err)
	}
	dir, err := os.MkdirTemp(mount, "cellium-agent-test-")
	if err != nil {
		t.Skipf("cannot create a test cgroup: %v", err)
	}
	t.Cleanup(func() { os.Remove(dir) })
	return dir
}

func (e *agentEnv) runFlags() []string {
	return []string{
		"--api-socket", e.socket,
		"--state-dir", filepath.Join(e.dir, "state"),
		"--run-dir", filepath.Join(e.dir, "run"),
		"--proc-fs", filepath.Join(e.dir, "proc"),
		"--health-addr", e.healthAddr,
		"--metrics-addr", e.metricsAddr,
		"--bpf-root", e.bpfRoot,
		"--cni-conf-dir", filepath.Join(e.dir, "net.d"),
		// Never the machine's cgroup root: the socket programs would
		// translate every socket of the host.
		"--cgroup-root", e.cgroup,
		// No health endpoint: it would be a veth in the host's namespace.
		"--cluster-health-port", "0",
		// No nftables table in the host's namespace.
		"--enable-masquerade=false",
		// No programs on the host's devices.
		"--enable-nodeport=false",
	}
}

func freePort(t testing.TB) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

func requireRoot(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the agent mounts bpffs and pins BPF maps")
	}
}

// agentCmd runs a client command of the agent binary.
func agentCmd(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	var out, errb bytes.Buffer
	cmd := exec.Command(agentBin, args...)
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if ee, ok := errors.AsType[*exec.ExitError](err); ok {
		return out.String(), errb.String(), ee.ExitCode()
	}
	if err != nil {
		t.Fatalf("agent %v: %v", args, err)
	}
	return out.String(), errb.String(), 0
}

// TestAgentProcess runs the built agent as a user would: start, wait until it
// has started, ask it over its socket, SIGTERM, check it exits cleanly.
func TestAgentProcess(t *testing.T) {
	requireRoot(t)
	env := newAgentEnv(t)
	agent := startAgent(t, env.runFlags()...)
	agent.waitFor("Started hive")
	startedHooks := agent.startedHooks

	// Every cell's start hook was logged, with its module.
	for _, module := range []string{"(daemon)", "(health)", "(api)", "(bpf-maps)", "(sysctl)"} {
		if !containsSuffix(startedHooks, module) {
			t.Errorf("no start hook logged for module %s; logged: %v", module, startedHooks)
		}
	}

	resp, err := http.Get("http://" + env.healthAddr + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/healthz after start = %d, want 200", resp.StatusCode)
	}

	// Ready once every barrier is done.
	var health apiv1.Health
	var out string
	poll(t, "a ready agent", func() (bool, string) {
		var errOut string
		var code int
		out, errOut, code = agentCmd(t, "status", "-o", "json", "--api-socket", env.socket)
		if code != 0 {
			t.Fatalf("agent status = %d: %s", code, errOut)
		}
		if err := json.Unmarshal([]byte(out), &health); err != nil {
			t.Fatalf("agent status -o json: %v\n%s", err, out)
		}
		return health.Ready, out
	})
	if !health.Started || !health.Ready || health.Level != apiv1.LevelOK {
		t.Fatalf("agent status = started %v ready %v level %s, want a started, ready, OK agent:\n%s",
			health.Started, health.Ready, health.Level, out)
	}

	// The table form draws the tree.
	out, _, code := agentCmd(t, "status", "--api-socket", env.socket)
	if code != 0 || !strings.Contains(out, "Agent:      ready") || !strings.Contains(out, "└─ job-refresh") || !strings.Contains(out, "\nIdentities: local (node-local, checkpointed in ") {
		t.Fatalf("agent status (table) = %d:\n%s", code, out)
	}

	if _, errOut, code := agentCmd(t, "map", "list", "-o", "json", "--api-socket", env.socket); code != 0 {
		t.Fatalf("agent map list = %d: %s", code, errOut)
	}
	out, _, code = agentCmd(t, "db", "show", "sysctl", "--api-socket", env.socket)
	if code != 0 || !strings.Contains(out, "net.ipv4.ip_forward") {
		t.Fatalf("agent db show sysctl = %d:\n%s", code, out)
	}

	agent.stop()
	if _, err := os.Lstat(env.socket); !os.IsNotExist(err) {
		t.Fatalf("API socket after exit: %v, want it removed", err)
	}
}

func containsSuffix(list []string, suffix string) bool {
	for _, s := range list {
		if strings.HasSuffix(s, suffix) {
			return true
		}
	}
	return false
}

func TestStatusWithoutAgent(t *testing.T) {
	socket := filepath.Join(t.TempDir(), "agent.sock")
	_, stderr, code := agentCmd(t, "status", "--api-socket", socket)
	if code != 1 || !strings.Contains(stderr, "cannot reach the agent at "+socket) {
		t.Fatalf("agent status with no agent = %d %q, want exit 1 naming the socket", code, stderr)
	}
}

// TestBadConfigStartsNothing checks that a bad key or value in the config
// dir, the environment or the flags fails before any cell starts.
func TestBadConfigStartsNothing(t *testing.T) {
	tests := []struct {
		name  string
		files map[string]string
		env   []string
		args  []string
		want  string
	}{
		{name: "unknown config-dir key", files: map[string]string{"enable-ip-fowarding": "false"},
			want: `unknown key "enable-ip-fowarding"`},
		{name: "bad config-dir value", files: map[string]string{"enable-ip-forwarding": "sometimes"},
			want: `/enable-ip-forwarding): invalid argument "sometimes"`},
		{name: "bad env value", env: []string{"AGENT_ENABLE_IP_FORWARDING=sometimes"},
			want: `AGENT_ENABLE_IP_FORWARDING: invalid argument "sometimes"`},
		{name: "value a cell rejects", args: []string{"--state-dir", "relative/dir"},
			want: `invalid --state-dir "relative/dir": must be an absolute path`},
		{name: "bad log format", args: []string{"--log-format", "xml"},
			want: `invalid --log-format "xml": want auto, text or json`},
		{name: "bad flag value names the form", args: []string{"--conntrack-tcp-max", "-1"},
			want: `invalid argument "-1" for "--conntrack-tcp-max" flag: strconv.ParseUint: parsing "-1": invalid syntax (want a non-negative integer)`},
		{name: "value a cell rejects names its variable", env: []string{"AGENT_POD_CIDR=garbage"},
			want: `invalid --pod-cidr "garbage": want a CIDR such as 10.244.0.0/24 or fd00:10:244::/112 (--pod-cidr came from environment variable AGENT_POD_CIDR)`},
		{name: "value a cell rejects names its file", files: map[string]string{"pod-cidr": "10.1.0.0/16\n10.2.0.0/16\n"},
			want: `more than one ipv4 CIDR; give at most one per family (--pod-cidr came from --config-dir file `},
		{name: "one value on two lines", files: map[string]string{"node-name": "a\nb"},
			want: `holds 2 lines: --node-name takes one value`},
		{name: "missing proc-fs", args: []string{"--proc-fs", "/nonexistent"},
			want: `invalid --proc-fs "/nonexistent": stat /nonexistent: no such file or directory`},
		{name: "missing devices-netns", args: []string{"--devices-netns", "/nonexistent"},
			want: `invalid --devices-netns "/nonexistent": stat /nonexistent: no such file or directory`},
		{name: "port out of range", args: []string{"--health-addr", "127.0.0.1:99999"},
			want: `invalid --health-addr "127.0.0.1:99999": want host:port, e.g. 127.0.0.1:9879: port "99999" is not a port number (0 to 65535)`},
		{name: "metrics address without a port", args: []string{"--metrics-addr", "9962"},
			want: `invalid --metrics-addr "9962": want host:port, e.g. 127.0.0.1:9962`},
		{name: "bad lb mode", args: []string{"--lb-mode", "direct"},
			want: `invalid --lb-mode "direct": want snat or dsr`},
		{name: "socket under a file", args: []string{"--hubble-listen-address", "unix://$DIR/file/hubble.sock"},
			want: `/file/hubble.sock": $DIR/file is not a directory`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			configDir := filepath.Join(dir, "config")
			os.Mkdir(configDir, 0o755)
			os.Mkdir(filepath.Join(dir, "proc"), 0o755)
			for k, v := range tc.files {
				os.WriteFile(filepath.Join(configDir, k), []byte(v), 0o644)
			}
			socket := filepath.Join(dir, "agent.sock")
			// $DIR in a case is its directory, which holds a regular file "file".
			os.WriteFile(filepath.Join(dir, "file"), nil, 0o644)
			for i := range tc.args {
				tc.args[i] = strings.ReplaceAll(tc.args[i], "$DIR", dir)
			}
			tc.want = strings.ReplaceAll(tc.want, "$DIR", dir)
			args := append([]string{"run", "--config-dir", configDir, "--api-socket", socket,
				"--state-dir", filepath.Join(dir, "state"), "--health-addr", "", "--metrics-addr", "",
				"--bpf-root", filepath.Join(dir, "bpffs"), "--proc-fs", filepath.Join(dir, "proc")}, tc.args...)
			var stderr bytes.Buffer
			cmd := exec.Command(agentBin, args...)
			cmd.Env = append(os.Environ(), tc.env...)
			cmd.Stderr = &stderr
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			go func() { <-ctx.Done(); cmd.Process.Kill() }()
			err := cmd.Run()
			ee, ok := errors.AsType[*exec.ExitError](err)
			if !ok || ee.ExitCode() != 1 {
				t.Fatalf("agent run = %v, want exit code 1\n%s", err, stderr.String())
			}
			if !strings.Contains(stderr.String(), tc.want) {
				t.Fatalf("stderr does not say %q:\n%s", tc.want, stderr.String())
			}
			for _, p := range []string{socket, filepath.Join(dir, "state"), filepath.Join(dir, "bpffs")} {
				if _, err := os.Stat(p); !os.IsNotExist(err) {
					t.Errorf("%s exists after a failed config: something started", p)
				}
			}
		})
	}
}

// TestHiveNeedsNoRoot runs `agent hive` and `agent hive dot-graph` as nobody.
func TestHiveNeedsNoRoot(t *testing.T) {
	run := func(args ...string) string {
		t.Helper()
		cmd := exec.Command(agentBin, args...)
		if os.Geteuid() == 0 {
			cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
		}
		cmd.Dir = "/"
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		if err := cmd.Run(); err != nil {
			t.Fatalf("agent %v as nobody: %v\n%s", args, err, errb.String())
		}
		return out.String()
	}
	out := run("hive", "--state-dir", "/nonexistent/state")
	for _, want := range []string{"Ⓜ️ daemon (", "Ⓜ️ bpf-maps (", "Start hooks:", "Stop hooks:", `StateDir: (string) (len=18) "/nonexistent/state"`} {
		if !strings.Contains(out, want) {
			t.Errorf("agent hive output lacks %q", want)
		}
	}
	if out := run("hive", "dot-graph"); !strings.HasPrefix(out, "digraph") {
		t.Errorf("agent hive dot-graph does not print a digraph: %.80q", out)
	}
}

// syncFile has name's data written to disk.
func syncFile(name string) error {
	f, err := os.Open(name)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}
