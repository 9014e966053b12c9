package main

import (
	"bytes"
	"debug/elf"
	"io"
	"os"
	"os/exec"
	"slices"
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

// TestAgentLinksNoDeveloperTooling: the daemon links none of the developer
// tooling, which is cmd/cellium-dev's (the dev cluster, the CNI library it
// adds pods with, the relay and API server builds, the image build) or the
// tests' (docs/performance.md, "Memory at idle"): every agent start paid
// for its initializers and the pages they touched.
func TestAgentLinksNoDeveloperTooling(t *testing.T) {
	checkAgentLinksNone(t, []string{
		"github.com/cellium/cellium/pkg/devcluster",
		"github.com/cellium/cellium/pkg/hubblerelay",
		"github.com/cellium/cellium/pkg/kubeapiserver",
		"github.com/cellium/cellium/pkg/toolbuild",
		"github.com/cellium/cellium/pkg/tlsca",
		"github.com/cellium/cellium/pkg/kubeapitest",
		"github.com/cellium/cellium/pkg/etcdtest",
		"github.com/cellium/cellium/pkg/nettest",
		"github.com/cellium/cellium/deploy",
		"github.com/containernetworking/cni/libcni",
		"github.com/google/go-containerregistry/",
	}, nil)
}

// TestAgentLinksNoFakeClientMachinery: the daemon links neither client-go's
// testing package (its fake clients' reactors and object tracker) nor what
// only it pulled in: strategic merge patch, managed fields,
// structured-merge-diff's typed values, kube-openapi, gnostic's and
// go-openapi's OpenAPI models, json-patch (~50 packages, ~1.35 MB of an
// idle agent's resident pages; docs/performance.md). The embedded API
// server answers the typed clients itself (cells/k8sclient/fake.go, its
// own patches in patch.go), and pkg/kubeclient serves them over
// rest.Interface without client-go's gentype, which imports the testing
// package for its fakes. k8s.io/apimachinery's runtime itself needs
// kube-openapi's util and structured-merge-diff's value: those stay.
func TestAgentLinksNoFakeClientMachinery(t *testing.T) {
	checkAgentLinksNone(t, []string{
		"k8s.io/client-go/testing",
		"k8s.io/client-go/gentype",
		"k8s.io/apimachinery/pkg/util/strategicpatch",
		"k8s.io/apimachinery/pkg/util/managedfields",
		"sigs.k8s.io/structured-merge-diff/",
		"k8s.io/kube-openapi/",
		"github.com/google/gnostic-models/",
		"github.com/go-openapi/",
		"gopkg.in/evanphx/json-patch.v4",
		"github.com/evanphx/json-patch/",
	}, []string{
		"sigs.k8s.io/structured-merge-diff/v6/value",
		"k8s.io/kube-openapi/pkg/util",
	})
}

// checkAgentLinksNone fails t for each package of the agent's (as the
// image builds it: make image) that is one of unwanted or under one
// ending in "/", unless it is one of allowed.
func checkAgentLinksNone(t *testing.T, unwanted, allowed []string) {
	t.Helper()
	list := exec.Command("go", "list", "-deps", ".")
	list.Env = append(os.Environ(), "CGO_ENABLED=0")
	out, err := list.Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	daemon := false
	for pkg := range strings.Lines(string(out)) {
		pkg = strings.TrimSpace(pkg)
		daemon = daemon || pkg == "github.com/cellium/cellium/cells"
		if slices.Contains(allowed, pkg) {
			continue
		}
		for _, u := range unwanted {
			if pkg == u || strings.HasPrefix(pkg, strings.TrimSuffix(u, "/")+"/") {
				t.Errorf("the agent links %s", pkg)
			}
		}
	}
	if !daemon {
		t.Fatalf("go list -deps of the agent lacks its cells:\n%s", out)
	}
}

// `agent dev-cluster`, which moved, says what to run instead.
func TestDevClusterMoved(t *testing.T) {
	out, errOut, code := agentCmd(t, "dev-cluster", "up", "--nodes", "3")
	want := "Error: agent dev-cluster moved to its own binary: run cellium-dev cluster up --nodes 3 (make build puts bin/cellium-dev beside bin/agent; docs/dev-cluster.md)\n"
	if code != 1 || out != "" || errOut != want {
		t.Errorf("agent dev-cluster up --nodes 3 = %d, %q, %q; want 1 and %q", code, out, errOut, want)
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
		// Mode-specific: nothing at start.
		"github.com/cellium/cellium/pkg/k8sapi":     4096,
		"github.com/cellium/cellium/cells/bpfmaps":  8192,
		"github.com/cellium/cellium/pkg/kubeclient": 256 << 10,
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
