package endpointmanager

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

// A waiter for the lock gives up when its context ends, with ErrBusy;
// once the holder unlocks, the next one gets it.
func TestOpLockWaitEndsWithContext(t *testing.T) {
	l := newOpLock()
	if err := l.lock(context.Background()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	err := l.lock(ctx)
	if !errors.Is(err, ErrBusy) || !strings.Contains(err.Error(), "context deadline exceeded") {
		t.Fatalf("lock while held = %v, want ErrBusy naming the deadline", err)
	}
	l.unlock()
	ctx, cancel = context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := l.lock(ctx); err != nil {
		t.Fatalf("lock after unlock: %v", err)
	}
}
