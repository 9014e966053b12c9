package keyedlock

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/cellium/cellium/pkg/polltest"
)

// One key's holders go one at a time in the order they came, another key
// is free meanwhile, a waiter gives up with its context's error, TryLock
// fails while held, and the key's entry goes once nobody uses it.
func TestMap(t *testing.T) {
	var m Map
	unlockA, err := m.Lock(context.Background(), "a")
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan int, 3)
	for i := range 3 {
		go func() {
			unlock, err := m.Lock(context.Background(), "a")
			if err != nil {
				t.Error(err)
				return
			}
			got <- i
			unlock()
		}()
		// The next one comes once this one waits.
		polltest.Until(t, fmt.Sprintf("waiter %d waits", i), 10*time.Second, time.Millisecond, func() (bool, string) {
			n := m.Users("a")
			return n == i+2, fmt.Sprintf("%d users", n)
		})
	}

	unlockB, ok := m.TryLock("b")
	if !ok {
		t.Fatal("TryLock of b while only a is held: not taken")
	}
	unlockB()
	if _, ok := m.TryLock("a"); ok {
		t.Fatal("TryLock of a held key: taken")
	}
	short, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := m.Lock(short, "a"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Lock of a held key with a short deadline = %v, want the deadline", err)
	}
	if n := m.Users("a"); n != 4 {
		t.Fatalf("users of a after a waiter and a TryLock gave up = %d, want the holder and 3 waiters", n)
	}

	unlockA()
	for want := range 3 {
		if i := <-got; i != want {
			t.Fatalf("waiter %d got the lock as number %d, want waiters in the order they came", i, want)
		}
	}
	polltest.Until(t, "every entry is gone", 10*time.Second, time.Millisecond, func() (bool, string) {
		m.mu.Lock()
		defer m.mu.Unlock()
		return len(m.locks) == 0, fmt.Sprintf("%d entries", len(m.locks))
	})
	if _, ok := m.TryLock("a"); !ok {
		t.Fatal("TryLock of a free key: not taken")
	}
}
