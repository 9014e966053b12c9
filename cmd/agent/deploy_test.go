package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// TestDeployConfigMap checks the DaemonSet's ConfigMap against the agent:
// every key must be a flag with a valid value, or the pods would not start.
func TestDeployConfigMap(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("..", "..", "deploy", "configmap.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var cm struct {
		Data map[string]string `yaml:"data"`
	}
	if err := yaml.Unmarshal(raw, &cm); err != nil {
		t.Fatalf("deploy/configmap.yaml: %v", err)
	}
	if len(cm.Data) == 0 {
		t.Fatal("deploy/configmap.yaml has no data")
	}
	dir := t.TempDir()
	for k, v := range cm.Data {
		if err := os.WriteFile(filepath.Join(dir, k), []byte(v), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// `agent hive` resolves every flag source and builds the graph, which
	// validates the values, without starting anything.
	var stdout, stderr bytes.Buffer
	if code := execute([]string{"hive", "--config-dir", dir}, &stdout, &stderr); code != 0 {
		t.Fatalf("agent hive with deploy/configmap.yaml as --config-dir: exit %d\n%s", code, stderr.String())
	}
	if !strings.Contains(stdout.String(), `HealthAddr: (string) (len=12) "0.0.0.0:9879"`) {
		t.Errorf("the ConfigMap's health-addr did not reach the health cell")
	}
}

// TestDeployImage checks that the DaemonSet runs the image `make image`
// builds, never pulls it from a registry, and installs the plugin with the
// agent's own install-cni (the image has no shell).
func TestDeployImage(t *testing.T) {
	makefile, err := os.ReadFile(filepath.Join("..", "..", "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	var image string
	for _, line := range strings.Split(string(makefile), "\n") {
		if name, ok := strings.CutPrefix(line, "IMAGE "); ok {
			image = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(name), "?="))
		}
	}
	if image == "" {
		t.Fatal("the Makefile sets no IMAGE")
	}
	raw, err := os.ReadFile(filepath.Join("..", "..", "deploy", "daemonset.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	type container struct {
		Name            string   `yaml:"name"`
		Image           string   `yaml:"image"`
		ImagePullPolicy string   `yaml:"imagePullPolicy"`
		Command         []string `yaml:"command"`
	}
	var ds struct {
		Spec struct {
			Template struct {
				Spec struct {
					InitContainers []container `yaml:"initContainers"`
					Containers     []container `yaml:"containers"`
				} `yaml:"spec"`
			} `yaml:"template"`
		} `yaml:"spec"`
	}
	if err := yaml.Unmarshal(raw, &ds); err != nil {
		t.Fatalf("deploy/daemonset.yaml: %v", err)
	}
	pod := ds.Spec.Template.Spec
	all := append(append([]container{}, pod.InitContainers...), pod.Containers...)
	for _, c := range all {
		if c.Image != image || c.ImagePullPolicy != "IfNotPresent" {
			t.Errorf("container %s: image %q pull policy %q, want make image's %q, IfNotPresent", c.Name, c.Image, c.ImagePullPolicy, image)
		}
	}
	if len(pod.InitContainers) != 1 || strings.Join(pod.InitContainers[0].Command[:2], " ") != "/usr/local/bin/agent install-cni" {
		t.Errorf("init containers %+v, want one running agent install-cni", pod.InitContainers)
	}
}
