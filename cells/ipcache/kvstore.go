package ipcache

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"strings"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"

	"github.com/cellium/cellium/cells/endpointmanager"
	"github.com/cellium/cellium/cells/kvstore"
	"github.com/cellium/cellium/cells/nodes"
	"github.com/cellium/cellium/pkg/identity"
)

// ipPrefix is where nodes publish their pods' addresses (docs/kvstore.md).
const ipPrefix = "state/ip/v1/"

// IPValue is the value of an ip/v1/<ip> key.
type IPValue struct {
	IP        netip.Addr               `json:"ip"`
	HostIP    netip.Addr               `json:"hostIP,omitzero"`
	Identity  identity.NumericIdentity `json:"identity"`
	Namespace string                   `json:"namespace,omitempty"`
	PodName   string                   `json:"podName,omitempty"`
}

// parseIPKey reads an ip/v1 key and its value; the error names what is wrong.
func parseIPKey(key string, value []byte) (netip.Prefix, Claim, error) {
	addr, err := netip.ParseAddr(strings.TrimPrefix(key, ipPrefix))
	if err != nil {
		return netip.Prefix{}, Claim{}, fmt.Errorf("key %s: not an address", key)
	}
	var v IPValue
	dec := json.NewDecoder(strings.NewReader(string(value)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&v); err != nil {
		return netip.Prefix{}, Claim{}, fmt.Errorf("key %s: value %q: %w", key, value, err)
	}
	if v.IP != addr {
		return netip.Prefix{}, Claim{}, fmt.Errorf("key %s: value names another address, %s", key, v.IP)
	}
	return hostPrefix(addr), Claim{Source: SourceKVStore, Identity: v.Identity, HostIP: v.HostIP, Namespace: v.Namespace, PodName: v.PodName}, nil
}

// watchKVStore keeps the kvstore's claims equal to the ip/v1 keys. A
// delete of a key this node publishes (its endpoint still has the address)
// asks the publisher to write it back.
func (c *ipCache) watchKVStore(ctx context.Context, health cell.Health, listed func(statedb.WriteTxn)) error {
	claimed := map[string]netip.Prefix{}
	for batch := range kvstore.Batches(c.kv.Watch(ctx, ipPrefix), 1024) {
		txn := c.db.WriteTxn(c.tbl)
		for _, ev := range batch {
			switch ev.Kind {
			case kvstore.EventListed:
				if listed != nil {
					listed(txn)
					listed = nil
				}
				health.OK(fmt.Sprintf("Following %d remote addresses", len(claimed)))
			case kvstore.EventUpsert:
				p, cl, err := parseIPKey(ev.Key, ev.Value)
				if err != nil {
					c.log.Warn("Ignoring an invalid ipcache key from the kvstore", "error", err)
					break
				}
				claimed[ev.Key] = p
				c.claim(txn, p, cl)
			case kvstore.EventDelete:
				if p, ok := claimed[ev.Key]; ok {
					delete(claimed, ev.Key)
					c.unclaim(txn, p, SourceKVStore)
				}
				c.writeBackIfLocal(txn, ev.Key)
			}
		}
		txn.Commit()
	}
	return nil
}

// writeBackIfLocal asks the publisher to write back the deleted key of an
// address a local endpoint still has.
func (c *ipCache) writeBackIfLocal(txn statedb.ReadTxn, key string) {
	addr, err := netip.ParseAddr(strings.TrimPrefix(key, ipPrefix))
	if err != nil {
		return
	}
	if e, _, found := c.tbl.Get(txn, ByPrefix.Query(hostPrefix(addr))); found && e.Winner().Source == SourceLocal {
		c.log.Warn("A local endpoint's address was deleted from the kvstore; writing it back", "key", key)
		select {
		case c.republish <- struct{}{}:
		default:
		}
	}
}

// publish writes the addresses of this node's endpoints to ip/v1 (leased)
// and deletes those of endpoints that went: on each change of the
// endpoints table, the keys whose value changed; on a request of the
// watcher (a key of ours was deleted), all of them; after a failure, what
// failed, a second later. A lost lease is the kvstore's to write again.
func (c *ipCache) publish(ctx context.Context, health cell.Health, eps statedb.Table[*endpointmanager.Endpoint], nodeTbl statedb.Table[*nodes.Node]) error {
	published := map[string][]byte{}
	resync := false
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
			for _, ip := range ep.IPs() {
				v, _ := json.Marshal(IPValue{IP: ip, HostIP: hostIP, Identity: ep.Identity, Namespace: ep.PodNamespace, PodName: ep.PodName})
				want[ipPrefix+ip.String()] = v
			}
		}
		var failed error
		for key, v := range want {
			if !resync && bytes.Equal(published[key], v) {
				continue
			}
			wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			_, err := c.kv.UpdateIfDifferent(wctx, key, v, kvstore.Leased())
			cancel()
			if err != nil {
				failed = err
				delete(published, key)
				continue
			}
			published[key] = v
		}
		for key := range published {
			if _, ok := want[key]; ok {
				continue
			}
			wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			err := c.kv.Delete(wctx, key)
			cancel()
			if err != nil {
				failed = err
				continue
			}
			delete(published, key)
		}
		resync = false
		var retry <-chan time.Time
		if failed != nil {
			health.Degraded("Publishing local addresses to the kvstore", failed)
			retry = time.After(time.Second)
		} else {
			health.OK(fmt.Sprintf("Published %d local addresses", len(published)))
		}
		select {
		case <-watch:
		case <-nodesChanged:
		case <-retry:
		case <-c.republish:
			resync = true
		case <-ctx.Done():
			return nil
		}
	}
}
