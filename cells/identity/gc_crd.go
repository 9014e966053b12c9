package identity

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"golang.org/x/time/rate"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cellium/cellium/pkg/identity"
	"github.com/cellium/cellium/pkg/k8sapi"
)

// The Lease that makes one agent at a time the collector in crd mode.
const (
	gcLeaseName      = "cellium-identity-gc"
	gcLeaseNamespace = "kube-system"
)

// gcDeletesPerSecond bounds the collector's deletes.
const gcDeletesPerSecond = 20

// crdGC is the collector's memory between rounds.
type crdGC struct {
	// candidates are the identities the last round found unused, with
	// their resource version.
	candidates map[string]string
	// goneNodes are the node names that endpoint objects named and that
	// had no Node object in the last round.
	goneNodes map[string]bool
	limiter   *rate.Limiter
}

// holdLease takes or renews the collector's Lease for this node; false
// when another agent holds it and has renewed it within its duration.
func (a *Allocator) holdLease(ctx context.Context, interval time.Duration) (bool, error) {
	leases := a.crd.client.Leases(gcLeaseNamespace)
	now := metav1.NewMicroTime(time.Now())
	holder, dur := a.node, int32(3*interval/time.Second)
	lease, err := leases.Get(ctx, gcLeaseName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		_, err = leases.Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: gcLeaseName, Namespace: gcLeaseNamespace},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: &holder, LeaseDurationSeconds: &dur, AcquireTime: &now, RenewTime: &now}}, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			return false, nil
		}
		return err == nil, err
	}
	if err != nil {
		return false, err
	}
	s := &lease.Spec
	if s.HolderIdentity != nil && *s.HolderIdentity != holder && s.RenewTime != nil && s.LeaseDurationSeconds != nil &&
		s.RenewTime.Add(time.Duration(*s.LeaseDurationSeconds)*time.Second).After(now.Time) {
		return false, nil
	}
	if s.HolderIdentity == nil || *s.HolderIdentity != holder {
		s.AcquireTime = &now
	}
	s.HolderIdentity, s.RenewTime, s.LeaseDurationSeconds = &holder, &now, &dur
	if _, err := leases.Update(ctx, lease, metav1.UpdateOptions{}); apierrors.IsConflict(err) {
		return false, nil
	} else if err != nil {
		return false, err
	}
	return true, nil
}

// gcRoundCRD is one round of the collector in crd mode, run by the agent
// that holds the Lease (the others skip it and forget their candidates):
//
//   - CelliumEndpoints of a node that has had no Node object for two rounds
//     are deleted (their agent is gone and cannot do it);
//   - a CelliumIdentity that no CelliumEndpoint and no endpoint of this
//     node uses is a candidate; one that is a candidate in two rounds in a
//     row, at the same resource version, is deleted with that resource
//     version as precondition. One used again meanwhile is kept.
//
// Deletes are rate-limited. An agent whose identity in use is deleted all
// the same writes it back (watch-crd-identities).
func (a *Allocator) gcRoundCRD(ctx context.Context) error {
	select {
	case <-a.crd.registered:
	default:
		return nil
	}
	gc := &a.crd.gc
	leader, err := a.holdLease(ctx, a.gcInterval)
	if err != nil || !leader {
		gc.candidates, gc.goneNodes = nil, nil
		return err
	}
	nodeList, err := a.crd.cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{ResourceVersion: "0"})
	if err != nil {
		return fmt.Errorf("identity GC: list nodes: %w", err)
	}
	nodes := map[string]bool{}
	for _, n := range nodeList.Items {
		nodes[n.Name] = true
	}
	eps, err := a.crd.client.ListEndpoints(ctx, "")
	if err != nil {
		return fmt.Errorf("identity GC: list CelliumEndpoints: %w", err)
	}
	used := map[string]bool{}
	gone := map[string]bool{}
	deletedEPs := 0
	for _, ep := range eps.Items {
		node := ep.Status.NodeName
		if !nodes[node] && node != a.node {
			gone[node] = true
			if gc.goneNodes[node] {
				if err := gc.limiter.Wait(ctx); err != nil {
					return nil
				}
				if err := a.crd.client.DeleteEndpoint(ctx, ep.Namespace, ep.Name, ep.UID); err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
					return fmt.Errorf("identity GC: delete CelliumEndpoint %s/%s of deleted node %s: %w", ep.Namespace, ep.Name, node, err)
				}
				deletedEPs++
				continue
			}
		}
		used[strconv.FormatUint(uint64(ep.Status.Identity), 10)] = true
	}
	gc.goneNodes = gone
	a.mu.RLock()
	for _, u := range a.used {
		used[u.id.String()] = true
	}
	a.mu.RUnlock()

	ids, err := a.crd.client.ListIdentities(ctx)
	if err != nil {
		return fmt.Errorf("identity GC: list CelliumIdentities: %w", err)
	}
	next := map[string]string{}
	deleted := 0
	for _, id := range ids.Items {
		if used[id.Name] {
			continue
		}
		if n, err := identity.Parse(id.Name); err != nil || !n.IsCluster() {
			continue // not ours to collect: refused by the watch
		}
		if rv, ok := gc.candidates[id.Name]; !ok || rv != id.ResourceVersion {
			next[id.Name] = id.ResourceVersion
			continue
		}
		if err := gc.limiter.Wait(ctx); err != nil {
			return nil
		}
		switch err := a.crd.client.DeleteIdentity(ctx, id.Name, id.ResourceVersion); {
		case err == nil:
			deleted++
		case apierrors.IsNotFound(err), apierrors.IsConflict(err):
		default:
			return fmt.Errorf("identity GC: delete unused CelliumIdentity %s: %w", id.Name, err)
		}
	}
	gc.candidates = next
	if deleted > 0 || deletedEPs > 0 || len(next) > 0 {
		a.log.Info("Identity GC round", "deleted", deleted, "unused-once", len(next), "identities", len(ids.Items),
			"endpoints-of-deleted-nodes-deleted", deletedEPs)
	}
	return nil
}

// writeBackCRD creates again the CelliumIdentity of an identity this node
// uses, which someone deleted: its endpoints keep their number.
func (a *Allocator) writeBackCRD(ctx context.Context, u *usedIdentity) error {
	a.mu.RLock()
	still := a.used[u.labels.String()] == u && u.refs.Load() > 0
	a.mu.RUnlock()
	if !still {
		return nil
	}
	obj := &k8sapi.CelliumIdentity{ObjectMeta: metav1.ObjectMeta{Name: u.id.String()}, Spec: k8sapi.IdentitySpec{Labels: u.labels.Strings()}}
	_, err := a.crd.client.CreateIdentity(ctx, obj)
	if apierrors.IsAlreadyExists(err) {
		return nil // back already (another node's write-back), or taken: the watch says
	}
	if err != nil {
		a.log.Warn("An identity in use lost its CelliumIdentity and writing it back failed; retrying", "identity", u.id, "error", err)
		return err
	}
	a.repairs.Inc()
	a.log.Warn("Wrote back the CelliumIdentity of an identity in use", "identity", u.id, "labels", u.labels.String())
	return nil
}
