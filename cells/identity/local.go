package identity

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/cellium/cellium/pkg/identity"
	"github.com/cellium/cellium/pkg/labels"
	"github.com/cellium/cellium/pkg/statefile"
)

type checkpoint struct {
	Version    int `json:"version"`
	Identities []struct {
		ID     identity.NumericIdentity `json:"id"`
		Labels string                   `json:"labels"`
	} `json:"identities"`
}

// loadCheckpoint reads the local identities; a file that cannot be used is
// moved aside (its endpoints get new identities) rather than stop the agent.
func (a *Allocator) loadCheckpoint() ([]*Identity, error) {
	// Not os.ReadFile: a FIFO there would block the start for ever.
	b, err := statefile.ReadRegular(a.path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	var cp checkpoint
	if err == nil {
		err = json.Unmarshal(b, &cp)
	}
	var out []*Identity
	if err == nil && cp.Version != 1 {
		err = fmt.Errorf("unknown version %d, want 1", cp.Version)
	}
	for _, e := range cp.Identities {
		if err != nil {
			break
		}
		var ls labels.Labels
		ls, err = labels.Parse(e.Labels)
		if err == nil && !e.ID.IsLocal() {
			err = fmt.Errorf("identity %d is outside the local range", e.ID)
		}
		out = append(out, &Identity{ID: e.ID, Labels: ls, Kind: KindLocal, Source: SourceLocal})
	}
	if err != nil {
		to, merr := statefile.MoveAside(a.path, filepath.Join(filepath.Dir(a.path), "invalid"))
		if merr != nil {
			return nil, fmt.Errorf("identity checkpoint %s: %w; moving it aside: %w", a.path, err, merr)
		}
		a.log.Error("Invalid identity checkpoint moved aside; restored endpoints get new identities", "file", a.path, "moved-to", to, "error", err)
		// Shown in agent status until the agent restarts.
		a.health.NewScope("checkpoint").Degraded("Identity checkpoint moved aside; restored endpoints get new identities",
			fmt.Errorf("%s moved to %s: %w", a.path, to, err))
		return nil, nil
	}
	return out, nil
}

// writeCheckpoint writes every local identity in use or restored, with
// a.mu held.
func (a *Allocator) writeCheckpoint() error {
	cp := checkpoint{Version: 1}
	for _, u := range a.used {
		if u.kind == KindLocal {
			cp.Identities = append(cp.Identities, struct {
				ID     identity.NumericIdentity `json:"id"`
				Labels string                   `json:"labels"`
			}{u.id, u.labels.String()})
		}
	}
	b, err := json.Marshal(cp)
	if err != nil {
		return err
	}
	if err := statefile.Write(a.path, b); err != nil {
		return fmt.Errorf("write identity checkpoint %s: %w", a.path, err)
	}
	return nil
}

// allocateLocal gives a new label set the lowest free node-local number,
// checkpointed before it is handed out.
func (a *Allocator) allocateLocal(ls labels.Labels) (identity.NumericIdentity, error) {
	key := ls.String()
	a.mu.Lock()
	defer a.mu.Unlock()
	if u := a.used[key]; u != nil {
		u.refs.Add(1)
		a.publish(u)
		return u.id, nil
	}
	u := newUsedIdentity(a.freeLocal(), ls, SourceLocal, 1)
	a.used[key] = u
	if err := a.writeCheckpoint(); err != nil {
		delete(a.used, key)
		return 0, err
	}
	a.publish(u)
	a.log.Info("Allocated a node-local identity", "identity", u.id, "labels", key)
	return u.id, nil
}

// RestoreDone forgets the restored local identities that no restored
// endpoint took back.
func (a *Allocator) RestoreDone() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	dropped := 0
	for key, u := range a.used {
		if u.refs.Load() == 0 {
			delete(a.used, key)
			dropped++
		}
	}
	if dropped == 0 {
		return nil
	}
	return a.writeCheckpoint()
}

// freeLocal is the lowest local identity not in use, with a.mu held.
func (a *Allocator) freeLocal() identity.NumericIdentity {
	taken := make(map[identity.NumericIdentity]bool, len(a.used))
	for _, u := range a.used {
		taken[u.id] = true
	}
	for n := identity.MinLocal; ; n++ {
		if !taken[n] {
			return n
		}
	}
}
