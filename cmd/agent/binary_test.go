package main

import (
	"debug/elf"
	"strings"
	"testing"
)

// TestAgentLinksOnlyUsedAPIGroups: the agent links the typed clients of
// the Kubernetes API groups its cells use (k8sclient's groups), not
// client-go's whole Clientset nor its whole fake: ~50 groups' typed and
// fake clients, a fifth of the binary that the start reads.
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
	used := map[string]bool{}
	for _, s := range syms {
		for _, prefix := range []string{"k8s.io/client-go/kubernetes/typed/", "k8s.io/client-go/kubernetes/fake."} {
			if rest, ok := strings.CutPrefix(s.Name, prefix); ok {
				group, _, _ := strings.Cut(rest, ".")
				used[prefix+group] = true
			}
		}
	}
	for _, unwanted := range []string{
		"k8s.io/client-go/kubernetes/typed/apps/v1",
		"k8s.io/client-go/kubernetes/typed/batch/v1",
		"k8s.io/client-go/kubernetes/typed/apps/v1/fake",
		"k8s.io/client-go/kubernetes/fake.(*Clientset)",
	} {
		if used[unwanted] {
			t.Errorf("the agent links %s", unwanted)
		}
	}
	if !used["k8s.io/client-go/kubernetes/typed/core/v1"] {
		t.Errorf("no core/v1 typed client in the agent: the test looks for the wrong symbols (%d found)", len(used))
	}
}
