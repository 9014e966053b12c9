package kvstore

import (
	"context"
	"log/slog"
	"time"

	"github.com/cellium/cellium/cells/health"
)

// unreachableRecheck is how often a barrier excused by UnlessUnreachable
// looks at the client's status: the client has no notification of its
// changes, and its status job itself checks every second while etcd is
// away.
const unreachableRecheck = time.Second

// UnlessUnreachable is w, except that it also passes once etcd has failed
// to answer: readiness says what this node needs, and a node restarted
// while etcd is away runs its pods and takes new ones with what it
// restored. The tables w waits for stay uninitialized until etcd answers,
// so nothing restored is pruned meanwhile; the kvstore's health stays
// Degraded and says why. With the kvstore disabled, or connected, w is
// waited for as it is.
func UnlessUnreachable(w health.Wait, c Client, log *slog.Logger) health.Wait {
	return health.Wait{Name: w.Name, Until: func(ctx context.Context, progress func(string)) error {
		if !c.Enabled() {
			return w.Until(ctx, progress)
		}
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		inner := make(chan error, 1)
		go func() { inner <- w.Until(ctx, progress) }()
		tick := time.NewTicker(unreachableRecheck)
		defer tick.Stop()
		for {
			if s := c.Status(); unreachable(s) {
				log.Warn("Readiness barrier passed without the kvstore; its tables initialize when etcd answers",
					"barrier", w.Name, "state", s.State, "error", s.LastError)
				return nil
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
