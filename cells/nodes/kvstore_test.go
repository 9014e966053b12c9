package nodes_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cilium/hive/cell"
	clientv3 "go.etcd.io/etcd/client/v3"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/cellium/cellium/cells/health"
	"github.com/cellium/cellium/cells/internal/celltest"
	"github.com/cellium/cellium/cells/internal/kvsync/kvsynctest"
	"github.com/cellium/cellium/cells/kvstore"
	"github.com/cellium/cellium/cells/nodes"
	"github.com/cellium/cellium/pkg/etcdtest"
	"github.com/cellium/cellium/pkg/polltest"
)

func nodeValue(name, ip string, podCIDRs ...string) []byte {
	v := nodes.Value{Name: name, Spec: nodes.Spec{Addresses: []nodes.Address{{Type: nodes.InternalIP, IP: netip.MustParseAddr(ip)}}}}
	for _, c := range podCIDRs {
		v.PodCIDRs = append(v.PodCIDRs, netip.MustParsePrefix(c))
	}
	b, _ := json.Marshal(v)
	return b
}

func put(t *testing.T, kv kvstore.Client, key string, value []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := kv.UpdateIfDifferent(ctx, key, value); err != nil {
		t.Fatal(err)
	}
}

// healthNames waits until the health of id is Degraded and its error
// holds every one of what.
func (a *agent) healthNames(t *testing.T, id string, what ...string) {
	t.Helper()
	celltest.Eventually(t, id+" names "+strings.Join(what, ", "), func() (bool, string) {
		s, _, found := a.hs.Get(a.db.ReadTxn(), health.StatusID.Query(id))
		if !found || s.Level != cell.StatusDegraded {
			return false, fmt.Sprintf("found %v: %+v", found, s)
		}
		for _, w := range what {
			if !strings.Contains(s.Error, w) {
				return false, fmt.Sprintf("%+v", s)
			}
		}
		return true, ""
	})
}

// TestNewcomerCannotTakePodCIDR: a node key whose name sorts first,
// claiming the pod CIDR of a node that holds it, does not take it: the
// newcomer is refused and named in health, the established node keeps its
// CIDR. A CIDR a Node object gives its node is that node's even against a
// key that was there first.
func TestNewcomerCannotTakePodCIDR(t *testing.T) {
	etcd := etcdtest.Start(t)
	a := start(t, opts{name: "node-a", podCIDR: "10.244.10.0/24", nodeIP: []string{"192.0.2.20"}, etcd: etcd.Endpoint(),
		k8s: []runtime.Object{k8sNode("node-k", "192.0.2.40", "10.244.40.0/24")}})
	put(t, a.kv, "state/nodes/v1/aaa-early", nodeValue("aaa-early", "192.0.2.41", "10.244.40.0/24"))
	b := start(t, opts{name: "node-b", podCIDR: "10.244.11.0/24", nodeIP: []string{"192.0.2.21"}, etcd: etcd.Endpoint()})
	_ = b
	cidrs := func(r map[string]*nodes.Node, name string, want ...string) bool {
		n := r[name]
		if n == nil {
			return false
		}
		var got []string
		for _, p := range n.PodCIDRs {
			got = append(got, p.String())
		}
		return slices.Equal(got, want)
	}
	a.wait(t, "node-b with its CIDR, node-k with the CIDR its Node object gives it", func(r map[string]*nodes.Node) bool {
		return cidrs(r, "node-b", "10.244.11.0/24") && cidrs(r, "node-k", "10.244.40.0/24") && cidrs(r, "aaa-early")
	})

	put(t, a.kv, "state/nodes/v1/aaa-evil", nodeValue("aaa-evil", "192.0.2.66", "10.244.11.0/24"))
	rows := a.wait(t, "aaa-evil known, without node-b's CIDR", func(r map[string]*nodes.Node) bool {
		return r["aaa-evil"] != nil && cidrs(r, "aaa-evil")
	})
	if !cidrs(rows, "node-b", "10.244.11.0/24") {
		t.Fatalf("node-b lost its CIDR to a newcomer: %+v", rows["node-b"])
	}
	if p := rows["aaa-evil"].Problems; len(p) != 1 || !strings.Contains(p[0], "10.244.11.0/24 ignored: it overlaps 10.244.11.0/24 of node node-b") {
		t.Fatalf("aaa-evil's problems %q", p)
	}
	a.healthNames(t, "nodes.job-merge", "aaa-evil: pod CIDR 10.244.11.0/24 ignored", "aaa-early: pod CIDR 10.244.40.0/24 ignored")
	// A change of the newcomer's key changes nothing.
	put(t, a.kv, "state/nodes/v1/aaa-evil", nodeValue("aaa-evil", "192.0.2.67", "10.244.11.0/24"))
	a.wait(t, "aaa-evil at its new address, still without the CIDR", func(r map[string]*nodes.Node) bool {
		return r["aaa-evil"].PrimaryIP() == netip.MustParseAddr("192.0.2.67") && cidrs(r, "aaa-evil") && cidrs(r, "node-b", "10.244.11.0/24")
	})
}

// TestOlderKeyKeepsPodCIDRAfterRestart: an agent that starts anew, with
// no Node objects and so nothing of its own to go by, gives a pod CIDR two
// keys claim to the key that was there first, as the agents that watched
// them arrive do, not to the name that sorts first.
func TestOlderKeyKeepsPodCIDRAfterRestart(t *testing.T) {
	etcd := etcdtest.Start(t)
	a := start(t, opts{name: "node-a", podCIDR: "10.244.10.0/24", nodeIP: []string{"192.0.2.20"}, etcd: etcd.Endpoint()})
	put(t, a.kv, "state/nodes/v1/node-z", nodeValue("node-z", "192.0.2.50", "10.244.50.0/24"))
	a.wait(t, "node-z with its CIDR", func(r map[string]*nodes.Node) bool {
		return r["node-z"] != nil && len(r["node-z"].PodCIDRs) == 1
	})
	put(t, a.kv, "state/nodes/v1/aaa-late", nodeValue("aaa-late", "192.0.2.51", "10.244.50.0/24"))

	c := start(t, opts{name: "node-c", podCIDR: "10.244.12.0/24", nodeIP: []string{"192.0.2.22"}, etcd: etcd.Endpoint()})
	rows := c.wait(t, "node-z and aaa-late known", func(r map[string]*nodes.Node) bool {
		return r["node-z"] != nil && r["aaa-late"] != nil
	})
	if z := rows["node-z"]; len(z.PodCIDRs) != 1 || z.PodCIDRs[0] != netip.MustParsePrefix("10.244.50.0/24") {
		t.Fatalf("node-z, whose key came first, lost its CIDR on a new agent: %+v", z)
	}
	if late := rows["aaa-late"]; len(late.PodCIDRs) != 0 {
		t.Fatalf("aaa-late, whose key came later, got the CIDR on a new agent: %+v", late)
	}
}

// TestOwnNodeKeyPutBack: this node's key overwritten by someone else (a
// forged health address, no lease) is written back, leased, and the
// repair is counted.
func TestOwnNodeKeyPutBack(t *testing.T) {
	etcd := etcdtest.Start(t)
	a := start(t, opts{name: "node-a", podCIDR: "10.244.10.0/24", nodeIP: []string{"192.0.2.20"}, etcd: etcd.Endpoint()})
	ctx := context.Background()
	rows := a.wait(t, "node-a known", func(r map[string]*nodes.Node) bool { return r["node-a"] != nil })
	published, _ := json.Marshal(nodes.Value{Name: "node-a", Spec: rows["node-a"].Spec})
	celltest.Eventually(t, "node-a published", func() (bool, string) {
		v, found, err := a.kv.Get(ctx, "state/nodes/v1/node-a")
		return err == nil && found && string(v) == string(published), fmt.Sprintf("%q found %v, %v", v, found, err)
	})
	forged := nodes.Value{Name: "node-a", Spec: nodes.Spec{
		Addresses: []nodes.Address{{Type: nodes.InternalIP, IP: netip.MustParseAddr("192.0.2.20")}},
		HealthIPs: []netip.Addr{netip.MustParseAddr("198.51.100.66")}}}
	for i := range 2 {
		b, _ := json.Marshal(forged)
		put(t, a.kv, "state/nodes/v1/node-a", b)
		celltest.Eventually(t, "node-a's key written back, leased", func() (bool, string) {
			kvs, err := a.kv.List(ctx, "state/nodes/v1/node-a")
			return err == nil && len(kvs) == 1 && string(kvs[0].Value) == string(published) && kvs[0].Lease != 0, fmt.Sprintf("%+v, %v", kvs, err)
		})
		celltest.Eventually(t, "the repair counted", func() (bool, string) {
			n := kvsynctest.Repairs(t, a.m, "nodes")
			return n == float64(i+1), fmt.Sprint(n, " repairs")
		})
	}
}

// TestNodeKeysRefused: keys with values too large or too long lists, zoned
// or repeated addresses, or a name that is not a node name are refused,
// named in health, and change nothing else; an accepted key that turns bad
// takes back what it said.
func TestNodeKeysRefused(t *testing.T) {
	etcd := etcdtest.Start(t)
	a := start(t, opts{name: "node-a", podCIDR: "10.244.10.0/24", nodeIP: []string{"192.0.2.20"}, etcd: etcd.Endpoint()})
	put(t, a.kv, "state/nodes/v1/node-c", nodeValue("node-c", "192.0.2.22", "10.244.12.0/24"))
	a.wait(t, "node-c", func(r map[string]*nodes.Node) bool { return r["node-c"] != nil && len(r["node-c"].PodCIDRs) == 1 })

	many := `{"name":"node-d","addresses":[{"type":"InternalIP","ip":"192.0.2.23"}],"healthIPs":[` +
		strings.TrimSuffix(strings.Repeat(`"10.244.13.5",`, 60000), ",") + `]}`
	// Put straight, not through the client's compare-and-write, which
	// sends the value twice.
	raw, err := clientv3.New(clientv3.Config{Endpoints: []string{etcd.Endpoint()}, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	for _, c := range []struct{ key, value, why string }{
		{"node-d", many, "bytes"},
		{"node-e", `{"name":"node-e","addresses":[{"type":"InternalIP","ip":"192.0.2.24"}],"healthIPs":["10.244.14.5","10.244.14.5"]}`, "twice"},
		{"node-f", `{"name":"node-f","addresses":[{"type":"InternalIP","ip":"fe80::1%eth0"}]}`, "without zone"},
		{"node-g", `{"name":"node-g","addresses":[{"type":"InternalIP","ip":"::ffff:192.0.2.25"}]}`, "invalid address"},
		{"Node_H", `{"name":"Node_H","addresses":[{"type":"InternalIP","ip":"192.0.2.26"}]}`, "not a node name"},
		{"node-i", `{"name":"node-i","addresses":[{"type":"InternalIP","ip":"192.0.2.27"}],"podCIDRs":["10.1.0.0/24","10.2.0.0/24","10.3.0.0/24","10.4.0.0/24","10.5.0.0/24","10.6.0.0/24","10.7.0.0/24","10.8.0.0/24","10.9.0.0/24"]}`, "at most"},
		{"node-c", `{"name":"node-c","addresses":[{"type":"InternalIP","ip":"0.0.0.0"}],"podCIDRs":["10.244.12.0/24"]}`, "invalid address"},
	} {
		if _, err := raw.Put(context.Background(), "nodes/state/nodes/v1/"+c.key, c.value); err != nil {
			t.Fatal(err)
		}
		a.healthNames(t, "nodes.job-kvstore-watch", "state/nodes/v1/"+c.key+": ", c.why)
	}
	a.wait(t, "only this node left: the refused keys changed nothing, node-c's turned bad", func(r map[string]*nodes.Node) bool {
		return len(r) == 1 && r["node-a"] != nil && len(r["node-a"].Problems) == 0
	})
}

// TestOwnNodeKeyAfterEtcdReplaced: etcd replaced by an empty one behind
// the same endpoint (a restore, a rebuilt member): this node's key is
// written again, leased, and a node key written to the new store is seen,
// though the new store's revisions are behind those the agent had
// watched to.
func TestOwnNodeKeyAfterEtcdReplaced(t *testing.T) {
	etcd := etcdtest.Start(t)
	raw, err := clientv3.New(clientv3.Config{Endpoints: []string{etcd.Endpoint()}, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// Revisions the empty store will not have reached when the agent
	// reads it again.
	for i := range 20 {
		if _, err := raw.Put(ctx, "nodes/other", strconv.Itoa(i)); err != nil {
			t.Fatal(err)
		}
	}
	a := start(t, opts{name: "node-a", podCIDR: "10.244.10.0/24", nodeIP: []string{"192.0.2.20"}, etcd: etcd.Endpoint()})
	published := func() (bool, string) {
		ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		resp, err := raw.Get(ctx, "nodes/state/nodes/v1/node-a")
		if err != nil || len(resp.Kvs) != 1 || resp.Kvs[0].Lease == 0 {
			return false, fmt.Sprint(resp, err)
		}
		return true, ""
	}
	polltest.Until(t, "node-a's key published, leased", 10*time.Second, 20*time.Millisecond, published)

	etcd.Wipe()
	etcd.Restart()
	polltest.Until(t, "node-a's key in the new etcd, leased", 30*time.Second, 50*time.Millisecond, published)
	if _, err := raw.Put(ctx, "nodes/state/nodes/v1/node-n", string(nodeValue("node-n", "192.0.2.30", "10.244.30.0/24"))); err != nil {
		t.Fatal(err)
	}
	a.wait(t, "node-n, written to the new etcd, known", func(r map[string]*nodes.Node) bool {
		return r["node-n"] != nil && len(r["node-n"].PodCIDRs) == 1
	})
}
