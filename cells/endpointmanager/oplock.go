package endpointmanager

import (
	"context"
	"sync"

	"github.com/cellium/cellium/cells/internal/keyedlock"
)

// opLocks are the manager's locks. Operations on one container (its
// creation, deletion and identity changes) are serialized by the
// container's own lock, so that they see the table, the kernel and the
// disk as no other operation on that container leaves them half changed;
// operations on different containers run at once. Everything they share
// (endpoint IDs, addresses, the table) has its own short critical section.
// The restore, and what looks at every container at once, take the whole
// manager: shared holds of every container operation, exclusive for them.
// Every wait ends with the waiter's context, with ErrBusy.
type opLocks struct {
	mu sync.Mutex
	// readers hold the manager shared; writer holds it exclusively.
	readers int
	writer  bool
	// writersWaiting keep new shared holders out, so that an exclusive
	// holder is not starved by a stream of container operations.
	writersWaiting int
	// changed is closed, and replaced, whenever the manager's lock is
	// released or a waiting writer gives up.
	changed chan struct{}
	// containers are the locks of the containers, by container ID: a
	// waiter gives up when its context ends, so that should one operation
	// ever get stuck holding one, the others fail at their own deadlines
	// with an error that says so (ErrBusy) instead of hanging with it.
	containers keyedlock.Map
}

func newOpLocks() *opLocks {
	return &opLocks{changed: make(chan struct{})}
}

// broadcast wakes the waiters for the manager's lock. With l.mu held.
func (l *opLocks) broadcast() {
	close(l.changed)
	l.changed = make(chan struct{})
}

// lockAll holds the manager exclusively: no container operation runs until
// unlockAll.
func (l *opLocks) lockAll(ctx context.Context) error {
	waiting := false
	for {
		l.mu.Lock()
		if !l.writer && l.readers == 0 {
			l.writer = true
			if waiting {
				l.writersWaiting--
			}
			l.mu.Unlock()
			return nil
		}
		if !waiting {
			waiting = true
			l.writersWaiting++
		}
		changed := l.changed
		l.mu.Unlock()
		select {
		case <-changed:
		case <-ctx.Done():
			l.mu.Lock()
			l.writersWaiting--
			l.broadcast()
			l.mu.Unlock()
			return errorf(ErrBusy, "gave up waiting for the endpoint operations to finish: %v", context.Cause(ctx))
		}
	}
}

// tryLockAll holds the manager exclusively if nothing holds it now, and
// says whether it does. For background work that can wait for its next
// round: as a waiting writer it would keep every new container operation
// out for as long as one slow operation runs.
func (l *opLocks) tryLockAll() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.writer || l.readers > 0 {
		return false
	}
	l.writer = true
	return true
}

func (l *opLocks) unlockAll() {
	l.mu.Lock()
	l.writer = false
	l.broadcast()
	l.mu.Unlock()
}

// lockShared holds the manager shared.
func (l *opLocks) lockShared(ctx context.Context) error {
	for {
		l.mu.Lock()
		if !l.writer && l.writersWaiting == 0 {
			l.readers++
			l.mu.Unlock()
			return nil
		}
		changed := l.changed
		l.mu.Unlock()
		select {
		case <-changed:
		case <-ctx.Done():
			return errorf(ErrBusy, "gave up waiting for the endpoint restore (or another operation on every endpoint) to finish: %v", context.Cause(ctx))
		}
	}
}

func (l *opLocks) unlockShared() {
	l.mu.Lock()
	l.readers--
	if l.readers == 0 {
		l.broadcast()
	}
	l.mu.Unlock()
}

// lockContainer holds the manager shared and the container's lock, in that
// order (a container's holder never waits for the manager). Waiters for
// one container get it in the order they came. unlock releases both.
func (l *opLocks) lockContainer(ctx context.Context, containerID string) (unlock func(), err error) {
	if err := l.lockShared(ctx); err != nil {
		return nil, err
	}
	unlockContainer, err := l.containers.Lock(ctx, containerID)
	if err != nil {
		l.unlockShared()
		return nil, errorf(ErrBusy, "gave up waiting for another operation on container %s to finish: %v", containerID, context.Cause(ctx))
	}
	return func() {
		unlockContainer()
		l.unlockShared()
	}, nil
}
