// Package faultpoint is the agent's hidden fault points: a test flag
// (--endpoint-test-crash-at, --policy-map-test-crash-after) arms one, and
// the agent kills itself with SIGKILL when it is reached, so that crash
// tests stop it at a chosen step of a change, as the OOM killer or a
// node's power would.
//
// The contract: an unarmed point costs a comparison and does nothing; an
// armed one logs what it kills the agent at (Warn "Test fault point:
// killing the agent") and never returns. Arm logs once, at construction,
// that the point is armed.
//
//	var crash faultpoint.Count // zero: never
//	crash = faultpoint.After(log, cfg.TestCrashAfter, "policy map write")
//	...
//	crash.Hit("map", name) // kills at the Nth hit
package faultpoint

import (
	"log/slog"
	"os"
	"sync/atomic"
	"syscall"
)

// Kill kills the agent with SIGKILL, logging "Test fault point: killing
// the agent" with where (" at ...", " after ...") and args; it does not
// return.
func Kill(log *slog.Logger, where string, args ...any) {
	log.Warn("Test fault point: killing the agent"+where, args...)
	syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {}
}

// Step is a point armed at one named step: At kills the agent when it is
// reached with that name. The zero Step is never armed.
type Step struct {
	log  *slog.Logger
	step string
}

// AtStep arms a Step at step ("" for none).
func AtStep(log *slog.Logger, step string) Step {
	if step != "" {
		log.Warn("Test fault point armed: the agent kills itself at a step", "step", step)
	}
	return Step{log: log, step: step}
}

// At kills the agent if the point is armed at step.
func (s Step) At(step string) {
	if s.step != "" && s.step == step {
		Kill(s.log, " at a step", "step", step)
	}
}

// Count is a point armed at its Nth hit: Hit counts, from any goroutine,
// and kills the agent at the Nth. The zero Count is never armed.
type Count struct {
	log  *slog.Logger
	n    uint32
	what string
	hits atomic.Uint32
}

// After arms a Count at hit n of what it counts, a "policy map write"
// say (0 for never).
func After(log *slog.Logger, n uint32, what string) *Count {
	if n != 0 {
		log.Warn("Test fault point armed: the agent kills itself after a "+what, "after", n)
	}
	return &Count{log: log, n: n, what: what}
}

// Hit counts a hit and kills the agent at the Nth, logging args.
func (c *Count) Hit(args ...any) {
	if c == nil || c.n == 0 {
		return
	}
	if c.hits.Add(1) == c.n {
		Kill(c.log, " after a "+c.what, append([]any{"hit", c.n}, args...)...)
	}
}
