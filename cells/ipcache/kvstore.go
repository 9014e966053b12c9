package ipcache

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"strings"

	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"

	"github.com/cellium/cellium/cells/endpointmanager"
	"github.com/cellium/cellium/cells/internal/kvsync"
	"github.com/cellium/cellium/cells/nodes"
	"github.com/cellium/cellium/pkg/identity"
)

// ipPrefix is where nodes publish their pods' addresses (docs/kvstore.md).
const ipPrefix = "state/ip/v1/"

// Bounds of an ip/v1 key's value: its JSON is about 150 bytes.
const (
	maxIPValue = 1024
	maxPodName = 253
)

// IPValue is the value of an ip/v1/<ip> key.
type IPValue struct {
	IP        netip.Addr               `json:"ip"`
	HostIP    netip.Addr               `json:"hostIP,omitzero"`
	Identity  identity.NumericIdentity `json:"identity"`
	Namespace string                   `json:"namespace,omitempty"`
	PodName   string                   `json:"podName,omitempty"`
}

// publishable says whether a pod's identity may be published for other
// nodes: a cluster identity, or init and health, the reserved ones a pod
// of another node can have. The others (host, world, remote-node, ...)
// would make another node's address pose as something it is not, and a
// node-local number means nothing elsewhere.
func publishable(id identity.NumericIdentity) bool {
	return id.IsCluster() || id == identity.Init || id == identity.Health
}

// parseIPKey reads an ip/v1 key and its value; the error says what is
// wrong. The key must be the address in its one canonical form (no
// IPv4-mapped IPv6 alias, no zone), so that one address has one key.
func parseIPKey(key string, value []byte) (netip.Prefix, Claim, error) {
	name := strings.TrimPrefix(key, ipPrefix)
	addr, err := netip.ParseAddr(name)
	switch {
	case err != nil:
		return netip.Prefix{}, Claim{}, fmt.Errorf("not an address")
	case addr.Zone() != "":
		return netip.Prefix{}, Claim{}, fmt.Errorf("an address with a zone")
	case addr.Is4In6():
		return netip.Prefix{}, Claim{}, fmt.Errorf("an IPv4-mapped IPv6 address; the key of %s is %s%s", addr.Unmap(), ipPrefix, addr.Unmap())
	case addr.String() != name:
		return netip.Prefix{}, Claim{}, fmt.Errorf("not the canonical form of %s", addr)
	case !addr.IsGlobalUnicast():
		return netip.Prefix{}, Claim{}, fmt.Errorf("not a unicast address")
	}
	var v IPValue
	dec := json.NewDecoder(strings.NewReader(string(value)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&v); err != nil {
		return netip.Prefix{}, Claim{}, fmt.Errorf("value %.80q: %w", value, err)
	}
	switch {
	case v.IP != addr:
		return netip.Prefix{}, Claim{}, fmt.Errorf("value names another address, %s", v.IP)
	case !publishable(v.Identity):
		return netip.Prefix{}, Claim{}, fmt.Errorf("identity %s: a pod's address may have a cluster identity (%d-%d), init or health", v.Identity, identity.MinCluster, identity.MaxCluster)
	case v.HostIP.IsValid() && (v.HostIP.Zone() != "" || v.HostIP.Is4In6() || !v.HostIP.IsGlobalUnicast()):
		return netip.Prefix{}, Claim{}, fmt.Errorf("hostIP %s: want a unicast address without zone", v.HostIP)
	case len(v.Namespace) > maxPodName || len(v.PodName) > maxPodName:
		return netip.Prefix{}, Claim{}, fmt.Errorf("namespace or pod name longer than %d bytes", maxPodName)
	}
	return hostPrefix(addr), Claim{Source: SourceKVStore, Identity: v.Identity, HostIP: v.HostIP, Namespace: v.Namespace, PodName: v.PodName}, nil
}

// ipKey is an ip/v1 key as the follower hands it on.
type ipKey struct {
	prefix netip.Prefix
	claim  Claim
}

// nodeAddrs are the addresses of the nodes table, kept as of a revision of
// it: an ip/v1 key may not claim a node's address.
type nodeAddrs struct {
	tbl   statedb.Table[*nodes.Node]
	rev   statedb.Revision
	addrs map[netip.Addr]string
}

func (n *nodeAddrs) owner(txn statedb.ReadTxn, a netip.Addr) (string, bool) {
	if rev := n.tbl.Revision(txn); n.addrs == nil || rev != n.rev {
		n.rev, n.addrs = rev, map[netip.Addr]string{}
		for node := range n.tbl.All(txn) {
			for _, na := range node.Addresses {
				n.addrs[na.IP.Unmap()] = node.Name
			}
		}
	}
	node, ok := n.addrs[a]
	return node, ok
}

// watchKVStore keeps the kvstore's claims equal to the accepted ip/v1
// keys; a refused key (see parseIPKey, and the address of a node) takes
// its earlier claim away. The owner puts back this node's keys when
// someone else changes them.
func (c *ipCache) watchKVStore(ctx context.Context, health cell.Health, nodeTbl statedb.Table[*nodes.Node], listed func(statedb.WriteTxn)) error {
	addrs := &nodeAddrs{tbl: nodeTbl}
	rule := kvsync.Rule[ipKey]{
		Prefix: ipPrefix, MaxValue: maxIPValue, What: "ipcache key",
		Parse: func(key string, value []byte) (ipKey, error) {
			p, cl, err := parseIPKey(key, value)
			if err != nil {
				return ipKey{}, err
			}
			if node, ok := addrs.owner(c.db.ReadTxn(), p.Addr()); ok {
				return ipKey{}, fmt.Errorf("%s is an address of node %s, not a pod's", p.Addr(), node)
			}
			return ipKey{p, cl}, nil
		},
	}
	claimed := map[string]netip.Prefix{}
	return kvsync.Follow(ctx, c.kv, c.log, health, rule, c.owner, func(changes []kvsync.Change[ipKey], done bool) {
		txn := c.db.WriteTxn(c.tbl)
		for _, ch := range changes {
			if ch.Deleted {
				c.unclaim(txn, claimed[ch.Key], SourceKVStore)
				delete(claimed, ch.Key)
				continue
			}
			claimed[ch.Key] = ch.Value.prefix
			c.claim(txn, ch.Value.prefix, ch.Value.claim)
		}
		if done && listed != nil {
			listed(txn)
			listed = nil
		}
		txn.Commit()
	})
}

// publish gives the owner the addresses of this node's endpoints as ip/v1
// keys, again on each change of the endpoints or of this node's address;
// the owner writes them (leased), deletes those of endpoints that went,
// and puts back what someone else changes.
func (c *ipCache) publish(ctx context.Context, _ cell.Health, eps statedb.Table[*endpointmanager.Endpoint], nodeTbl statedb.Table[*nodes.Node]) error {
	for {
		txn := c.db.ReadTxn()
		all, watch := eps.AllWatch(txn)
		// The node's address, for other nodes to reach the pods through.
		_, nodesChanged := nodeTbl.AllWatch(txn)
		var hostIP netip.Addr
		if local, ok := nodes.LocalNode(txn, nodeTbl); ok {
			hostIP = local.PrimaryIP()
		}
		want := map[string][]byte{}
		for ep := range all {
			id := ep.Identity
			if !publishable(id) {
				id = identity.Init
			}
			for _, ip := range ep.IPs() {
				v, _ := json.Marshal(IPValue{IP: ip, HostIP: hostIP, Identity: id, Namespace: ep.PodNamespace, PodName: ep.PodName})
				want[ipPrefix+ip.String()] = v
			}
		}
		c.owner.Want(want)
		select {
		case <-watch:
		case <-nodesChanged:
		case <-ctx.Done():
			return nil
		}
	}
}
