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
