package main

import (
	"bytes"
	"log/slog"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
)

// stuckStop is a cell whose stop hook blocks until released.
func stuckStop(entered chan<- struct{}, release <-chan struct{}) cell.Cell {
	return cell.Module("stuck", "A stop hook that hangs", cell.Invoke(func(lc cell.Lifecycle) {
		lc.Append(cell.Hook{OnStop: func(cell.HookContext) error {
			close(entered)
			<-release
			return nil
		}})
	}))
}

func TestSecondSignalCutsAStuckStopShort(t *testing.T) {
	entered, release := make(chan struct{}), make(chan struct{})
	defer close(release)
	h := hive.New(stuckStop(entered, release))
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))

	signals := make(chan os.Signal, 2)
	result := make(chan error, 1)
	go func() { result <- runUntilSignalled(h, log, signals) }()

	signals <- syscall.SIGTERM
	select {
	case <-entered:
	case err := <-result:
		t.Fatalf("returned before the stuck hook ran: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("the first signal did not stop the hive")
	}
	signals <- syscall.SIGINT
	select {
	case err := <-result:
		if err == nil || !strings.Contains(err.Error(), "second signal interrupt") || !strings.Contains(err.Error(), "stuckStop") {
			t.Fatalf("after a second signal: %v, want an error naming the signal and the stuck hook", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("a second signal did not cut the stuck stop short")
	}
	if !strings.Contains(logs.String(), "Exiting at once") {
		t.Fatalf("log does not say it exits at once:\n%s", logs.String())
	}
	if strings.Contains(logs.String(), "level=DEBUG") {
		t.Fatalf("debug records reached an info-level log:\n%s", logs.String())
	}
}

func TestOneSignalStopsTheHive(t *testing.T) {
	h := hive.New(cell.Invoke(func() {}))
	signals := make(chan os.Signal, 2)
	result := make(chan error, 1)
	go func() { result <- runUntilSignalled(h, slog.New(slog.DiscardHandler), signals) }()
	signals <- syscall.SIGTERM
	select {
	case err := <-result:
		if err != nil {
			t.Fatalf("stop after one signal: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("one signal did not stop the hive")
	}
}
