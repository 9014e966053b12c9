package nodes

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/cellium/cellium/cells/internal/kvsync"
)

// keyPrefix is where agents publish their nodes (docs/kvstore.md).
const keyPrefix = "state/nodes/v1/"

// Bounds of a nodes/v1 key: its value is well under 1 KiB, one address per
// family of each type, a pod CIDR or two per family, one health address
// per family.
const (
	maxNodeValue = 8 << 10
	maxAddresses = 8
	maxPodCIDRs  = 8
	maxHealthIPs = 4
)

// Value is the value of a nodes/v1/<name> key.
type Value struct {
	Name string `json:"name"`
	Spec
}

// parseKey reads a nodes/v1 key and its value; the error says what is
// wrong.
func parseKey(key string, value []byte) (string, Spec, error) {
	name := strings.TrimPrefix(key, keyPrefix)
	if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
		return "", Spec{}, fmt.Errorf("not a node name: %s", strings.Join(errs, "; "))
	}
	var v Value
	dec := json.NewDecoder(strings.NewReader(string(value)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&v); err != nil {
		return "", Spec{}, fmt.Errorf("value %.80q: %w", value, err)
	}
	if v.Name != name {
		return "", Spec{}, fmt.Errorf("value names another node, %q", v.Name)
	}
	if len(v.Addresses) > maxAddresses || len(v.PodCIDRs) > maxPodCIDRs || len(v.HealthIPs) > maxHealthIPs {
		return "", Spec{}, fmt.Errorf("%d addresses, %d pod CIDRs, %d health IPs: want at most %d, %d and %d",
			len(v.Addresses), len(v.PodCIDRs), len(v.HealthIPs), maxAddresses, maxPodCIDRs, maxHealthIPs)
	}
	for i, a := range v.Addresses {
		if !unicast(a.IP) || (a.Type != InternalIP && a.Type != ExternalIP) {
			return "", Spec{}, fmt.Errorf("invalid address %+v: want {type: InternalIP or ExternalIP, ip: a unicast address without zone}", a)
		}
		if slices.Contains(v.Addresses[:i], a) {
			return "", Spec{}, fmt.Errorf("address %s twice", a.IP)
		}
	}
	for i, p := range v.PodCIDRs {
		if !p.IsValid() || p != p.Masked() || p.Addr().Is4In6() {
			return "", Spec{}, fmt.Errorf("invalid pod CIDR %s", p)
		}
		if slices.Contains(v.PodCIDRs[:i], p) {
			return "", Spec{}, fmt.Errorf("pod CIDR %s twice", p)
		}
	}
	for i, ip := range v.HealthIPs {
		if !unicast(ip) {
			return "", Spec{}, fmt.Errorf("invalid health IP %s: want a unicast address without zone", ip)
		}
		if slices.Contains(v.HealthIPs[:i], ip) {
			return "", Spec{}, fmt.Errorf("health IP %s twice", ip)
		}
	}
	return name, v.Spec, nil
}

// unicast: an address a node or its health endpoint can have, in one
// form only.
func unicast(a netip.Addr) bool {
	return a.IsValid() && a.Zone() == "" && !a.Is4In6() && a.IsGlobalUnicast()
}

// nodeKey is a nodes/v1 key as the follower hands it on.
type nodeKey struct {
	name string
	spec Spec
}

// kvstoreNodes follows the nodes/v1 keys and publishes this node's.
type kvstoreNodes struct {
	nodes *nodes
	// owner writes this node's key and puts it back.
	owner *kvsync.Owner
}

// watch keeps the kvstore's claims equal to the accepted nodes/v1 keys of
// other nodes: a refused key takes back what it said before.
func (k *kvstoreNodes) watch(ctx context.Context, health cell.Health, listed func(statedb.WriteTxn)) error {
	rule := kvsync.Rule[nodeKey]{
		Prefix: keyPrefix, MaxValue: maxNodeValue, What: "node key",
		Parse: func(key string, value []byte) (nodeKey, error) {
			name, spec, err := parseKey(key, value)
			return nodeKey{name, spec}, err
		},
	}
	return kvsync.Follow(ctx, k.nodes.kv, k.nodes.log, health, rule, k.owner, func(changes []kvsync.Change[nodeKey], done bool) {
		for _, ch := range changes {
			name := strings.TrimPrefix(ch.Key, keyPrefix)
			if name == k.nodes.name {
				// This node's key is what it says of itself, not something
				// to learn from: a value written over it must not fill
				// what the local description leaves empty (health IPs).
				// The owner puts it back.
				continue
			}
			if ch.Deleted {
				k.nodes.claims.setCreated(name, 0)
				k.nodes.claims.set(name, SourceKVStore, Spec{}, false)
				continue
			}
			k.nodes.claims.setCreated(name, ch.CreateRevision)
			k.nodes.claims.set(name, SourceKVStore, ch.Value.spec, true)
		}
		if done && listed != nil {
			k.nodes.claims.listed(listed)
			listed = nil
		}
	})
}

// publish gives the owner this node's key whenever the local node
// changes; the owner writes it (leased) and puts it back when someone
// else changes or deletes it.
func (k *kvstoreNodes) publish(ctx context.Context, _ cell.Health) error {
	for {
		txn := k.nodes.db.ReadTxn()
		local, _, watch, found := k.nodes.tbl.GetWatch(txn, ByName.Query(k.nodes.name))
		if found && local.Local {
			v, _ := json.Marshal(Value{Name: local.Name, Spec: local.Spec})
			k.owner.Want(map[string][]byte{keyPrefix + local.Name: v})
		}
		select {
		case <-watch:
		case <-ctx.Done():
			return nil
		}
	}
}
