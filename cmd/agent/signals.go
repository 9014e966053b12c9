package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/cilium/hive"
)

// runUntilSignalled runs h as h.Run does (start, run until a signal or a
// shutdown, stop), except that a second signal cuts a start or stop that
// hangs short: runUntilSignalled returns at once with an error naming the
// hook still running, for the process to exit non-zero. The first signal
// stops the hive even while it is still starting (hive itself listens for
// signals only once started).
func runUntilSignalled(h *hive.Hive, log *slog.Logger, signals <-chan os.Signal) error {
	hooks := &hookTracker{state: &hookState{}, inner: withoutInvokeFailed{log.Handler()}}
	done := make(chan error, 1)
	go func() { done <- h.Run(slog.New(hooks)) }()

	select {
	case err := <-done:
		return err
	case sig := <-signals:
		log.Info("Signal received, stopping (a second one exits at once)", "signal", sig)
		h.Shutdown()
	}
	select {
	case err := <-done:
		return err
	case sig := <-signals:
		hook, since := hooks.state.running()
		if hook == "" {
			return fmt.Errorf("second signal %v: exiting without finishing the stop", sig)
		}
		err := fmt.Errorf("second signal %v: exiting without finishing the stop; hook %s has been running for %s", sig, hook, since.Round(time.Millisecond))
		log.Error("Exiting at once", "signal", sig, "hook", hook, "running-for", since)
		return err
	}
}

// hookTracker is a slog handler that passes every record on and remembers
// which start or stop hook the hive's lifecycle is executing: the lifecycle
// logs "Executing start/stop hook" (at debug) before a hook and "... hook
// executed" or "... hook failed" after it, with the hook's function as an
// attribute. While the hive starts or stops it asks for debug records
// whatever the agent's level; the others it passes on only when enabled.
type hookTracker struct {
	inner slog.Handler
	state *hookState
	attrs []slog.Attr
}

type hookState struct {
	mu        sync.Mutex
	lifecycle bool // the hive is starting or stopping
	hook      string
	since     time.Time
}

func (s *hookState) running() (string, time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.hook == "" {
		return "", 0
	}
	return s.hook, time.Since(s.since)
}

func (t *hookTracker) Enabled(ctx context.Context, level slog.Level) bool {
	if t.inner.Enabled(ctx, level) {
		return true
	}
	t.state.mu.Lock()
	defer t.state.mu.Unlock()
	return t.state.lifecycle
}

func (t *hookTracker) Handle(ctx context.Context, r slog.Record) error {
	t.observe(r)
	if !t.inner.Enabled(ctx, r.Level) {
		return nil
	}
	return t.inner.Handle(ctx, r)
}

func (t *hookTracker) observe(r slog.Record) {
	s := t.state
	s.mu.Lock()
	defer s.mu.Unlock()
	switch r.Message {
	case "Starting hive", "Stopping hive":
		s.lifecycle = true
	case "Started hive", "Failed to start hive", "Stopped hive", "Failed to stop hive":
		s.lifecycle, s.hook = false, ""
	case "Executing start hook", "Executing stop hook":
		s.hook, s.since = t.hookName(), time.Now()
	case "Start hook executed", "Stop hook executed", "Start hook failed", "Stop hook failed":
		s.hook = ""
	}
}

// hookName is the function (and detail) the lifecycle put on its logger.
func (t *hookTracker) hookName() string {
	var fn, detail string
	for _, a := range t.attrs {
		switch a.Key {
		case "function":
			fn = a.Value.String()
		case "detail":
			detail = a.Value.String()
		}
	}
	if detail != "" {
		return fmt.Sprintf("%s (%s)", fn, detail)
	}
	return fn
}

func (t *hookTracker) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &hookTracker{inner: t.inner.WithAttrs(attrs), state: t.state, attrs: append(t.attrs[:len(t.attrs):len(t.attrs)], attrs...)}
}

func (t *hookTracker) WithGroup(name string) slog.Handler {
	return &hookTracker{inner: t.inner.WithGroup(name), state: t.state, attrs: t.attrs}
}
