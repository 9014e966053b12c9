// Package celltest builds small hives for the cells' tests: the cells under
// test plus the infrastructure every cell needs (statedb, jobs, health), with
// the same hive options as the agent, so that health is scoped per module
// exactly as in production.
//
//	h := celltest.New(sysctl.Cell)
//	hive.AddConfigOverride(h, func(c *sysctl.Config) { c.ProcFS = dir })
//	celltest.Start(t, h)
//
// The probe and metrics servers are turned off (--health-addr "",
// --metrics-addr ""), so tests never fight over their ports.
package celltest

import (
	"context"
	"maps"
	"testing"
	"time"

	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/hivetest"
	"github.com/cilium/hive/job"
	"github.com/cilium/hive/script"
	"github.com/cilium/statedb"
	"github.com/spf13/pflag"

	"github.com/cellium/cellium/cells/health"
	"github.com/cellium/cellium/cells/metrics"
	"github.com/cellium/cellium/pkg/polltest"
)

// New builds a hive of cells plus statedb, jobs and health. Like the agent,
// it ends with health.StartedMarker, so readiness works as in production.
func New(cells ...cell.Cell) *hive.Hive {
	opts := hive.DefaultOptions()
	opts.ModuleDecorators = health.ModuleDecorators
	all := append([]cell.Cell{statedb.Cell, job.Cell, health.Cell}, cells...)
	h := hive.NewWithOptions(opts, append(all, health.StartedMarker)...)
	hive.AddConfigOverride(h, func(c *health.Config) { c.HealthAddr = "" })
	hive.AddConfigOverride(h, func(c *metrics.Config) { c.MetricsAddr = "" })
	return h
}

// Start starts h and stops it when the test ends.
func Start(t testing.TB, h *hive.Hive) {
	t.Helper()
	log := hivetest.Logger(t)
	if err := h.Start(log, context.Background()); err != nil {
		t.Fatalf("start hive: %v", err)
	}
	t.Cleanup(func() {
		if err := h.Stop(log, context.Background()); err != nil {
			t.Errorf("stop hive: %v", err)
		}
	})
}

// Eventually is polltest.Until with the cells' tests' timing: it calls ok
// every 5ms until it says true, and fails the test after 10 seconds with
// what ok said last. For state that has no watch channel to wait on.
func Eventually(t testing.TB, what string, ok func() (bool, string)) {
	t.Helper()
	polltest.Until(t, what, 10*time.Second, 5*time.Millisecond, ok)
}

// ScriptEngine returns a script engine for a txtar test of h: the default
// script commands, `hive start`/`hive stop`, the statedb `db/...` commands,
// and extra. args are the flags of the test file's `#!` line.
func ScriptEngine(t testing.TB, h *hive.Hive, args []string, extra map[string]script.Cmd) *script.Engine {
	t.Helper()
	flags := pflag.NewFlagSet("", pflag.ContinueOnError)
	h.RegisterFlags(flags)
	if err := flags.Parse(args); err != nil {
		t.Fatalf("flags of the #! line: %v", err)
	}
	cmds, err := h.ScriptCommands(hivetest.Logger(t))
	if err != nil {
		t.Fatalf("script commands: %v", err)
	}
	maps.Insert(cmds, maps.All(script.DefaultCmds()))
	maps.Insert(cmds, maps.All(extra))
	t.Cleanup(func() {
		// A script that fails half way leaves the hive running.
		h.Stop(hivetest.Logger(t), context.Background())
	})
	return &script.Engine{Cmds: cmds, Conds: script.DefaultConds()}
}
