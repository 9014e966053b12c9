package main

import (
	"bufio"
	"bytes"
	"flag"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"strings"
	"testing"

	"github.com/cellium/cellium/pkg/heapprofile"
)

// TestHeapProfileOnlyWithPprof checks that the agent samples no heap
// profile unless it serves its profiles: the binary starts with the
// profiler off (pkg/heapprofile/off, which main.go imports), the agent's
// graph built with default flags leaves it off, and --pprof turns it on at
// Go's rate. `agent hive` builds the graph as `agent run` does, without
// starting it.
func TestHeapProfileOnlyWithPprof(t *testing.T) {
	if f := flag.Lookup("test.memprofilerate"); f != nil && f.Value.String() != "0" {
		t.Skip("-test.memprofilerate turns the heap profiler on")
	}
	t.Cleanup(func() { runtime.MemProfileRate = 0 })
	if runtime.MemProfileRate != 0 {
		t.Fatalf("the agent's binary samples heap profiles from its start (runtime.MemProfileRate %d)", runtime.MemProfileRate)
	}
	hive := func(args ...string) {
		t.Helper()
		var stdout, stderr bytes.Buffer
		if code := execute(append([]string{"hive", "--config-dir", t.TempDir()}, args...), &stdout, &stderr); code != 0 {
			t.Fatalf("agent hive %v: exit %d\n%s", args, code, stderr.String())
		}
	}
	hive()
	if runtime.MemProfileRate != 0 {
		t.Fatalf("with default flags the agent samples heap profiles (runtime.MemProfileRate %d)", runtime.MemProfileRate)
	}
	hive("--pprof")
	if runtime.MemProfileRate != heapprofile.Rate() || runtime.MemProfileRate == 0 {
		t.Fatalf("with --pprof runtime.MemProfileRate is %d, want Go's %d", runtime.MemProfileRate, heapprofile.Rate())
	}
}

// TestHeapProfileOffEarly checks that the profiler goes off before any
// package initializer of the agent's binary allocates: an allocation
// sampled before heapprofile/off's initializer would stay in the profile's
// table. It reads the initializers' order and allocations from
// GODEBUG=inittrace=1 of this test binary, which links what the agent
// links.
func TestHeapProfileOffEarly(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run", "^$")
	// The agent built once for this run: TestMain builds none then.
	cmd.Env = append(os.Environ(), "GODEBUG=inittrace=1", "CELLIUM_AGENT_BIN="+agentBin)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s -test.run '^$': %v\n%s", exe, err, stderr.String())
	}
	// init github.com/x/y @0.005 ms, 0.003 ms clock, 0 bytes, 0 allocs
	line := regexp.MustCompile(`^init (\S+) @.* (\d+) bytes, (\d+) allocs$`)
	var before []string
	sc := bufio.NewScanner(&stderr)
	for sc.Scan() {
		m := line.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		if m[1] == "github.com/cellium/cellium/pkg/heapprofile/off" {
			if len(before) > 0 {
				t.Fatalf("initializers that allocated before the heap profiler went off:\n%s", strings.Join(before, "\n"))
			}
			return
		}
		if m[2] != "0" || m[3] != "0" {
			before = append(before, sc.Text())
		}
	}
	t.Fatalf("no initializer of heapprofile/off in the trace:\n%s", stderr.String())
}
