package main

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cellium/cellium/pkg/etcdtest"
	"github.com/cellium/cellium/pkg/kubeapitest"
)

// TestScaleSetupResumes: a BenchmarkScaleCluster setup that fails keeps
// what it created as a partial store (and one every checkpoint), and the
// next setup of the same store resumes from it, creating only the missing
// objects, and saves the whole store in place of the partial one.
func TestScaleSetupResumes(t *testing.T) {
	kasBin, err := kubeapitest.Binary()
	if err != nil {
		t.Skip(err)
	}
	etcdBin, err := etcdtest.Binary()
	if err != nil {
		t.Skip(err)
	}
	const n, failAt = 30, 20
	saved := filepath.Join(t.TempDir(), "services-30")
	o := scaleSetup{etcdBin: etcdBin, kasBin: kasBin, n: n, nodeName: "bench-node", saved: saved, checkpoint: 10}

	errStop := errors.New("the test stops the setup")
	scaleCreateHook = func(i int) error {
		if i >= failAt {
			return errStop
		}
		return nil
	}
	_, err = setupScaleCluster(t, o)
	scaleCreateHook = nil
	if !errors.Is(err, errStop) {
		t.Fatalf("the setup stopped at Service %d returned %v, want the hook's error", failAt, err)
	}
	if _, err := os.Stat(saved + ".partial"); err != nil {
		t.Fatalf("no partial store after the setup failed: %v", err)
	}

	c, err := setupScaleCluster(t, o)
	if err != nil {
		t.Fatal(err)
	}
	if c.setup != "resumed" || c.found < failAt || c.found+c.created != n {
		t.Fatalf("the second setup: setup=%s found %d created %d, want resumed, found ≥ %d and %d in all", c.setup, c.found, c.created, failAt, n)
	}
	if _, err := os.Stat(saved + ".partial"); !os.IsNotExist(err) {
		t.Errorf("the partial store is still there after the final save (%v)", err)
	}
	ctx := context.Background()
	svcs, err := c.kas.Admin.CoreV1().Services("bench").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	slices, err := c.kas.Admin.DiscoveryV1().EndpointSlices("bench").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(svcs.Items) != n || len(slices.Items) != n {
		t.Fatalf("the store holds %d Services and %d EndpointSlices, want %d of each", len(svcs.Items), len(slices.Items), n)
	}
	// The saved store is the whole one: a third setup starts from it.
	if c, err := setupScaleCluster(t, o); err != nil || c.setup != "cached" {
		t.Fatalf("a third setup: setup=%s, %v; want cached", c.setup, err)
	}
}
