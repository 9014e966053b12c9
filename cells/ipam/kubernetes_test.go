package ipam_test

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/hivetest"
	"github.com/cilium/statedb"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cellium/cellium/cells/daemon"
	"github.com/cellium/cellium/cells/health"
	"github.com/cellium/cellium/cells/internal/celltest"
	"github.com/cellium/cellium/cells/ipam"
	"github.com/cellium/cellium/cells/k8sclient"
	"github.com/cellium/cellium/cells/k8sclient/k8sclienttest"
)

// k8sAgent runs the ipam cell with --ipam=kubernetes over a fake API server
// holding node.
func k8sAgent(t *testing.T, node *corev1.Node) (*ipam.IPAM, *k8sclient.Fake, *statedb.DB, statedb.Table[*health.Status]) {
	var (
		alloc  *ipam.IPAM
		cs     *k8sclient.Fake
		db     *statedb.DB
		status statedb.Table[*health.Status]
	)
	h := celltest.New(daemon.Cell, ipam.Cell, k8sclienttest.Cell(node),
		cell.Invoke(func(i *ipam.IPAM, f *k8sclient.Fake, d *statedb.DB, s statedb.Table[*health.Status]) {
			alloc, cs, db, status = i, f, d, s
		}))
	dir := t.TempDir()
	hive.AddConfigOverride(h, func(c *daemon.Config) {
		c.StateDir, c.RunDir, c.NodeName = filepath.Join(dir, "state"), filepath.Join(dir, "run"), "node-1"
	})
	hive.AddConfigOverride(h, func(c *ipam.Config) { c.IPAM = ipam.ModeKubernetes })
	celltest.Start(t, h)
	return alloc, cs, db, status
}

// With --ipam=kubernetes the pools are the local Node's spec.podCIDRs;
// allocation waits until the Node has them.
func TestKubernetesPodCIDRs(t *testing.T) {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1"}}
	other := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-2"}, Spec: corev1.NodeSpec{PodCIDRs: []string{"10.244.9.0/24"}}}
	alloc, cs, _, _ := k8sAgent(t, node)
	ctx := context.Background()
	if _, err := cs.CoreV1().Nodes().Create(ctx, other, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	_, err := alloc.Allocate(cancelled, ipam.Request{Owner: "pod", Family: ipam.IPv4})
	if !errors.Is(err, ipam.ErrNotReady) || !strings.Contains(err.Error(), "waiting for pod-cidrs") {
		t.Fatalf("allocation before the Node has pod CIDRs = %v, want ErrNotReady naming pod-cidrs", err)
	}

	node = node.DeepCopy()
	node.Spec.PodCIDRs = []string{"10.244.1.0/24", "fd00:10:244:1::/112"}
	if _, err := cs.CoreV1().Nodes().Update(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	a, err := alloc.Allocate(ctx, ipam.Request{Owner: "pod", Family: ipam.IPv6})
	if err != nil || a.IP.String() != "fd00:10:244:1::2" {
		t.Fatalf("allocation from the Node's pools = %v, %v; want fd00:10:244:1::2", a, err)
	}
	pools := alloc.Pools()
	if len(pools) != 2 || pools[0].CIDR.String() != "10.244.1.0/24" || pools[0].Router.String() != "10.244.1.1" {
		t.Fatalf("pools = %+v, want the Node's, not another Node's", pools)
	}
}

// Pod CIDRs that are not valid leave the IPAM not ready, with the module
// degraded naming the Node.
func TestKubernetesInvalidPodCIDRs(t *testing.T) {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1"}, Spec: corev1.NodeSpec{PodCIDRs: []string{"10.244.1.7/24"}}}
	_, _, db, status := k8sAgent(t, node)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		row, _, watch, found := status.GetWatch(db.ReadTxn(), health.StatusID.Query("ipam"))
		if found && row.Level == cell.StatusDegraded {
			if want := `invalid spec.podCIDRs of Node node-1 "10.244.1.7/24": host bits are set`; !strings.Contains(row.Error, want) {
				t.Fatalf("ipam health error = %q, want %q", row.Error, want)
			}
			return
		}
		select {
		case <-watch:
		case <-ctx.Done():
			t.Fatalf("ipam health = %+v, want Degraded", row)
		}
	}
}

func TestKubernetesModeNeedsAClientset(t *testing.T) {
	h := celltest.New(daemon.Cell, ipam.Cell)
	hive.AddConfigOverride(h, func(c *daemon.Config) { c.StateDir, c.RunDir = t.TempDir(), t.TempDir() })
	hive.AddConfigOverride(h, func(c *ipam.Config) { c.IPAM = ipam.ModeKubernetes })
	err := h.Populate(hivetest.Logger(t))
	if err == nil || !strings.Contains(err.Error(), "--ipam=kubernetes needs a Kubernetes clientset") {
		t.Fatalf("populate = %v", err)
	}
}
