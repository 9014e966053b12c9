package ipam

import (
	"context"
	"fmt"

	"github.com/cilium/hive/cell"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/tools/cache"

	"github.com/cellium/cellium/cells/k8sclient"
)

// initPodCIDRs is the ipam table's initializer of --ipam=kubernetes, done
// once the local Node's spec.podCIDRs are the pools.
const initPodCIDRs = "pod-cidrs"

// nodePodCIDRs waits for the local Node to have spec.podCIDRs (the
// controller manager assigns them after the Node registers) and makes them
// the pools. They never change afterwards: Kubernetes does not allow it.
func (i *IPAM) nodePodCIDRs(ctx context.Context, health cell.Health) error {
	health.OK(fmt.Sprintf("Waiting for spec.podCIDRs of Node %s", i.nodeName))
	i.health.OK(fmt.Sprintf("Waiting for spec.podCIDRs of Node %s", i.nodeName))

	ctx, cancel := context.WithCancel(ctx)
	inf := k8sclient.NewInformer(i.clientset, i.clientset.CoreV1().Nodes(), &corev1.Node{}, func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("metadata.name", i.nodeName).String()
	})
	factory := k8sclient.NewInformers(inf)
	defer func() {
		cancel()
		factory.Shutdown()
	}()
	found := make(chan []string, 1)
	// The embedded API server ignores field selectors in watches: the
	// handler checks the name itself.
	seen := func(obj any) {
		node, ok := obj.(*corev1.Node)
		if !ok || node.Name != i.nodeName || len(node.Spec.PodCIDRs) == 0 {
			return
		}
		select {
		case found <- node.Spec.PodCIDRs:
		default:
		}
	}
	_, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    seen,
		UpdateFunc: func(_, obj any) { seen(obj) },
	})
	if err != nil {
		return err
	}
	factory.Start(ctx)

	var cidrs []string
	select {
	case cidrs = <-found:
	case <-ctx.Done():
		return nil
	}
	pools, err := parsePools(fmt.Sprintf("spec.podCIDRs of Node %s", i.nodeName), cidrs)
	if err != nil {
		i.health.Degraded("Invalid pod CIDRs", err)
		return err
	}
	return i.setPools(pools)
}

// setPools makes pools the pools and serves allocation from them.
func (i *IPAM) setPools(pools []Pool) error {
	txn := i.db.WriteTxn(i.tbl)
	defer txn.Abort()
	if err := i.reserveRouters(txn, pools); err != nil {
		return err
	}
	i.mu.Lock()
	i.pools = pools
	i.mu.Unlock()
	i.podCIDRsKnown(txn)
	txn.Commit()
	i.log.Info("Pod CIDRs from the Node", "node", i.nodeName, "pools", poolsString(pools))
	i.health.OK("Pools " + poolsString(pools))
	return nil
}
