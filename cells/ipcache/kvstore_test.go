package ipcache_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/cilium/hive/cell"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/cellium/cellium/cells/bpfmaps/bpfmapstest"
	"github.com/cellium/cellium/cells/endpointmanager"
	"github.com/cellium/cellium/cells/health"
	"github.com/cellium/cellium/cells/internal/celltest"
	"github.com/cellium/cellium/cells/internal/kvsync/kvsynctest"
	"github.com/cellium/cellium/cells/ipcache"
	"github.com/cellium/cellium/cells/nodes"
	"github.com/cellium/cellium/pkg/etcdtest"
	"github.com/cellium/cellium/pkg/identity"
	"github.com/cellium/cellium/pkg/polltest"
)

// kvEnv is one node's ipcache against a real etcd, and a raw client that
// plays someone else writing the node's keys.
type kvEnv struct {
	*node
	raw *clientv3.Client
	ctx context.Context
}

func startKVEnv(t *testing.T, prefix string) *kvEnv {
	t.Helper()
	etcd := etcdtest.Start(t)
	n := startNode(t, bpfmapstest.Root(t), etcd.Endpoint(), prefix)
	raw, err := clientv3.New(clientv3.Config{Endpoints: []string{etcd.Endpoint()}, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { raw.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	txn := n.db.WriteTxn(n.eps, n.nodes)
	n.eps.Insert(txn, &endpointmanager.Endpoint{ID: 1, ContainerID: "c1", IPv4: netip.MustParseAddr("10.0.0.5"),
		PodNamespace: "default", PodName: "web", Identity: 300})
	n.nodes.Insert(txn, &nodes.Node{Name: "self", Local: true, Spec: nodes.Spec{Addresses: []nodes.Address{{Type: nodes.InternalIP, IP: netip.MustParseAddr("192.168.50.1")}}}})
	n.nodes.Insert(txn, &nodes.Node{Name: "other", Spec: nodes.Spec{
		Addresses: []nodes.Address{{Type: nodes.InternalIP, IP: netip.MustParseAddr("192.168.50.2")}},
		PodCIDRs:  []netip.Prefix{netip.MustParsePrefix("10.0.1.0/24")}}})
	txn.Commit()
	return &kvEnv{node: n, raw: raw, ctx: ctx}
}

func (e *kvEnv) put(t *testing.T, key string, v any) {
	t.Helper()
	s, ok := v.(string)
	if !ok {
		b, _ := json.Marshal(v)
		s = string(b)
	}
	if _, err := e.raw.Put(e.ctx, e.prefix(key), s); err != nil {
		t.Fatal(err)
	}
}

func (e *kvEnv) prefix(key string) string { return "ipk/state/ip/v1/" + key }

// refused waits until the kvstore watcher's health names key as refused
// with why.
func (e *kvEnv) refused(t *testing.T, key, why string) {
	t.Helper()
	celltest.Eventually(t, "health names "+key, func() (bool, string) {
		s, _, found := e.hs.Get(e.db.ReadTxn(), health.StatusID.Query("ipcache.job-kvstore-watch"))
		return found && s.Level == cell.StatusDegraded && strings.Contains(s.Error, "state/ip/v1/"+key+": ") && strings.Contains(s.Error, why), fmt.Sprintf("found %v: %+v", found, s)
	})
}

// TestOwnKeysPutBack: another identity and pod name written over a local
// pod's ip/v1 key (without lease) is replaced by this node's value, on its
// lease, and the repair is counted; the same once more.
func TestOwnKeysPutBack(t *testing.T) {
	e := startKVEnv(t, "ipk")
	own := func() (bool, string) {
		resp, err := e.raw.Get(e.ctx, e.prefix("10.0.0.5"))
		if err != nil {
			return false, err.Error()
		}
		if len(resp.Kvs) != 1 || resp.Kvs[0].Lease == 0 {
			return false, fmt.Sprintf("%+v", resp.Kvs)
		}
		var v ipcache.IPValue
		return json.Unmarshal(resp.Kvs[0].Value, &v) == nil && v.Identity == 300 && v.PodName == "web", string(resp.Kvs[0].Value)
	}
	celltest.Eventually(t, "the local address published", own)
	for i := range 2 {
		e.put(t, "10.0.0.5", ipcache.IPValue{IP: netip.MustParseAddr("10.0.0.5"), Identity: 666, Namespace: "evil", PodName: "forged"})
		celltest.Eventually(t, "the forged key put back, leased", own)
		celltest.Eventually(t, "the repair counted", func() (bool, string) {
			n := kvsynctest.Repairs(t, e.mets, "ipcache")
			return n == float64(i+1), fmt.Sprint(n, " repairs")
		})
	}
	// The same value written again without a lease: the key would outlive
	// the node. It is put back on the lease.
	resp, err := e.raw.Get(e.ctx, e.prefix("10.0.0.5"))
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("get the published key: %v", err)
	}
	if _, err := e.raw.Put(e.ctx, e.prefix("10.0.0.5"), string(resp.Kvs[0].Value)); err != nil {
		t.Fatal(err)
	}
	celltest.Eventually(t, "the key stripped of its lease put back on it", own)
	celltest.Eventually(t, "the repair counted", func() (bool, string) {
		n := kvsynctest.Repairs(t, e.mets, "ipcache")
		return n == 3, fmt.Sprint(n, " repairs")
	})
	e.mapHas(t, "10.0.0.5", 300, "")
}

// TestKVStoreKeysRefused: keys that are not a pod's address in canonical
// form, or whose value is too large or names an identity a pod cannot
// have, are refused and named in health; they change nothing else, and a
// key accepted before loses its claim when it turns bad.
func TestKVStoreKeysRefused(t *testing.T) {
	e := startKVEnv(t, "ipk")
	pod := ipcache.IPValue{IP: netip.MustParseAddr("10.0.1.7"), HostIP: netip.MustParseAddr("192.168.50.2"), Identity: 301, Namespace: "default", PodName: "db"}
	e.put(t, "10.0.1.7", pod)
	e.mapHas(t, "10.0.1.7", 301, "192.168.50.2")
	e.mapHas(t, "192.168.50.2", identity.RemoteNode, "")

	// An IPv4-mapped alias of the pod's address: refused, the pod's own
	// entry stays, and deleting the alias does not take it away.
	alias := pod
	alias.IP, alias.Identity = netip.MustParseAddr("::ffff:10.0.1.7"), 302
	e.put(t, "::ffff:10.0.1.7", alias)
	e.refused(t, "::ffff:10.0.1.7", "IPv4-mapped")
	if _, err := e.raw.Delete(e.ctx, e.prefix("::ffff:10.0.1.7")); err != nil {
		t.Fatal(err)
	}

	bad := func(ip string, mod func(*ipcache.IPValue)) ipcache.IPValue {
		v := ipcache.IPValue{IP: netip.MustParseAddr(ip), HostIP: netip.MustParseAddr("192.168.50.2"), Identity: 303}
		mod(&v)
		return v
	}
	for _, c := range []struct {
		key   string
		value any
		why   string
	}{
		{"10.0.1.20", bad("10.0.1.20", func(v *ipcache.IPValue) { v.Identity = identity.Unknown }), "identity"},
		{"10.0.1.21", bad("10.0.1.21", func(v *ipcache.IPValue) { v.Identity = identity.Host }), "identity"},
		{"fd00::1%eth0", bad("fd00::1%eth0", func(*ipcache.IPValue) {}), "zone"},
		{"192.168.50.2", bad("192.168.50.2", func(*ipcache.IPValue) {}), "address of node other"},
		{"192.168.50.1", bad("192.168.50.1", func(*ipcache.IPValue) {}), "address of node self"},
		{"10.0.1.22", `{"ip":"10.0.1.22","identity":303,"podName":"` + strings.Repeat("x", 1<<20) + `"}`, "bytes"},
		{"010.0.1.23", `{"ip":"10.0.1.23","identity":303}`, "not an address"},
	} {
		e.put(t, c.key, c.value)
		e.refused(t, c.key, c.why)
	}
	// Nothing else changed: the pod, the node's address, the world
	// behind the pod CIDR where the bad keys pointed.
	e.mapHas(t, "10.0.1.7", 301, "192.168.50.2")
	e.mapHas(t, "192.168.50.2", identity.RemoteNode, "")
	e.mapHas(t, "10.0.1.20", identity.World, "192.168.50.2")
	e.mapHas(t, "10.0.1.21", identity.World, "192.168.50.2")
	e.mapLacks(t, "10.0.1.20/32")
	e.mapLacks(t, "10.0.1.22/32")

	// An accepted key that turns bad loses its claim.
	e.put(t, "10.0.1.7", bad("10.0.1.7", func(v *ipcache.IPValue) { v.Identity = identity.World }))
	e.refused(t, "10.0.1.7", "identity")
	e.mapLacks(t, "10.0.1.7/32")
}

// TestOwnKeysAfterEtcdReplaced: etcd replaced by an empty one behind the
// same endpoint: the local pod's key is written again, leased.
func TestOwnKeysAfterEtcdReplaced(t *testing.T) {
	etcd := etcdtest.Start(t)
	raw, err := clientv3.New(clientv3.Config{Endpoints: []string{etcd.Endpoint()}, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	// Revisions the empty store will not have reached when the agent
	// reads it again: how the kvstore client tells it was replaced.
	for i := range 20 {
		if _, err := raw.Put(context.Background(), "rep/other", fmt.Sprint(i)); err != nil {
			t.Fatal(err)
		}
	}
	n := startNode(t, bpfmapstest.Root(t), etcd.Endpoint(), "rep")
	txn := n.db.WriteTxn(n.eps)
	n.eps.Insert(txn, &endpointmanager.Endpoint{ID: 1, ContainerID: "c1", IPv4: netip.MustParseAddr("10.0.0.5"),
		PodNamespace: "default", PodName: "web", Identity: 300})
	txn.Commit()
	published := func() (bool, string) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		resp, err := raw.Get(ctx, "rep/state/ip/v1/10.0.0.5")
		if err != nil || len(resp.Kvs) != 1 || resp.Kvs[0].Lease == 0 {
			return false, fmt.Sprintf("%v %v", resp, err)
		}
		return true, ""
	}
	polltest.Until(t, "the local address published", 10*time.Second, 20*time.Millisecond, published)
	etcd.Wipe()
	etcd.Restart()
	polltest.Until(t, "the local address in the new etcd, leased", 30*time.Second, 50*time.Millisecond, published)
}
