package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cellium/cellium/pkg/apiv1"
)

const policyManifests = `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: web-from-client, namespace: prod}
spec:
  podSelector: {matchLabels: {app: web}}
  ingress:
  - from:
    - podSelector: {matchLabels: {app: client}}
    ports:
    - {port: 8080}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: bad, namespace: prod}
spec:
  podSelector: {}
  ingress:
  - ports:
    - {port: 90, endPort: 80}
`

// TestPolicyCommands: NetworkPolicies from the manifests directory, as
// `agent policy` shows them, and the bad one named in `agent status`.
func TestPolicyCommands(t *testing.T) {
	requireRoot(t)
	env := newAgentEnv(t)
	manifests := filepath.Join(env.dir, "manifests")
	if err := os.MkdirAll(manifests, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(manifests, "policies.yaml"), []byte(policyManifests), 0o644); err != nil {
		t.Fatal(err)
	}
	agent := startAgent(t, append(env.runFlags(), "--k8s-manifests-dir", manifests)...)
	defer agent.stop()
	agent.waitFor("Started hive")

	var list apiv1.PolicyList
	poll(t, "both policies listed", func() (bool, string) {
		out, errOut, code := agentCmd(t, "policy", "list", "-o", "json", "--api-socket", env.socket)
		if code != 0 {
			return false, errOut
		}
		if err := json.Unmarshal([]byte(out), &list); err != nil {
			t.Fatalf("agent policy list -o json: %v\n%s", err, out)
		}
		return len(list.Policies) == 2, out
	})
	if list.Revision == 0 || list.Policies[0].Name != "prod/bad" || list.Policies[0].Applied ||
		!list.Policies[1].Applied || list.Policies[1].Name != "prod/web-from-client" {
		t.Fatalf("agent policy list -o json = %+v", list)
	}

	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"policy", "list"}, []string{"Policy revision", "prod/web-from-client", "Ingress", "{app=web}",
			"ns=prod pods{app=client} : 8080/TCP", "applied", "not applied: NetworkPolicy prod/bad: ingress[0]: ports[0]: endPort 80"}},
		{[]string{"policy", "get", "prod/web-from-client"}, []string{"ns=prod pods{app=client} : 8080/TCP"}},
		{[]string{"policy", "selectors"}, []string{"SELECTOR", "ns=prod pods{app=client}", "prod/web-from-client"}},
		{[]string{"policy", "trace", "--from", "world", "--to", "host", "--port", "80/TCP"},
			[]string{"world -> host 80/TCP: ALLOWED", "neither side is a pod of this node"}},
		{[]string{"status"}, []string{"NetworkPolicy prod/bad"}},
	} {
		out, errOut, code := agentCmd(t, append(c.args, "--api-socket", env.socket)...)
		if code != 0 {
			t.Errorf("agent %v = %d: %s", c.args, code, errOut)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(out, w) {
				t.Errorf("agent %v does not say %q:\n%s", c.args, w, out)
			}
		}
	}
	if _, errOut, code := agentCmd(t, "policy", "get", "prod", "--api-socket", env.socket); code == 0 || !strings.Contains(errOut, "want NAMESPACE/NAME") {
		t.Errorf("agent policy get prod = %d: %s", code, errOut)
	}
}
