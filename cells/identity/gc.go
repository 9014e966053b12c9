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
const gcLock = "state/identities/v1/locks/gc"

// gcCandidate is a master key found unused in a round, with its revision:
// the next round deletes it if it is still unused and unchanged.
type gcCandidate struct {
	labels string
	rev    int64
}

// gcRound is one round of the collection of master keys that no node
// uses (no value key of their label set names their number). A key is
// deleted only when the previous round of this agent found it unused at
// the same revision, and only by a transaction that checks, as it deletes,
// that the key is unchanged and still unused: an allocation racing the
// collector either adds its value key first (and the delete does not
// happen) or finds the key gone (and allocates anew). Agents that do not
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
	// A master key is in use while a value key of its label set names its
	// number.
	type use struct{ labels, number string }
	inUse := map[use]bool{}
	for _, v := range values {
		rest := strings.TrimPrefix(v.Key, valuePrefix)
		if i := strings.LastIndexByte(rest, '/'); i > 0 {
			inUse[use{rest[:i], string(v.Value)}] = true
		}
	}
	next := map[string]gcCandidate{}
	deleted := 0
	for _, m := range masters {
		labels := string(m.Value)
		if inUse[use{labels, strings.TrimPrefix(m.Key, idPrefix)}] {
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

// deleteUnused deletes a master key if it is unchanged since revision rev
// and no value key of its label set names its number.
func (a *Allocator) deleteUnused(ctx context.Context, key, labels string, rev int64) (bool, error) {
	unchanged, values, number := kvstore.ModRevisionIs(key, rev), valuePrefix+labels+"/", []byte(strings.TrimPrefix(key, idPrefix))
	del := []kvstore.Op{kvstore.Del(key)}
	i, err := a.kv.Txn(ctx,
		kvstore.Branch{If: []kvstore.Cond{unchanged, kvstore.NoneUnder(values)}, Then: del},
		kvstore.Branch{If: []kvstore.Cond{unchanged, kvstore.EveryValueUnderIsNot(values, number)}, Then: del})
	if err != nil {
		return false, fmt.Errorf("delete unused identity %s: %w", key, err)
	}
	return i >= 0, nil
}
