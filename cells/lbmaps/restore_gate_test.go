package lbmaps

import (
	"context"
	"errors"
	"net/netip"
	"testing"

	"github.com/cilium/statedb/reconciler"

	"github.com/cellium/cellium/cells/loadbalancer"
)

// TestOperationsWaitForRestore: the restore runs beside the other start
// hooks, so every operation must wait for it: one that ran first could
// hand out an ID an entry in the maps holds. ops here has no maps and no
// state, so an operation that did not wait would panic.
func TestOperationsWaitForRestore(t *testing.T) {
	o := &ops{restoreDone: make(chan struct{})}
	batch := func() []reconciler.BatchEntry[*loadbalancer.Frontend] {
		fe := &loadbalancer.Frontend{Address: loadbalancer.L3n4Addr{
			Addr: netip.MustParseAddr("10.96.0.10"), Port: 80, Protocol: loadbalancer.TCP}}
		return []reconciler.BatchEntry[*loadbalancer.Frontend]{{Object: fe}}
	}

	// Still restoring: the operation gives up with its context, untouched.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	b := batch()
	o.UpdateBatch(ctx, nil, b)
	if !errors.Is(b[0].Result, context.Canceled) {
		t.Fatalf("update before restore: result %v, want %v", b[0].Result, context.Canceled)
	}
	b = batch()
	o.DeleteBatch(ctx, nil, b)
	if !errors.Is(b[0].Result, context.Canceled) {
		t.Fatalf("delete before restore: result %v, want %v", b[0].Result, context.Canceled)
	}
	if err := o.Prune(ctx, nil, nil); !errors.Is(err, context.Canceled) {
		t.Fatalf("prune before restore: %v, want %v", err, context.Canceled)
	}

	// Restore failed: every operation fails with its error, and writes
	// nothing (there is nothing to write with).
	restoreErr := errors.New("restore IPv4 load-balancing maps: iterate: boom")
	o.restoreErr = restoreErr
	close(o.restoreDone)
	b = batch()
	o.UpdateBatch(context.Background(), nil, b)
	if !errors.Is(b[0].Result, restoreErr) {
		t.Fatalf("update after a failed restore: result %v, want %v", b[0].Result, restoreErr)
	}
	b = batch()
	o.DeleteBatch(context.Background(), nil, b)
	if !errors.Is(b[0].Result, restoreErr) {
		t.Fatalf("delete after a failed restore: result %v, want %v", b[0].Result, restoreErr)
	}
	if err := o.Prune(context.Background(), nil, nil); !errors.Is(err, restoreErr) {
		t.Fatalf("prune after a failed restore: %v, want %v", err, restoreErr)
	}
}
