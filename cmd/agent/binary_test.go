package main

import (
	"debug/elf"
	"strings"
	"testing"
)

// TestAgentLinksOnlyUsedAPIGroups: the agent links the types and clients of
// the Kubernetes API groups it uses (pkg/kubeclient's scheme), not client-go's
// scheme of every group, which its generated typed clients, its informer
// factory and its fake clientset all import: ~50 groups' types, registered
// by reflection at start, which was most of the binary's pages that the
// start touched (docs/performance.md, "Idle memory").
func TestAgentLinksOnlyUsedAPIGroups(t *testing.T) {
	f, err := elf.Open(agentBin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	syms, err := f.Symbols()
	if err != nil {
		t.Skipf("no symbol table in %s: %v", agentBin, err)
	}
	unwanted := []string{
		"k8s.io/client-go/kubernetes/scheme.",
		"k8s.io/client-go/kubernetes/typed/",
		"k8s.io/client-go/kubernetes/fake.",
		"k8s.io/client-go/informers.",
		"k8s.io/client-go/discovery.",
		"k8s.io/api/apps/",
		"k8s.io/api/batch/",
	}
	found := map[string]string{}
	coreV1 := false
	for _, s := range syms {
		for _, prefix := range unwanted {
			if strings.HasPrefix(s.Name, prefix) && found[prefix] == "" {
				found[prefix] = s.Name
			}
		}
		coreV1 = coreV1 || strings.HasPrefix(s.Name, "k8s.io/api/core/v1.")
	}
	for _, prefix := range unwanted {
		if found[prefix] != "" {
			t.Errorf("the agent links %s (%s)", prefix, found[prefix])
		}
	}
	if !coreV1 {
		t.Errorf("no k8s.io/api/core/v1 symbol in the agent: the test looks for the wrong symbols")
	}
}
