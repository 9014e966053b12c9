package identity

import (
	"fmt"
	"strings"

	"github.com/cellium/cellium/pkg/labels"
)

// NamespaceLabel is the label every pod's identity has: its namespace.
const NamespaceLabel = "io.kubernetes.pod.namespace"

// defaultLabelFilter drops the labels that differ between pods of one
// workload: with them, every pod would have an identity of its own.
var defaultLabelFilter = []string{
	"!pod-template-hash",
	"!controller-revision-hash",
	"!pod-template-generation",
	"!statefulset.kubernetes.io/pod-name",
	"!apps.kubernetes.io/pod-index",
	"!batch.kubernetes.io/*",
	"!controller-uid",
	"!job-name",
	"!kubernetes.io/*",
}

// labelFilter decides which pod labels go into an identity. Each pattern
// is a label key, or a key prefix ending in *; a pattern starting with !
// drops what it matches. A label is kept when no drop pattern matches it
// and, if there are keep patterns, one of them does.
type labelFilter struct {
	keep, drop []string
}

func parseLabelFilter(patterns []string) (labelFilter, error) {
	var f labelFilter
	for _, p := range patterns {
		p = strings.TrimSpace(p)
		drop := strings.HasPrefix(p, "!")
		key := strings.TrimPrefix(p, "!")
		body := strings.TrimSuffix(key, "*")
		if body == "" || strings.ContainsAny(body, "*=;:! \t\n") {
			return f, fmt.Errorf("invalid --labels pattern %q: want a label key or key prefix ending in *, with a leading ! to drop it (e.g. !pod-template-hash, app.kubernetes.io/*)", p)
		}
		if drop {
			f.drop = append(f.drop, key)
		} else {
			f.keep = append(f.keep, key)
		}
	}
	return f, nil
}

func match(pattern, key string) bool {
	if prefix, ok := strings.CutSuffix(pattern, "*"); ok {
		return strings.HasPrefix(key, prefix)
	}
	return pattern == key
}

func (f labelFilter) accepts(key string) bool {
	for _, p := range f.drop {
		if match(p, key) {
			return false
		}
	}
	if len(f.keep) == 0 {
		return true
	}
	for _, p := range f.keep {
		if match(p, key) {
			return true
		}
	}
	return false
}

// PodLabels is the label set of a pod's identity: the pod's labels that
// the filter keeps, and its namespace, all from source k8s.
func (a *Allocator) PodLabels(namespace string, podLabels map[string]string) labels.Labels {
	ls := make([]labels.Label, 0, len(podLabels)+1)
	for k, v := range podLabels {
		if k != NamespaceLabel && a.filter.accepts(k) {
			ls = append(ls, labels.Label{Source: labels.SourceK8s, Key: k, Value: v})
		}
	}
	if namespace != "" {
		ls = append(ls, labels.Label{Source: labels.SourceK8s, Key: NamespaceLabel, Value: namespace})
	}
	return labels.New(ls...)
}
