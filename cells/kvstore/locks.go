package kvstore

import (
	"context"
	"errors"
	"sync"
	"time"

	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/cellium/cellium/cells/internal/keyedlock"
)

const (
	// defaultLockTTL is the TTL of the session the locks live on: a dead
	// agent's locks are free again after it.
	defaultLockTTL = 25 * time.Second
	// defaultLockStale is how long a lock may be held in this process
	// before the kvstore-locks-gc job releases it: no caller holds a lock
	// for more than a few round trips.
	defaultLockStale = 2 * time.Minute
)

// locks are the cluster-wide mutexes this process holds, all on one
// short-lived etcd session that is made again when it is lost.
type locks struct {
	c     *etcdClient
	ttl   time.Duration
	stale time.Duration

	mu   sync.Mutex
	sess *concurrency.Session
	held map[*heldLock]struct{}
	// local serialises this process's holders of one lock: an etcd mutex
	// is held by a session, and every caller here shares the one session.
	local keyedlock.Map
}

func newLocks(c *etcdClient, ttl time.Duration) *locks {
	return &locks{c: c, ttl: ttl, stale: defaultLockStale, held: map[*heldLock]struct{}{}}
}

// session is the live session, made anew when there is none.
func (l *locks) session(ctx context.Context) (*concurrency.Session, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.sess != nil {
		select {
		case <-l.sess.Done():
			l.sess = nil
		default:
			return l.sess, nil
		}
	}
	// The lease is granted here, under ctx, rather than by NewSession,
	// which would wait for etcd without bound.
	resp, err := l.c.cli.Grant(ctx, int64(max(l.ttl.Seconds(), 1)))
	if err != nil {
		return nil, err
	}
	sess, err := concurrency.NewSession(l.c.cli, concurrency.WithLease(resp.ID), concurrency.WithContext(l.c.ctx))
	if err != nil {
		return nil, err
	}
	l.sess = sess
	return sess, nil
}

func (l *locks) lock(ctx context.Context, key string, try bool) (Unlocker, error) {
	var unlockLocal func()
	if try {
		var ok bool
		if unlockLocal, ok = l.local.TryLock(key); !ok {
			return nil, ErrLocked
		}
	} else {
		var err error
		if unlockLocal, err = l.local.Lock(ctx, key); err != nil {
			return nil, err
		}
	}
	u, err := l.lockSession(ctx, key, try)
	if err != nil {
		unlockLocal()
		return nil, err
	}
	u.unlockLocal = unlockLocal
	return u, nil
}

func (l *locks) lockSession(ctx context.Context, key string, try bool) (*heldLock, error) {
	sess, err := l.session(ctx)
	if err != nil {
		return nil, err
	}
	m := concurrency.NewMutex(sess, l.c.prefix+key)
	if try {
		err = m.TryLock(ctx)
		if errors.Is(err, concurrency.ErrLocked) {
			return nil, ErrLocked
		}
	} else {
		err = m.Lock(ctx)
	}
	if err != nil {
		return nil, err
	}
	h := &heldLock{l: l, key: key, m: m, since: time.Now()}
	l.mu.Lock()
	l.held[h] = struct{}{}
	l.mu.Unlock()
	return h, nil
}

// gc releases the locks held longer than the stale timeout: a holder that
// never unlocks (a bug, or a call stuck on something else) must not stop
// every other agent.
func (l *locks) gc(ctx context.Context) error {
	l.mu.Lock()
	var stale []*heldLock
	for h := range l.held {
		if time.Since(h.since) > l.stale {
			stale = append(stale, h)
		}
	}
	l.mu.Unlock()
	for _, h := range stale {
		l.c.log.Warn("Releasing a kvstore lock held for too long", "lock", h.key, "held", time.Since(h.since).Round(time.Second), "stale-timeout", l.stale)
		if l.c.metrics != nil {
			l.c.metrics.locksReleased.Inc()
		}
		if err := h.Unlock(ctx); err != nil {
			l.c.log.Warn("Releasing a stale kvstore lock failed; its session's TTL will", "lock", h.key, "error", err)
		}
	}
	return nil
}

func (l *locks) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.held)
}

func (l *locks) close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.sess != nil {
		// Orphan, not Close: Close revokes the lease, a round trip a
		// stopping agent need not wait for; the TTL frees the locks.
		l.sess.Orphan()
		l.sess = nil
	}
}

type heldLock struct {
	l     *locks
	key   string
	m     *concurrency.Mutex
	since time.Time
	// unlockLocal lets this process's next holder of key in.
	unlockLocal func()
	once        sync.Once
	err         error
}

func (h *heldLock) Unlock(ctx context.Context) error {
	h.once.Do(func() {
		h.l.mu.Lock()
		delete(h.l.held, h)
		h.l.mu.Unlock()
		if err := h.m.Unlock(ctx); err != nil {
			h.err = wrap("unlock", h.key, err)
		}
		h.unlockLocal()
	})
	return h.err
}

// locksGCInterval is how often kvstore-locks-gc looks for stale locks.
func (l *locks) gcInterval() time.Duration { return max(l.stale/4, time.Second) }
