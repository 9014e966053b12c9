package devcluster

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"sigs.k8s.io/yaml"

	"github.com/cellium/cellium/pkg/statefile"
)

// The cluster's own manifests are named after what they hold, so a user's
// files beside them (services, say) do not clash.
func nodeManifest(node string) string { return "node." + node + ".yaml" }
func podManifest(p Pod) string        { return "pod." + podFileName(p) + ".yaml" }

// object is a manifest's object: only the fields that are set, which
// typed objects would not give (their zero structs print too).
type object = map[string]any

// nodeObject is the Node a kubelet would register and the controller
// manager would give pod CIDRs.
func nodeObject(n Node) object {
	cidrs := make([]string, len(n.PodCIDRs))
	for i, p := range n.PodCIDRs {
		cidrs[i] = p.String()
	}
	return object{
		"apiVersion": "v1",
		"kind":       "Node",
		"metadata": object{
			"name":   n.Name,
			"labels": object{"kubernetes.io/hostname": n.Name, "kubernetes.io/os": "linux"},
		},
		"spec": object{"podCIDR": cidrs[0], "podCIDRs": cidrs},
		"status": object{"addresses": []object{
			{"type": "InternalIP", "address": n.IPv4.String()},
			{"type": "InternalIP", "address": n.IPv6.String()},
			{"type": "Hostname", "address": n.Name},
		}},
	}
}

func podObject(p Pod) object {
	meta := object{"name": p.Name, "namespace": p.Namespace}
	if len(p.Labels) > 0 {
		meta["labels"] = p.Labels
	}
	container := object{"name": "main", "image": "none"}
	if len(p.Ports) > 0 {
		ports := make([]object, len(p.Ports))
		for i, cp := range p.Ports {
			ports[i] = object{"containerPort": cp.Port, "protocol": cp.Protocol}
			if cp.Name != "" {
				ports[i]["name"] = cp.Name
			}
		}
		container["ports"] = ports
	}
	return object{
		"apiVersion": "v1",
		"kind":       "Pod",
		"metadata":   meta,
		"spec": object{
			"nodeName":   p.Node,
			"containers": []object{container},
		},
	}
}

// writeManifest writes obj as YAML into the manifests directory,
// atomically: the agents never read half a file (the temporary one's
// extension is none they read). With a kube-apiserver (crd mode) it
// applies obj there too.
func (s *state) writeManifest(name string, obj any) error {
	data, err := yaml.Marshal(obj)
	if err != nil {
		return fmt.Errorf("manifest %s: %w", name, err)
	}
	header := "# Written by cellium-dev cluster; removed with what it describes.\n"
	if err := statefile.WriteMode(filepath.Join(s.manifestsDir(), name), append([]byte(header), data...), 0o644); err != nil {
		return err
	}
	return s.kubeApply(name, data)
}

// removeManifest removes a manifest, and with a kube-apiserver (crd mode)
// the objects it holds from there.
func (s *state) removeManifest(name string) error {
	path := filepath.Join(s.manifestsDir(), name)
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("remove manifest: %w", err)
	}
	if err := s.kubeDelete(name, data); err != nil {
		return err
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
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
