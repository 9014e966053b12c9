package kvstore

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/cilium/hive/hivetest"

	"github.com/cellium/cellium/cells/health"
	"github.com/cellium/cellium/pkg/etcdtest"
	"github.com/cellium/cellium/pkg/polltest"
)

// never is a barrier that passes only when its context ends.
var never = health.Wait{Name: "never", Until: func(ctx context.Context, _ func(string)) error {
	<-ctx.Done()
	return ctx.Err()
}}

func noProgress(string) {}

// TestUnlessUnreachable: a barrier on etcd passes once etcd has failed to
// answer, and not while the kvstore is connected (after an outage too) or
// disabled.
func TestUnlessUnreachable(t *testing.T) {
	log := hivetest.Logger(t)
	etcd := etcdtest.Start(t)
	etcd.Stop()
	c := startClient(t, etcd.Endpoint(), "ready", nil)

	if err := UnlessUnreachable(never, c, log).Until(ctxT(t), noProgress); err != nil {
		t.Fatalf("with etcd away: %v, want passed", err)
	}
	if s := c.Status(); !unreachable(s) {
		t.Fatalf("passed with status %+v", s)
	}

	etcd.Restart()
	polltest.Until(t, "connected", 30*time.Second, 50*time.Millisecond, func() (bool, string) {
		s := c.Status()
		return s.State == StateConnected, string(s.State)
	})
	// Three looks at the status: a connected client excuses nothing,
	// though its last error is still that of the outage.
	ctx, cancel := context.WithTimeout(context.Background(), 3*unreachableRecheck)
	defer cancel()
	if err := UnlessUnreachable(never, c, log).Until(ctx, noProgress); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("connected: %v, want the inner wait's deadline", err)
	}
	boom := errors.New("boom")
	failing := health.Wait{Name: "failing", Until: func(context.Context, func(string)) error { return boom }}
	if err := UnlessUnreachable(failing, c, log).Until(ctxT(t), noProgress); !errors.Is(err, boom) {
		t.Fatalf("connected, inner failing: %v, want its error", err)
	}

	ctx, cancel = context.WithTimeout(context.Background(), 3*unreachableRecheck)
	defer cancel()
	if err := UnlessUnreachable(never, disabled{}, log).Until(ctx, noProgress); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("disabled: %v, want the inner wait's deadline", err)
	}
}
