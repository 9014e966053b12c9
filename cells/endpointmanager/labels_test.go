package endpointmanager_test

import (
	"context"
	"encoding/json"
	"errors"
	"maps"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cilium/hive/cell"
	clientv3 "go.etcd.io/etcd/client/v3"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/cellium/cellium/cells/endpointmanager"
	idalloc "github.com/cellium/cellium/cells/identity"
	"github.com/cellium/cellium/cells/k8sclient"
	"github.com/cellium/cellium/pkg/apiv1"
	"github.com/cellium/cellium/pkg/etcdtest"
	"github.com/cellium/cellium/pkg/identity"
)

func k8sPod(name, node string, labels map[string]string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, Labels: labels},
		Spec:       corev1.PodSpec{NodeName: node},
	}
}

// waitLabels waits, on the table's watch channel, until the endpoint of
// containerID has labels.
func (n *node) waitLabels(t *testing.T, containerID string, labels map[string]string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		ep, _, watch, found := n.eps.GetWatch(n.db.ReadTxn(), endpointmanager.EndpointContainerID.Query(containerID))
		if found && maps.Equal(ep.Labels, labels) {
			return
		}
		select {
		case <-watch:
		case <-ctx.Done():
			t.Fatalf("endpoint of %s has labels %v, want %v", containerID, ep.Labels, labels)
		}
	}
}

// An endpoint carries the labels of its pod, as the API server has them
// for the pods of this node, and follows their changes; a pod of another
// node does not count.
func TestPodLabels(t *testing.T) {
	tn := newTestNet(t)
	n := tn.start(t, nodeOpts{k8s: []runtime.Object{k8sPod("web", "node-1", map[string]string{"app": "web"})}})
	web, db := newPod(t), newPod(t)
	epWeb := n.createAs(t, web, "web")
	n.createAs(t, db, "db")
	n.waitLabels(t, web.id, map[string]string{"app": "web"})
	first, _ := n.mgr.Lookup(endpointmanager.Selector{ContainerID: web.id})
	if !first.Identity.IsLocal() || first.IdentityPending {
		t.Fatalf("endpoint with pod labels has identity %v (pending %v), want a node-local one", first.Identity, first.IdentityPending)
	}

	// A pod of another node comes by the watch, then web changes: once the
	// change is seen, so was the other pod.
	elsewhere := k8sPod("db", "node-2", map[string]string{"app": "db"})
	if _, err := n.k8s.CoreV1().Pods("default").Create(context.Background(), elsewhere, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := k8sPod("web", "node-1", map[string]string{"app": "web", "tier": "front"})
	if _, err := n.k8s.CoreV1().Pods("default").Update(context.Background(), pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	n.waitLabels(t, web.id, map[string]string{"app": "web", "tier": "front"})
	if ep, _ := n.mgr.Lookup(endpointmanager.Selector{ContainerID: db.id}); len(ep.Labels) != 0 {
		t.Errorf("endpoint of a pod named like another node's pod got its labels %v", ep.Labels)
	}

	// The label change moved the endpoint to the new label set's identity.
	moved, _ := n.mgr.Lookup(endpointmanager.Selector{ContainerID: web.id})
	if !moved.Identity.IsLocal() || moved.Identity == first.Identity {
		t.Fatalf("after the label change the identity is %v, was %v: want another node-local one", moved.Identity, first.Identity)
	}

	var file struct {
		Labels   map[string]string
		Identity identity.NumericIdentity
	}
	data, err := os.ReadFile(filepath.Join(n.stateDir, "endpoints", strconv.Itoa(int(epWeb.ID)), "endpoint.json"))
	if err != nil || json.Unmarshal(data, &file) != nil || file.Labels["tier"] != "front" || file.Identity != moved.Identity {
		t.Errorf("state file after the label change: %s, %v", data, err)
	}

	// A restart keeps the endpoint's identity.
	n.stop()
	n = tn.start(t, nodeOpts{k8s: []runtime.Object{pod}})
	n.waitRestored(t)
	restored, _ := n.mgr.Lookup(endpointmanager.Selector{ContainerID: web.id})
	if restored.Identity != moved.Identity || restored.IdentityPending {
		t.Fatalf("after a restart the identity is %v (pending %v), want %v", restored.Identity, restored.IdentityPending, moved.Identity)
	}
}

// TestIdentityDuringKVStoreOutage: with etcd away, a new pod still gets its
// endpoint at once, with the init identity, and gets its cluster identity
// when etcd comes back, with no restart.
func TestIdentityDuringKVStoreOutage(t *testing.T) {
	etcd := etcdtest.Start(t)
	tn := newTestNet(t)
	n := tn.start(t, nodeOpts{etcd: etcd.Endpoint(), k8s: []runtime.Object{k8sPod("web", "node-1", map[string]string{"app": "web"})}})
	etcd.Stop()

	web := newPod(t)
	req := web.req()
	req.PodName = "web"
	ep, err := n.mgr.Create(context.Background(), req)
	if err != nil {
		t.Fatalf("ADD with etcd away: %v", err)
	}
	if ep.Identity != identity.Init || !ep.IdentityPending {
		t.Fatalf("endpoint created with etcd away has identity %v (pending %v), want init, pending", ep.Identity, ep.IdentityPending)
	}

	etcd.Restart()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for {
		row, _, watch, _ := n.eps.GetWatch(n.db.ReadTxn(), endpointmanager.EndpointContainerID.Query(web.id))
		if row.Identity.IsCluster() && !row.IdentityPending {
			break
		}
		select {
		case <-watch:
		case <-ctx.Done():
			t.Fatalf("identity after etcd returned: %v (pending %v), want a cluster identity", row.Identity, row.IdentityPending)
		}
	}
	// Its keys are in etcd: the master key and this node's value key.
	row, _ := n.mgr.Lookup(endpointmanager.Selector{ContainerID: web.id})
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{etcd.Endpoint()}, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	master, err := cli.Get(ctx, "em/state/identities/v1/id/"+row.Identity.String())
	if err != nil || len(master.Kvs) != 1 {
		t.Fatalf("master key of %v after the outage: %v, %v", row.Identity, master, err)
	}
	values, err := cli.Get(ctx, "em/state/identities/v1/value/"+string(master.Kvs[0].Value)+"/node-1")
	if err != nil || len(values.Kvs) != 1 || values.Kvs[0].Lease == 0 {
		t.Fatalf("node-1's leased value key after the outage: %v, %v", values, err)
	}
}

// waitEndpoint waits, on the table's watch channel, until the endpoint of
// containerID satisfies ok, and returns it.
func (n *node) waitEndpoint(t *testing.T, containerID, what string, ok func(*endpointmanager.Endpoint) bool) *endpointmanager.Endpoint {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		ep, _, watch, found := n.eps.GetWatch(n.db.ReadTxn(), endpointmanager.EndpointContainerID.Query(containerID))
		if found && ok(ep) {
			return ep
		}
		select {
		case <-watch:
		case <-ctx.Done():
			t.Fatalf("endpoint of %s: %s: last seen %+v", containerID, what, ep)
		}
	}
}

// identityLabels are the labels of identity id in the identities table.
func (n *node) identityLabels(t *testing.T, id identity.NumericIdentity) string {
	t.Helper()
	row, _, found := n.ids.Get(n.db.ReadTxn(), idalloc.ByID.Query(id))
	if !found {
		t.Fatalf("identity %v is not in the identities table", id)
	}
	return row.Labels.String()
}

// An endpoint's identity is made of its pod's labels, namespace and
// service account and its namespace's labels; a change of the namespace's
// labels moves every endpoint of the namespace to the new identity, and
// the old one goes with its last user.
func TestIdentityFromNamespaceAndServiceAccount(t *testing.T) {
	tn := newTestNet(t)
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "default", Labels: map[string]string{"team": "a"}}}
	web := k8sPod("web", "node-1", map[string]string{"app": "web"})
	web.Spec.ServiceAccountName = "web-sa"
	n := tn.start(t, nodeOpts{k8s: []runtime.Object{ns, web}})
	p := newPod(t)
	n.createAs(t, p, "web")
	const want = "k8s:app=web;k8s:io.cellium.k8s.namespace.labels.team=a;k8s:io.cellium.k8s.policy.serviceaccount=web-sa;k8s:io.kubernetes.pod.namespace=default"
	first := n.waitEndpoint(t, p.id, "has the service account and namespace labels", func(ep *endpointmanager.Endpoint) bool {
		return ep.ServiceAccount == "web-sa" && ep.NamespaceLabels["team"] == "a"
	})
	if got := n.identityLabels(t, first.Identity); got != want {
		t.Fatalf("identity %v has labels\n%s, want\n%s", first.Identity, got, want)
	}

	ns.Labels["team"] = "b"
	if _, err := n.k8s.CoreV1().Namespaces().Update(context.Background(), ns, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	moved := n.waitEndpoint(t, p.id, "moved to the new namespace labels' identity", func(ep *endpointmanager.Endpoint) bool {
		return ep.NamespaceLabels["team"] == "b" && ep.Identity != first.Identity && !ep.IdentityPending
	})
	if got := n.identityLabels(t, moved.Identity); !strings.Contains(got, "k8s:io.cellium.k8s.namespace.labels.team=b") {
		t.Fatalf("new identity %v has labels %s", moved.Identity, got)
	}
	// The old identity goes with its last user (released just after the
	// endpoint moved).
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		_, _, watch, found := n.ids.GetWatch(n.db.ReadTxn(), idalloc.ByID.Query(first.Identity))
		if !found {
			break
		}
		select {
		case <-watch:
		case <-ctx.Done():
			t.Fatalf("the old node-local identity %v outlived its last user", first.Identity)
		}
	}
}

// With the kvstore, a restart takes each endpoint's cluster identity back
// by labels before the endpoint is ready: the same number, acquired (not
// provisional), and this node's value key for it written again.
func TestRestoreClusterIdentity(t *testing.T) {
	etcd := etcdtest.Start(t)
	tn := newTestNet(t)
	pods := []runtime.Object{k8sPod("web", "node-1", map[string]string{"app": "web"})}
	n := tn.start(t, nodeOpts{etcd: etcd.Endpoint(), k8s: pods})
	p := newPod(t)
	n.createAs(t, p, "web")
	before := n.waitEndpoint(t, p.id, "has its cluster identity", func(ep *endpointmanager.Endpoint) bool {
		return ep.Identity.IsCluster() && !ep.IdentityPending
	})
	n.stop()

	n = tn.start(t, nodeOpts{etcd: etcd.Endpoint(), k8s: pods})
	n.waitRestored(t)
	after, _ := n.mgr.Lookup(endpointmanager.Selector{ContainerID: p.id})
	if after.Identity != before.Identity || after.IdentityPending {
		t.Fatalf("restored identity %v (pending %v), want %v acquired", after.Identity, after.IdentityPending, before.Identity)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{etcd.Endpoint()}, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	resp, err := cli.Get(context.Background(), "em/state/identities/v1/value/", clientv3.WithPrefix())
	if err != nil || len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != before.Identity.String() || !strings.HasSuffix(string(resp.Kvs[0].Key), "/node-1") {
		t.Fatalf("value keys after the restart: %v, %v", resp, err)
	}
}

// Two events handled at once from the same row (a pod's and its namespace's,
// from separate informers): the one that commits second finds the row moved
// and must derive its inputs again from the newer row, not drop its work,
// or the endpoint keeps the first event's older view until the next change.
func TestReidentifyRaceEndsWithTheLastView(t *testing.T) {
	tn := newTestNet(t)
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "default", Labels: map[string]string{"team": "a"}}}
	web := k8sPod("web", "node-1", map[string]string{"app": "web"})
	n := tn.start(t, nodeOpts{k8s: []runtime.Object{ns, web}})
	p := newPod(t)
	n.createAs(t, p, "web")
	stale := n.waitEndpoint(t, p.id, "has its namespace's labels", func(ep *endpointmanager.Endpoint) bool {
		return ep.NamespaceLabels["team"] == "a" && !ep.IdentityPending
	})
	team := func(v string) func(*endpointmanager.Endpoint) *endpointmanager.Endpoint {
		return func(ep *endpointmanager.Endpoint) *endpointmanager.Endpoint {
			if ep.NamespaceLabels["team"] == v {
				return nil
			}
			next := ep.Clone()
			next.NamespaceLabels = map[string]string{"team": v}
			return next
		}
	}
	// The first event commits its view; the second, from the same row,
	// comes second.
	n.mgr.ReidentifyFrom(stale, team("b"))
	n.mgr.ReidentifyFrom(stale, team("c"))
	got, found := n.mgr.Lookup(endpointmanager.Selector{ID: stale.ID})
	if !found {
		t.Fatal("the endpoint went")
	}
	if got.NamespaceLabels["team"] != "c" {
		t.Fatalf("endpoint has namespace labels %v, want the last event's team=c", got.NamespaceLabels)
	}
	if labels := n.identityLabels(t, got.Identity); !strings.Contains(labels, "k8s:io.cellium.k8s.namespace.labels.team=c") {
		t.Fatalf("endpoint's identity %v has labels %s, want team=c", got.Identity, labels)
	}
}

// TestCreateWaitsForPodList: an ADD that comes before the agent has listed
// the pods of its node waits for the list (ErrNotReady at its deadline,
// having made nothing), and then has the pod's labels when it returns. Made
// without them, the endpoint would have the identity, and so the policy, of
// a pod no NetworkPolicy selects, and its ADD would be answered so.
func TestCreateWaitsForPodList(t *testing.T) {
	var listable atomic.Bool
	tn := newTestNet(t)
	n := tn.start(t, nodeOpts{k8s: []runtime.Object{k8sPod("web", "node-1", map[string]string{"app": "web"})},
		extra: []cell.Cell{cell.Invoke(func(cs *k8sclient.Fake) {
			cs.PrependReactor("list", "pods", func(k8sclient.Action) (bool, runtime.Object, error) {
				if listable.Load() {
					return false, nil, nil
				}
				return true, nil, errors.New("the test holds the pods back")
			})
		})}})
	n.waitRestored(t)
	p := newPod(t)
	req := p.req()
	req.PodName = "web"

	// The pods cannot be listed: the deadline ends the wait.
	n.createGivesUp(t, req, "before the pods were listed", "default/web")

	listable.Store(true)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ep, err := n.mgr.Create(ctx, req)
	if err != nil {
		t.Fatalf("ADD once the pods can be listed: %v", err)
	}
	if !maps.Equal(ep.Labels, map[string]string{"app": "web"}) {
		t.Fatalf("the endpoint returned by the ADD has labels %v, want the pod's, app=web", ep.Labels)
	}
}

// createGivesUp checks that req's ADD, given 300 ms, ends with
// ErrNotReady naming pod, having made nothing.
func (n *node) createGivesUp(t *testing.T, req endpointmanager.CreateRequest, what, pod string) {
	t.Helper()
	short, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if ep, err := n.mgr.Create(short, req); !errors.Is(err, endpointmanager.ErrNotReady) || !strings.Contains(err.Error(), pod) {
		t.Fatalf("ADD %s = %+v, %v; want ErrNotReady naming %s", what, ep, err, pod)
	}
	if ids, allocs := n.endpointIDs(), n.allocations(); len(ids) != 0 || len(allocs) != 0 {
		t.Fatalf("the ADD that gave up left endpoints %v, addresses %q", ids, allocs)
	}
}

// TestCreateWaitsForPod: with a real API server, an ADD naming a pod that
// the agent's watch has not brought yet (listed after the initial list:
// watch lag) waits for the pod (ErrNotReady naming it at the deadline,
// having made nothing), and its endpoint has the pod's and namespace's
// labels, and the identity of those labels, when the ADD returns. Made
// without them, the endpoint would have the identity, and so the policy,
// of a pod no NetworkPolicy selects until the labels came.
func TestCreateWaitsForPod(t *testing.T) {
	tn := newTestNet(t)
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "default", Labels: map[string]string{"team": "a"}}}
	n := tn.start(t, nodeOpts{cluster: true, k8s: []runtime.Object{ns}})
	n.waitRestored(t)
	p := newPod(t)
	req := p.req()
	req.PodName = "web"

	// The pod is not there: the deadline ends the wait.
	n.createGivesUp(t, req, "of a pod the API server has not told of", "pod default/web")

	// The pod comes while the ADD waits.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	done := n.createReqAsync(ctx, req)
	if _, err := n.k8s.CoreV1().Pods("default").Create(ctx, k8sPod("web", "node-1", map[string]string{"app": "web"}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil {
		t.Fatalf("ADD once the pod is there: %v", r.err)
	}
	if !maps.Equal(r.ep.Labels, map[string]string{"app": "web"}) || r.ep.NamespaceLabels["team"] != "a" {
		t.Fatalf("the endpoint returned by the ADD has labels %v, namespace labels %v; want app=web, team=a", r.ep.Labels, r.ep.NamespaceLabels)
	}
	const want = "k8s:app=web;k8s:io.cellium.k8s.namespace.labels.team=a;k8s:io.kubernetes.pod.namespace=default"
	if got := n.identityLabels(t, r.ep.Identity); got != want {
		t.Fatalf("the ADD's endpoint has identity %v with labels\n%s, want\n%s", r.ep.Identity, got, want)
	}

	// The API server unreachable: a pod the watch brought still gets its
	// network, with its labels (read from the informer's store, no request
	// made); one it did not bring gets the error, for the kubelet to retry.
	n.k8s.PrependReactor("*", "*", func(k8sclient.Action) (bool, runtime.Object, error) {
		return true, nil, errors.New("the test made the API server unreachable")
	})
	again := newPod(t)
	req = again.req()
	req.PodName = "web"
	ep, err := n.mgr.Create(ctx, req)
	if err != nil || !maps.Equal(ep.Labels, map[string]string{"app": "web"}) || ep.Identity != r.ep.Identity {
		t.Fatalf("ADD of a known pod with the API server unreachable = %+v, %v; want the pod's labels and identity %v", ep, err, r.ep.Identity)
	}
	if _, err := n.mgr.Delete(ctx, endpointmanager.Selector{ContainerID: again.id}); err != nil {
		t.Fatal(err)
	}
	if _, err := n.mgr.Delete(ctx, endpointmanager.Selector{ContainerID: p.id}); err != nil {
		t.Fatal(err)
	}
	req.PodName = "db"
	n.createGivesUp(t, req, "of an unknown pod with the API server unreachable", "pod default/db")
}

// TestCreateWaitsForPodUID: a pod deleted and made again under the same
// name (a StatefulSet's) with other labels, while the watch still has the
// old one: an ADD naming the new pod's UID is not given the old pod's
// labels (ErrNotReady naming the pod and the UID at the deadline, having
// made nothing); once the new pod comes it has the new pod's labels and
// their identity. An ADD without a UID takes the pod of that name, as
// before.
func TestCreateWaitsForPodUID(t *testing.T) {
	tn := newTestNet(t)
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "default"}}
	old := k8sPod("web-0", "node-1", map[string]string{"app": "web", "rev": "old"})
	old.UID = "uid-old"
	n := tn.start(t, nodeOpts{cluster: true, k8s: []runtime.Object{ns, old}})
	n.waitRestored(t)
	p := newPod(t)
	req := p.req()
	req.PodName, req.PodUID = "web-0", "uid-new"

	// The store has web-0, but of another UID: the deadline ends the wait.
	n.createGivesUp(t, req, "of a pod whose name the store has with another UID", "pod default/web-0 (UID uid-new)")

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	done := n.createReqAsync(ctx, req)
	// The new pod comes: the old one's deletion, then the new one.
	if err := n.k8s.CoreV1().Pods("default").Delete(ctx, "web-0", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	fresh := k8sPod("web-0", "node-1", map[string]string{"app": "web", "rev": "new"})
	fresh.UID = "uid-new"
	if _, err := n.k8s.CoreV1().Pods("default").Create(ctx, fresh, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil {
		t.Fatalf("ADD once the pod of UID uid-new is there: %v", r.err)
	}
	if !maps.Equal(r.ep.Labels, fresh.Labels) {
		t.Fatalf("the endpoint returned by the ADD has labels %v, want the new pod's %v", r.ep.Labels, fresh.Labels)
	}
	const want = "k8s:app=web;k8s:io.kubernetes.pod.namespace=default;k8s:rev=new"
	if got := n.identityLabels(t, r.ep.Identity); got != want {
		t.Fatalf("the ADD's endpoint has identity %v with labels\n%s, want\n%s", r.ep.Identity, got, want)
	}

	// Without a UID, the pod of that name the store has.
	again := newPod(t)
	req = again.req()
	req.PodName = "web-0"
	ep, err := n.mgr.Create(ctx, req)
	if err != nil || !maps.Equal(ep.Labels, fresh.Labels) {
		t.Fatalf("ADD without a UID = %+v, %v; want the labels %v", ep, err, fresh.Labels)
	}

	// Through the API: the body's podUID is the one waited for; the
	// store's web-0 is not of UID uid-old, so no endpoint is made.
	third := newPod(t)
	short, cancelShort := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancelShort()
	if ep, err := n.client.CreateEndpoint(short, third.id, apiv1.EndpointCreate{Netns: third.ns.Path(), Interface: "eth0",
		PodNamespace: "default", PodName: "web-0", PodUID: "uid-old"}); err == nil {
		t.Fatalf("PUT with podUID uid-old made %+v, with the labels of the pod of UID uid-new", ep)
	}
	if _, found := n.mgr.Lookup(endpointmanager.Selector{ContainerID: third.id}); found {
		t.Fatal("the PUT that gave up left an endpoint")
	}
}
