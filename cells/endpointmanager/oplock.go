package endpointmanager

import "context"

// opLock is the manager's one lock. It is a channel of one rather than a
// sync.Mutex only so that a waiter gives up when its context ends: should
// one operation ever get stuck holding it, the others fail at their own
// deadlines with an error that says so, instead of hanging with it. One
// lock for everything keeps the reasoning simple: an operation sees the
// table, the kernel and the disk as no other operation leaves them half
// changed.
type opLock chan struct{}

func newOpLock() opLock { return make(opLock, 1) }

func (l opLock) lock(ctx context.Context) error {
	select {
	case l <- struct{}{}:
		return nil
	case <-ctx.Done():
		return errorf(ErrBusy, "gave up waiting for another endpoint operation to finish: %v", context.Cause(ctx))
	}
}

func (l opLock) unlock() { <-l }
