package devcluster

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/cellium/cellium/pkg/statefile"
)

// The cluster's own manifests are named after what they hold, so a user's
// files beside them (services, say) do not clash.
func nodeManifest(node string) string { return "node." + node + ".yaml" }
func podManifest(pod string) string   { return "pod." + pod + ".yaml" }

// nodeObject is the Node a kubelet would register and the controller
// manager would give pod CIDRs.
func nodeObject(n Node) *corev1.Node {
	cidrs := make([]string, len(n.PodCIDRs))
	for i, p := range n.PodCIDRs {
		cidrs[i] = p.String()
	}
	return &corev1.Node{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Node"},
		ObjectMeta: metav1.ObjectMeta{
			Name:   n.Name,
			Labels: map[string]string{"kubernetes.io/hostname": n.Name, "kubernetes.io/os": "linux"},
		},
		Spec: corev1.NodeSpec{PodCIDR: cidrs[0], PodCIDRs: cidrs},
		Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{
			{Type: corev1.NodeInternalIP, Address: n.IPv4.String()},
			{Type: corev1.NodeInternalIP, Address: n.IPv6.String()},
			{Type: corev1.NodeHostName, Address: n.Name},
		}},
	}
}

func podObject(p Pod) *corev1.Pod {
	return &corev1.Pod{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace, Labels: p.Labels},
		Spec: corev1.PodSpec{
			NodeName:   p.Node,
			Containers: []corev1.Container{{Name: "main", Image: "none"}},
		},
	}
}

// writeManifest writes obj as YAML into the manifests directory,
// atomically: the agents never read half a file (the temporary one's
// extension is none they read).
func writeManifest(dir, name string, obj any) error {
	data, err := yaml.Marshal(obj)
	if err != nil {
		return fmt.Errorf("manifest %s: %w", name, err)
	}
	header := "# Written by agent dev-cluster; removed with what it describes.\n"
	return statefile.WriteMode(filepath.Join(dir, name), append([]byte(header), data...), 0o644)
}

func removeManifest(dir, name string) error {
	if err := os.Remove(filepath.Join(dir, name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove manifest: %w", err)
	}
	return nil
}

// checkManifestName is a name WriteManifest accepts: a file the agents
// read, directly in the manifests directory, not one of the cluster's own.
func checkManifestName(name string) error {
	ext := filepath.Ext(name)
	switch {
	case name != filepath.Base(name) || strings.HasPrefix(name, "."):
		return fmt.Errorf("invalid manifest name %q: want a file name such as web.yaml", name)
	case ext != ".yaml" && ext != ".yml" && ext != ".json":
		return fmt.Errorf("invalid manifest name %q: the agents read only .yaml, .yml and .json files", name)
	case strings.HasPrefix(name, "node.") || strings.HasPrefix(name, "pod."):
		return fmt.Errorf("invalid manifest name %q: node.* and pod.* are the cluster's own", name)
	}
	return nil
}
