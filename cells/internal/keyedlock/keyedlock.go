// Package keyedlock is a mutex per key (a container ID, a label set, a
// kvstore lock name): holders of one key go one at a time, holders of
// different keys at once.
//
// Contract:
//   - Lock waits until the key is free or ctx ends; a waiter that gives up
//     returns ctx's error and leaves no trace. Waiters get the key in the
//     order they came: the order in which they were counted in Users, so
//     that a waiter seen there is in the queue.
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
	held bool
	// waiters are the channels of those waiting for the key, in the
	// order they came; the unlock closes the first, which then holds it.
	waiters []chan struct{}
	// refs are the holder and the waiters; at zero the entry leaves the
	// map.
	refs int
}

// Lock waits for key until ctx ends and returns its unlock, or ctx.Err().
func (m *Map) Lock(ctx context.Context, key string) (unlock func(), err error) {
	m.mu.Lock()
	e := m.entryLocked(key)
	e.refs++
	if !e.held {
		e.held = true
		m.mu.Unlock()
		return m.unlocker(key, e), nil
	}
	// In the queue, and counted, in one critical section.
	turn := make(chan struct{})
	e.waiters = append(e.waiters, turn)
	m.mu.Unlock()
	select {
	case <-turn:
		return m.unlocker(key, e), nil
	case <-ctx.Done():
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	select {
	case <-turn:
		// Handed the key as ctx ended: hand it on.
		m.unlockLocked(key, e)
		return nil, ctx.Err()
	default:
	}
	for i, w := range e.waiters {
		if w == turn {
			e.waiters = append(e.waiters[:i], e.waiters[i+1:]...)
			break
		}
	}
	m.dropLocked(key, e)
	return nil, ctx.Err()
}

// TryLock takes key if nobody holds it and returns its unlock; ok is
// false, and nothing changed, if someone does.
func (m *Map) TryLock(key string) (unlock func(), ok bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if e := m.locks[key]; e != nil && e.held {
		return nil, false
	}
	e := m.entryLocked(key)
	e.refs++
	e.held = true
	return m.unlocker(key, e), true
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

// entryLocked is key's entry, made if there is none. With m.mu held.
func (m *Map) entryLocked(key string) *entry {
	if m.locks == nil {
		m.locks = map[string]*entry{}
	}
	e := m.locks[key]
	if e == nil {
		e = &entry{}
		m.locks[key] = e
	}
	return e
}

// unlockLocked hands key to its first waiter, or frees it, and drops the
// holder's use. With m.mu held.
func (m *Map) unlockLocked(key string, e *entry) {
	if len(e.waiters) > 0 {
		close(e.waiters[0])
		e.waiters = e.waiters[1:]
	} else {
		e.held = false
	}
	m.dropLocked(key, e)
}

// dropLocked drops one use of key. With m.mu held.
func (m *Map) dropLocked(key string, e *entry) {
	if e.refs--; e.refs == 0 {
		delete(m.locks, key)
	}
}

func (m *Map) unlocker(key string, e *entry) func() {
	return func() {
		m.mu.Lock()
		defer m.mu.Unlock()
		m.unlockLocked(key, e)
	}
}
