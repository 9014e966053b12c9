package identity

import (
	"context"

	"github.com/cellium/cellium/cells/internal/keyedlock"
)

// keyedMutex is a keyedlock.Map whose waiters never give up: a release
// that stopped waiting half way would leave the label set's value key
// behind for the collector, and an allocation that waits has its own
// context for the etcd calls after it. The zero value is ready to use.
type keyedMutex struct{ m keyedlock.Map }

// lock locks key and returns its unlock.
func (k *keyedMutex) lock(key string) func() {
	unlock, _ := k.m.Lock(context.Background(), key) // no error without a deadline
	return unlock
}
