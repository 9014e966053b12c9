package main

import (
	"bytes"
	"net"
	"os"
	"path/filepath"
	"strconv"
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
	if !strings.Contains(stdout.String(), `HealthAddr: (string) (len=14) "127.0.0.1:9879"`) {
		t.Errorf("the ConfigMap's health-addr did not reach the health cell")
	}
	if !strings.Contains(stdout.String(), `MetricsAddr: (string) (len=5) ":9962"`) {
		t.Errorf("the ConfigMap's metrics-addr did not reach the metrics cell")
	}
}

// TestDeployProbes checks the DaemonSet's probes and ports against the
// ConfigMap: the kubelet probes the loopback address the probe server
// listens on, which is loopback only (issue 25), and the port named
// "metrics" is metrics-addr's, which is not the probes'.
func TestDeployProbes(t *testing.T) {
	var cm struct {
		Data map[string]string `yaml:"data"`
	}
	readYAML(t, "configmap.yaml", &cm)
	type probe struct {
		HTTPGet struct {
			Host string `yaml:"host"`
			Path string `yaml:"path"`
			Port int    `yaml:"port"`
		} `yaml:"httpGet"`
	}
	var ds struct {
		Spec struct {
			Template struct {
				Spec struct {
					Containers []struct {
						Name  string `yaml:"name"`
						Ports []struct {
							Name          string `yaml:"name"`
							ContainerPort int    `yaml:"containerPort"`
						} `yaml:"ports"`
						StartupProbe   *probe `yaml:"startupProbe"`
						LivenessProbe  *probe `yaml:"livenessProbe"`
						ReadinessProbe *probe `yaml:"readinessProbe"`
					} `yaml:"containers"`
				} `yaml:"spec"`
			} `yaml:"template"`
		} `yaml:"spec"`
	}
	readYAML(t, "daemonset.yaml", &ds)

	healthHost, healthPort, err := net.SplitHostPort(cm.Data["health-addr"])
	if err != nil || healthHost != "127.0.0.1" {
		t.Fatalf("configmap.yaml health-addr = %q, want 127.0.0.1:<port>", cm.Data["health-addr"])
	}
	_, metricsPort, err := net.SplitHostPort(cm.Data["metrics-addr"])
	if err != nil || metricsPort == healthPort {
		t.Fatalf("configmap.yaml metrics-addr = %q, want a host:port other than health-addr's port", cm.Data["metrics-addr"])
	}
	for _, c := range ds.Spec.Template.Spec.Containers {
		if c.Name != "agent" {
			continue
		}
		for name, p := range map[string]*probe{"startupProbe": c.StartupProbe, "livenessProbe": c.LivenessProbe, "readinessProbe": c.ReadinessProbe} {
			if p == nil {
				t.Errorf("daemonset.yaml: agent has no %s", name)
				continue
			}
			if got := net.JoinHostPort(p.HTTPGet.Host, strconv.Itoa(p.HTTPGet.Port)); got != cm.Data["health-addr"] {
				t.Errorf("daemonset.yaml %s probes %s, want health-addr %s", name, got, cm.Data["health-addr"])
			}
		}
		var named bool
		for _, p := range c.Ports {
			if p.Name == "metrics" {
				named = true
				if strconv.Itoa(p.ContainerPort) != metricsPort {
					t.Errorf("daemonset.yaml port metrics = %d, want metrics-addr's %s", p.ContainerPort, metricsPort)
				}
			}
		}
		if !named {
			t.Error("daemonset.yaml: agent has no port named metrics")
		}
		return
	}
	t.Fatal("daemonset.yaml has no container agent")
}

func readYAML(t *testing.T, file string, v any) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("..", "..", "deploy", file))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(raw, v); err != nil {
		t.Fatalf("deploy/%s: %v", file, err)
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
