package etcdtest

import (
	"context"
	"testing"
	"time"
)

func TestStopRestart(t *testing.T) {
	s := Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if !healthy(ctx, s.Endpoint()) {
		t.Fatal("not healthy after Start")
	}
	s.Stop()
	if healthy(ctx, s.Endpoint()) {
		t.Fatal("healthy after Stop")
	}
	s.Restart()
	if !healthy(ctx, s.Endpoint()) {
		t.Fatalf("not healthy after Restart; log: %s", s.Log())
	}
}
