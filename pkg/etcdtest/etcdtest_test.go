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
	if !s.healthy(ctx) {
		t.Fatal("not healthy after Start")
	}
	s.Stop()
	if s.healthy(ctx) {
		t.Fatal("healthy after Stop")
	}
	s.Restart()
	if !s.healthy(ctx) {
		t.Fatalf("not healthy after Restart; log: %s", s.Log())
	}
}
