package k8sendpoints

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cellium/cellium/cells/nodes"
	"github.com/cellium/cellium/pkg/identity"
	"github.com/cellium/cellium/pkg/k8sapi"
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

// parse checks an object of another node: its identity, its addresses
// (unicast, canonical, none a node's address or in another node's pod
// CIDR) and its node's address.
func parse(ep *k8sapi.CelliumEndpoint, txn statedb.ReadTxn, nodeTbl statedb.Table[*nodes.Node]) (*Endpoint, error) {
	st := ep.Status
	id := identity.NumericIdentity(st.Identity)
	if !publishable(id) {
		return nil, fmt.Errorf("identity %d: a pod may have a cluster identity (%d-%d), init or health", st.Identity, identity.MinCluster, identity.MaxCluster)
	}
	if st.NodeName == "" {
		return nil, errors.New("no nodeName")
	}
	row := &Endpoint{Namespace: ep.Namespace, Name: ep.Name, Node: st.NodeName, Identity: id,
		NamedPorts: st.NamedPorts, Created: ep.CreationTimestamp.Time}
	if st.NodeIP != "" {
		ip, err := netip.ParseAddr(st.NodeIP)
		if err != nil || ip.Zone() != "" || !ip.IsGlobalUnicast() {
			return nil, fmt.Errorf("nodeIP %q: want a unicast address", st.NodeIP)
		}
		row.NodeIP = ip.Unmap()
	}
	for _, s := range st.Addresses {
		a, err := netip.ParseAddr(s)
		switch {
		case err != nil || a.Zone() != "" || a.Is4In6() || a.String() != s:
			return nil, fmt.Errorf("address %q: want an address in canonical form", s)
		case !a.IsGlobalUnicast():
			return nil, fmt.Errorf("address %s: not a unicast address", a)
		}
		for n := range nodeTbl.All(txn) {
			if slices.ContainsFunc(n.Addresses, func(na nodes.Address) bool { return na.IP.Unmap() == a }) {
				return nil, fmt.Errorf("address %s is an address of node %s, not a pod's", a, n.Name)
			}
			if n.Name != st.NodeName && slices.ContainsFunc(n.PodCIDRs, func(p netip.Prefix) bool { return p.Contains(a) }) {
				return nil, fmt.Errorf("address %s is in the pod CIDR of node %s, not of its node %s", a, n.Name, st.NodeName)
			}
		}
		row.Addresses = append(row.Addresses, a)
	}
	return row, nil
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
	apply := func(ep *k8sapi.CelliumEndpoint, deleted bool) { s.apply(ep, deleted, w) }
	onListed := func() {
		txn := s.db.WriteTxn(s.tbl)
		listed(txn)
		txn.Commit()
		w.listed()
		s.refused.Listed()
	}
	return k8sapi.Inform(ctx, s.client.EndpointListWatch(""), &k8sapi.CelliumEndpoint{}, leanEndpoint, apply, onListed, func(err error) {
		if err != nil {
			health.Degraded("Watching CelliumEndpoint objects", err)
			return
		}
		health.OK("CelliumEndpoint objects listed and watched")
	})
}

// apply writes one object's change into the table; a bad object is named
// in health and takes its earlier row away.
func (s *syncer) apply(ep *k8sapi.CelliumEndpoint, deleted bool, w *writer) {
	key := ep.Namespace + "/" + ep.Name
	if ep.Labels[k8sapi.LabelNode] == s.node || ep.Status.NodeName == s.node {
		w.observe(ep, deleted)
	}
	txn := s.db.WriteTxn(s.tbl)
	defer txn.Commit()
	var row *Endpoint
	var err error
	if !deleted && ep.Status.NodeName != s.node {
		row, err = parse(ep, txn, s.nodes)
	}
	s.refused.Note(key, err)
	if row != nil {
		s.tbl.Insert(txn, row)
		return
	}
	if old, _, found := s.tbl.Get(txn, ByName.Query(key)); found {
		s.tbl.Delete(txn, old)
	}
}
