package endpointmanager

import (
	"context"
	"maps"
	"sync"
	"time"

	idalloc "github.com/cellium/cellium/cells/identity"
	"github.com/cellium/cellium/pkg/identity"
)

// identityTimeout bounds how long an ADD, a restore or a label change
// waits for the kvstore before the endpoint goes on with the init identity
// (or, restored, with the number it had); the resolve-identities job
// acquires the real one later. No identity is acquired with a lock held, so
// the wait holds back no other operation.
const identityTimeout = 2 * time.Second

// resolveInterval is how often resolve-identities looks for endpoints
// whose identity is not acquired yet.
const resolveInterval = 5 * time.Second

// identityPod is what ep's identity is made of.
func identityPod(ep *Endpoint) idalloc.Pod {
	return idalloc.Pod{Namespace: ep.PodNamespace, Labels: ep.Labels, ServiceAccount: ep.ServiceAccount, NamespaceLabels: ep.NamespaceLabels}
}

// sameIdentityInputs says whether a and b have the same identity inputs.
func sameIdentityInputs(a, b *Endpoint) bool {
	return a.PodNamespace == b.PodNamespace && a.ServiceAccount == b.ServiceAccount &&
		maps.Equal(a.Labels, b.Labels) && maps.Equal(a.NamespaceLabels, b.NamespaceLabels)
}

// acquireIdentity is the identity of ep's labels, counted for ep. When the
// allocator cannot answer in time, it is fallback (not counted) and
// pending says the resolve-identities job must acquire it.
func (m *Manager) acquireIdentity(ctx context.Context, ep *Endpoint, fallback identity.NumericIdentity) (id identity.NumericIdentity, pending bool) {
	if ep.Health {
		return identity.Health, false
	}
	ctx, cancel := context.WithTimeout(ctx, identityTimeout)
	defer cancel()
	ls := m.ids.PodLabels(identityPod(ep))
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

// acquireIdentities acquires the identities of restored endpoints, many at
// once and within one identityTimeout for all of them, each keeping the
// number it had while the allocator cannot answer.
func (m *Manager) acquireIdentities(ctx context.Context, eps []*Endpoint) {
	ctx, cancel := context.WithTimeout(ctx, identityTimeout)
	defer cancel()
	// With the cluster's identities listed, a label set gets the number it
	// had even when no node holds it any more (the agent was down longer
	// than its lease).
	if err := m.ids.WaitSynced(ctx); err != nil {
		m.log.Warn("The cluster's identities are not listed yet; restored endpoints may keep provisional identities", "error", err)
	}
	var wg sync.WaitGroup
	slots := make(chan struct{}, 32)
	for _, ep := range eps {
		slots <- struct{}{}
		wg.Go(func() {
			defer func() { <-slots }()
			ep.Identity, ep.IdentityPending = m.acquireIdentity(ctx, ep, ep.Identity)
		})
	}
	wg.Wait()
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

// reidentify moves the endpoint old to the identity of the inputs derive
// gives it (nil: nothing to change). The identity is acquired without the
// container's lock; the endpoint is then changed only if its identity and
// inputs are still those of old, else what was acquired is released. When
// another change got there first (a pod event and a namespace event handled
// at once, each from the same row), derive runs again on the newer row, so
// the endpoint ends with what derive says last, not with whichever event
// committed first.
func (m *Manager) reidentify(ctx context.Context, old *Endpoint, why string, derive func(*Endpoint) *Endpoint) {
	for old != nil {
		next := derive(old)
		if next == nil {
			return
		}
		old = m.reidentifyOnce(ctx, old, next, why)
	}
}

// reidentifyOnce is one try of reidentify; it returns the newer row when
// another change of the same container's endpoint got there first, nil
// when done (or when the endpoint went or is going).
func (m *Manager) reidentifyOnce(ctx context.Context, old, next *Endpoint, why string) *Endpoint {
	fallback := identity.Unknown
	if sameIdentityInputs(old, next) {
		// Resolving a provisional identity: keep it until the allocator answers.
		fallback = old.Identity
	}
	next.Identity, next.IdentityPending = m.acquireIdentity(ctx, next, fallback)
	unlock, err := m.locks.lockContainer(ctx, old.ContainerID)
	if err != nil {
		m.releaseIdentity(next)
		return nil
	}
	defer unlock()
	cur, _, found := m.tbl.Get(m.db.ReadTxn(), EndpointID.Query(old.ID))
	// A deleting endpoint's state file may be gone: writing it again would
	// bring the endpoint back at the next restore.
	if !found || cur.State == Deleting || cur.ContainerID != old.ContainerID {
		m.releaseIdentity(next)
		return nil
	}
	if !sameIdentityInputs(cur, old) || cur.Identity != old.Identity || cur.IdentityPending != old.IdentityPending {
		m.releaseIdentity(next)
		return cur
	}
	if sameIdentityInputs(cur, next) && cur.Identity == next.Identity && cur.IdentityPending == next.IdentityPending {
		// Still provisional: nothing to write.
		return nil
	}
	ep := cur.Clone()
	ep.Labels, ep.ServiceAccount, ep.NamespaceLabels = next.Labels, next.ServiceAccount, next.NamespaceLabels
	ep.Identity, ep.IdentityPending = next.Identity, next.IdentityPending
	if err := m.update(ep); err != nil {
		m.log.Error("Write the endpoint's new identity", "id", ep.ID, "pod", ep.PodNamespace+"/"+ep.PodName, "error", err)
		m.releaseIdentity(ep)
		return nil
	}
	m.releaseIdentity(old)
	if ep.Identity != old.Identity || ep.IdentityPending != old.IdentityPending {
		m.log.Info("Endpoint has a new identity", "id", ep.ID, "pod", ep.PodNamespace+"/"+ep.PodName, "why", why,
			"identity", ep.identityString(), "was", old.identityString())
	}
	return nil
}

// podChanged gives the endpoints of a pod what the API server now says of
// it; namespaceChanged does it for every endpoint of a namespace. The
// datapath keeps the endpoints' connections: only the identity they are
// known by changes.
func (m *Manager) podChanged(namespace, name string) {
	for ep := range m.tbl.List(m.db.ReadTxn(), EndpointPod.Query(namespace+"/"+name)) {
		m.refreshPod(ep, "pod labels changed")
	}
}

func (m *Manager) namespaceChanged(namespace string) {
	for ep := range m.tbl.All(m.db.ReadTxn()) {
		if ep.PodNamespace == namespace && ep.PodName != "" {
			m.refreshPod(ep, "namespace labels changed")
		}
	}
}

func (m *Manager) refreshPod(ep *Endpoint, why string) {
	m.reidentify(context.Background(), ep, why, m.podInputs)
}

// podInputs is ep with the identity inputs the API server now gives its
// pod, or nil when they are those it has (or the pod is not known).
func (m *Manager) podInputs(ep *Endpoint) *Endpoint {
	meta, ok := m.podMeta(ep.PodNamespace, ep.PodName)
	if !ok {
		return nil
	}
	next := ep.Clone()
	meta.apply(next)
	if sameIdentityInputs(ep, next) {
		return nil
	}
	return next
}

// stillPending is ep again while its identity is provisional.
func stillPending(ep *Endpoint) *Endpoint {
	if !ep.IdentityPending {
		return nil
	}
	return ep.Clone()
}

// resolveIdentities acquires the identities that ADDs, restores and label
// changes could not get in time (the kvstore was away).
func (m *Manager) resolveIdentities(ctx context.Context) error {
	for ep := range m.tbl.All(m.db.ReadTxn()) {
		if !ep.IdentityPending {
			continue
		}
		m.reidentify(ctx, ep, "identity resolved", stillPending)
		if cur, found := m.Lookup(Selector{ID: ep.ID}); found && cur.IdentityPending {
			return nil // still away: the next round tries again
		}
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
