package health_test

import (
	"context"
	"errors"
	"testing"

	"github.com/cilium/hive/cell"

	"github.com/cellium/cellium/cells/health"
	"github.com/cellium/cellium/cells/internal/celltest"
)

// TestReadinessWait: Wait does not return while a barrier is pending (its
// context's end does), and returns once none is.
func TestReadinessWait(t *testing.T) {
	var (
		r    *health.Readiness
		done func()
	)
	h := celltest.New(cell.Invoke(func(rd *health.Readiness) { r, done = rd, rd.Add("test-barrier") }))
	celltest.Start(t, h)

	ended, cancel := context.WithCancel(context.Background())
	cancel()
	if err := r.Wait(ended); !errors.Is(err, context.Canceled) {
		t.Fatalf("Wait with a barrier pending = %v, want the context's end", err)
	}
	done()
	if err := r.Wait(context.Background()); err != nil {
		t.Fatalf("Wait once every barrier is done = %v", err)
	}
}
