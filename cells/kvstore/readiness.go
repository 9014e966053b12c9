package kvstore

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"

	"github.com/cellium/cellium/cells/health"
)

// UnreachableRecheck is how often what waits for etcd unless it is
// unreachable (a barrier excused by UnlessUnreachable, the policy's
// computation) looks at the client's status: the client has no
// notification of its changes, and its status job itself checks every
// second while etcd is away.
const UnreachableRecheck = time.Second

// UnlessUnreachable is w, except that once etcd has failed to answer it is
// written instead: w less what cannot happen without etcd. Readiness says
// what this node needs, and a node restarted while etcd is away runs its
// pods and takes new ones with what it restored, once that is written. The
// tables w waits for stay uninitialized until etcd answers, so nothing
// restored is pruned meanwhile; the kvstore's health stays Degraded and
// says why. With the kvstore disabled, or connected, w is waited for as it
// is. w and written take the same name.
func UnlessUnreachable(w, written health.Wait, c Client, log *slog.Logger) health.Wait {
	return health.Wait{Name: w.Name, Until: func(ctx context.Context, progress func(string)) error {
		if !c.Enabled() {
			return w.Until(ctx, progress)
		}
		innerCtx, cancel := context.WithCancel(ctx)
		defer cancel()
		inner := make(chan error, 1)
		go func() { inner <- w.Until(innerCtx, progress) }()
		tick := time.NewTicker(UnreachableRecheck)
		defer tick.Stop()
		for {
			if s := c.Status(); unreachable(s) {
				// w ends before written starts: one of them reports
				// progress at a time.
				cancel()
				if err := <-inner; err == nil {
					return nil
				}
				err := written.Until(ctx, func(detail string) {
					progress(fmt.Sprintf("without the kvstore (%s): %s", s.State, detail))
				})
				if err == nil {
					log.Warn("Readiness barrier passed without the kvstore; its tables initialize when etcd answers",
						"barrier", w.Name, "state", s.State, "error", s.LastError)
				}
				return err
			}
			select {
			case err := <-inner:
				return err
			case <-tick.C:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}}
}

// ReconciledUnlessUnreachable is health.Reconciled on tbl, except that once
// etcd has failed to answer it waits only for the objects tbl holds to be
// reconciled (health.RowsReconciled), not for tbl's initialization, which
// waits for etcd's listing: see UnlessUnreachable.
func ReconciledUnlessUnreachable[Obj any](name string, db *statedb.DB, tbl statedb.Table[Obj], status func(Obj) reconciler.Status, c Client, log *slog.Logger) health.Wait {
	return UnlessUnreachable(
		health.Reconciled(name, db, tbl, status).Wait,
		health.RowsReconciled(name, db, tbl, status).Wait,
		c, log)
}

// Unreachable says whether c is enabled and has tried etcd and failed: what
// waits for a kvstore table's listing can then go on with what the node
// has, as UnlessUnreachable does.
func Unreachable(c Client) bool { return c != nil && c.Enabled() && unreachable(c.Status()) }

// unreachable says whether the client has tried etcd and failed: a status
// that is not connected and has an error. Before its first check fails
// the client is connecting without one.
func unreachable(s Status) bool {
	switch s.State {
	case StateConnecting, StateQuorumLost:
		return s.LastError != ""
	}
	return false
}
