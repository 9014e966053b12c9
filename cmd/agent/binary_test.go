package main

import (
	"bytes"
	"debug/elf"
	"io"
	"os"
	"os/exec"
	"strconv"
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

// TestAgentInitializersAllocateLittle: the agent's own packages'
// initializers do no work that only some commands or modes need (compiling
// regular expressions, building schemes): every agent start pays for it,
// in heap and in the executable's pages it touches (docs/performance.md,
// "Memory at idle"). Read from `GODEBUG=inittrace=1 agent version`; the
// limit is per package, pkg/kubeclient's scheme (used in every mode) and
// the cells' hive declarations aside.
func TestAgentInitializersAllocateLittle(t *testing.T) {
	cmd := exec.Command(agentBin, "version")
	cmd.Env = append(os.Environ(), "GODEBUG=inittrace=1")
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = io.Discard, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("agent version: %v\n%s", err, stderr.String())
	}
	limits := map[string]int{
		// Mode- and tool-specific: nothing at start.
		"github.com/cellium/cellium/pkg/devcluster":    4096,
		"github.com/cellium/cellium/pkg/hubblerelay":   4096,
		"github.com/cellium/cellium/pkg/kubeapiserver": 4096,
		"github.com/cellium/cellium/pkg/k8sapi":        4096,
		"github.com/cellium/cellium/cells/bpfmaps":     8192,
		"github.com/cellium/cellium/pkg/kubeclient":    256 << 10,
	}
	seen := 0
	for line := range strings.Lines(stderr.String()) {
		// init PKG @T ms, C ms clock, B bytes, A allocs
		f := strings.Fields(line)
		if len(f) < 10 || f[0] != "init" || f[8] != "bytes," {
			continue
		}
		if !strings.HasPrefix(f[1], "github.com/cellium/cellium/") {
			continue
		}
		seen++
		n, err := strconv.Atoi(f[7])
		if err != nil {
			t.Fatalf("inittrace line %q: %v", line, err)
		}
		limit, ok := limits[f[1]]
		if !ok {
			limit = 32 << 10
		}
		if n > limit {
			t.Errorf("%s's initializer allocates %d bytes, more than %d: %s", f[1], n, limit, strings.TrimSpace(line))
		}
	}
	if seen == 0 {
		t.Fatalf("no initializer of the agent's packages in its inittrace:\n%s", stderr.String())
	}
}
