// Package keyedlock is a mutex per key (a container ID, a label set, a
// kvstore lock name): holders of one key go one at a time, holders of
// different keys at once.
//
// Contract:
//   - Lock waits until the key is free or ctx ends; a waiter that gives up
//     returns ctx's error and leaves no trace. Waiters get the key in the
//     order they came.
//   - TryLock takes the key only if it is free at once.
//   - A key's entry exists only while someone holds or waits for it, so a
//     stream of distinct keys (one per pod, per label set) does not grow
//     the map.
//   - The unlock a Lock returns must be called exactly once.
//
// The zero Map is ready to use.
//
//	var locks keyedlock.Map
//	unlock, err := locks.Lock(ctx, containerID)
//	if err != nil { return fmt.Errorf("busy: %w", err) }
//	defer unlock()
package keyedlock

import (
	"context"
	"sync"
)

// Map holds the locks of the keys in use.
type Map struct {
	mu    sync.Mutex
	locks map[string]*entry
}

type entry struct {
	// slot is a channel of one: sending takes the lock, and blocked
	// senders are served in the order they came.
	slot chan struct{}
	// refs are the holders and waiters; at zero the entry leaves the map.
	refs int
}

// Lock waits for key until ctx ends and returns its unlock, or ctx.Err().
func (m *Map) Lock(ctx context.Context, key string) (unlock func(), err error) {
	e := m.acquire(key)
	select {
	case e.slot <- struct{}{}:
		return m.unlocker(key, e), nil
	default:
	}
	select {
	case e.slot <- struct{}{}:
		return m.unlocker(key, e), nil
	case <-ctx.Done():
		m.release(key, e)
		return nil, ctx.Err()
	}
}

// TryLock takes key if nobody holds it and returns its unlock; ok is
// false, and nothing changed, if someone does.
func (m *Map) TryLock(key string) (unlock func(), ok bool) {
	e := m.acquire(key)
	select {
	case e.slot <- struct{}{}:
		return m.unlocker(key, e), true
	default:
		m.release(key, e)
		return nil, false
	}
}

// Users is how many hold or wait for key.
func (m *Map) Users(key string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	if e := m.locks[key]; e != nil {
		return e.refs
	}
	return 0
}

func (m *Map) acquire(key string) *entry {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.locks == nil {
		m.locks = map[string]*entry{}
	}
	e := m.locks[key]
	if e == nil {
		e = &entry{slot: make(chan struct{}, 1)}
		m.locks[key] = e
	}
	e.refs++
	return e
}

func (m *Map) release(key string, e *entry) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if e.refs--; e.refs == 0 {
		delete(m.locks, key)
	}
}

func (m *Map) unlocker(key string, e *entry) func() {
	return func() {
		<-e.slot
		m.release(key, e)
	}
}
