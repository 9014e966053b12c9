package endpointmanager

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/cellium/cellium/pkg/polltest"
)

// pollUntil polls cond until it holds, failing the test after 10s.
func pollUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	polltest.Until(t, what, 10*time.Second, time.Millisecond, func() (bool, string) { return cond(), "not yet" })
}

// Operations on one container get its lock one at a time, in the order
// they came; another container's lock is free meanwhile; a waiter gives up
// at its deadline with ErrBusy naming the container; and the container's
// entry goes once nobody holds or waits for it.
func TestContainerLocksOrderedPerContainer(t *testing.T) {
	l := newOpLocks()
	unlockA, err := l.lockContainer(context.Background(), "a")
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan int, 3)
	for i := range 3 {
		go func() {
			unlock, err := l.lockContainer(context.Background(), "a")
			if err != nil {
				t.Error(err)
				return
			}
			got <- i
			unlock()
		}()
		// The next one comes once this one waits.
		pollUntil(t, fmt.Sprintf("waiter %d waits", i), func() bool { return l.containers.Users("a") == i+2 })
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	unlockB, err := l.lockContainer(ctx, "b")
	if err != nil {
		t.Fatalf("lock of container b while a is held: %v", err)
	}
	unlockB()

	short, cancelShort := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancelShort()
	if _, err := l.lockContainer(short, "a"); !errors.Is(err, ErrBusy) || !strings.Contains(err.Error(), "container a") {
		t.Fatalf("lock of a held container with a short deadline = %v, want ErrBusy naming the container", err)
	}

	unlockA()
	for want := range 3 {
		if i := <-got; i != want {
			t.Fatalf("waiter %d got the lock as number %d, want waiters in the order they came", i, want)
		}
	}
	pollUntil(t, "the entry of container a is gone", func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		return l.containers.Users("a") == 0 && l.readers == 0
	})
}

// The whole manager waits for the container operations that run, keeps
// new ones out while it waits and holds, and a waiter for it that gives up
// lets them in again.
func TestLockAllExcludesContainerOperations(t *testing.T) {
	l := newOpLocks()
	unlockA, err := l.lockContainer(context.Background(), "a")
	if err != nil {
		t.Fatal(err)
	}
	// A waiter for the whole manager that gives up.
	short, cancelShort := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancelShort()
	if err := l.lockAll(short); !errors.Is(err, ErrBusy) {
		t.Fatalf("lockAll while a container is held, short deadline = %v, want ErrBusy", err)
	}
	unlockB, err := l.lockContainer(context.Background(), "b")
	if err != nil {
		t.Fatalf("container lock after a waiter for the whole manager gave up: %v", err)
	}
	unlockB()

	all := make(chan struct{})
	go func() {
		if err := l.lockAll(context.Background()); err != nil {
			t.Error(err)
		}
		close(all)
	}()
	pollUntil(t, "lockAll waits", func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		return l.writersWaiting == 1
	})
	// While it waits, a new container operation waits too.
	short2, cancelShort2 := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancelShort2()
	if _, err := l.lockContainer(short2, "c"); !errors.Is(err, ErrBusy) {
		t.Fatalf("container lock while the whole manager is waited for = %v, want ErrBusy", err)
	}
	select {
	case <-all:
		t.Fatal("lockAll returned while container a was held")
	default:
	}
	unlockA()
	<-all
	short3, cancelShort3 := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancelShort3()
	if _, err := l.lockContainer(short3, "c"); !errors.Is(err, ErrBusy) {
		t.Fatalf("container lock while the whole manager is held = %v, want ErrBusy", err)
	}
	l.unlockAll()
	unlockC, err := l.lockContainer(context.Background(), "c")
	if err != nil {
		t.Fatalf("container lock after unlockAll: %v", err)
	}
	unlockC()
}

// The job orphans-gone does not wait for the manager's lock while a
// container operation holds it (a slow ADD): it skips the round. Waiting,
// it would be a waiting writer, which keeps every new ADD and DEL out until
// the slow one ends.
func TestOrphansRoundSkipsWhileAnOperationRuns(t *testing.T) {
	// An orphan whose interface exists (lo): a round that runs keeps it.
	m := &Manager{locks: newOpLocks(), orphans: map[string]orphan{"kept": {containerID: "kept", hostIfName: "lo"}}}
	unlockSlow, err := m.locks.lockContainer(context.Background(), "slow-add")
	if err != nil {
		t.Fatal(err)
	}
	defer unlockSlow()
	done := make(chan error, 1)
	go func() { done <- m.releaseGoneOrphans(context.Background()) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("orphans round: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the orphans round waits for the manager's lock while an ADD holds a container's")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	unlock, err := m.locks.lockContainer(ctx, "another")
	if err != nil {
		t.Fatalf("another container's operation after the orphans round: %v", err)
	}
	unlock()
	if len(m.orphans) != 1 {
		t.Errorf("the skipped round changed the orphans: %v", m.orphans)
	}
}

// tryLockAll takes the manager only when nothing holds it.
func TestTryLockAll(t *testing.T) {
	l := newOpLocks()
	unlock, err := l.lockContainer(context.Background(), "a")
	if err != nil {
		t.Fatal(err)
	}
	if l.tryLockAll() {
		t.Fatal("tryLockAll took the manager while container a's operation holds it")
	}
	unlock()
	if !l.tryLockAll() {
		t.Fatal("tryLockAll did not take the free manager")
	}
	if l.tryLockAll() {
		t.Fatal("tryLockAll took the manager twice")
	}
	l.unlockAll()
}

// On a node where operations always run, orphans-gone does not skip for
// ever (the gone orphans' addresses would stay held): after orphanSkipsMax
// rounds skipped, the next waits for the manager's lock as a writer, giving
// up after orphanLockWait; after orphanSkipsMax more skipped, the next
// waits again, and runs once the operation ends.
func TestOrphansRoundWaitsAfterSkips(t *testing.T) {
	m := &Manager{log: slog.New(slog.DiscardHandler), locks: newOpLocks(), orphans: map[string]orphan{"kept": {containerID: "kept", hostIfName: "lo"}}}
	waiting := func() int {
		m.locks.mu.Lock()
		defer m.locks.mu.Unlock()
		return m.locks.writersWaiting
	}
	round := func() <-chan error {
		done := make(chan error, 1)
		go func() { done <- m.releaseGoneOrphans(context.Background()) }()
		return done
	}
	skips := func() {
		t.Helper()
		for i := range orphanSkipsMax {
			if err := <-round(); err != nil {
				t.Fatalf("round %d: %v", i+1, err)
			}
			if waiting() != 0 {
				t.Fatalf("round %d waits for the lock", i+1)
			}
		}
	}
	unlockSlow, err := m.locks.lockContainer(context.Background(), "slow-add")
	if err != nil {
		t.Fatal(err)
	}
	skips()
	// Given up after orphanLockWait: no waiting writer left behind.
	start := time.Now()
	if err := <-round(); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d < orphanLockWait {
		t.Fatalf("round %d returned after %s without waiting %s for the lock", orphanSkipsMax+1, d, orphanLockWait)
	}
	if n := waiting(); n != 0 {
		t.Fatalf("%d writers waiting after the round gave up", n)
	}
	skips()
	done := round()
	pollUntil(t, "the round waiting for the manager's lock", func() bool { return waiting() == 1 })
	unlockSlow()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !m.locks.tryLockAll() {
		t.Fatal("the manager still held after the round")
	}
	m.locks.unlockAll()
}
