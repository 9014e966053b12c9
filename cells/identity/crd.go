package identity

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"
	"golang.org/x/time/rate"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cellium/cellium/cells/internal/refused"
	"github.com/cellium/cellium/cells/k8sclient"
	"github.com/cellium/cellium/cells/kvstore"
	"github.com/cellium/cellium/pkg/backoff"
	"github.com/cellium/cellium/pkg/identity"
	"github.com/cellium/cellium/pkg/k8sapi"
	"github.com/cellium/cellium/pkg/labels"
)

// Mode is where cluster identities live (--identity-allocation-mode).
type Mode string

const (
	modeAuto = "auto"
	// ModeKVStore: master and value keys in the kvstore (--kvstore).
	ModeKVStore Mode = "kvstore"
	// ModeCRD: CelliumIdentity objects in the Kubernetes API.
	ModeCRD Mode = "crd"
	// ModeLocal: this node's numbers, checkpointed in the state dir.
	ModeLocal Mode = "local"
)

// resolveMode checks --identity-allocation-mode against the kvstore and
// the Kubernetes API there are, and resolves auto: kvstore when --kvstore
// is set, crd with a real API server, local otherwise.
func resolveMode(flag string, kv kvstore.Client, cs k8sclient.Clientset) (Mode, error) {
	realAPI := cs != nil && !cs.Embedded()
	switch Mode(flag) {
	case modeAuto:
		switch {
		case kv.Enabled():
			return ModeKVStore, nil
		case realAPI:
			return ModeCRD, nil
		}
		return ModeLocal, nil
	case ModeKVStore:
		if !kv.Enabled() {
			return "", fmt.Errorf("--identity-allocation-mode=kvstore needs a kvstore: set --kvstore=etcd (and --kvstore-opt etcd.address=...), or use crd or local")
		}
	case ModeCRD:
		if !realAPI {
			return "", fmt.Errorf("--identity-allocation-mode=crd needs a real Kubernetes API server (--k8s-mode=in-cluster or --kubeconfig): the embedded one (--k8s-manifests-dir) holds no custom resources; use local")
		}
	case ModeLocal:
		if kv.Enabled() {
			return "", fmt.Errorf("--identity-allocation-mode=local conflicts with --kvstore=%s: other nodes would read this node's local numbers from the kvstore; use kvstore (or crd), or drop --kvstore", "etcd")
		}
	default:
		return "", fmt.Errorf("invalid --identity-allocation-mode %q: want auto, kvstore, crd or local", flag)
	}
	return Mode(flag), nil
}

// Mode is where the allocator's identities live.
func (a *Allocator) Mode() Mode { return a.mode }

// crdBackend is the crd mode's state.
type crdBackend struct {
	client *k8sapi.Client
	// registered is closed once the CRDs are established.
	registered chan struct{}
	// listed marks the table initialized once the identities are listed.
	listed func(statedb.WriteTxn)
	// refused names the bad objects in health (scope "crd-identities").
	refused *refused.Set
	cs      k8sclient.Clientset
	gc      crdGC
}

func (a *Allocator) newCRDBackend(p params) error {
	client, err := k8sapi.NewClient(k8sclient.RESTConfig(p.Clientset))
	if err != nil {
		return err
	}
	txn := p.DB.WriteTxn(p.Table)
	listed := p.Table.RegisterInitializer(txn, "crd-identities")
	txn.Commit()
	a.setBackendState(stateRegistering)
	a.crd = &crdBackend{client: client, registered: make(chan struct{}), listed: listed,
		refused: refused.New(p.Log, p.Health.NewScope("crd-identities"), "CelliumIdentity"), cs: p.Clientset,
		gc: crdGC{limiter: rate.NewLimiter(gcDeletesPerSecond, 1)}}
	p.Jobs.Add(
		job.OneShot("register-crds", a.registerCRDs, job.WithRetry(-1, &backoff.Jittered{Min: 500 * time.Millisecond, Max: 30 * time.Second})),
		job.OneShot("watch-crd-identities", a.watchCRD),
		job.OneShot("identity-write-back", a.runWriteBacks),
		job.Timer("identity-gc", a.gcRoundCRD, p.Config.IdentityGCInterval),
	)
	return nil
}

// CRDClient is the client of Cellium's custom resources in crd mode, and
// a channel closed once their CRDs are established; nil otherwise.
func (a *Allocator) CRDClient() (*k8sapi.Client, <-chan struct{}) {
	if a.crd == nil {
		return nil, nil
	}
	return a.crd.client, a.crd.registered
}

// registerCRDs installs the CRDs that are missing or older, and waits
// until the API server serves them; retried until it succeeds.
func (a *Allocator) registerCRDs(ctx context.Context, health cell.Health) error {
	if err := a.crd.client.EnsureCRDs(ctx, a.log); err != nil {
		return err
	}
	health.OK("CRDs established")
	a.setBackendState(stateListing)
	close(a.crd.registered)
	return nil
}

// candidate is the attempt'th number tried for the label set key: a
// sequence of its own, the same on every node, so that nodes racing to
// allocate one new label set try the same numbers and meet on one.
func candidate(key string, attempt int) identity.NumericIdentity {
	h := fnv.New64a()
	h.Write([]byte(key))
	h.Write(binary.LittleEndian.AppendUint32(nil, uint32(attempt)))
	span := uint64(identity.MaxCluster - identity.MinCluster + 1)
	return identity.MinCluster + identity.NumericIdentity(h.Sum64()%span)
}

// allocateCRD is the cluster number of ls. A label set the table knows (the
// watch keeps every CelliumIdentity in it) costs no API call. A new one is
// created: the label set's candidate numbers are tried in order, each by
// creating its object; a number taken by another label set is skipped, one
// taken by this one (another node was first) is joined.
func (a *Allocator) allocateCRD(ctx context.Context, ls labels.Labels) (identity.NumericIdentity, error) {
	key := ls.String()
	if n, ok := a.lookupCluster(key); ok {
		return n, nil
	}
	select {
	case <-a.crd.registered:
	case <-ctx.Done():
		return 0, fmt.Errorf("allocate an identity for %s: CRDs not yet established: %w", key, ctx.Err())
	}
	for attempt := range maxAllocateAttempts {
		n := candidate(key, attempt)
		if row, _, found := a.tbl.Get(a.db.ReadTxn(), ByID.Query(n)); found {
			if row.Labels.String() == key {
				return n, nil
			}
			continue
		}
		obj := &k8sapi.CelliumIdentity{ObjectMeta: metav1.ObjectMeta{Name: n.String()}, Spec: k8sapi.IdentitySpec{Labels: ls.Strings()}}
		_, err := a.crd.client.CreateIdentity(ctx, obj)
		if err == nil {
			a.log.Info("Allocated a cluster identity", "identity", n, "labels", key, "backend", ModeCRD)
			return n, nil
		}
		if !apierrors.IsAlreadyExists(err) {
			return 0, fmt.Errorf("allocate an identity for %s: create CelliumIdentity %s: %w", key, n, err)
		}
		have, err := a.crd.client.GetIdentity(ctx, n.String())
		if apierrors.IsNotFound(err) {
			// Collected meanwhile: try the same number again.
			continue
		}
		if err != nil {
			return 0, fmt.Errorf("allocate an identity for %s: get CelliumIdentity %s: %w", key, n, err)
		}
		if slices.Equal(have.Spec.Labels, obj.Spec.Labels) {
			return n, nil
		}
	}
	return 0, fmt.Errorf("no cluster identity for %s after %d attempts: its candidate numbers are taken", key, maxAllocateAttempts)
}

// parseCRDIdentity checks a CelliumIdentity: its name a number in canonical
// form in the cluster range, its labels a label set in canonical form.
func parseCRDIdentity(obj *k8sapi.CelliumIdentity) (*Identity, error) {
	n, err := strconv.ParseUint(obj.Name, 10, 32)
	id := identity.NumericIdentity(n)
	switch {
	case err != nil || id.String() != obj.Name:
		return nil, fmt.Errorf("name is not an identity number in canonical form")
	case !id.IsCluster():
		return nil, fmt.Errorf("identity %d is outside the cluster range %d-%d", id, identity.MinCluster, identity.MaxCluster)
	case len(obj.Spec.Labels) == 0:
		return nil, errors.New("empty label set")
	}
	joined := strings.Join(obj.Spec.Labels, ";")
	ls, err := labels.Parse(joined)
	switch {
	case err != nil:
		return nil, fmt.Errorf("labels %.80q are not a label set: %w", joined, err)
	case !slices.Equal(ls.Strings(), obj.Spec.Labels):
		return nil, fmt.Errorf("labels %.80q not in canonical form (sorted, each once: %.80q)", joined, ls.String())
	}
	return &Identity{ID: id, Labels: ls, Kind: KindCluster, Source: SourceCRD}, nil
}

// leanIdentity is the informer's transform: it keeps of an object only
// what the watch reads, so the informer's store holds little.
func leanIdentity(id *k8sapi.CelliumIdentity) *k8sapi.CelliumIdentity {
	return &k8sapi.CelliumIdentity{
		ObjectMeta: metav1.ObjectMeta{Name: id.Name, ResourceVersion: id.ResourceVersion, UID: id.UID},
		Spec:       id.Spec,
	}
}

// watchCRD keeps the table's cluster identities equal to the accepted
// CelliumIdentity objects, once the CRDs are established. While the watch
// fails (the API server gone, access revoked) its health is Degraded with
// the error and the backend's state says so, until it is back.
func (a *Allocator) watchCRD(ctx context.Context, health cell.Health) error {
	select {
	case <-a.crd.registered:
	case <-ctx.Done():
		return nil
	}
	listed := func() {
		txn := a.db.WriteTxn(a.tbl)
		a.crd.listed(txn)
		txn.Commit()
		a.crd.refused.Listed()
	}
	return k8sapi.Inform(ctx, a.crd.client.IdentityListWatch(), &k8sapi.CelliumIdentity{}, leanIdentity, a.applyCRD, listed, func(err error) {
		if err != nil {
			a.setBackendState(stateWatchFailing)
			health.Degraded("Watching CelliumIdentity objects", err)
			return
		}
		a.setBackendState(stateWatching)
		health.OK("CelliumIdentity objects listed and watched")
	})
}

// applyCRD writes an identity object's change into the table. A bad
// object is refused and named in health; it changes no row (a row of a
// number whose object turned bad goes, as if deleted).
func (a *Allocator) applyCRD(o *k8sapi.CelliumIdentity, deleted bool) {
	row, err := parseCRDIdentity(o)
	if deleted {
		err = nil
	}
	a.crd.refused.Note(o.Name, err)
	var writeBack *usedIdentity
	defer func() {
		if writeBack != nil {
			a.writeBacks.add([]*usedIdentity{writeBack})
		}
	}()
	a.mu.Lock()
	defer a.mu.Unlock()
	txn := a.db.WriteTxn(a.tbl)
	defer txn.Commit()
	if row == nil || deleted {
		n, perr := strconv.ParseUint(o.Name, 10, 32)
		id := identity.NumericIdentity(n)
		if perr != nil || !id.IsCluster() {
			return
		}
		if u := a.usedByID(id); u != nil && u.kind == KindCluster {
			// In use here: the row stays, and a deleted object is
			// written back.
			if deleted {
				writeBack = u
			}
			return
		}
		if old, _, found := a.tbl.Get(txn, ByID.Query(id)); found {
			a.tbl.Delete(txn, old)
		}
		return
	}
	if u := a.used[row.Labels.String()]; u != nil && u.id == row.ID {
		row.Refs = int(u.refs.Load())
	}
	a.tbl.Insert(txn, row)
}
