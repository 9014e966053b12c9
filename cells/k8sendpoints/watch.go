package k8sendpoints

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	idcell "github.com/cellium/cellium/cells/identity"
	"github.com/cellium/cellium/cells/internal/tables"
	"github.com/cellium/cellium/cells/nodes"
	"github.com/cellium/cellium/pkg/identity"
	"github.com/cellium/cellium/pkg/k8sapi"
	"github.com/cellium/cellium/pkg/labels"
)

// leanEndpoint is the informer's transform: of an object it keeps what the
// watch and the writer read, so the informer's store holds little.
func leanEndpoint(ep *k8sapi.CelliumEndpoint) *k8sapi.CelliumEndpoint {
	meta := metav1.ObjectMeta{Name: ep.Name, Namespace: ep.Namespace, ResourceVersion: ep.ResourceVersion, UID: ep.UID,
		CreationTimestamp: ep.CreationTimestamp, OwnerReferences: ep.OwnerReferences}
	if node, ok := ep.Labels[k8sapi.LabelNode]; ok {
		meta.Labels = map[string]string{k8sapi.LabelNode: node}
	}
	return &k8sapi.CelliumEndpoint{ObjectMeta: meta, Status: ep.Status}
}

// publishable says whether a pod of another node may have identity id: a
// cluster identity, or init or health. The others (host, world, ...) would
// make a pod pose as something it is not, and a node-local number means
// nothing here.
func publishable(id identity.NumericIdentity) bool {
	return id.IsCluster() || id == identity.Init || id == identity.Health
}

// pendingGrace is how long an object of another node may name an identity
// or a node this agent does not know yet before it is refused (logged,
// counted, named in health). Objects usually arrive before their identity
// (a new label set's CelliumIdentity) or their node's pod CIDRs, on every
// node: until this has passed such an object is pending, without a row, a
// warning or a count. The other refusals (an address outside its node's
// pod CIDRs, an identity of another namespace) are immediate. A variable
// for tests only.
var pendingGrace = time.Minute

// refusal is why an object of another node is refused: reason is the
// label it is counted under (identity, namespace, node, address). A
// pending one (its identity or node not known) may pass later, when the
// identity or node is known.
type refusal struct {
	reason  string
	err     error
	pending bool
}

func (r *refusal) Error() string { return r.err.Error() }

func refuse(reason, format string, args ...any) error {
	return &refusal{reason: reason, err: fmt.Errorf(format, args...)}
}

// notKnown is the refusal of an object whose identity or node is not
// known (yet).
func notKnown(reason, format string, args ...any) error {
	return &refusal{reason: reason, err: fmt.Errorf(format, args...), pending: true}
}

// parse checks an object of another node: its identity (a cluster one
// must be known, and of the object's namespace), its node (known), its
// addresses (unicast, canonical, in its node's pod CIDRs and none a
// node's address) and its node's address. A writer of the objects, or a
// node's agent, could otherwise give any address (8.8.8.8, another node's
// pod) any identity of any namespace in every node's ipcache.
func parse(ep *k8sapi.CelliumEndpoint, txn statedb.ReadTxn, nodeTbl statedb.Table[*nodes.Node], idTbl statedb.Table[*idcell.Identity]) (*Endpoint, error) {
	st := ep.Status
	id := identity.NumericIdentity(st.Identity)
	if !publishable(id) {
		return nil, refuse("identity", "identity %d: a pod may have a cluster identity (%d-%d), init or health", st.Identity, identity.MinCluster, identity.MaxCluster)
	}
	if id.IsCluster() {
		ident, _, found := idTbl.Get(txn, idcell.ByID.Query(id))
		if !found {
			return nil, notKnown("identity", "identity %d is not known (no CelliumIdentity)", id)
		}
		if ns, _ := ident.Labels.Get(labels.SourceK8s, idcell.NamespaceLabel); ns != ep.Namespace {
			return nil, refuse("namespace", "identity %d is of namespace %q, not the object's namespace %q", id, ns, ep.Namespace)
		}
	}
	if st.NodeName == "" {
		return nil, refuse("node", "no nodeName")
	}
	node, _, found := nodeTbl.Get(txn, nodes.ByName.Query(st.NodeName))
	if !found {
		return nil, notKnown("node", "node %s is not known", st.NodeName)
	}
	row := &Endpoint{Namespace: ep.Namespace, Name: ep.Name, Node: st.NodeName, Identity: id,
		NamedPorts: st.NamedPorts, Created: ep.CreationTimestamp.Time}
	if st.NodeIP != "" {
		ip, err := netip.ParseAddr(st.NodeIP)
		if err != nil || ip.Zone() != "" || !ip.IsGlobalUnicast() {
			return nil, refuse("node", "nodeIP %q: want a unicast address", st.NodeIP)
		}
		row.NodeIP = ip.Unmap()
	}
	for _, s := range st.Addresses {
		a, err := netip.ParseAddr(s)
		switch {
		case err != nil || a.Zone() != "" || a.Is4In6() || a.String() != s:
			return nil, refuse("address", "address %q: want an address in canonical form", s)
		case !a.IsGlobalUnicast():
			return nil, refuse("address", "address %s: not a unicast address", a)
		case !slices.ContainsFunc(node.PodCIDRs, func(p netip.Prefix) bool { return p.Contains(a) }):
			return nil, refuse("address", "address %s is not in the pod CIDRs of its node %s (%s)", a, node.Name, prefixes(node.PodCIDRs))
		}
		for n := range nodeTbl.All(txn) {
			if slices.ContainsFunc(n.Addresses, func(na nodes.Address) bool { return na.IP.Unmap() == a }) {
				return nil, refuse("address", "address %s is an address of node %s, not a pod's", a, n.Name)
			}
		}
		row.Addresses = append(row.Addresses, a)
	}
	return row, nil
}

func prefixes(ps []netip.Prefix) string {
	if len(ps) == 0 {
		return "none"
	}
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = p.String()
	}
	return strings.Join(out, ", ")
}

// watch keeps the table equal to the valid CelliumEndpoint objects of the
// other nodes, and hands this node's to the writer. While the watch fails
// its health is Degraded with the error, until it is back.
func (s *syncer) watch(ctx context.Context, health cell.Health, listed func(statedb.WriteTxn), w *writer) error {
	select {
	case <-s.registered:
	case <-ctx.Done():
		return nil
	}
	// Objects are checked against the identities: before those are listed
	// every object would be pending for a while. Not against the nodes
	// table's initialization: with --kvstore=etcd it waits for etcd's
	// listing, and this node's own objects (the writer waits for the
	// listing here) must not wait for etcd. An object whose node is not
	// known yet is pending until the node is (recheck).
	if tables.WaitInitialized(ctx, s.db, s.ids) != nil {
		return nil
	}
	ctx, cancel := context.WithCancel(ctx)
	objectsListed := make(chan struct{})
	initDone := make(chan struct{})
	go func() {
		defer close(initDone)
		s.initialized(ctx, objectsListed, listed)
	}()
	defer func() {
		cancel()
		<-initDone
	}()
	apply := func(ep *k8sapi.CelliumEndpoint, deleted bool) { s.apply(ep, deleted, w) }
	onListed := func() {
		w.listed()
		s.refused.Listed()
		close(objectsListed)
	}
	return k8sapi.Inform(ctx, s.client.EndpointListWatch(""), &k8sapi.CelliumEndpoint{}, leanEndpoint, apply, onListed, func(err error) {
		if err != nil {
			health.Degraded("Watching CelliumEndpoint objects", err)
			return
		}
		health.OK("CelliumEndpoint objects listed and watched")
	})
}

// initialized marks the table initialized once the objects are listed and
// the nodes table is initialized, having checked every object of other
// nodes again in the same transaction: the ipcache prunes its map then, and
// must not miss an object that was pending only for its node's listing.
func (s *syncer) initialized(ctx context.Context, objectsListed <-chan struct{}, listed func(statedb.WriteTxn)) {
	select {
	case <-objectsListed:
	case <-ctx.Done():
		return
	}
	if tables.WaitInitialized(ctx, s.db, s.nodes) != nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	txn := s.db.WriteTxn(s.tbl)
	for key, ep := range s.others {
		s.check(txn, key, ep)
	}
	listed(txn)
	txn.Commit()
}

// apply writes one object's change into the table; a bad object is named
// in health and takes its earlier row away. The objects of other nodes are
// kept (others), to be checked again when their node or identity changes.
func (s *syncer) apply(ep *k8sapi.CelliumEndpoint, deleted bool, w *writer) {
	key := ep.Namespace + "/" + ep.Name
	if ep.Labels[k8sapi.LabelNode] == s.node || ep.Status.NodeName == s.node {
		w.observe(ep, deleted)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !deleted && ep.Status.NodeName != s.node {
		s.others[key] = ep
	} else {
		delete(s.others, key)
		ep = nil
	}
	txn := s.db.WriteTxn(s.tbl)
	s.check(txn, key, ep)
	txn.Commit()
}

// check writes the row of the object of another node at key, ep, or with
// ep nil takes its row away. s.mu is held.
func (s *syncer) check(txn statedb.WriteTxn, key string, ep *k8sapi.CelliumEndpoint) {
	var row *Endpoint
	var err error
	if ep != nil {
		row, err = parse(ep, txn, s.nodes, s.ids)
	}
	if r, ok := err.(*refusal); ok && r.pending {
		now := time.Now()
		p, was := s.pending[key]
		if !was {
			p = &pendingObject{since: now}
			s.pending[key] = p
			select {
			case s.pendingAdded <- struct{}{}:
			default:
			}
		}
		if waited := now.Sub(p.since); waited < pendingGrace {
			s.log.Debug("CelliumEndpoint pending", "name", key, "reason", err)
			err = nil
		} else {
			p.refused = true
			err = &refusal{reason: r.reason, err: fmt.Errorf("%w (waited %s)", r.err, pendingGrace)}
		}
	} else {
		delete(s.pending, key)
	}
	if s.refused.Note(key, err) {
		reason := "other"
		if r, ok := err.(*refusal); ok {
			reason = r.reason
		}
		s.metrics.refused.WithLabelValues(reason).Inc()
	}
	if row != nil {
		s.tbl.Insert(txn, row)
		return
	}
	if old, _, found := s.tbl.Get(txn, ByName.Query(key)); found {
		s.tbl.Delete(txn, old)
	}
}

// recheck is the job that checks the objects of other nodes again when
// their node (its pod CIDRs, its addresses) or their identity changes: an
// object refused because its node or identity was not known yet is
// accepted once it is, and one whose node lost the pod CIDR holding its
// address goes.
func (s *syncer) recheck(ctx context.Context, health cell.Health) error {
	wtxn := s.db.WriteTxn(s.nodes, s.ids)
	nodeChanges, err := s.nodes.Changes(wtxn)
	if err != nil {
		wtxn.Abort()
		return fmt.Errorf("follow table %s: %w", s.nodes.Name(), err)
	}
	defer nodeChanges.Close()
	idChanges, err := s.ids.Changes(wtxn)
	if err != nil {
		wtxn.Abort()
		return fmt.Errorf("follow table %s: %w", s.ids.Name(), err)
	}
	defer idChanges.Close()
	wtxn.Commit()
	health.OK("Checking objects again on node and identity changes")
	var grace *time.Timer
	defer func() {
		if grace != nil {
			grace.Stop()
		}
	}()
	for {
		rtxn := s.db.ReadTxn()
		nodeSeq, nodeWatch := nodeChanges.Next(rtxn)
		idSeq, idWatch := idChanges.Next(rtxn)
		nodesChanged := false
		for range nodeSeq {
			nodesChanged = true
		}
		changedIDs := map[identity.NumericIdentity]bool{}
		for c := range idSeq {
			changedIDs[c.Object.ID] = true
		}
		// Any node's change checks every object again: an address must
		// be in its node's pod CIDRs and no node's address. Nodes change
		// seldom; identities come and go, and check only their objects.
		if nodesChanged || len(changedIDs) > 0 {
			s.mu.Lock()
			txn := s.db.WriteTxn(s.tbl)
			for key, ep := range s.others {
				if nodesChanged || changedIDs[identity.NumericIdentity(ep.Status.Identity)] {
					s.check(txn, key, ep)
				}
			}
			txn.Commit()
			s.mu.Unlock()
		}
		// The objects pending for longer than pendingGrace are checked
		// again, to be refused; the timer is at the earliest deadline.
		var graceC <-chan time.Time
		if grace != nil {
			grace.Stop()
		}
		if next, ok := s.graceOver(); ok {
			grace = time.NewTimer(time.Until(next))
			graceC = grace.C
		}
		select {
		case <-ctx.Done():
			return nil
		case <-nodeWatch:
		case <-idWatch:
		case <-s.pendingAdded:
		case <-graceC:
		}
	}
}

// graceOver checks again the objects pending for pendingGrace or longer
// (refusing them) and says when the next pending one's grace is over.
func (s *syncer) graceOver() (next time.Time, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	var over []string
	for key, p := range s.pending {
		switch deadline := p.since.Add(pendingGrace); {
		case p.refused:
		case !deadline.After(now):
			over = append(over, key)
		case !ok || deadline.Before(next):
			next, ok = deadline, true
		}
	}
	if len(over) > 0 {
		txn := s.db.WriteTxn(s.tbl)
		for _, key := range over {
			if ep := s.others[key]; ep != nil {
				s.check(txn, key, ep)
			} else {
				delete(s.pending, key)
			}
		}
		txn.Commit()
	}
	return next, ok
}
