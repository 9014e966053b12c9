package main

import (
	"bytes"
	"flag"
	"runtime"
	"testing"

	"github.com/cellium/cellium/pkg/heapprofile"
)

// TestHeapProfileOnlyWithPprof checks that the agent samples no heap
// profile unless it serves its profiles: the binary starts with the
// profiler off (pkg/heapprofile, linked through the metrics cell), the
// agent's graph built with default flags leaves it off, and --pprof turns
// it on at Go's rate. `agent hive` builds the graph as `agent run` does,
// without starting it.
func TestHeapProfileOnlyWithPprof(t *testing.T) {
	if f := flag.Lookup("test.memprofile"); f != nil && f.Value.String() != "" {
		t.Skip("-test.memprofile turns the heap profiler on")
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
