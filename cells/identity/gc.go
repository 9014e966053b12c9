package identity

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/cellium/cellium/cells/kvstore"
)

// gcLock is the lock that makes one agent at a time the collector of
// unused master keys.
const gcLock = lockPrefix + "gc"

// gcCandidate is a master key found unused in a round, with its revision:
// the next round deletes it if it is still unused and unchanged.
type gcCandidate struct {
	labels string
	rev    int64
}

// gcRound is one round of the collection of master keys that no node
// uses (no value key names their label set). A key is deleted only when
// the previous round of this agent found it unused at the same revision,
// and only under its label set's lock after checking again, so an
// allocation racing the collector keeps its number. Agents that do not
// get the collector's lock skip the round and forget their candidates.
func (a *Allocator) gcRound(ctx context.Context) error {
	unlock, err := a.kv.TryLock(ctx, gcLock)
	if errors.Is(err, kvstore.ErrLocked) {
		a.gcCandidates = nil
		return nil
	}
	if err != nil {
		return err
	}
	defer func() {
		uctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		unlock.Unlock(uctx)
	}()

	masters, err := a.kv.List(ctx, idPrefix)
	if err != nil {
		return err
	}
	values, err := a.kv.List(ctx, valuePrefix)
	if err != nil {
		return err
	}
	inUse := map[string]bool{}
	for _, v := range values {
		rest := strings.TrimPrefix(v.Key, valuePrefix)
		if i := strings.LastIndexByte(rest, '/'); i > 0 {
			inUse[rest[:i]] = true
		}
	}
	next := map[string]gcCandidate{}
	deleted := 0
	for _, m := range masters {
		labels := string(m.Value)
		if inUse[labels] {
			continue
		}
		prev, seen := a.gcCandidates[m.Key]
		if !seen || prev.rev != m.ModRevision || prev.labels != labels {
			next[m.Key] = gcCandidate{labels: labels, rev: m.ModRevision}
			continue
		}
		ok, err := a.deleteUnused(ctx, m.Key, labels, m.ModRevision)
		if err != nil {
			return err
		}
		if ok {
			deleted++
		}
	}
	a.gcCandidates = next
	if deleted > 0 || len(next) > 0 {
		a.log.Info("Identity GC round", "deleted", deleted, "unused-once", len(next), "master-keys", len(masters))
	}
	return nil
}

// deleteUnused deletes a master key under its label set's lock if no
// value key names the set and the key is unchanged.
func (a *Allocator) deleteUnused(ctx context.Context, key, labels string, rev int64) (bool, error) {
	unlock, err := a.kv.Lock(ctx, lockPrefix+labels)
	if err != nil {
		return false, err
	}
	defer func() {
		uctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		unlock.Unlock(uctx)
	}()
	values, err := a.kv.List(ctx, valuePrefix+labels+"/")
	if err != nil || len(values) > 0 {
		return false, err
	}
	ok, err := a.kv.DeleteIfRevision(ctx, key, rev)
	if err != nil {
		return false, fmt.Errorf("delete unused identity %s: %w", key, err)
	}
	return ok, nil
}
