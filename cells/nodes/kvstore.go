package nodes

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"

	"github.com/cellium/cellium/cells/kvstore"
)

// keyPrefix is where agents publish their nodes (docs/kvstore.md).
const keyPrefix = "state/nodes/v1/"

// Value is the value of a nodes/v1/<name> key.
type Value struct {
	Name string `json:"name"`
	Spec
}

// parseKey reads a nodes/v1 key and its value; the error names what is
// wrong.
func parseKey(key string, value []byte) (string, Spec, error) {
	name := strings.TrimPrefix(key, keyPrefix)
	var v Value
	dec := json.NewDecoder(strings.NewReader(string(value)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&v); err != nil {
		return "", Spec{}, fmt.Errorf("key %s: value %.80q: %w", key, value, err)
	}
	if v.Name != name {
		return "", Spec{}, fmt.Errorf("key %s: value names another node, %q", key, v.Name)
	}
	for _, a := range v.Addresses {
		if !a.IP.IsValid() || (a.Type != InternalIP && a.Type != ExternalIP) {
			return "", Spec{}, fmt.Errorf("key %s: invalid address %+v: want {type: InternalIP or ExternalIP, ip}", key, a)
		}
	}
	for _, p := range v.PodCIDRs {
		if !p.IsValid() || p != p.Masked() {
			return "", Spec{}, fmt.Errorf("key %s: invalid pod CIDR %s", key, p)
		}
	}
	return name, v.Spec, nil
}

// kvstoreNodes follows the nodes/v1 keys and publishes this node's.
type kvstoreNodes struct {
	log   *slog.Logger
	kv    kvstore.Client
	nodes *nodes
	// republish asks publish to write this node's key again: someone
	// deleted it.
	republish chan struct{}
}

func (k *kvstoreNodes) watch(ctx context.Context, health cell.Health, listed func(statedb.WriteTxn)) error {
	known := map[string]bool{}
	for batch := range kvstore.Batches(k.kv.Watch(ctx, keyPrefix), 1024) {
		for _, ev := range batch {
			switch ev.Kind {
			case kvstore.EventListed:
				if listed != nil {
					txn := k.nodes.db.WriteTxn(k.nodes.tbl)
					listed(txn)
					txn.Commit()
					listed = nil
				}
				health.OK(fmt.Sprintf("Following %d nodes", len(known)))
			case kvstore.EventUpsert:
				name, spec, err := parseKey(ev.Key, ev.Value)
				if err != nil {
					k.log.Warn("Ignoring an invalid node key from the kvstore", "error", err)
					if name := strings.TrimPrefix(ev.Key, keyPrefix); known[name] {
						// What it said before no longer holds.
						delete(known, name)
						k.nodes.claims.set(name, SourceKVStore, Spec{}, false)
					}
					continue
				}
				known[name] = true
				k.nodes.claims.set(name, SourceKVStore, spec, true)
			case kvstore.EventDelete:
				name := strings.TrimPrefix(ev.Key, keyPrefix)
				delete(known, name)
				k.nodes.claims.set(name, SourceKVStore, Spec{}, false)
				if name == k.nodes.name {
					select {
					case k.republish <- struct{}{}:
					default:
					}
				}
			}
		}
	}
	return nil
}

// publish writes this node's key (leased) whenever the local node changes,
// and again a second later after a failure.
func (k *kvstoreNodes) publish(ctx context.Context, health cell.Health) error {
	var published []byte
	for {
		txn := k.nodes.db.ReadTxn()
		local, _, watch, found := k.nodes.tbl.GetWatch(txn, ByName.Query(k.nodes.name))
		var retry <-chan time.Time
		if found && local.Local {
			v, _ := json.Marshal(Value{Name: local.Name, Spec: local.Spec})
			if string(v) != string(published) {
				wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				_, err := k.kv.UpdateIfDifferent(wctx, keyPrefix+local.Name, v, kvstore.Leased())
				cancel()
				if err != nil {
					health.Degraded("Publishing this node to the kvstore", err)
					retry = time.After(time.Second)
				} else {
					published = v
					health.OK("Published node " + local.Name)
				}
			}
		}
		select {
		case <-watch:
		case <-retry:
		case <-k.republish:
			k.log.Warn("This node's key was deleted from the kvstore; writing it back", "key", keyPrefix+k.nodes.name)
			published = nil
		case <-ctx.Done():
			return nil
		}
	}
}
