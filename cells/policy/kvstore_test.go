package policy_test

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"
	clientv3 "go.etcd.io/etcd/client/v3"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/cellium/cellium/cells/daemon"
	"github.com/cellium/cellium/cells/endpointmanager"
	idcell "github.com/cellium/cellium/cells/identity"
	"github.com/cellium/cellium/cells/internal/celltest"
	"github.com/cellium/cellium/cells/k8sclient"
	"github.com/cellium/cellium/cells/k8sclient/k8sclienttest"
	"github.com/cellium/cellium/cells/kvstore"
	"github.com/cellium/cellium/cells/policy"
	"github.com/cellium/cellium/pkg/etcdtest"
	"github.com/cellium/cellium/pkg/labels"
)

// TestComputedWhileEtcdUnreachable: an agent in kvstore mode started while
// etcd is away computes and writes the policy of its endpoints with the
// identities it has (their CNI ADD is not held back by "not computed
// yet"), but does not mark it computed, so policy-maps prunes nothing
// restored; once etcd answers, the listed identities' allows follow and the
// policy is marked computed.
func TestComputedWhileEtcdUnreachable(t *testing.T) {
	etcd := etcdtest.Start(t)
	// A client identity in etcd, as another node allocated it.
	client := labels.New(
		labels.Label{Source: labels.SourceK8s, Key: "app", Value: "client"},
		labels.Label{Source: labels.SourceK8s, Key: idcell.NamespaceLabel, Value: "prod"})
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{etcd.Endpoint()}, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := cli.Put(ctx, "away/state/identities/v1/id/40000", client.String()); err != nil {
		t.Fatal(err)
	}
	etcd.Stop()

	a := &testAgent{t: t}
	var lp liveParams
	var kv kvstore.Client
	clientPeer := networkingv1.NetworkPolicyPeer{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "client"}}}
	h := celltest.New(
		daemon.Cell, kvstore.Cell, idcell.Cell, policy.Cell,
		k8sclienttest.Cell(netpol("from-client", ingressFrom(clientPeer, portOf(intstr.FromInt32(80))))),
		cell.Provide(endpointmanager.NewTable, statedb.RWTable[*endpointmanager.Endpoint].ToTable),
		cell.Invoke(func(cs *k8sclient.Fake, db *statedb.DB, eps statedb.RWTable[*endpointmanager.Endpoint],
			entries statedb.Table[*policy.Entry], enf statedb.Table[*policy.Enforcement], c kvstore.Client, p liveParams) {
			a.cs, a.db, a.endpoints, a.entries, a.enforcement, kv, lp = cs, db, eps, entries, enf, c, p
		}),
	)
	dir := t.TempDir()
	hive.AddConfigOverride(h, func(c *daemon.Config) {
		c.StateDir, c.RunDir, c.NodeName = filepath.Join(dir, "state"), filepath.Join(dir, "run"), nodeName
	})
	hive.AddConfigOverride(h, func(c *kvstore.Config) {
		c.KVStore, c.KVStoreOpt, c.KVStorePrefix = "etcd", []string{"etcd.address=" + etcd.Endpoint()}, "away"
	})
	hive.AddConfigOverride(h, func(c *idcell.Config) { c.IdentityAllocationMode = "kvstore" })
	celltest.Start(t, h)

	// A restored endpoint: its identity's row is not in the table (etcd
	// lists it), its policy is.
	ep := &endpointmanager.Endpoint{ID: 1, PodNamespace: "prod", PodName: "web", Labels: map[string]string{"app": "web"}, Identity: 40001}
	wtxn := a.db.WriteTxn(a.endpoints)
	if _, _, err := a.endpoints.Insert(wtxn, ep); err != nil {
		t.Fatal(err)
	}
	_, rev, _ := a.endpoints.Get(wtxn, endpointmanager.EndpointID.Query(1))
	wtxn.Commit()

	a.waitEntries(1, "ingress 1 0 0-0 reserved:host")
	if in, out := a.enforcementOf(1); !in || out {
		t.Fatalf("endpoint 1 isolated ingress %v egress %v with etcd away, want ingress", in, out)
	}
	celltest.Eventually(t, "endpoint 1's policy computed with etcd away", func() (bool, string) {
		_, why, _ := lp.Live[0].Live(ep, rev)
		return why != "not computed yet", why
	})
	if !kvstore.Unreachable(kv) {
		t.Fatalf("kvstore %+v not unreachable, want etcd away", kv.Status())
	}
	txn := a.db.ReadTxn()
	for _, tbl := range []statedb.TableMeta{a.entries, a.enforcement} {
		if init, _ := tbl.Initialized(txn); init {
			t.Fatalf("table %s initialized with etcd away: policy-maps would prune restored allows", tbl.Name())
		}
	}

	etcd.Restart()
	a.waitEntries(1, "ingress 1 0 0-0 reserved:host", "ingress 40000 6 80-0 prod/from-client")
	celltest.Eventually(t, "the policy tables initialized once etcd answers", func() (bool, string) {
		txn := a.db.ReadTxn()
		e, _ := a.entries.Initialized(txn)
		f, _ := a.enforcement.Initialized(txn)
		return e && f, fmt.Sprintf("entries %v, enforcement %v", e, f)
	})
}
