package k8sapi

import (
	"bytes"
	"context"
	_ "embed"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/yaml"
)

// CRDsYAML is the CustomResourceDefinitions, as in deploy/crds.yaml.
//
//go:embed crds.yaml
var CRDsYAML []byte

// LabelCRDVersion on a CRD is the version of its definition; the agent
// updates an installed CRD whose version is lower than its own.
const LabelCRDVersion = "cellium.io/crd-version"

var crdResource = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// CRDs returns the CustomResourceDefinitions to install.
func CRDs() ([]*unstructured.Unstructured, error) {
	var out []*unstructured.Unstructured
	for i, doc := range bytes.Split(CRDsYAML, []byte("\n---\n")) {
		u := &unstructured.Unstructured{}
		if err := yaml.Unmarshal(doc, &u.Object); err != nil {
			return nil, fmt.Errorf("crds.yaml document %d: %w", i+1, err)
		}
		out = append(out, u)
	}
	return out, nil
}

func crdVersion(u *unstructured.Unstructured) int {
	n, err := strconv.Atoi(u.GetLabels()[LabelCRDVersion])
	if err != nil {
		return 0
	}
	return n
}

// EnsureCRDs installs each CRD that is missing or older than this agent's,
// and waits until every one is Established (served by the API server).
// A CRD newer than this agent's is left alone: a newer agent installed it.
func (c *Client) EnsureCRDs(ctx context.Context, log *slog.Logger) error {
	crds, err := CRDs()
	if err != nil {
		return err
	}
	api := c.dyn.Resource(crdResource)
	for _, want := range crds {
		name := want.GetName()
		have, err := api.Get(ctx, name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			if _, err := api.Create(ctx, want, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
				return fmt.Errorf("create CRD %s: %w", name, err)
			}
			log.Info("Installed a CRD", "crd", name, "version", crdVersion(want))
		case err != nil:
			return fmt.Errorf("get CRD %s: %w", name, err)
		case crdVersion(have) < crdVersion(want):
			want = want.DeepCopy()
			want.SetResourceVersion(have.GetResourceVersion())
			if _, err := api.Update(ctx, want, metav1.UpdateOptions{}); err != nil {
				return fmt.Errorf("update CRD %s from version %d to %d: %w", name, crdVersion(have), crdVersion(want), err)
			}
			log.Info("Updated a CRD", "crd", name, "from", crdVersion(have), "to", crdVersion(want))
		}
	}
	for _, want := range crds {
		name := want.GetName()
		err := wait.PollUntilContextCancel(ctx, 200*time.Millisecond, true, func(ctx context.Context) (bool, error) {
			have, err := api.Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			return established(have), nil
		})
		if err != nil {
			return fmt.Errorf("CRD %s not established: %w", name, err)
		}
	}
	return nil
}

// established says whether a CRD's Established condition is True.
func established(crd *unstructured.Unstructured) bool {
	conds, _, _ := unstructured.NestedSlice(crd.Object, "status", "conditions")
	for _, c := range conds {
		m, _ := c.(map[string]any)
		if m["type"] == "Established" && m["status"] == "True" {
			return true
		}
	}
	return false
}
