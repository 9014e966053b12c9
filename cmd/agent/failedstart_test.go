package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// runToExit runs `agent run flags...` and returns its exit code and stderr.
func runToExit(t *testing.T, flags ...string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, agentBin, append([]string{"run"}, flags...)...)
	cmd.Stderr = &stderr
	err := cmd.Run()
	if ee, ok := errors.AsType[*exec.ExitError](err); ok {
		return ee.ExitCode(), stderr.String()
	}
	if err != nil {
		t.Fatal(err)
	}
	return 0, stderr.String()
}

// pins lists what is pinned under dir, relative to it.
func pins(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err == nil && path != dir {
			rel, _ := filepath.Rel(dir, path)
			out = append(out, rel)
		}
		return nil
	})
	slices.Sort(out)
	return out
}

// flagValue replaces the value of --name in flags.
func flagValue(flags []string, name, value string) []string {
	flags = slices.Clone(flags)
	i := slices.Index(flags, "--"+name)
	flags[i+1] = value
	return flags
}

// TestFailedStartUndoesItsPins: a start that fails late (the socket
// programs cannot attach: --cgroup-root is no cgroup2) after the maps were
// pinned removes what it pinned; after a good run, a failed start leaves
// that run's pins alone.
func TestFailedStartUndoesItsPins(t *testing.T) {
	requireRoot(t)
	env := newAgentEnv(t)
	notCgroup := t.TempDir()
	pinDir := filepath.Join(env.bpfRoot, "cellium")

	code, stderr := runToExit(t, flagValue(env.runFlags(), "cgroup-root", notCgroup)...)
	if code == 0 || !strings.Contains(stderr, "--cgroup-root") {
		t.Fatalf("agent run with a --cgroup-root that is no cgroup2 = %d, want a failure naming it:\n%s", code, stderr)
	}
	if !strings.Contains(stderr, "removed what this run pinned") {
		t.Errorf("the log does not say what the failed start removed:\n%s", stderr)
	}
	if _, err := os.Lstat(pinDir); !os.IsNotExist(err) {
		t.Fatalf("after a failed first start the pin directory holds %v, want it gone", pins(t, pinDir))
	}
	if _, err := os.Stat(filepath.Join(env.dir, "net.d", "05-cellium.conflist")); !os.IsNotExist(err) {
		t.Fatalf("CNI configuration after a failed start: %v, want none", err)
	}

	agent := startAgent(t, env.runFlags()...)
	agent.waitFor("Started hive")
	agent.stop()
	good := pins(t, pinDir)
	if !slices.Contains(good, "links") || !slices.Contains(good, "cellium_lb4_services") {
		t.Fatalf("pins after a good run = %v, want the maps and links", good)
	}

	code, stderr = runToExit(t, flagValue(env.runFlags(), "cgroup-root", notCgroup)...)
	if code == 0 {
		t.Fatalf("second failed start exited 0:\n%s", stderr)
	}
	if after := pins(t, pinDir); !slices.Equal(after, good) {
		t.Fatalf("a failed start after a good run changed the pins:\n before %v\n after  %v", good, after)
	}
	agentCmd(t, "cleanup", "--bpf-root", env.bpfRoot, "--cgroup-root", env.cgroup, "--cni-conf-dir", filepath.Join(env.dir, "net.d"))
}

// TestSecondAgentOnOnePrefixRefused: two agents on one --bpf-map-prefix
// would steal each other's programs; the second stops before it opens a map.
func TestSecondAgentOnOnePrefixRefused(t *testing.T) {
	requireRoot(t)
	env := newAgentEnv(t)
	first := startAgent(t, env.runFlags()...)
	first.waitFor("Started hive")

	other := newAgentEnv(t)
	flags := flagValue(other.runFlags(), "bpf-root", env.bpfRoot)
	code, stderr := runToExit(t, flags...)
	want := "another agent is running on pin directory " + filepath.Join(env.bpfRoot, "cellium")
	if code == 0 || !strings.Contains(stderr, want) {
		t.Fatalf("second agent on the same prefix = %d, want a refusal saying %q:\n%s", code, want, stderr)
	}
	if strings.Contains(stderr, "Opened BPF map") {
		t.Fatalf("the second agent opened maps before it was refused:\n%s", stderr)
	}
	first.stop()
	agentCmd(t, "cleanup", "--bpf-root", env.bpfRoot, "--cgroup-root", env.cgroup, "--cni-conf-dir", filepath.Join(env.dir, "net.d"))
}
