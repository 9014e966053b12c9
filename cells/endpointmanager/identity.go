package endpointmanager

import (
	"context"
	"time"

	"github.com/cellium/cellium/pkg/identity"
)

// identityTimeout bounds how long an ADD, a restore or a label change
// waits for the kvstore before the endpoint goes on with the init identity
// (or, restored, with the number it had); the resolve-identities job
// acquires the real one later.
const identityTimeout = 2 * time.Second

// resolveInterval is how often resolve-identities looks for endpoints
// whose identity is not acquired yet.
const resolveInterval = 5 * time.Second

// acquireIdentity is the identity of ep's labels, counted for ep. When the
// allocator cannot answer in time, it is fallback (not counted) and
// pending says the resolve-identities job must acquire it.
func (m *Manager) acquireIdentity(ctx context.Context, ep *Endpoint, fallback identity.NumericIdentity) (id identity.NumericIdentity, pending bool) {
	ctx, cancel := context.WithTimeout(ctx, identityTimeout)
	defer cancel()
	ls := m.ids.PodLabels(ep.PodNamespace, ep.Labels)
	id, err := m.ids.Allocate(ctx, ls)
	if err == nil {
		return id, false
	}
	if fallback == identity.Unknown {
		fallback = identity.Init
		if known, ok := m.ids.Lookup(ls); ok {
			fallback = known
		}
	}
	m.log.Warn("No identity for the endpoint's labels yet; it has a provisional one until the allocator answers",
		"id", ep.ID, "labels", ls.String(), "provisional", fallback, "error", err)
	return fallback, true
}

// releaseIdentity drops ep's use of its identity.
func (m *Manager) releaseIdentity(ep *Endpoint) {
	if ep.IdentityPending {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), identityTimeout)
	defer cancel()
	if err := m.ids.Release(ctx, ep.Identity); err != nil {
		m.log.Warn("Releasing the endpoint's identity failed", "id", ep.ID, "identity", ep.Identity, "error", err)
	}
}

// resolveIdentities acquires the identities that ADDs, restores and label
// changes could not get in time (the kvstore was away).
func (m *Manager) resolveIdentities(ctx context.Context) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	for ep := range m.tbl.All(m.db.ReadTxn()) {
		if !ep.IdentityPending {
			continue
		}
		id, pending := m.acquireIdentity(ctx, ep, ep.Identity)
		if pending {
			return nil // still away: the next round tries again
		}
		ep = ep.Clone()
		ep.Identity, ep.IdentityPending = id, false
		if err := m.update(ep); err != nil {
			return err
		}
		m.log.Info("Endpoint has its identity", "id", ep.ID, "identity", id)
	}
	return nil
}

// update writes a changed endpoint to its state file and the table.
func (m *Manager) update(ep *Endpoint) error {
	if err := m.states.write(ep, phaseReady); err != nil {
		return err
	}
	txn := m.db.WriteTxn(m.tbl)
	defer txn.Abort()
	if _, _, err := m.tbl.Insert(txn, ep); err != nil {
		return err
	}
	txn.Commit()
	return nil
}
